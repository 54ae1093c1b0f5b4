"""The advantages phase: the step's rewards (clipped by clip_range_score, less the KL penalty with use_kl_in_reward) -> one
advantage per completion."""


import numpy as np

from alignment.algo.advantages import REWARD_AGGREGATIONS, AdvantageInputs
from alignment.algo.kl import kl_penalized_rewards
from alignment.parallel.distributed import World
from alignment.run.settings import AdvantageSettings
from alignment.step.records import ScoredBatch, loss_mask


def step_advantages(scored: ScoredBatch, settings: AdvantageSettings, world: World) -> tuple:
    """-> ((B,) float32 advantages by advantage_estimator (and multi_objective_aggregation), 0 where the reward failed;
    the KL in the reward's metrics, {} without it). Statistics over the whole step are summed over all processes."""
    mask = loss_mask(scored, settings.overlong_filter)
    rewards, metrics = scored.rewards, {}
    if settings.clip_range_score is not None:  # NaN (a failed reward) stays NaN
        rewards = np.clip(rewards, -settings.clip_range_score, settings.clip_range_score)
    if settings.use_kl_in_reward:
        rewards, metrics = rewards_less_kl(scored, mask, settings, world)
    inputs = AdvantageInputs(
        rewards=rewards,
        group_size=settings.rollout_n,
        scale=settings.scale_rewards,
        loss_tokens=mask.sum(axis=1),
        reward_columns=scored.reward_columns,
        reward_functions=settings.reward_functions,
        reward_weights=settings.reward_function_weights,
        global_sum=world.sum,
    )
    return REWARD_AGGREGATIONS.get(settings.multi_objective_aggregation)(inputs, settings.advantage_estimator), metrics


def rewards_less_kl(scored: ScoredBatch, mask: np.ndarray, settings: AdvantageSettings, world: World) -> tuple:
    """use_kl_in_reward: each sequence's reward less kl_in_reward_coeff x its summed KL(pi || pi_ref), pi the policy that
    sampled it (the engine's log-probs) -> ((B,) rewards, {kl_in_reward/kl: the KL per loss token, kl_in_reward/penalty:
    the mean penalty per sequence}, over all processes)."""
    rewards, sequence_kl = kl_penalized_rewards(
        scored.rewards, scored.rollout.logprobs, scored.ref_logprobs, mask, settings.kl_in_reward_coeff, settings.kl_in_reward_estimator
    )
    tokens, kl_sum, sequences = world.sum(np.array([mask.sum(), sequence_kl.sum(), len(mask)], dtype=np.float64))
    metrics = {
        "kl_in_reward/kl": kl_sum / max(tokens, 1.0),
        "kl_in_reward/penalty": settings.kl_in_reward_coeff * kl_sum / max(sequences, 1.0),
    }
    return rewards, metrics
