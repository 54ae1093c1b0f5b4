"""Loading models and tokenizers (paddleformers), and the one forward pass every phase shares."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import paddle
from paddle.utils import unique_name
from paddleformers.generation import GenerationConfig
from paddleformers.transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from paddleformers.utils.log import logger as paddleformers_logger
from safetensors import SafetensorError, safe_open

from alignment.basics.errors import ModelLoadError
from alignment.models.prefix_grouper import grouped_completion_hidden
from alignment.models.template_limits import bounded_chat_template

paddleformers_logger.set_level("WARNING")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")  # one of them holds the vocabulary
# The sizes config.json sets; one it lacks takes paddleformers' default (Qwen2: hidden_size 4096), which the weights do not fit.
SIZE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"
)


def load_tokenizer(path: str, chat_template: str | None = None):
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{path}: no tokenizer there (none of {', '.join(TOKENIZER_FILES)}); "
            "copy the tokenizer files of the model it was made from into it"
        )
    for name in ("tokenizer_config.json", "tokenizer.json"):  # name the file and line where they are damaged
        if (Path(path) / name).is_file():
            read_json_object(Path(path) / name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # the tokenizers library raises a bare Exception for a damaged tokenizer.json
        raise ModelLoadError(f"{path}: the tokenizer does not load: {_one_line(e)}") from e
    if chat_template:  # the template's text (the config reads a file's), never a path: long templates are no file name
        tokenizer.chat_template = chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.apply_chat_template = bounded_chat_template(tokenizer.apply_chat_template)  # a template is code: limited
    return tokenizer


# paddleformers' default "flex_checkpoint" format is collective and fragile here: its loader writes a
# metadata file into the model folder on every load (fails on read-only folders, races between ranks)
# and fails outright under contiguous kernels; its saver holds a barrier across all ranks and writes
# corrupt weights under contiguous kernels. The plain safetensors path ("unified_checkpoint") reads and
# writes the same Hugging Face layout from one process. Its loader warns that a tied lm_head "is newly
# initialized" although it is tied to the embeddings, so that warning is silenced for tied models, and
# weights really missing from the files are caught by _check_stored_weights instead (paddleformers
# would leave them randomly initialised with only that warning).
#
# The layout is the one transformers reads, tensor for tensor: Hugging Face names, linear weights as
# torch's (out, in) (paddle holds them as (in, out) and the loader and saver transpose), the dtype the
# model holds; a tied model's file also stores lm_head.weight, which transformers ignores. paddleformers
# neither loads nor saves generation_config.json for these models (their can_generate() is False), so
# load_causal_lm and save_model carry it: Qwen2.5-Instruct's lists <|im_end|> as a stop token there.


def load_causal_lm(path: str, dtype: str = "float32"):
    """A model folder -> the model; a folder that cannot make one raises ModelLoadError naming the file, checked
    before any weight memory is allocated: config.json, then every weight's presence and shape in the safetensors."""
    config, unset_sizes = _model_config(Path(path))
    _check_stored_weights(Path(path), config, unset_sizes)
    paddleformers_logger.set_level("ERROR" if config.tie_word_embeddings else "WARNING")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, load_checkpoint_format="unified_checkpoint")
        if (Path(path) / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(path)
    except Exception as e:  # what the checks above do not foresee, from paddleformers' loader: name the folder
        raise ModelLoadError(f"{path}: the model does not load: {_one_line(e)}") from e
    finally:
        paddleformers_logger.set_level("WARNING")
    return model


def read_json_object(file: Path) -> dict:
    """A model folder's JSON file (config.json, tokenizer.json, ...) -> its object; ModelLoadError naming the file
    (and line:column) where it is not one: a download or copy cut short, an editor's slip."""
    try:
        value = json.loads(file.read_bytes())
    except OSError as e:
        raise ModelLoadError(f"{file}: cannot be read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    except (ValueError, RecursionError) as e:  # not UTF-8; nested past Python's recursion limit
        raise ModelLoadError(f"{file}: not valid JSON: {_one_line(e)}") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{file}: not a JSON object")
    return value


def enable_recompute(model, granularity: str) -> None:
    """Recompute each decoder layer's activations in the backward pass (paddleformers' full, uniform,
    one layer per unit: the only scheme its Qwen2 / Qwen3 / Llama forward implements). It applies only
    where gradients flow, so rollout and the reference model's forward are unaffected."""
    model.config.recompute_granularity = granularity
    model.config.recompute_method = "uniform"
    model.config.recompute_num_layers = 1


def stop_token_ids(model, tokenizer) -> list:
    """The tokenizer's eos plus any the model's generation config lists (Qwen2.5-Instruct ends turns
    with <|im_end|> but lists <|endoftext|> too)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return sorted(i for i in ids if i is not None)


def save_model(model, path: str) -> None:
    """Hugging Face layout: config.json + model.safetensors (+ generation_config.json); transformers and
    load_causal_lm load it."""
    model.save_pretrained(path, save_checkpoint_format="unified_checkpoint")
    if model.generation_config is not None:
        model.generation_config.save_pretrained(path)


def _model_config(folder: Path) -> tuple:
    """-> (paddleformers' config, the SIZE_KEYS config.json lacks, whose defaults it holds)."""
    settings = read_json_object(folder / "config.json")
    if not (settings.get("architectures") or settings.get("init_class")):
        raise ModelLoadError(f'{folder / "config.json"}: names no model class (e.g. "architectures": ["Qwen2ForCausalLM"])')
    try:
        config = AutoConfig.from_pretrained(str(folder))
    except Exception as e:  # paddleformers' config classes raise what their checks choose
        raise ModelLoadError(f'{folder / "config.json"}: {_one_line(e)}') from e
    return config, [key for key in SIZE_KEYS if key not in settings and getattr(config, key, None) is not None]


def _check_stored_weights(folder: Path, config, unset_sizes: list) -> None:
    """Every weight of the model config.json describes must be in the safetensors files with its shape (a linear
    weight stored transposed, as torch's (out, in), fits). The model is built lazily (no memory) under its own
    name scope, so the real model's parameter names, which key the optimizer state, do not change."""
    try:
        with unique_name.guard(), paddle.LazyGuard():
            expected = {name: list(p.shape) for name, p in AutoModelForCausalLM.from_config(config).state_dict().items()}
    except Exception as e:  # e.g. an architectures entry paddleformers has no class for
        raise ModelLoadError(f'{folder / "config.json"}: no model can be built from it: {_one_line(e)}') from e
    stored = _stored_shapes(folder)
    unset = "".join(f"; config.json does not set {key} (default {getattr(config, key)} used)" for key in unset_sizes)
    _check_none_missing(folder, expected, stored, config.tie_word_embeddings, unset)
    for name, shape in expected.items():
        if name in stored and stored[name][0] not in (shape, shape[::-1]):
            have, file = stored[name]
            want = max((shape, shape[::-1]), key=lambda s: sum(a == b for a, b in zip(s, have)))  # in the file's orientation
            raise ModelLoadError(f"{file}: {name} has shape {have}, but {folder / 'config.json'} makes it {want}{unset}")


def check_every_weight_stored(model, folder: Path) -> None:
    """A model built from `folder` by another loader (the reward model's): every weight it has must be stored
    there, since a head left at its random initialisation would give scores silently."""
    _check_none_missing(folder, model.state_dict(), _stored_shapes(folder), model.config.tie_word_embeddings)


def _check_none_missing(folder: Path, expected, stored: dict, tied_embeddings: bool, unset: str = "") -> None:
    tied = {"lm_head.weight"} if tied_embeddings else set()
    missing = sorted(set(expected) - tied - set(stored))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelLoadError(f"{folder}: the safetensors files lack {len(missing)} of the model's weights: {shown}{unset}")


def _stored_shapes(folder: Path) -> dict:
    """-> {tensor name: (shape, file)} from the headers of the folder's safetensors file(s)."""
    index = folder / "model.safetensors.index.json"  # sharded: the index names the files
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{index}: not a safetensors index ({_one_line(e)})") from None
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ModelLoadError(f"{folder}: no model.safetensors (nor model.safetensors.index.json) there")
    shapes = {}
    for name in files:
        file = folder / name
        if not file.is_file():
            raise ModelLoadError(f"{file}: no such file, though {index.name} names it")
        try:
            with safe_open(file, framework="np") as weights:
                shapes.update({key: (list(weights.get_slice(key).get_shape()), file) for key in weights.keys()})
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{file}: {_truncation(file) or f'not a readable safetensors file ({_one_line(e)})'}") from None
    return shapes


def _truncation(file: Path) -> str | None:
    """'truncated: ...' where the file is shorter than its header (an 8-byte length, then JSON with each tensor's
    data_offsets past the header) says it is: an interrupted download or copy."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 + length:
                return f"truncated: {size} bytes, shorter than its own header"
            header = json.loads(f.read(length))
        end = 8 + length + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    return f"truncated: {size} of the {end} bytes its header announces (copy or download it again)" if size < end else None


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


@dataclass
class TokenBatch:
    """Prompts left-padded to P, completions right-padded to T: input_ids = [prompt | completion]."""

    input_ids: paddle.Tensor  # (B, P+T) int64
    attention_mask: paddle.Tensor  # (B, P+T) int64
    position_ids: paddle.Tensor  # (B, P+T) int64
    completion_ids: paddle.Tensor  # (B, T) int64
    completion_mask: paddle.Tensor  # (B, T) float32
    prompt_width: int


def make_token_batch(prompts: list, completion_ids: np.ndarray, completion_mask: np.ndarray, pad_token_id: int) -> TokenBatch:
    width = max(len(p) for p in prompts)
    batch, length = completion_ids.shape
    ids = np.full((batch, width + length), pad_token_id, dtype=np.int64)
    mask = np.zeros((batch, width + length), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) : width] = prompt
        mask[row, width - len(prompt) : width] = 1
    ids[:, width:] = completion_ids
    mask[:, width:] = completion_mask > 0
    positions = np.maximum(mask.cumsum(axis=1) - 1, 0)
    return TokenBatch(
        input_ids=paddle.to_tensor(ids),
        attention_mask=paddle.to_tensor(mask),
        position_ids=paddle.to_tensor(positions),
        completion_ids=paddle.to_tensor(completion_ids.astype(np.int64)),
        completion_mask=paddle.to_tensor(completion_mask.astype(np.float32)),
        prompt_width=width,
    )


def completion_logits(model, batch: TokenBatch) -> paddle.Tensor:
    """-> (B, T, V) fp32 logits that predicted each completion token."""
    logits = model(
        batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False, return_dict=True
    ).logits
    length = batch.completion_ids.shape[1]
    return logits[:, batch.prompt_width - 1 : batch.prompt_width - 1 + length].astype("float32")


def completion_hidden(model, batch: TokenBatch, group_prompts: bool = False) -> paddle.Tensor:
    """-> (B, T, H) final hidden states (after the last norm) that predicted each completion token: the
    input of lm_head, for chunked_token_logprobs, which never holds the (B, T, V) logits. group_prompts: rows that
    share a prompt run it once (alignment/models/prefix_grouper.py; the model must take its cache: fused_train.groups_prompts)."""
    if group_prompts:
        hidden = grouped_completion_hidden(model.model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.prompt_width)
        if hidden is not None:
            return hidden
    hidden = model.model(
        batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False, return_dict=True
    ).last_hidden_state
    start, length = batch.prompt_width - 1, batch.completion_ids.shape[1]
    # hidden[:, start:start + length] by split: paddle's CPU slice backward (Eigen's pad, one thread) is 3x slower
    return paddle.split(hidden, [start, length, hidden.shape[1] - start - length], axis=1)[1]


def output_head(model) -> tuple:
    """-> (weight (V, H), bias (V,) or None) of the model's lm_head, which computes hidden @ weight^T + bias;
    paddleformers holds the weight as (V, H) whether it is tied to the embedding (the same Parameter) or not."""
    return model.lm_head.weight, model.lm_head.bias



def layout_unsupported(model) -> Optional[str]:
    """Why the compiled operators (the fused engine's and the training modules') cannot take this model's layout, whatever
    its model type (None: they can): float32, separate q/k/v and gate/up projections, no sliding window, no bias on o_proj."""
    config = model.config
    if model.lm_head.weight.dtype != paddle.float32:
        return f"{model.lm_head.weight.dtype} weights (the CPU operators are float32)"
    if getattr(config, "fuse_attention_qkv", False) or getattr(config, "fuse_attention_ffn", False):
        return "fuse_attention_qkv / fuse_attention_ffn layouts"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if any(layer.self_attn.o_proj.bias is not None for layer in model.model.layers):
        return "a bias on o_proj (attention_bias on a Llama or Qwen3)"
    return None
