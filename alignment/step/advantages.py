"""The advantages phase: the step's rewards -> one advantage per completion."""


import numpy as np

from alignment.algo.core import (
    baseline_subtracted,
    group_advantages,
    normalized_per_function,
    rloo_advantages,
    sample_std,
    whiten,
    whitening_sums,
)
from alignment.parallel.distributed import World
from alignment.run.config import GRPOConfig
from alignment.step.records import ScoredBatch, loss_mask


def step_advantages(scored: ScoredBatch, config: GRPOConfig, world: World) -> np.ndarray:
    """(B,) float32 advantages by advantage_estimator (and multi_objective_aggregation), 0 where the reward failed;
    statistics over the whole step are summed over all processes."""
    rewards, size, estimator = scored.rewards, config.rollout_n, config.advantage_estimator
    if config.multi_objective_aggregation == "normalize_then_sum":
        combined = normalized_per_function([scored.reward_columns[name] for name in config.reward_functions], config.reward_function_weights, size)
        return whiten(combined, world.sum(whitening_sums(combined, np.ones(len(combined)))))[0]
    if estimator == "grpo":
        batch_std = global_reward_std(scored, world) if config.scale_rewards == "batch" else None
        return group_advantages(rewards, size, config.scale_rewards, batch_std)[0]
    if estimator == "rloo":
        return rloo_advantages(rewards, size)[0]
    # REINFORCE++: every loss token carries its sequence's (baseline-subtracted) reward, whitened over all of them
    values = baseline_subtracted(rewards, size) if estimator == "reinforce_plus_plus_baseline" else rewards
    tokens = loss_mask(scored, config).sum(axis=1)
    return whiten(values, world.sum(whitening_sums(values, tokens)))[0]


def global_reward_std(scored: ScoredBatch, world: World) -> float:
    """Sample std (ddof=1) of every valid reward of the step, over all processes: scale_rewards=batch's divisor."""
    return sample_std(world.sum(whitening_sums(scored.rewards, np.ones(len(scored.rewards)))))
