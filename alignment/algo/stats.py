"""Statistics of rewards: within each prompt's group (the one place a group's mean and std are computed), over the
batch (the moments that whitening sums over processes), and over an evaluation prompt's samples."""

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RewardGroups:
    """B rewards as P groups of G, float64, NaN where a reward could not be computed."""

    values: np.ndarray  # (P, G)
    valid: np.ndarray  # (P, G) bool: the reward is finite
    counts: np.ndarray  # (P, 1) valid members
    filled: np.ndarray  # (P, G) the values, 0 where not valid

    def mean(self) -> np.ndarray:  # (P, 1) over the valid members
        return self.filled.sum(axis=1, keepdims=True) / np.maximum(self.counts, 1)

    def std(self, mean: np.ndarray) -> np.ndarray:  # (P, 1) the sample std (ddof=1, as torch.std in TRL and verl) about mean
        squares = np.where(self.valid, (self.values - mean) ** 2, 0.0).sum(axis=1, keepdims=True)
        return np.sqrt(squares / np.maximum(self.counts - 1, 1))

    def spread(self) -> np.ndarray:  # (P, 1) max - min of the valid members
        highest = np.where(self.valid, self.values, -np.inf).max(axis=1, keepdims=True)
        return highest - np.where(self.valid, self.values, np.inf).min(axis=1, keepdims=True)


def reward_groups(rewards: np.ndarray, group_size: int) -> RewardGroups:
    values = rewards.astype(np.float64).reshape(-1, group_size)
    valid = np.isfinite(values)
    return RewardGroups(values, valid, valid.sum(axis=1, keepdims=True), np.where(valid, values, 0.0))


def groups_with_signal(rewards: np.ndarray, group_size: int, min_std: float) -> np.ndarray:
    """rewards (B,) NaN where failed -> (P,) bool: the group has at least two valid rewards whose sample std
    (ddof=1) is at least min_std and above zero. DAPO's dynamic sampling keeps only these: a group whose
    rewards are (nearly) equal has (nearly) zero advantages and only dilutes the batch; a threshold rather
    than exact equality, because scores such as the cosine or a reward model's differ by rounding."""
    groups = reward_groups(rewards, group_size)
    std = groups.std(groups.mean())
    return ((groups.counts >= 2) & (std >= min_std) & (std > 0)).reshape(-1)


def whitening_sums(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """values (B,) NaN where failed, weights (B,) >= 0 -> [sum w, sum w v, sum w v^2] float64 over the finite
    values: the moments sample_std() and whiten() need, summed over processes by the caller first."""
    finite = np.isfinite(values)
    v, w = values[finite].astype(np.float64), np.asarray(weights, dtype=np.float64)[finite]
    return np.array([w.sum(), (w * v).sum(), (w * v * v).sum()])


def sample_std(sums: np.ndarray) -> float:
    """[count, sum, sum of squares] from whitening_sums (weighted counts allowed) -> the unbiased (Bessel) std,
    0 for a count of 1 or less."""
    count, total, squares = sums
    return math.sqrt(max(squares - total**2 / count, 0.0) / (count - 1)) if count > 1 else 0.0


def mean_and_pass_at_k(correct: np.ndarray) -> tuple:
    """correct (P, k) bool, k samples of each of P prompts -> (mean@k (P,), pass@k (P,)) float64: the
    fraction of a prompt's samples that are correct, and whether any is (Chen et al.'s unbiased pass@k,
    1 - C(n - c, k) / C(n, k), is exactly that when n = k samples are drawn)."""
    correct = np.asarray(correct, dtype=bool)
    return correct.mean(axis=1), correct.any(axis=1).astype(np.float64)
