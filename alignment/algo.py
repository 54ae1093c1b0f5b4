"""GRPO's math as pure functions of arrays and tensors, each returning what the trainer logs.

Shapes: B sequences (prompt-major groups of G), T completion tokens, V vocabulary.
"""

import math

import numpy as np
import paddle


def group_advantages(rewards: np.ndarray, group_size: int, scale: str = "group", batch_std: float | None = None, eps: float = 1e-6) -> tuple:
    """rewards (B,), NaN where a reward could not be computed -> (advantages (B,) float32, metrics).

    A_i = r_i - mean(r) over the valid members of i's group, divided by
    - scale "group": the group's std (GRPO), the sample standard deviation (ddof=1, as torch.std in TRL
      and verl);
    - scale "batch": the std of every valid reward in the batch (TRL's scale_rewards="batch", more robust
      when a group's rewards barely differ); the trainer passes the global one as batch_std, else it is
      computed from `rewards`, ddof=1;
    - scale "none": nothing (Dr.GRPO: dividing by the group's std over-weights the easy and hard groups).
    eps keeps the division finite when the std is tiny. Members whose reward is NaN get advantage 0 (the
    trainer also leaves them out of the loss); a group with fewer than two valid members, or whose rewards
    are all equal, carries no signal and gets 0 throughout.
    """
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards of shape {rewards.shape} are not whole groups of {group_size}")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be group, batch or none, not {scale!r}")
    groups = rewards.astype(np.float64).reshape(-1, group_size)  # (P, G)
    valid = np.isfinite(groups)
    counts = valid.sum(axis=1, keepdims=True)  # (P, 1)
    filled = np.where(valid, groups, 0.0)
    mean = filled.sum(axis=1, keepdims=True) / np.maximum(counts, 1)
    squares = np.where(valid, (groups - mean) ** 2, 0.0).sum(axis=1, keepdims=True)
    if scale == "group":
        denominator = np.sqrt(squares / np.maximum(counts - 1, 1)) + eps
    elif scale == "batch":
        if batch_std is None:
            batch_std = float(np.std(groups[valid], ddof=1)) if valid.sum() > 1 else 0.0
        denominator = np.full_like(mean, batch_std + eps)
    else:
        denominator = np.ones_like(mean)
    # equality of the raw rewards, not squares > 0: the mean of identical floats can be off by an ulp
    spread = np.where(valid, groups, -np.inf).max(axis=1, keepdims=True) - np.where(valid, groups, np.inf).min(axis=1, keepdims=True)
    has_signal = (counts >= 2) & (spread > 0)
    advantages = np.divide(filled - mean, denominator, out=np.zeros_like(filled), where=valid & has_signal)
    metrics = {
        "advantage_abs_mean": float(np.abs(advantages[valid]).mean()) if valid.any() else 0.0,
        "groups_without_signal": float(1.0 - has_signal.mean()),
    }
    return advantages.reshape(-1).astype(np.float32), metrics


def groups_with_signal(rewards: np.ndarray, group_size: int, min_std: float) -> np.ndarray:
    """rewards (B,) NaN where failed -> (P,) bool: the group has at least two valid rewards whose sample std
    (ddof=1) is at least min_std and above zero. DAPO's dynamic sampling keeps only these: a group whose
    rewards are (nearly) equal has (nearly) zero advantages and only dilutes the batch; a threshold rather
    than exact equality, because scores such as the cosine or a reward model's differ by rounding."""
    groups = rewards.astype(np.float64).reshape(-1, group_size)  # (P, G)
    valid = np.isfinite(groups)
    counts = valid.sum(axis=1)
    mean = np.where(valid, groups, 0.0).sum(axis=1) / np.maximum(counts, 1)
    squares = np.where(valid, (groups - mean[:, None]) ** 2, 0.0).sum(axis=1)
    std = np.sqrt(squares / np.maximum(counts - 1, 1))
    return (counts >= 2) & (std >= min_std) & (std > 0)


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
    matmul=paddle.matmul,
) -> tuple:
    """token_logprobs and token_entropy of the logits hidden @ weight^T + bias, without ever holding them
    for more than chunk_tokens tokens at a time: a micro-batch of 8 x 512 tokens over Qwen2.5's 151,936
    words is 2.5 GB per float32 copy of its logits, and autograd would keep several.

    hidden (B, T, H) final hidden states, weight (V, H) lm_head's weight (tied to the embedding or not),
    bias (V,) or None, tokens (B, T) int64 -> (log pi(token) (B, T) float32, differentiable with respect
    to hidden, weight and bias; entropy (B, T) float32 in nats, detached: it is only logged). The backward
    pass recomputes each chunk's logits instead of keeping them. matmul(x, y, transpose_x, transpose_y) computes
    the three products (paddle.matmul, or cpu_bf16's bf16 one)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    return _ChunkedLogprobs.apply(hidden, weight, bias, tokens, temperature, chunk_tokens, matmul)


def _scaled_logits(rows: paddle.Tensor, weight: paddle.Tensor, bias: paddle.Tensor | None, temperature: float, matmul) -> paddle.Tensor:
    """rows (c, H) -> (c, V) float32 logits / temperature, the lm_head's matmul in the weight's dtype then
    cast, as completion_logits does."""
    logits = matmul(rows, weight, False, True)
    if bias is not None:
        logits = logits + bias
    return logits.astype("float32") / temperature


class _ChunkedLogprobs(paddle.autograd.PyLayer):
    """d log p(y) / d z = onehot(y) - softmax(z) for z = logits / t, so with g the incoming gradient of the
    log-probs, G = g (onehot(y) - softmax(z)) / t (c, V) is the gradient of a chunk's raw logits, and
    grad hidden = G @ W, grad W = sum over chunks of G^T @ h, grad bias = sum over chunks and rows of G."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk_tokens, matmul):
        rows = hidden.reshape([-1, hidden.shape[-1]])  # (N, H), N = B T
        targets = tokens.reshape([-1, 1])  # (N, 1)
        logprobs, entropies, normalisers = [], [], []
        for start in range(0, rows.shape[0], chunk_tokens):
            end = start + chunk_tokens
            scaled = _scaled_logits(rows[start:end], weight, bias, temperature, matmul)  # (c, V)
            normaliser = paddle.logsumexp(scaled, axis=-1, keepdim=True)  # (c, 1)
            chunk_logprobs = scaled.subtract_(normaliser)  # (c, V), in place: the logits are not needed again
            logprobs.append(paddle.take_along_axis(chunk_logprobs, targets[start:end], axis=-1))  # (c, 1)
            entropies.append(-(chunk_logprobs.exp() * chunk_logprobs).sum(axis=-1, keepdim=True))  # (c, 1)
            normalisers.append(normaliser)
        entropy = paddle.concat(entropies).reshape(tokens.shape)  # (B, T)
        ctx.mark_non_differentiable(entropy)
        # saved: only (N, 1) normalisers besides the inputs, so backward gets softmax without a logsumexp
        ctx.save_for_backward(hidden, weight, bias, targets, paddle.concat(normalisers))
        ctx.temperature, ctx.chunk_tokens, ctx.matmul = temperature, chunk_tokens, matmul
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
            grad_logits = _scaled_logits(chunk, weight, bias, ctx.temperature, ctx.matmul).subtract_(normalisers[start:end]).exp_()
            grad_logits.multiply_(-scale[start:end])
            grad_logits.put_along_axis_(targets[start:end], scale[start:end], axis=-1, reduce="add")  # (c, V)
            grad_logits = grad_logits.astype(weight.dtype)
            if not hidden.stop_gradient:
                grad_rows.append(ctx.matmul(grad_logits, weight, False, False))  # (c, H)
            if grad_weight is not None:
                grad_weight.add_(ctx.matmul(grad_logits, chunk, True, False).astype("float32"))  # (V, H)
            if grad_bias is not None:
                grad_bias.add_(grad_logits.astype("float32").sum(axis=0))
        grads = [
            None if hidden.stop_gradient else paddle.concat(grad_rows).reshape(hidden.shape),
            None if grad_weight is None else grad_weight.astype(weight.dtype),
        ]
        if bias is not None:  # one gradient per tensor input, None exactly where it has stop_gradient (paddle checks)
            grads.append(None if grad_bias is None else grad_bias.astype(bias.dtype))
        return (*grads, None)  # tokens


def kl_estimate(logprobs: paddle.Tensor, ref_logprobs: paddle.Tensor, estimator: str = "k3") -> paddle.Tensor:
    """Schulman's estimators of KL(pi || pi_ref) per token from the sampled token's d = log pi_ref - log pi:
    k1 = -d (unbiased, high variance, can be negative), k2 = d^2 / 2 (biased, low variance; its gradient is
    that of the reverse KL), k3 = exp(d) - d - 1 (unbiased, non-negative, low variance: GRPO's).
    (B, T), (B, T) -> (B, T)."""
    delta = ref_logprobs - logprobs
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta.square()
    if estimator == "k3":
        return paddle.exp(delta) - delta - 1.0
    raise ValueError(f"kl estimator must be k1, k2 or k3, not {estimator!r}")


def clipped_surrogate(
    logprobs: paddle.Tensor,
    old_logprobs: paddle.Tensor,
    advantages: paddle.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple:
    """PPO's clipped objective per token, as a loss: max(-A r, -A clip(r, 1 - low, 1 + high)), r = pi / pi_old,
    with clip_high > clip_low being DAPO's clip-higher. With dual_clip = c > 1 (Ye et al. 2020, verl's
    clip_ratio_c), a token with A < 0 loses at most -A c: a huge ratio on a bad token cannot dominate.

    logprobs, old_logprobs (B, T); advantages (B,) -> (loss (B, T), flags: bool (B, T) tensors "clipped"
    (the clipped branch is active, so the token's gradient is zero), "clipped_low" (A < 0 and r < 1 - low),
    "clipped_high" (A > 0 and r > 1 + high), "dual_clipped" (A < 0 and the -A c bound is active))."""
    ratio = paddle.exp(logprobs - old_logprobs)
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


def truncated_importance_weights(old_logprobs: paddle.Tensor, rollout_logprobs: paddle.Tensor, cap: float) -> tuple:
    """The rollout engine samples from pi_rollout, numerically not quite the trainer's pi_old (other kernels,
    other summation order; with vLLM in other trainers, often more than that). Truncated importance sampling
    (Yao et al. 2025, TRL's vllm_importance_sampling_correction, verl's TIS) weights each token's policy
    loss by w = min(pi_old / pi_rollout, cap), detached. (B, T), (B, T) -> (w (B, T), capped (B, T) bool)."""
    ratio = paddle.exp(old_logprobs - rollout_logprobs).detach()
    return paddle.clip(ratio, max=cap), ratio > cap


def aggregation_counts(mask: np.ndarray) -> np.ndarray:
    """mask (B, T) of loss tokens -> [tokens, sequences with at least one loss token, sequences] float64, the
    counts the loss types divide by; the trainer sums them over processes before calling loss_token_weights."""
    return np.array([mask.sum(), (mask.sum(axis=1) > 0).sum(), mask.shape[0]], dtype=np.float64)


def loss_token_weights(mask: np.ndarray, loss_type: str, max_dec_len: int, counts: np.ndarray) -> np.ndarray:
    """mask (B, T), the global aggregation_counts -> (B, T) float32 weights w with loss = sum w * token loss:

    - dapo: 1 / (loss tokens in the global batch): every token counts the same, so long completions are not
      down-weighted (DAPO's token-level mean; the default);
    - grpo: 1 / (its sequence's loss tokens x sequences with loss tokens): the mean over each sequence's
      tokens, then over sequences (the GRPO paper's; a long wrong answer is penalised less per token);
    - dr_grpo: 1 / (sequences x max_dec_len), a constant (Dr.GRPO: no length normalisation at all).
    The weights of the global batch are fixed before any micro-batch runs, so the gradient does not depend
    on how the batch is cut into micro-batches and processes."""
    tokens, live_sequences, sequences = counts
    mask = mask.astype(np.float64)
    if loss_type == "dapo":
        weights = mask / max(tokens, 1.0)
    elif loss_type == "grpo":
        weights = mask / np.maximum(mask.sum(axis=1, keepdims=True), 1.0) / max(live_sequences, 1.0)
    elif loss_type == "dr_grpo":
        weights = mask / (max(sequences, 1.0) * max_dec_len)
    else:
        raise ValueError(f"loss_type must be dapo, grpo or dr_grpo, not {loss_type!r}")
    return weights.astype(np.float32)


def policy_loss(
    logprobs: paddle.Tensor,
    old_logprobs: paddle.Tensor,
    advantages: paddle.Tensor,
    weights: paddle.Tensor,
    mask: paddle.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    importance_weights: paddle.Tensor | None = None,
    kl_coeff: float = 0.0,
    ref_logprobs: paddle.Tensor | None = None,
    kl_estimator: str = "k3",
) -> tuple:
    """Loss of one micro-batch: sum over its tokens of weights x (clipped surrogate x importance weight +
    kl_coeff x KL). logprobs, old_logprobs, weights (from loss_token_weights), mask (1 on loss tokens),
    importance_weights, ref_logprobs: (B, T); advantages (B,). Summing these losses over micro-batches and
    processes gives the global batch's loss however the batch is cut.

    Returns (loss, sums): token sums over the mask of the clip flags, the KL and the importance weight,
    which the caller divides by the global token count once all micro-batches are in."""
    surrogate, flags = clipped_surrogate(logprobs, old_logprobs, advantages, clip_low, clip_high, dual_clip)
    sums = {name: float((flag.astype("float32") * mask).sum()) for name, flag in flags.items()}
    per_token = surrogate
    if importance_weights is not None:
        per_token = per_token * importance_weights
    if kl_coeff > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coeff > 0 needs ref_logprobs")
        kl = kl_estimate(logprobs, ref_logprobs, kl_estimator)
        per_token = per_token + kl_coeff * kl
        sums["kl"] = float((kl * mask).sum())
    return (per_token * weights).sum(), sums


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
