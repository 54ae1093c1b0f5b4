"""The advantages phase: the step's rewards -> one advantage per completion."""


import numpy as np

from alignment.algo.advantages import REWARD_AGGREGATIONS, AdvantageInputs
from alignment.parallel.distributed import World
from alignment.run.config import GRPOConfig
from alignment.step.records import ScoredBatch, loss_mask


def step_advantages(scored: ScoredBatch, config: GRPOConfig, world: World) -> np.ndarray:
    """(B,) float32 advantages by advantage_estimator (and multi_objective_aggregation), 0 where the reward failed;
    statistics over the whole step are summed over all processes."""
    inputs = AdvantageInputs(
        rewards=scored.rewards,
        group_size=config.rollout_n,
        scale=config.scale_rewards,
        loss_tokens=loss_mask(scored, config).sum(axis=1),
        reward_columns=scored.reward_columns,
        reward_functions=config.reward_functions,
        reward_weights=config.reward_function_weights,
        global_sum=world.sum,
    )
    return REWARD_AGGREGATIONS.get(config.multi_objective_aggregation)(inputs, config.advantage_estimator)
