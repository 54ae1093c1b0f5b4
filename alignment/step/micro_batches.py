"""How the update cuts rows into micro-batches. A rollout's completions end at different lengths and are padded to
the longest (B, T); a micro-batch runs only up to its own longest completion, and the rows go into micro-batches
longest first, so that short completions share micro-batches, and little padding, with each other. The forward and
backward work then follows the tokens generated rather than the batch's longest answer.

The gradient does not depend on the cut (the loss weights are fixed for the whole mini-batch before any micro-batch
runs: alignment/algo/aggregation.py), except under a loss type whose weights depend on which rows share a micro-batch
(bnpo): there the rows keep their order and only the padding is cut."""

from dataclasses import dataclass

import numpy as np


def completion_widths(completion_mask: np.ndarray) -> np.ndarray:
    """(B, T) 1 on each completion's tokens -> (B,) columns up to each row's last token (0 for an empty row)."""
    filled = completion_mask > 0
    return np.where(filled.any(axis=1), filled.shape[1] - np.argmax(filled[:, ::-1], axis=1), 0)


def longest_first(rows: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """rows (m,) of the batch -> the same rows, the longest completions (widths (B,)) first; equal ones keep their order."""
    return rows[np.argsort(-widths[rows], kind="stable")]


@dataclass(frozen=True)
class MicroBatch:
    """Rows of the batch that run together, and the completion columns they need."""

    rows: np.ndarray  # (b,)
    width: int  # the longest completion among the rows (at least 1 column)

    @classmethod
    def of(cls, rows: np.ndarray, widths: np.ndarray) -> "MicroBatch":
        return cls(rows, max(int(widths[rows].max(initial=0)), 1))

    def take(self, array: np.ndarray) -> np.ndarray:
        """(B, T) per-token values of the batch -> (b, width) of these rows."""
        return array[self.rows, : self.width]
