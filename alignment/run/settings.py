"""What each phase of a training step reads of the config: one frozen record per phase, holding only its keys, built
once from the config by run/build.py (step_settings), so that alignment/step/ never sees the config. A field named as
a config key holds that key's value (run/build.py's from_keys fills it by name); the others say what they derive from."""

from dataclasses import dataclass
from typing import Optional

from alignment.algo.loss_settings import LossSettings
from alignment.rewards import RewardSettings
from alignment.storage.dashboards import DashboardSettings


@dataclass(frozen=True)
class ScoringSettings:
    """Scoring a rollout's completions (step/scoring.py), in training and in evaluation."""

    accuracy_function: str
    reward_settings: RewardSettings  # the length, repetition and substance rewards' keys
    reported_functions: tuple  # the reward functions whose values come back one by one: none from a PaddleNLP-protocol server


@dataclass(frozen=True)
class RolloutSettings:
    """Sampling completions and scoring them, and dynamic sampling's refills (step/rollout.py's Sampler)."""

    seed: int
    rollout_n: int
    dynamic_sampling: bool
    dynamic_sampling_min_std: float
    max_resample_times: int
    scoring: ScoringSettings


@dataclass(frozen=True)
class EvaluationSettings:
    """When the loop evaluates and how (step/evaluation.py)."""

    eval_on_start: bool
    eval_steps: int
    per_device_eval_batch_size: int
    eval_rollout_n: int
    max_evaluate_steps: int
    multi_turn: bool  # an environment: the tool-use metrics


@dataclass(frozen=True)
class AdvantageSettings:
    """The step's rewards -> one advantage per completion (step/advantages.py)."""

    overlong_filter: bool
    clip_range_score: Optional[float]
    use_kl_in_reward: bool
    kl_in_reward_coeff: float
    kl_in_reward_estimator: str
    rollout_n: int
    scale_rewards: str
    reward_functions: list
    reward_function_weights: Optional[list]
    multi_objective_aggregation: str
    advantage_estimator: str


@dataclass(frozen=True)
class UpdateSettings:
    """The policy update over a scored batch (step/update.py); the loss's own keys in `loss`."""

    seed: int
    per_device_train_batch_size: int
    num_iterations: int
    mini_batch_size: int
    shuffle_minibatch: bool
    overlong_filter: bool
    loss_type: str
    max_dec_len: int
    top_entropy_quantile: float
    entropy_coeff: float
    rejection_sampling: Optional[str]
    rejection_sampling_threshold: Optional[str]
    use_rollout_logprobs: bool
    importance_sampling_correction: bool
    importance_sampling_mode: str
    importance_sampling_cap: float
    importance_sampling_min: Optional[float]
    temperature: float
    logprob_chunk_tokens: int
    use_prefix_grouper: bool
    recompute: bool
    loss: LossSettings


@dataclass(frozen=True)
class LoopSettings:
    """The loop's own: logging, stopping, saving (step/trainer.py, step/state.py)."""

    output_dir: str
    logging_steps: int
    dashboards: DashboardSettings  # report_to's dashboards
    log_completions_per_step: int
    max_consecutive_skips: int
    max_train_minutes: float  # 0: no limit
    save_steps: int
    save_total_limit: Optional[int]
    config_json: str  # the config as grpo_config.json and every checkpoint hold it (GRPOConfig.to_json)


@dataclass(frozen=True)
class StepSettings:
    """Every phase's settings, as the training loop hands them on."""

    loop: LoopSettings
    rollout: RolloutSettings
    evaluation: EvaluationSettings
    advantages: AdvantageSettings
    update: UpdateSettings
