"""Rewards -> one advantage per completion. B sequences in prompt-major groups of G; NaN rewards could not be computed.

Three registries: ADVANTAGE_ESTIMATORS (config key advantage_estimator), REWARD_SCALES (scale_rewards: what
estimator grpo divides by) and REWARD_AGGREGATIONS (multi_objective_aggregation: how several reward functions'
values become one advantage). An estimator takes an AdvantageInputs and returns the (B,) float32 advantages.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from alignment.algo.registry import Registry
from alignment.algo.stats import RewardGroups, reward_groups, sample_std, whitening_sums

ADVANTAGE_ESTIMATORS = Registry("advantage_estimator must be {choices}, not {name!r}")
# name -> f(groups, their means (P, 1), batch_std, eps) -> the (P, 1) divisor of r_i - mean
REWARD_SCALES = Registry("scale must be {choices}, not {name!r}")
REWARD_AGGREGATIONS = Registry("multi_objective_aggregation must be {choices}, not {name!r}")


@dataclass(frozen=True)
class AdvantageInputs:
    """One step's rewards, as the estimators read them."""

    rewards: np.ndarray  # (B,) the weighted sum of the reward functions, NaN where failed
    group_size: int
    scale: str  # scale_rewards (estimator grpo)
    loss_tokens: np.ndarray  # (B,) each sequence's loss tokens (REINFORCE++ whitens over tokens)
    reward_columns: dict  # reward function -> (B,) its values, NaN where failed
    reward_functions: list  # the reward functions, in the order of reward_weights
    reward_weights: list
    global_sum: Callable  # (n,) float64 -> its sum over all processes (identity in one process)


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(batch: AdvantageInputs) -> np.ndarray:
    """r_i - its group's mean, divided as scale_rewards says (batch: the std of every valid reward of the step, all processes)."""
    batch_std = sample_std(batch.global_sum(whitening_sums(batch.rewards, np.ones(len(batch.rewards))))) if batch.scale == "batch" else None
    return group_advantages(batch.rewards, batch.group_size, batch.scale, batch_std)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(batch: AdvantageInputs) -> np.ndarray:
    return rloo_advantages(batch.rewards, batch.group_size)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus(batch: AdvantageInputs) -> np.ndarray:
    """Every loss token carries its sequence's reward, whitened over all of them (no group baseline)."""
    return whiten(batch.rewards, batch.global_sum(whitening_sums(batch.rewards, batch.loss_tokens)))


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(batch: AdvantageInputs) -> np.ndarray:
    """As reinforce_plus_plus, with r_i - its group's mean as each sequence's value."""
    values = baseline_subtracted(batch.rewards, batch.group_size)
    return whiten(values, batch.global_sum(whitening_sums(values, batch.loss_tokens)))


@ADVANTAGE_ESTIMATORS.register("grpo_passk")
def grpo_passk(batch: AdvantageInputs) -> np.ndarray:
    return passk_advantages(batch.rewards, batch.group_size, batch.scale)


@ADVANTAGE_ESTIMATORS.register("opo")
def opo(batch: AdvantageInputs) -> np.ndarray:
    return opo_advantages(batch.rewards, batch.group_size, batch.loss_tokens)


@REWARD_AGGREGATIONS.register("sum_then_normalize")
def sum_then_normalize(batch: AdvantageInputs, estimator: str) -> np.ndarray:
    """The weighted sum of the reward functions is the reward: the estimator's advantages of it."""
    return ADVANTAGE_ESTIMATORS.get(estimator)(batch)


@REWARD_AGGREGATIONS.register("normalize_then_sum")
def normalize_then_sum(batch: AdvantageInputs, estimator: str) -> np.ndarray:
    """GDPO: each function's values normalised within their group, the weighted sum whitened over the step (estimator grpo)."""
    columns = [batch.reward_columns[name] for name in batch.reward_functions]
    combined = normalized_per_function(columns, batch.reward_weights, batch.group_size)
    return whiten(combined, batch.global_sum(whitening_sums(combined, np.ones(len(combined)))))


@REWARD_SCALES.register("group")
def group_scale(groups: RewardGroups, mean: np.ndarray, batch_std: float | None, eps: float) -> np.ndarray:
    return groups.std(mean) + eps


@REWARD_SCALES.register("batch")
def batch_scale(groups: RewardGroups, mean: np.ndarray, batch_std: float | None, eps: float) -> np.ndarray:
    if batch_std is None:
        batch_std = float(np.std(groups.values[groups.valid], ddof=1)) if groups.valid.sum() > 1 else 0.0
    return np.full_like(mean, batch_std + eps)


@REWARD_SCALES.register("none")
def no_scale(groups: RewardGroups, mean: np.ndarray, batch_std: float | None, eps: float) -> np.ndarray:
    return np.ones_like(mean)


def group_advantages(
    rewards: np.ndarray, group_size: int, scale: str = "group", batch_std: float | None = None, eps: float = 1e-6
) -> np.ndarray:
    """rewards (B,), NaN where a reward could not be computed -> advantages (B,) float32.

    A_i = r_i - mean(r) over the valid members of i's group, divided by
    - scale "group": the group's std (GRPO), the sample standard deviation (ddof=1, as torch.std in TRL
      and verl);
    - scale "batch": the std of every valid reward in the batch (TRL's scale_rewards="batch", more robust
      when a group's rewards barely differ); the trainer passes the global one as batch_std, else it is
      computed from `rewards`, ddof=1;
    - scale "none": nothing (Dr.GRPO: dividing by the group's std over-weights the easy and hard groups).
    eps keeps the division finite when the std is tiny. Members whose reward is NaN get advantage 0 (the
    trainer also leaves them out of the loss); a group with fewer than two valid members, or whose rewards
    are all equal, carries no signal and gets 0 throughout.
    """
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards of shape {rewards.shape} are not whole groups of {group_size}")
    divisor = REWARD_SCALES.get(scale)
    groups = reward_groups(rewards, group_size)
    mean = groups.mean()
    denominator = divisor(groups, mean, batch_std, eps)
    # equality of the raw rewards, not std > 0: the mean of identical floats can be off by an ulp
    has_signal = (groups.counts >= 2) & (groups.spread() > 0)
    advantages = np.divide(groups.filled - mean, denominator, out=np.zeros_like(groups.filled), where=groups.valid & has_signal)
    return advantages.reshape(-1).astype(np.float32)


def rloo_advantages(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """RLOO (Ahmadian et al. 2024; verl's and ms-swift's rloo): A_i = r_i - the mean of the other valid members
    of i's group = n / (n - 1) (r_i - mean), n the group's valid members; no division by a std. rewards (B,),
    NaN where failed -> advantages (B,) float32. As in group_advantages, a failed member gets 0 and
    a group with fewer than two valid members gets 0 throughout (verl would pass a lone reward through)."""
    groups = reward_groups(rewards, group_size)
    others_mean = (groups.filled.sum(axis=1, keepdims=True) - groups.filled) / np.maximum(groups.counts - 1, 1)
    advantages = np.where(groups.valid & (groups.counts >= 2), groups.filled - others_mean, 0.0)
    return advantages.reshape(-1).astype(np.float32)


def passk_advantages(rewards: np.ndarray, group_size: int, scale: str = "group", eps: float = 1e-6) -> np.ndarray:
    """Pass@k training (Chen et al. 2025, arXiv 2503.19595; verl's grpo_passk): a group of k is rewarded for its best
    answer, so only the best member gets an advantage, r_max - r_second (the reward the group would lose without it),
    divided by the group's std under scale "group" (verl's norm_adv_by_std_in_grpo); every other member gets 0, so a
    wrong exploratory answer beside a right one is not pushed down. rewards (B,) NaN where failed -> (B,) float32;
    among equal best rewards the first is the best (torch.topk's pick), and then r_max - r_second = 0. A group with
    fewer than two valid members gets 0 (verl refuses it)."""
    groups = reward_groups(rewards, group_size)
    ranked = np.where(groups.valid, groups.values, -np.inf)  # (P, G)
    best = ranked.argmax(axis=1)  # the first of equal maxima
    top_two = -np.sort(-ranked, axis=1)[:, :2]  # (P, 2)
    gap = top_two[:, 0] - top_two[:, 1]
    if scale == "group":
        gap = gap / (groups.std(groups.mean())[:, 0] + eps)
    advantages = np.zeros_like(groups.filled)
    live = groups.counts[:, 0] >= 2
    advantages[np.nonzero(live)[0], best[live]] = gap[live]
    return advantages.reshape(-1).astype(np.float32)


def opo_advantages(rewards: np.ndarray, group_size: int, lengths: np.ndarray) -> np.ndarray:
    """OPO (Hao et al. 2025, arXiv 2505.23585; verl's opo): r_i - the group's length-weighted mean reward
    sum_j |y_j| r_j / sum_j |y_j|, the baseline that minimises the gradient's variance when every token carries its
    sequence's reward (the optimal baseline under exact on-policy training). rewards (B,) NaN where failed, lengths (B,)
    the loss tokens -> (B,) float32; a failed member gets 0 and is left out of the baseline; a group with one valid
    member keeps its reward (baseline 0, as verl's)."""
    groups = reward_groups(rewards, group_size)
    weights = np.where(groups.valid, np.asarray(lengths, dtype=np.float64).reshape(groups.values.shape), 0.0)  # (P, G)
    weighted = (weights * groups.filled).sum(axis=1, keepdims=True) / np.maximum(weights.sum(axis=1, keepdims=True), 1e-12)
    baseline = np.where(groups.counts >= 2, weighted, 0.0)  # (P, 1)
    return np.where(groups.valid, groups.filled - baseline, 0.0).reshape(-1).astype(np.float32)


def baseline_subtracted(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """rewards (B,) NaN where failed -> r_i - mean of i's group's valid rewards (B,) float64, NaN kept:
    REINFORCE++-baseline's first step (Hu et al. 2025), before whitening over the batch."""
    groups = reward_groups(rewards, group_size)
    return (groups.values - groups.mean()).reshape(-1)


def whiten(values: np.ndarray, sums: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """(v - mean) / (std + eps) with the weighted mean and the unbiased std of the global sums from
    whitening_sums: weights = each sequence's loss tokens gives verl's masked_whiten over the batch's tokens
    (REINFORCE++, where every token of a sequence carries its reward), weights = 1 a per-sequence one (GDPO's
    batch normalisation in TRL). NaN values get 0. -> advantages (B,) float32."""
    count, total, _ = sums
    mean = total / count if count > 0 else 0.0
    finite = np.isfinite(values)
    advantages = np.where(finite, (np.where(finite, values, 0.0) - mean) / (sample_std(sums) + eps), 0.0)
    return advantages.astype(np.float32)


def normalized_per_function(columns: list, weights: list, group_size: int, eps: float = 1e-6) -> np.ndarray:
    """GDPO (arXiv 2601.05242; TRL's multi_objective_aggregation = normalize_then_sum): each reward function's
    values normalised within each group by its own mean and std (sample std, ddof=1) before the weighted sum,
    so one function's scale cannot drown out another's. columns: K arrays (B,), NaN where failed; a row NaN
    in any column is NaN in the result (it is left out of the loss), and the group statistics use the other
    rows only. -> (B,) float64, to be whitened over the batch (whiten with weights 1)."""
    table = np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1)  # (B, K)
    failed = ~np.isfinite(table).all(axis=1)  # (B,)
    table[failed] = np.nan
    total = np.zeros(len(table))
    for column, weight in zip(table.T, weights):
        normalised = group_advantages(column, group_size, "group", eps=eps)
        total += weight * normalised.astype(np.float64)
    total[failed] = np.nan
    return total
