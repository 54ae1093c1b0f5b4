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


def mean_and_pass_at_k(correct: np.ndarray) -> tuple:
    """correct (P, k) bool, k samples of each of P prompts -> (mean@k (P,), pass@k (P,)) float64: the
    fraction of a prompt's samples that are correct, and whether any is (Chen et al.'s unbiased pass@k,
    1 - C(n - c, k) / C(n, k), is exactly that when n = k samples are drawn)."""
    correct = np.asarray(correct, dtype=bool)
    return correct.mean(axis=1), correct.any(axis=1).astype(np.float64)


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


def chunked_token_logprobs(
    hidden: paddle.Tensor,
    weight: paddle.Tensor,
    bias: paddle.Tensor | None,
    tokens: paddle.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
) -> tuple:
    """token_logprobs and token_entropy of the logits hidden @ weight^T + bias, without ever holding them
    for more than chunk_tokens tokens at a time: a micro-batch of 8 x 512 tokens over Qwen2.5's 151,936
    words is 2.5 GB per float32 copy of its logits, and autograd would keep several.

    hidden (B, T, H) final hidden states, weight (V, H) lm_head's weight (tied to the embedding or not),
    bias (V,) or None, tokens (B, T) int64 -> (log pi(token) (B, T) float32, differentiable with respect
    to hidden, weight and bias; entropy (B, T) float32 in nats, detached: it is only logged). The backward
    pass recomputes each chunk's logits instead of keeping them."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    return _ChunkedLogprobs.apply(hidden, weight, bias, tokens, temperature, chunk_tokens)


def _scaled_logits(rows: paddle.Tensor, weight: paddle.Tensor, bias: paddle.Tensor | None, temperature: float) -> paddle.Tensor:
    """rows (c, H) -> (c, V) float32 logits / temperature, the lm_head's matmul in the weight's dtype then
    cast, as completion_logits does."""
    logits = paddle.matmul(rows, weight, transpose_y=True)
    if bias is not None:
        logits = logits + bias
    return logits.astype("float32") / temperature


class _ChunkedLogprobs(paddle.autograd.PyLayer):
    """d log p(y) / d z = onehot(y) - softmax(z) for z = logits / t, so with g the incoming gradient of the
    log-probs, G = g (onehot(y) - softmax(z)) / t (c, V) is the gradient of a chunk's raw logits, and
    grad hidden = G @ W, grad W = sum over chunks of G^T @ h, grad bias = sum over chunks and rows of G."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk_tokens):
        rows = hidden.reshape([-1, hidden.shape[-1]])  # (N, H), N = B T
        targets = tokens.reshape([-1, 1])  # (N, 1)
        logprobs, entropies, normalisers = [], [], []
        for start in range(0, rows.shape[0], chunk_tokens):
            end = start + chunk_tokens
            scaled = _scaled_logits(rows[start:end], weight, bias, temperature)  # (c, V)
            normaliser = paddle.logsumexp(scaled, axis=-1, keepdim=True)  # (c, 1)
            chunk_logprobs = scaled.subtract_(normaliser)  # (c, V), in place: the logits are not needed again
            logprobs.append(paddle.take_along_axis(chunk_logprobs, targets[start:end], axis=-1))  # (c, 1)
            entropies.append(-(chunk_logprobs.exp() * chunk_logprobs).sum(axis=-1, keepdim=True))  # (c, 1)
            normalisers.append(normaliser)
        entropy = paddle.concat(entropies).reshape(tokens.shape)  # (B, T)
        ctx.mark_non_differentiable(entropy)
        # saved: only (N, 1) normalisers besides the inputs, so backward gets softmax without a logsumexp
        ctx.save_for_backward(hidden, weight, bias, targets, paddle.concat(normalisers))
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        return paddle.concat(logprobs).reshape(tokens.shape), entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, normalisers = ctx.saved_tensor()
        rows = hidden.reshape([-1, hidden.shape[-1]])  # (N, H)
        scale = grad_logprobs.reshape([-1, 1]).astype("float32") / ctx.temperature  # (N, 1) g / t
        grad_rows = []
        grad_weight = None if weight.stop_gradient else paddle.zeros(weight.shape, "float32")  # (V, H)
        grad_bias = None if bias is None or bias.stop_gradient else paddle.zeros(bias.shape, "float32")  # (V,)
        for start in range(0, rows.shape[0], ctx.chunk_tokens):
            end = start + ctx.chunk_tokens
            chunk = rows[start:end]  # (c, H)
            # G in place of the recomputed logits: softmax, times -g/t, plus g/t at the chosen token
            grad_logits = _scaled_logits(chunk, weight, bias, ctx.temperature).subtract_(normalisers[start:end]).exp_()
            grad_logits.multiply_(-scale[start:end])
            grad_logits.put_along_axis_(targets[start:end], scale[start:end], axis=-1, reduce="add")  # (c, V)
            grad_logits = grad_logits.astype(weight.dtype)
            if not hidden.stop_gradient:
                grad_rows.append(paddle.matmul(grad_logits, weight))  # (c, H)
            if grad_weight is not None:
                grad_weight.add_(paddle.matmul(grad_logits, chunk, transpose_x=True).astype("float32"))  # (V, H)
            if grad_bias is not None:
                grad_bias.add_(grad_logits.astype("float32").sum(axis=0))
        grads = [
            None if hidden.stop_gradient else paddle.concat(grad_rows).reshape(hidden.shape),
            None if grad_weight is None else grad_weight.astype(weight.dtype),
        ]
        if bias is not None:  # one gradient per tensor input, None exactly where it has stop_gradient (paddle checks)
            grads.append(None if grad_bias is None else grad_bias.astype(bias.dtype))
        return (*grads, None)  # tokens


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
