"""Loading models and tokenizers (paddleformers), and the one forward pass every phase shares."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
from paddleformers.generation import GenerationConfig
from paddleformers.transformers import AutoModelForCausalLM, AutoTokenizer
from paddleformers.utils.log import logger as paddleformers_logger
from safetensors import safe_open

paddleformers_logger.set_level("WARNING")


def load_tokenizer(path: str, chat_template: str | None = None):
    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template:
        tokenizer.chat_template = Path(chat_template).read_text() if Path(chat_template).is_file() else chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# paddleformers' default "flex_checkpoint" format is collective and fragile here: its loader writes a
# metadata file into the model folder on every load (fails on read-only folders, races between ranks)
# and fails outright under contiguous kernels; its saver holds a barrier across all ranks and writes
# corrupt weights under contiguous kernels. The plain safetensors path ("unified_checkpoint") reads and
# writes the same Hugging Face layout from one process. Its loader warns that a tied lm_head "is newly
# initialized" although it is tied to the embeddings, so that warning is silenced for tied models, and
# weights really missing from the files are caught by _check_every_weight_stored instead (paddleformers
# would leave them randomly initialised with only that warning).
#
# The layout is the one transformers reads, tensor for tensor: Hugging Face names, linear weights as
# torch's (out, in) (paddle holds them as (in, out) and the loader and saver transpose), the dtype the
# model holds; a tied model's file also stores lm_head.weight, which transformers ignores. paddleformers
# neither loads nor saves generation_config.json for these models (their can_generate() is False), so
# load_causal_lm and save_model carry it: Qwen2.5-Instruct's lists <|im_end|> as a stop token there.


def load_causal_lm(path: str, dtype: str = "float32"):
    tied = _reads_tied_embeddings(path)
    paddleformers_logger.set_level("ERROR" if tied else "WARNING")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, load_checkpoint_format="unified_checkpoint")
    finally:
        paddleformers_logger.set_level("WARNING")
    _check_every_weight_stored(model, Path(path))
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model


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


def _check_every_weight_stored(model, folder: Path) -> None:
    stored = _stored_tensor_names(folder)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = sorted(set(model.state_dict()) - tied - stored)
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(f"{folder}: the safetensors files lack {len(missing)} of the model's weights: {shown}")


def _stored_tensor_names(folder: Path) -> set:
    index = folder / "model.safetensors.index.json"  # sharded: the index maps every tensor to its file
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    with safe_open(folder / "model.safetensors", framework="np") as weights:
        return set(weights.keys())


def _reads_tied_embeddings(path: str) -> bool:
    config = Path(path) / "config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("tie_word_embeddings", False))


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


def completion_hidden(model, batch: TokenBatch) -> paddle.Tensor:
    """-> (B, T, H) final hidden states (after the last norm) that predicted each completion token: the
    input of lm_head, for chunked_token_logprobs, which never holds the (B, T, V) logits."""
    hidden = model.model(
        batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False, return_dict=True
    ).last_hidden_state
    length = batch.completion_ids.shape[1]
    return hidden[:, batch.prompt_width - 1 : batch.prompt_width - 1 + length]


def output_head(model) -> tuple:
    """-> (weight (V, H), bias (V,) or None) of the model's lm_head, which computes hidden @ weight^T + bias;
    paddleformers holds the weight as (V, H) whether it is tied to the embedding (the same Parameter) or not."""
    return model.lm_head.weight, model.lm_head.bias
