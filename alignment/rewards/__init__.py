from . import format_rewards, instructions, length_rewards, logic_rewards, math_rewards  # noqa: F401  (importing them registers the built-in rewards)
from .registry import RewardSpec, available_rewards, get_reward, register_reward
from .scoring import ScoreTable, score_completions
from .settings import RewardSettings

# The reward function name of the sequence-classification model at reward_model_name_or_path: scored by the
# trainer in process (alignment/rewards/reward_model.py), not a registered rule.
REWARD_MODEL = "reward_model"

__all__ = [
    "REWARD_MODEL",
    "RewardSettings",
    "RewardSpec",
    "ScoreTable",
    "available_rewards",
    "get_reward",
    "register_reward",
    "score_completions",
]
