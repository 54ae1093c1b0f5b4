"""How token losses become the step's loss (config key loss_type): a weight per token, fixed for the global
batch before any micro-batch runs, so the gradient does not depend on how the batch is cut into micro-batches
and processes. A loss type takes the mask (B, T) float64, the global aggregation_counts and max_dec_len, and
returns the (B, T) float64 weights w with loss = sum w * token loss."""

import numpy as np

from alignment.algo.registry import Registry

LOSS_AGGREGATIONS = Registry("loss_type must be {choices}, not {name!r}")


@LOSS_AGGREGATIONS.register("dapo")
def dapo_weights(mask: np.ndarray, counts: np.ndarray, max_dec_len: int) -> np.ndarray:
    """1 / (loss tokens in the global batch): every token counts the same, so long completions are not
    down-weighted (DAPO's token-level mean; the default)."""
    tokens, _, _ = counts
    return mask / max(tokens, 1.0)


@LOSS_AGGREGATIONS.register("grpo")
def grpo_weights(mask: np.ndarray, counts: np.ndarray, max_dec_len: int) -> np.ndarray:
    """1 / (its sequence's loss tokens x sequences with loss tokens): the mean over each sequence's tokens, then
    over sequences (the GRPO paper's; a long wrong answer is penalised less per token)."""
    _, live_sequences, _ = counts
    return mask / np.maximum(mask.sum(axis=1, keepdims=True), 1.0) / max(live_sequences, 1.0)


@LOSS_AGGREGATIONS.register("dr_grpo")
def dr_grpo_weights(mask: np.ndarray, counts: np.ndarray, max_dec_len: int) -> np.ndarray:
    """1 / (sequences x max_dec_len), a constant (Dr.GRPO: no length normalisation at all)."""
    _, _, sequences = counts
    return mask / (max(sequences, 1.0) * max_dec_len)


def aggregation_counts(mask: np.ndarray) -> np.ndarray:
    """mask (B, T) of loss tokens -> [tokens, sequences with at least one loss token, sequences] float64, the
    counts the loss types divide by; the trainer sums them over processes before calling loss_token_weights."""
    return np.array([mask.sum(), (mask.sum(axis=1) > 0).sum(), mask.shape[0]], dtype=np.float64)


def loss_token_weights(mask: np.ndarray, loss_type: str, max_dec_len: int, counts: np.ndarray) -> np.ndarray:
    """mask (B, T), the global aggregation_counts -> (B, T) float32 weights, by loss_type."""
    weigh = LOSS_AGGREGATIONS.get(loss_type)
    return weigh(mask.astype(np.float64), counts, max_dec_len).astype(np.float32)
