"""The rollout correction (config key importance_sampling_mode): the rollout engine samples from pi_rollout,
numerically not quite the trainer's pi_old (other kernels, other summation order, bf16 weights; with vLLM in
other trainers, often more than that). Each token's policy loss is weighted by the ratio pi_old / pi_rollout
(Yao et al. 2025), detached, per token or per sequence (the product of its loss tokens' ratios), and either
truncated into [floor, cap] or set to 0 outside it ("mask": IcePop's rejection): TRL's
vllm_importance_sampling_mode values.

A mode takes log(pi_old / pi_rollout) (B, T), 0 off the loss tokens and detached, the cap and the floor (None:
no floor), and returns (weights, outside: bool, the ratio left [floor, cap]), both (B, T) or (B, 1)."""

from __future__ import annotations  # paddle.Tensor in signatures: no paddle needed to register (run_grpo.py --help)

import math
from dataclasses import dataclass

import numpy as np
import paddle

from alignment.algo.kl import KL_ESTIMATORS
from alignment.algo.registry import Registry

ROLLOUT_CORRECTIONS = Registry("importance sampling mode must be one of {listed}, not {name!r}")


@ROLLOUT_CORRECTIONS.register("token_truncate")
def token_truncate(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _truncated(paddle.exp(log_ratio), cap, floor)


@ROLLOUT_CORRECTIONS.register("token_mask")
def token_mask(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _masked(paddle.exp(log_ratio), cap, floor)


@ROLLOUT_CORRECTIONS.register("sequence_truncate")
def sequence_truncate(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _truncated(_sequence_ratio(log_ratio), cap, floor)


@ROLLOUT_CORRECTIONS.register("sequence_mask")
def sequence_mask(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _masked(_sequence_ratio(log_ratio), cap, floor)


def _sequence_ratio(log_ratio: paddle.Tensor) -> paddle.Tensor:  # (B, T) -> (B, 1) the product of the sequence's ratios
    return paddle.exp(log_ratio.sum(axis=-1, keepdim=True))


def _outside(ratio: paddle.Tensor, cap: float, floor: float | None) -> paddle.Tensor:
    outside = ratio > cap
    if floor is not None:
        outside = outside | (ratio < floor)
    return outside


def _truncated(ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    outside = _outside(ratio, cap, floor)
    return paddle.clip(ratio, min=floor, max=cap), outside


def _masked(ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    outside = _outside(ratio, cap, floor)
    return paddle.where(outside, paddle.zeros_like(ratio), ratio), outside


def rollout_correction(
    old_logprobs: paddle.Tensor,
    rollout_logprobs: paddle.Tensor,
    mask: paddle.Tensor,
    mode: str = "token_truncate",
    cap: float = 2.0,
    floor: float | None = None,
) -> tuple:
    """old_logprobs, rollout_logprobs, mask (B, T) -> (weights (B, T), outside (B, T) bool: the ratio of the token
    (or of its sequence) left [floor, cap] and was truncated or masked)."""
    correct = ROLLOUT_CORRECTIONS.get(mode)
    weights, outside = correct(((old_logprobs - rollout_logprobs) * mask).detach(), cap, floor)
    return paddle.expand(weights, mask.shape), paddle.expand(outside, mask.shape)


def off_policy_sequence_mask(
    advantages: paddle.Tensor, logprobs: paddle.Tensor, sampling_logprobs: paddle.Tensor, mask: paddle.Tensor, threshold: float
) -> paddle.Tensor:
    """DeepSeek-V3.2's off-policy sequence masking (arXiv 2512.02556, eq. 9; TRL's off_policy_mask_threshold): a sequence
    with A < 0 whose policy has moved from the one that sampled it by more than `threshold` (the mean over its loss
    tokens of log pi_sampling - log pi, the sampled tokens' estimate of KL(pi_sampling || pi)) is dropped from the
    policy term: pushing down a sample the policy no longer makes teaches it little and destabilises it.
    advantages (B,), logprobs (detached), sampling_logprobs, mask (B, T) -> (B, 1) float32, 1: kept, 0: dropped."""
    gap = ((sampling_logprobs - logprobs) * mask).sum(axis=-1, keepdim=True) / mask.sum(axis=-1, keepdim=True).clip(min=1.0)
    kept = (advantages.unsqueeze(-1) >= 0) | (gap <= threshold)
    return kept.astype("float32")


# Rejection sampling of rollouts (config keys rejection_sampling, rejection_sampling_threshold; verl's rollout_rs and
# rollout_rs_threshold): a token, or a whole sequence, whose divergence between the trainer's pi_old and the engine's
# pi_rollout is past a bound leaves the loss mask, so it neither trains nor counts in the normalisation. An option takes
# log(pi_old / pi_rollout) (B, T) float64, clamped to [-20, 20], and the mask, and returns its statistic per token (B, T)
# or per sequence (B, 1). The k1 options are two-sided and bounded in log space (lower_upper ratios, or 1/upper and upper
# from one number); the others have an upper bound only.
ROLLOUT_REJECTIONS = Registry("rejection_sampling option must be one of {listed}, not {name!r}")
# verl's earlier names: the token ratio, the sequence ratio (their product) and the geometric mean of the token ratios
REJECTION_SYNONYMS = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


@dataclass(frozen=True)
class RejectionRule:
    option: str  # a ROLLOUT_REJECTIONS name
    lower: float | None  # the k1 options' lower ratio bound
    upper: float


def _divergence(estimator: str, log_ratio: np.ndarray) -> np.ndarray:
    """kl.py's estimator at d = log(pi_old / pi_rollout) (B, T) float64: k1 = -d, k2 = d^2 / 2, k3 = e^d - 1 - d, verl's
    token divergences between the two policies."""
    return KL_ESTIMATORS.get(estimator)(paddle.to_tensor(log_ratio)).numpy()


def _sequence_sum(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return (values * mask).sum(axis=1, keepdims=True)


def _sequence_mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return _sequence_sum(values, mask) / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)


def _sequence_max(values: np.ndarray, mask: np.ndarray) -> np.ndarray:  # 0 for a sequence without loss tokens
    highest = np.where(mask > 0, values, -np.inf).max(axis=1, keepdims=True)
    return np.where(np.isfinite(highest), highest, 0.0)


ROLLOUT_REJECTIONS.register("token_k1")(lambda log_ratio, mask: _divergence("k1", log_ratio))
ROLLOUT_REJECTIONS.register("token_k2")(lambda log_ratio, mask: _divergence("k2", log_ratio))
ROLLOUT_REJECTIONS.register("token_k3")(lambda log_ratio, mask: _divergence("k3", log_ratio))
ROLLOUT_REJECTIONS.register("seq_sum_k1")(lambda log_ratio, mask: _sequence_sum(_divergence("k1", log_ratio), mask))
ROLLOUT_REJECTIONS.register("seq_sum_k2")(lambda log_ratio, mask: _sequence_sum(_divergence("k2", log_ratio), mask))
ROLLOUT_REJECTIONS.register("seq_sum_k3")(lambda log_ratio, mask: _sequence_sum(_divergence("k3", log_ratio), mask))
ROLLOUT_REJECTIONS.register("seq_mean_k1")(lambda log_ratio, mask: _sequence_mean(_divergence("k1", log_ratio), mask))
ROLLOUT_REJECTIONS.register("seq_mean_k2")(lambda log_ratio, mask: _sequence_mean(_divergence("k2", log_ratio), mask))
ROLLOUT_REJECTIONS.register("seq_mean_k3")(lambda log_ratio, mask: _sequence_mean(_divergence("k3", log_ratio), mask))
ROLLOUT_REJECTIONS.register("seq_max_k2")(lambda log_ratio, mask: _sequence_max(_divergence("k2", log_ratio), mask))
ROLLOUT_REJECTIONS.register("seq_max_k3")(lambda log_ratio, mask: _sequence_max(_divergence("k3", log_ratio), mask))


def rejection_rules(options: str, thresholds: str) -> list:
    """verl's spelling -> [RejectionRule]: options "a,b" (names or REJECTION_SYNONYMS), thresholds one shared entry or
    one per option, each "upper" or, for a k1 option, "lower_upper". Raises ValueError saying what is wrong."""
    names = list(dict.fromkeys(REJECTION_SYNONYMS.get(o.strip(), o.strip()) for o in options.split(",") if o.strip()))
    if not names:
        raise ValueError("names no option")
    for name in names:
        ROLLOUT_REJECTIONS.get(name)
    specs = [t.strip() for t in thresholds.split(",") if t.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"gives {len(specs)} thresholds for {len(names)} options: give one for all, or one per option")
    return [_rule(name, spec) for name, spec in zip(names, specs * len(names) if len(specs) == 1 else specs)]


def _rule(name: str, spec: str) -> RejectionRule:
    lower_text, bar, upper_text = spec.rpartition("_")
    if bar and not name.endswith("k1"):
        raise ValueError(f"{spec!r} for {name}: only the k1 options take lower_upper; give one upper bound")
    try:
        upper = float(upper_text)
        lower = float(lower_text) if bar else (1.0 / upper if name.endswith("k1") and upper > 0 else None)
    except ValueError:
        raise ValueError(f"{spec!r} for {name} is not a number (nor lower_upper)") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper) or not math.isfinite(upper):
        raise ValueError(f"{spec!r} for {name}: the bounds must be positive and finite, lower <= upper")
    return RejectionRule(name, lower, upper)


def rejection_keep(old_logprobs: np.ndarray, rollout_logprobs: np.ndarray, mask: np.ndarray, rules: list) -> np.ndarray:
    """(B, T) each -> (B, T) float32, 1 where every rule keeps the token (a sequence rule keeps all of a sequence's
    tokens or none), as verl's compute_rollout_rejection_mask."""
    log_ratio = np.clip((old_logprobs.astype(np.float64) - rollout_logprobs) * mask, -20.0, 20.0)
    keep = np.ones(mask.shape, dtype=bool)
    for rule in rules:
        statistic = ROLLOUT_REJECTIONS.get(rule.option)(log_ratio, mask)
        if rule.lower is not None:  # k1: bounded in log space
            kept = (statistic >= math.log(rule.lower)) & (statistic <= math.log(rule.upper))
        else:
            kept = statistic <= rule.upper
        keep &= np.broadcast_to(kept, mask.shape)
    return keep.astype(np.float32)


def off_policy_sums(old_logprobs: np.ndarray, rollout_logprobs: np.ndarray, weights: np.ndarray, mask: np.ndarray) -> dict:
    """The sums behind verl's off-policy diagnostics, to be summed over processes and micro-batches: old, rollout
    log-probs, the applied importance weights and the mask (B, T) -> {tokens, weight, weight_squared (for the
    effective sample size (sum w)^2 / (N sum w^2), 1 when every weight is equal), rho_squared (for chi2_token =
    E[rho^2] - 1, rho = pi_old / pi_rollout per token), sequences, rho_squared_sequence (for chi2_seq = E[(prod rho)^2]
    - 1 over the sequences with loss tokens)}."""
    log_ratio = (old_logprobs.astype(np.float64) - rollout_logprobs) * mask
    live = mask.sum(axis=1) > 0
    sequence_log_ratio = np.clip(log_ratio.sum(axis=1), -20.0, 20.0)
    w = weights.astype(np.float64) * mask
    return {
        "tokens": float(mask.sum()),
        "weight": float(w.sum()),
        "weight_squared": float((w**2).sum()),
        "rho_squared": float((np.exp(2 * np.clip(log_ratio, -20.0, 20.0)) * mask).sum()),
        "sequences": float(live.sum()),
        "rho_squared_sequence": float(np.exp(2 * sequence_log_ratio)[live].sum()),
    }


def off_policy_diagnostics(sums: dict) -> dict:
    """off_policy_sums summed over every process and micro-batch -> verl's diagnostics of the gap between pi_old and
    pi_rollout: the importance weights' effective sample size as a fraction of the tokens ((sum w)^2 / (N sum w^2): 1
    when every weight is equal; verl's rollout_is_eff_sample_size) and the chi-square divergences per token and per
    sequence (verl's chi2_token and chi2_seq)."""
    tokens, sequences = max(sums["tokens"], 1.0), max(sums["sequences"], 1.0)
    squared = sums["weight_squared"]
    return {
        "eff_sample_size": sums["weight"] ** 2 / (tokens * squared) if squared > 0 else 0.0,
        "chi2_token": sums["rho_squared"] / tokens - 1.0,
        "chi2_seq": sums["rho_squared_sequence"] / sequences - 1.0,
    }


def rejection_counts(trained: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The loss mask before rejection sampling and rejection_keep's mask (B, T) -> [loss tokens, rejected ones, sequences
    with loss tokens, those with a rejected token] float64, to be summed over processes (verl's rollout_rs_masked_fraction
    is the second over the first, rollout_rs_seq_masked_fraction the fourth over the third)."""
    rejected = trained * (1 - keep)
    live = trained.sum(axis=1) > 0
    return np.array([trained.sum(), rejected.sum(), live.sum(), (live & (rejected.sum(axis=1) > 0)).sum()], dtype=np.float64)
