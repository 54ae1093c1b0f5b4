"""Loading models and tokenizers (paddleformers), and the one forward pass every phase shares."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
from paddleformers.transformers import AutoModelForCausalLM, AutoTokenizer
from paddleformers.utils.log import logger as paddleformers_logger

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
# initialized" although it is tied to the embeddings, so that warning is silenced for tied models.


def load_causal_lm(path: str, dtype: str = "float32"):
    tied = _reads_tied_embeddings(path)
    paddleformers_logger.set_level("ERROR" if tied else "WARNING")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, load_checkpoint_format="unified_checkpoint")
    finally:
        paddleformers_logger.set_level("WARNING")
    return model


def save_model(model, path: str) -> None:
    """Hugging Face layout: config.json + model.safetensors (transformers and from_pretrained load it)."""
    model.save_pretrained(path, save_checkpoint_format="unified_checkpoint")


def _reads_tied_embeddings(path: str) -> bool:
    import json

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
        batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, return_dict=True
    ).logits
    length = batch.completion_ids.shape[1]
    return logits[:, batch.prompt_width - 1 : batch.prompt_width - 1 + length].astype("float32")
