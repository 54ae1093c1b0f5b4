from . import format_rewards, math_rewards  # noqa: F401  (importing them registers the built-in rewards)
from .registry import RewardSpec, available_rewards, get_reward, register_reward
from .scoring import ScoreTable, score_completions

__all__ = [
    "RewardSpec",
    "ScoreTable",
    "available_rewards",
    "get_reward",
    "register_reward",
    "score_completions",
]
