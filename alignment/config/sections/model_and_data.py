"""Model and data: the policy model and its tokenizer, the datasets and their columns, the prompt and completion lengths."""

from dataclasses import dataclass
from typing import Optional

from alignment.config.checks import check
from alignment.config.sections import _key
from alignment.basics.errors import ConfigError
from alignment.basics.data import parse_step_range


@dataclass(frozen=True)
class ModelAndData:
    TITLE = "Model and data"

    actor_model_name_or_path: str = _key(
        "data/tiny-qwen2",
        "Policy model: a local Hugging Face-layout folder (config.json, safetensors, tokenizer), or a .gguf file (llama.cpp, Ollama), "
        "imported into <output_dir>/imported/<file name without .gguf> and reused while the file is unchanged.",
    )
    tokenizer_name_or_path: Optional[str] = _key(
        None,
        "Tokenizer folder (or .gguf file, imported as the actor's is); default: the actor's.",
    )
    chat_template: Optional[str] = _key(None, "Jinja chat template (text or file) replacing the tokenizer's.")
    train_datasets: str = _key(
        "data/arith/train.jsonl",
        "Training data, comma-separated: .jsonl, .json, .parquet or .csv files, or folders written by datasets' save_to_disk.",
    )
    eval_datasets: Optional[str] = _key(None, "Held-out data, comma-separated, as train_datasets; none: no evaluation.")
    prompt_key: Optional[str] = _key(None, "Column holding the prompt; default: detected (src, question, messages, prompt).")
    response_key: Optional[str] = _key(
        None,
        "Column holding the reference answer, a dotted key for a nested field; default: detected (tgt, answer, solution, response, "
        "ground_truth, reward_model.ground_truth as verl writes it).",
    )
    calculation_steps: Optional[str] = _key(
        None,
        "Keep only the rows whose reference answer marks this many <<...>> calculations, as GSM8K's worked answers do: a count (2) "
        "or a range (1-2); applies to train_datasets and eval_datasets. Default: every row.",
    )
    system_prompt: Optional[str] = _key(None, "System prompt (text or a file) put before every prompt without one.")
    max_prompt_len: int = _key(512, "Longest prompt in tokens, chat template included.")
    skip_bad_rows: bool = _key(
        False,
        "Skip malformed data rows (bad JSON, missing or wrong-typed fields, invalid UTF-8), printing each one's file:line and the count, "
        "instead of stopping at the first.",
    )
    prompt_truncation: str = _key("left", "Prompts over max_prompt_len: left (cut from the start) or drop.", choices=["left", "drop"])
    max_dec_len: int = _key(256, "Most tokens generated per completion.")
    min_dec_len: int = _key(0, "Fewest tokens generated before an eos token may end a completion.")
    max_seq_len: Optional[int] = _key(None, "Upper bound on max_prompt_len + max_dec_len; default: the model's max_position_embeddings.")


def check_names_a_dataset(c: ModelAndData, key: str) -> None:
    paths = getattr(c, key) or ""
    check(key == "eval_datasets" and not paths or any(p.strip() for p in paths.split(",")), f"{key} = '{paths}' names no file")


def check_calculation_steps(c: ModelAndData) -> None:
    if c.calculation_steps is not None:
        try:
            parse_step_range(c.calculation_steps)
        except ValueError as e:
            raise ConfigError(f"calculation_steps = {e}") from None


def check_lengths(c: ModelAndData) -> None:
    check(c.max_prompt_len >= 1 and c.max_dec_len >= 1, "max_prompt_len and max_dec_len must be at least 1")
    check(0 <= c.min_dec_len <= c.max_dec_len, f"min_dec_len ({c.min_dec_len}) must lie in [0, max_dec_len ({c.max_dec_len})]")
