"""The loss's settings, read by the objectives (objectives.py) and by the loss around them (loss.py): a module of
its own so that neither of the two imports the other for it. Each field is the config key of its name (run/build.py fills
it by name): a new knob of the loss is its key in alignment/config/sections/algorithm.py, a field here, and the
registry entry that reads it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LossSettings:
    """How each token's loss is made: the config's algorithm keys, read once."""

    clip_range_ratio_low: float = 0.2
    clip_range_ratio_high: float = 0.2
    dual_clip_ratio: float | None = None
    importance_sampling_level: str = "token"  # token, or sequence (GSPO)
    surrogate: str = "clip"  # clip (PPO), cispo, sapo or gmpo
    sapo_temperature_pos: float = 1.0  # SAPO's gate temperatures for A > 0 and A <= 0
    sapo_temperature_neg: float = 1.05
    off_policy_mask_threshold: float | None = None  # DeepSeek-V3.2's off-policy sequence mask; None: off
    kl_loss_coeff: float = 0.0
    kl_estimator: str = "k3"
    use_bias_correction_kl: bool = False  # TRL's: the KL term times the ratio pi / pi_old
