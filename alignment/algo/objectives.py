"""Policy objectives (config key surrogate) and the importance ratio they are built on (importance_sampling_level).

An objective takes (ratio (B, T) or (B, 1) from importance_ratio, logprobs (B, T) with their gradient,
advantages (B,), the loss mask (B, T), the LossSettings) and returns (loss (B, T) per token, or (B, 1) per
sequence, flags: bool tensors (B, T) or (B, 1)).
Every objective sets the flags "clipped", "clipped_low" and "clipped_high"; FLAG_METRICS names each flag's
metric, the fraction of the step's loss tokens (over every update) where it was set.
"""

from __future__ import annotations  # paddle.Tensor in signatures: no paddle needed to register (run_grpo.py --help)

import paddle

from alignment.algo.loss_settings import LossSettings
from alignment.algo.registry import Registry

OBJECTIVES = Registry("surrogate must be {choices}, not {name!r}")
# name -> f(log pi - log pi_old (B, T), mask (B, T)) -> the ratio pi / pi_old with its gradient
IMPORTANCE_RATIOS = Registry("importance sampling level must be {choices}, not {name!r}")

SHARED_FLAGS = ("clipped", "clipped_low", "clipped_high")
# metrics.jsonl logs the shared flags' fractions after the entropy, any other flag's (where the objective sets it) after optimizer_steps
FLAG_METRICS = {
    "clipped": "clip_fraction",
    "clipped_low": "clip_low_fraction",
    "clipped_high": "clip_high_fraction",
    "dual_clipped": "dual_clip_fraction",
    "off_policy_masked": "off_policy_masked_fraction",
}


@OBJECTIVES.register("clip")
def clip(ratio: paddle.Tensor, logprobs: paddle.Tensor, advantages: paddle.Tensor, mask: paddle.Tensor, settings: LossSettings) -> tuple:
    """PPO's clipped ratio x advantage, with clip-higher and the dual clip (flag dual_clipped with dual_clip)."""
    return clipped_surrogate(ratio, advantages, settings.clip_range_ratio_low, settings.clip_range_ratio_high, settings.dual_clip_ratio)


@OBJECTIVES.register("cispo")
def cispo(ratio: paddle.Tensor, logprobs: paddle.Tensor, advantages: paddle.Tensor, mask: paddle.Tensor, settings: LossSettings) -> tuple:
    return cispo_surrogate(ratio, logprobs, advantages, settings.clip_range_ratio_low, settings.clip_range_ratio_high)


@OBJECTIVES.register("sapo")
def sapo(ratio: paddle.Tensor, logprobs: paddle.Tensor, advantages: paddle.Tensor, mask: paddle.Tensor, settings: LossSettings) -> tuple:
    return sapo_surrogate(ratio, advantages, settings.sapo_temperature_pos, settings.sapo_temperature_neg)


@OBJECTIVES.register("gmpo")
def gmpo(ratio: paddle.Tensor, logprobs: paddle.Tensor, advantages: paddle.Tensor, mask: paddle.Tensor, settings: LossSettings) -> tuple:
    """GMPO takes the token ratios (importance_sampling_level token; the config refuses sequence): it makes its own
    per-sequence geometric mean, from log r, after clipping each token's."""
    return gmpo_surrogate(paddle.log(ratio), mask, advantages, settings.clip_range_ratio_low, settings.clip_range_ratio_high)


@IMPORTANCE_RATIOS.register("token")
def token_ratio(log_ratio: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:  # (B, T): PPO, GRPO
    return paddle.exp(log_ratio)


@IMPORTANCE_RATIOS.register("sequence")
def sequence_ratio(log_ratio: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
    """GSPO's (Zheng et al. 2025) s_i = exp(mean over i's loss tokens of log pi - log pi_old) (B, 1), the geometric
    mean of the token ratios, so one sequence is clipped as a whole (TRL's importance_sampling_level)."""
    return paddle.exp((log_ratio * mask).sum(axis=-1, keepdim=True) / mask.sum(axis=-1, keepdim=True).clip(min=1.0))


def importance_ratio(logprobs: paddle.Tensor, old_logprobs: paddle.Tensor, mask: paddle.Tensor, level: str = "token") -> paddle.Tensor:
    """pi / pi_old with its gradient, per token (B, T) or per sequence (B, 1) as `level` says."""
    ratio_of = IMPORTANCE_RATIOS.get(level)
    return ratio_of(logprobs - old_logprobs, mask)


def clipped_surrogate(
    ratio: paddle.Tensor, advantages: paddle.Tensor, clip_low: float, clip_high: float, dual_clip: float | None = None
) -> tuple:
    """PPO's clipped objective as a loss: max(-A r, -A clip(r, 1 - low, 1 + high)), with clip_high > clip_low
    being DAPO's clip-higher. With dual_clip = c > 1 (Ye et al. 2020, verl's clip_ratio_c), a token with A < 0
    loses at most -A c: a huge ratio on a bad token cannot dominate.

    ratio (B, T) or (B, 1) from importance_ratio; advantages (B,) -> (loss shaped as ratio, flags: bool tensors
    of that shape "clipped" (the clipped branch is active, so the gradient is zero), "clipped_low" (A < 0 and
    r < 1 - low), "clipped_high" (A > 0 and r > 1 + high), "dual_clipped" (A < 0 and the -A c bound is active))."""
    advantages = advantages.unsqueeze(-1)  # (B, 1)
    unclipped = -advantages * ratio
    clipped = -advantages * paddle.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = paddle.maximum(unclipped, clipped)
    negative = paddle.expand_as(advantages < 0, ratio)
    flags = {
        "clipped": clipped > unclipped,
        "clipped_low": negative & (ratio < 1.0 - clip_low),
        "clipped_high": paddle.expand_as(advantages > 0, ratio) & (ratio > 1.0 + clip_high),
    }
    if dual_clip is not None:
        bound = -advantages * dual_clip  # (B, 1), positive where A < 0
        flags["dual_clipped"] = negative & (loss > bound)
        loss = paddle.where(flags["dual_clipped"], paddle.expand_as(bound, loss), loss)
    return loss, flags


def cispo_surrogate(ratio: paddle.Tensor, logprobs: paddle.Tensor, advantages: paddle.Tensor, clip_low: float, clip_high: float) -> tuple:
    """CISPO (MiniMax-M1, 2025): -sg(clip(r, 1 - low, 1 + high)) A log pi. The ratio is clipped as an importance
    weight without a gradient, so no token's gradient is ever zeroed (PPO's clip drops tokens whose ratio left
    the range, often the rare reflective ones). ratio (B, T) or (B, 1), logprobs (B, T), advantages (B,) ->
    (loss (B, T), flags "clipped" (the weight was clipped), "clipped_low" (r < 1 - low), "clipped_high"
    (r > 1 + high), any sign of A)."""
    weight = paddle.clip(ratio, 1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -weight * advantages.unsqueeze(-1) * logprobs
    low, high = ratio < 1.0 - clip_low, ratio > 1.0 + clip_high
    shape = logprobs.shape
    return loss, {"clipped": paddle.expand(low | high, shape), "clipped_low": paddle.expand(low, shape),
                  "clipped_high": paddle.expand(high, shape)}


def sapo_surrogate(ratio: paddle.Tensor, advantages: paddle.Tensor, temperature_pos: float, temperature_neg: float) -> tuple:
    """SAPO (Gao et al. 2025, arXiv 2511.20347; TRL's loss_type sapo, verl's loss_mode sapo): -f(r) A with the smooth gate
    f(r) = sigmoid(tau (r - 1)) 4 / tau in place of the hard clip, tau = temperature_pos where A > 0, else temperature_neg.
    f(1) = 2 / tau and f'(1) = 1, so on-policy the gradient is GRPO's; away from r = 1 the gradient f'(r) = 4 s (1 - s)
    (s the sigmoid) fades smoothly instead of dropping to zero at the clip. ratio (B, T) or (B, 1), advantages (B,) ->
    (loss shaped as ratio, flags: SAPO clips nothing, so "clipped", "clipped_low" and "clipped_high" are all False, as
    verl logs its clip fractions as 0)."""
    advantages = advantages.unsqueeze(-1)  # (B, 1)
    temperature = paddle.where(advantages > 0, paddle.full_like(advantages, temperature_pos), paddle.full_like(advantages, temperature_neg))
    gate = paddle.nn.functional.sigmoid(temperature * (ratio - 1.0)) * 4.0 / temperature
    loss = -gate * advantages
    unclipped = paddle.zeros(loss.shape, dtype="bool")
    return loss, {"clipped": unclipped, "clipped_low": unclipped, "clipped_high": unclipped}


def gmpo_surrogate(log_ratio: paddle.Tensor, mask: paddle.Tensor, advantages: paddle.Tensor, clip_low: float, clip_high: float) -> tuple:
    """GMPO (Zhao et al. 2025, arXiv 2507.20673; verl's loss_mode geo_mean): the geometric mean of the token ratios in
    place of their arithmetic mean, each token's log-ratio clipped in log space first, PPO-style by the sign of A:
    -A exp(mean over the loss tokens of sgn(A) min(sgn(A) log r, sgn(A) clip(log r, -low, high))). One outlier token
    moves the geometric mean far less than the arithmetic one, so the paper clips wider: low = high = 0.4 (e^-0.4,
    e^0.4). log_ratio, mask (B, T), advantages (B,) -> (loss (B, 1) per sequence, flags (B, T): "clipped" (the
    clipped log-ratio is the one used: no gradient through that token), "clipped_high" (A > 0 and log r > high),
    "clipped_low" (A < 0 and log r < -low))."""
    sign = paddle.sign(advantages).unsqueeze(-1)  # (B, 1)
    bounded = paddle.clip(log_ratio, -clip_low, clip_high)
    kept = sign * paddle.minimum(sign * log_ratio, sign * bounded)  # (B, T)
    mean_log_ratio = (kept * mask).sum(axis=-1, keepdim=True) / mask.sum(axis=-1, keepdim=True).clip(min=1.0)
    loss = -advantages.unsqueeze(-1) * paddle.exp(mean_log_ratio)  # (B, 1)
    high = paddle.expand_as(sign > 0, log_ratio) & (log_ratio > clip_high)
    low = paddle.expand_as(sign < 0, log_ratio) & (log_ratio < -clip_low)
    return loss, {"clipped": high | low, "clipped_low": low, "clipped_high": high}
