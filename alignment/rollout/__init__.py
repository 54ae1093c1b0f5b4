"""Rollout engines behind one interface (base.RolloutEngine): given prompts, sample G completions each
and return a Rollout with token ids, the sampling log-probs, and finish reasons."""

from alignment.rollout.base import Rollout, RolloutEngine, SamplingParams
from alignment.rollout.eager import EagerEngine


def build_engine(config, model, eos_token_ids: list, pad_token_id: int) -> RolloutEngine:
    return EagerEngine(model, eos_token_ids, pad_token_id)


__all__ = ["EagerEngine", "Rollout", "RolloutEngine", "SamplingParams", "build_engine"]
