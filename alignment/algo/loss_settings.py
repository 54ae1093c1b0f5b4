"""The loss's settings, read by the objectives (objectives.py) and by the loss around them (loss.py): a module of
its own so that neither of the two imports the other for it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LossSettings:
    """How each token's loss is made: the config's algorithm keys, read once."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    level: str = "token"  # importance_sampling_level: token, or sequence (GSPO)
    surrogate: str = "clip"  # clip (PPO), cispo, sapo or gmpo
    sapo_temperature_pos: float = 1.0  # SAPO's gate temperatures for A > 0 and A <= 0
    sapo_temperature_neg: float = 1.05
    off_policy_mask_threshold: float | None = None  # DeepSeek-V3.2's off-policy sequence mask; None: off
    kl_coeff: float = 0.0
    kl_estimator: str = "k3"
    kl_bias_correction: bool = False  # TRL's use_bias_correction_kl: the KL term times the ratio pi / pi_old
