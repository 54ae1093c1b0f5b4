"""GRPO's math as pure functions of arrays and tensors, each returning what the trainer logs.

Shapes: B sequences (prompt-major groups of G), T completion tokens, V vocabulary.
"""

import math

import numpy as np
import paddle


def group_advantages(rewards: np.ndarray, group_size: int, eps: float = 1e-6) -> tuple:
    """rewards (B,), NaN where a reward could not be computed -> (advantages (B,) float32, metrics).

    A_i = (r_i - mean(r)) / (std(r) + eps) over the valid members of i's group, with the sample standard
    deviation (ddof=1, as torch.std in TRL and verl). eps keeps the division finite when a group's
    rewards barely differ. Members whose reward is NaN get advantage 0 (the trainer also leaves them out
    of the loss); a group with fewer than two valid members, or whose rewards are all equal, carries no
    signal and gets 0 throughout.
    """
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards of shape {rewards.shape} are not whole groups of {group_size}")
    groups = rewards.astype(np.float64).reshape(-1, group_size)  # (P, G)
    valid = np.isfinite(groups)
    counts = valid.sum(axis=1, keepdims=True)  # (P, 1)
    filled = np.where(valid, groups, 0.0)
    mean = filled.sum(axis=1, keepdims=True) / np.maximum(counts, 1)
    squares = np.where(valid, (groups - mean) ** 2, 0.0).sum(axis=1, keepdims=True)
    std = np.sqrt(squares / np.maximum(counts - 1, 1))
    # equality of the raw rewards, not squares > 0: the mean of identical floats can be off by an ulp
    spread = np.where(valid, groups, -np.inf).max(axis=1, keepdims=True) - np.where(valid, groups, np.inf).min(axis=1, keepdims=True)
    has_signal = (counts >= 2) & (spread > 0)
    advantages = np.divide(filled - mean, std + eps, out=np.zeros_like(filled), where=valid & has_signal)
    metrics = {
        "advantage_abs_mean": float(np.abs(advantages[valid]).mean()) if valid.any() else 0.0,
        "groups_without_signal": float(1.0 - has_signal.mean()),
    }
    return advantages.reshape(-1).astype(np.float32), metrics


def log_softmax(logits: paddle.Tensor, temperature: float = 1.0) -> paddle.Tensor:
    """log softmax(logits / temperature) over the last axis, as x - logsumexp(x): paddle 3.3.1's CPU
    log_softmax kernel slows down superlinearly with the vocabulary (46 rows of 151,936 logits took 79 s
    against 0.2 s this way; bench/bench_log_softmax.py)."""
    scaled = logits / temperature
    return scaled - paddle.logsumexp(scaled, axis=-1, keepdim=True)


def token_logprobs(logits: paddle.Tensor, tokens: paddle.Tensor, temperature: float = 1.0) -> paddle.Tensor:
    """logits (B, T, V), tokens (B, T) -> log pi(token) (B, T) under softmax(logits / temperature)."""
    scaled = logits / temperature
    chosen = paddle.take_along_axis(scaled, tokens.unsqueeze(-1), axis=-1).squeeze(-1)
    return chosen - paddle.logsumexp(scaled, axis=-1)


def token_entropy(logits: paddle.Tensor, temperature: float = 1.0) -> paddle.Tensor:
    """(B, T, V) -> (B, T) entropy of softmax(logits / temperature), in nats."""
    logprobs = log_softmax(logits, temperature)
    return -(logprobs.exp() * logprobs).sum(axis=-1)


def kl_k3(logprobs: paddle.Tensor, ref_logprobs: paddle.Tensor) -> paddle.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token: exp(d) - d - 1 with d = ref - logp.
    Non-negative, unbiased, and lower-variance than -d; (B, T) -> (B, T)."""
    delta = ref_logprobs - logprobs
    return paddle.exp(delta) - delta - 1.0


def clipped_surrogate(
    logprobs: paddle.Tensor, old_logprobs: paddle.Tensor, advantages: paddle.Tensor, clip_low: float, clip_high: float
) -> tuple:
    """PPO's clipped objective per token, as a loss: max(-A r, -A clip(r, 1 - low, 1 + high)), r = pi / pi_old.

    logprobs, old_logprobs (B, T); advantages (B,) -> (loss (B, T), clipped (B, T) bool: where the
    clipped branch is active, so the token's gradient is zero)."""
    ratio = paddle.exp(logprobs - old_logprobs)
    advantages = advantages.unsqueeze(-1)
    unclipped = -advantages * ratio
    clipped = -advantages * paddle.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return paddle.maximum(unclipped, clipped), clipped > unclipped


def grpo_loss(
    logprobs: paddle.Tensor,
    old_logprobs: paddle.Tensor,
    advantages: paddle.Tensor,
    mask: paddle.Tensor,
    token_count: float,
    clip_range: float,
    kl_coeff: float = 0.0,
    ref_logprobs: paddle.Tensor | None = None,
) -> tuple:
    """Loss of one micro-batch: per-token clipped surrogate + kl_coeff * k3, summed over the micro-batch's
    tokens and divided by `token_count`, the number of loss tokens in the whole global batch (DAPO's
    token-level mean). Summing these losses over micro-batches and ranks gives the same gradient however
    the batch is cut.

    mask (B, T) is 1 on completion tokens that count. Returns (loss, sums): sums are token-summed
    statistics (clipped, kl) that the caller divides by token_count once all micro-batches are in.
    """
    surrogate, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, clip_range, clip_range)
    per_token = surrogate
    sums = {"clipped": float((clipped.astype("float32") * mask).sum())}
    if kl_coeff > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coeff > 0 needs ref_logprobs")
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + kl_coeff * kl
        sums["kl"] = float((kl * mask).sum())
    loss = (per_token * mask).sum() / token_count
    return loss, sums


def learning_rate_factor(step: int, total_steps: int, warmup_steps: int, schedule: str, floor: float) -> float:
    """Multiplier of the peak learning rate before optimizer step `step` (0-based): linear warmup from 0
    over warmup_steps (as in Hugging Face's schedulers), then constant, linear or cosine decay to
    `floor` = min_learning_rate / learning_rate at the last step."""
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * shape
