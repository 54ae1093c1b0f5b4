"""How token losses become the step's loss (config key loss_type): a weight per token, fixed for the global
batch before any micro-batch runs, so the gradient does not depend on how the batch is cut into micro-batches
and processes (bnpo excepted: TRL defines it per micro-batch). A loss type takes the mask (B, T) float64 of this
process's mini-batch, the global aggregation_counts and the BatchCut, and returns the (B, T) float64 weights w
with loss = sum w * token loss."""

from dataclasses import dataclass

import numpy as np

from alignment.algo.registry import Registry

LOSS_AGGREGATIONS = Registry("loss_type must be {choices}, not {name!r}")


@dataclass(frozen=True)
class BatchCut:
    """How the mini-batch is run: what the loss types that do not count tokens divide by."""

    max_dec_len: int
    micro_batch_size: int  # rows of the mask per micro-batch (the last may be shorter)
    processes: int


@LOSS_AGGREGATIONS.register("dapo")
def dapo_weights(mask: np.ndarray, counts: np.ndarray, cut: BatchCut) -> np.ndarray:
    """1 / (loss tokens in the global batch): every token counts the same, so long completions are not
    down-weighted (DAPO's token-level mean; the default)."""
    tokens, _, _ = counts
    return mask / max(tokens, 1.0)


@LOSS_AGGREGATIONS.register("grpo")
def grpo_weights(mask: np.ndarray, counts: np.ndarray, cut: BatchCut) -> np.ndarray:
    """1 / (its sequence's loss tokens x sequences with loss tokens): the mean over each sequence's tokens, then
    over sequences (the GRPO paper's; a long wrong answer is penalised less per token)."""
    _, live_sequences, _ = counts
    return mask / np.maximum(mask.sum(axis=1, keepdims=True), 1.0) / max(live_sequences, 1.0)


@LOSS_AGGREGATIONS.register("dr_grpo")
def dr_grpo_weights(mask: np.ndarray, counts: np.ndarray, cut: BatchCut) -> np.ndarray:
    """1 / (sequences x max_dec_len), a constant (Dr.GRPO: no length normalisation at all)."""
    _, _, sequences = counts
    return mask / (max(sequences, 1.0) * cut.max_dec_len)


# The loss types whose weights depend on which rows share a micro-batch: the update keeps their rows in the batch's order.
CUT_DEPENDENT = frozenset({"bnpo"})


@LOSS_AGGREGATIONS.register("bnpo")
def bnpo_weights(mask: np.ndarray, counts: np.ndarray, cut: BatchCut) -> np.ndarray:
    """TRL's and ms-swift's bnpo: the token mean over each micro-batch's loss tokens (the "local batch"), then the mean
    over the micro-batches and processes (gradient accumulation and data parallelism average them). So, unlike dapo,
    it depends on per_device_train_batch_size: a short micro-batch's tokens weigh more. With one micro-batch in one
    process it is dapo."""
    weights = np.zeros_like(mask)
    starts = range(0, len(mask), cut.micro_batch_size)
    for start in starts:
        block = mask[start : start + cut.micro_batch_size]
        weights[start : start + cut.micro_batch_size] = block / max(block.sum(), 1.0)
    return weights / (len(starts) * cut.processes)


def aggregation_counts(mask: np.ndarray) -> np.ndarray:
    """mask (B, T) of loss tokens -> [tokens, sequences with at least one loss token, sequences] float64, the
    counts the loss types divide by; the trainer sums them over processes before calling loss_token_weights."""
    return np.array([mask.sum(), (mask.sum(axis=1) > 0).sum(), mask.shape[0]], dtype=np.float64)


def loss_token_weights(
    mask: np.ndarray, loss_type: str, max_dec_len: int, counts: np.ndarray, micro_batch_size: int | None = None, processes: int = 1
) -> np.ndarray:
    """mask (B, T), the global aggregation_counts -> (B, T) float32 weights, by loss_type; micro_batch_size None: the
    mask is one micro-batch."""
    weigh = LOSS_AGGREGATIONS.get(loss_type)
    cut = BatchCut(max_dec_len, micro_batch_size or max(len(mask), 1), processes)
    return weigh(mask.astype(np.float64), counts, cut).astype(np.float32)
