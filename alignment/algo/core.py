"""GRPO's math as pure functions of arrays and tensors, each returning what the trainer logs.

Shapes: B sequences (prompt-major groups of G), T completion tokens, V vocabulary.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

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
    return advantages.reshape(-1).astype(np.float32), _advantage_metrics(advantages, valid, has_signal)


def rloo_advantages(rewards: np.ndarray, group_size: int) -> tuple:
    """RLOO (Ahmadian et al. 2024; verl's and ms-swift's rloo): A_i = r_i - the mean of the other valid members
    of i's group = n / (n - 1) (r_i - mean), n the group's valid members; no division by a std. rewards (B,),
    NaN where failed -> (advantages (B,) float32, metrics). As in group_advantages, a failed member gets 0 and
    a group with fewer than two valid members gets 0 throughout (verl would pass a lone reward through)."""
    groups = rewards.astype(np.float64).reshape(-1, group_size)  # (P, G)
    valid = np.isfinite(groups)
    counts = valid.sum(axis=1, keepdims=True)  # (P, 1)
    filled = np.where(valid, groups, 0.0)
    others_mean = (filled.sum(axis=1, keepdims=True) - filled) / np.maximum(counts - 1, 1)
    advantages = np.where(valid & (counts >= 2), filled - others_mean, 0.0)
    return advantages.reshape(-1).astype(np.float32), _advantage_metrics(advantages, valid, counts >= 2)


def baseline_subtracted(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """rewards (B,) NaN where failed -> r_i - mean of i's group's valid rewards (B,) float64, NaN kept:
    REINFORCE++-baseline's first step (Hu et al. 2025), before whitening over the batch."""
    groups = rewards.astype(np.float64).reshape(-1, group_size)
    valid = np.isfinite(groups)
    mean = np.where(valid, groups, 0.0).sum(axis=1, keepdims=True) / np.maximum(valid.sum(axis=1, keepdims=True), 1)
    return (groups - mean).reshape(-1)


def whitening_sums(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """values (B,) NaN where failed, weights (B,) >= 0 -> [sum w, sum w v, sum w v^2] float64 over the finite
    values: the moments sample_std() and whiten() need, summed over processes by the caller first."""
    finite = np.isfinite(values)
    v, w = values[finite].astype(np.float64), np.asarray(weights, dtype=np.float64)[finite]
    return np.array([w.sum(), (w * v).sum(), (w * v * v).sum()])


def sample_std(sums: np.ndarray) -> float:
    """[count, sum, sum of squares] from whitening_sums (weighted counts allowed) -> the unbiased (Bessel) std,
    0 for a count of 1 or less."""
    count, total, squares = sums
    return math.sqrt(max(squares - total**2 / count, 0.0) / (count - 1)) if count > 1 else 0.0


def whiten(values: np.ndarray, sums: np.ndarray, eps: float = 1e-6) -> tuple:
    """(v - mean) / (std + eps) with the weighted mean and the unbiased std of the global sums from
    whitening_sums: weights = each sequence's loss tokens gives verl's masked_whiten over the batch's tokens
    (REINFORCE++, where every token of a sequence carries its reward), weights = 1 a per-sequence one (GDPO's
    batch normalisation in TRL). NaN values get 0. -> (advantages (B,) float32, metrics)."""
    count, total, _ = sums
    mean = total / count if count > 0 else 0.0
    finite = np.isfinite(values)
    advantages = np.where(finite, (np.where(finite, values, 0.0) - mean) / (sample_std(sums) + eps), 0.0)
    return advantages.astype(np.float32), {"advantage_abs_mean": float(np.abs(advantages[finite]).mean()) if finite.any() else 0.0}


def normalized_per_function(columns: list, weights: list, group_size: int, eps: float = 1e-6) -> np.ndarray:
    """GDPO (arXiv 2601.05242; TRL's multi_objective_aggregation = normalize_then_sum): each reward function's
    values normalised within each group by its own mean and std (sample std, ddof=1) before the weighted sum,
    so one function's scale cannot drown out another's. columns: K arrays (B,), NaN where failed; a row NaN
    in any column is NaN in the result (it is left out of the loss), and the group statistics use the other
    rows only. -> (B,) float64, to be whitened over the batch (whiten with weights 1)."""
    table = np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1)  # (B, K)
    failed = ~np.isfinite(table).all(axis=1)  # (B,)
    table[failed] = np.nan
    total = np.zeros(len(table))
    for column, weight in zip(table.T, weights):
        normalised, _ = group_advantages(column, group_size, "group", eps=eps)
        total += weight * normalised.astype(np.float64)
    total[failed] = np.nan
    return total


def _advantage_metrics(advantages: np.ndarray, valid: np.ndarray, has_signal: np.ndarray) -> dict:
    return {
        "advantage_abs_mean": float(np.abs(advantages[valid]).mean()) if valid.any() else 0.0,
        "groups_without_signal": float(1.0 - has_signal.mean()),
    }


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


def paddle_row_stats(logits: paddle.Tensor, targets: paddle.Tensor, temperature: float) -> tuple:
    """logits (c, V) float32, targets (c, 1) -> (log-probs, entropies, normalisers logsumexp(logits / t)), each
    (c, 1), with paddle's kernels (the compiled grpo_logprob_rows computes the same in two passes a row)."""
    scaled = logits / temperature
    normaliser = paddle.logsumexp(scaled, axis=-1, keepdim=True)  # (c, 1)
    logprobs = scaled.subtract_(normaliser)  # (c, V), in place: the logits are not needed again
    entropy = -(logprobs.exp() * logprobs).sum(axis=-1, keepdim=True)
    return paddle.take_along_axis(logprobs, targets, axis=-1), entropy, normaliser


def paddle_row_grad(logits, targets, normaliser, entropy, scale, entropy_scale, temperature: float) -> paddle.Tensor:
    """-> G (c, V), the gradient of raw logits (c, V) from the log-probs' incoming gradient scale = g / t and the
    entropies' entropy_scale = e / t ((c, 1) each; entropy_scale None where the entropy is only logged):
    G = scale onehot(target) - p (scale + entropy_scale (log p + H)), with paddle's kernels (the compiled
    grpo_logprob_rows_grad computes it in one pass a row)."""
    logp = (logits / temperature).subtract_(normaliser)  # (c, V)
    if entropy_scale is None:
        grad = logp.exp_().multiply_(-scale)
    else:
        grad = logp.exp()
        grad.multiply_(logp.add_(entropy).multiply_(-entropy_scale).subtract_(scale))
    return grad.put_along_axis_(targets, scale, axis=-1, reduce="add")


@dataclass(frozen=True)
class HeadKernels:
    """What chunked_token_logprobs computes with: matmul(x, y, transpose_x, transpose_y) for the head's three
    products (paddle.matmul, or cpu_bf16's bf16 one), and row_stats / row_grad for what each chunk of logits
    gives (paddle's kernels, or the compiled ones where the training operators run: fused_train.head_kernels)."""

    matmul: Callable = paddle.matmul
    row_stats: Callable = paddle_row_stats
    row_grad: Callable = paddle_row_grad


def chunked_token_logprobs(
    hidden: paddle.Tensor,
    weight: paddle.Tensor,
    bias: paddle.Tensor | None,
    tokens: paddle.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    kernels: HeadKernels = HeadKernels(),
    entropy_grad: bool = False,
) -> tuple:
    """token_logprobs and token_entropy of the logits hidden @ weight^T + bias, without ever holding them
    for more than chunk_tokens tokens at a time: a micro-batch of 8 x 512 tokens over Qwen2.5's 151,936
    words is 2.5 GB per float32 copy of its logits, and autograd would keep several.

    hidden (B, T, H) final hidden states, weight (V, H) lm_head's weight (tied to the embedding or not),
    bias (V,) or None, tokens (B, T) int64 -> (log pi(token) (B, T) float32, differentiable with respect
    to hidden, weight and bias; entropy (B, T) float32 in nats, differentiable too with entropy_grad (an entropy
    bonus), else detached: it is only logged). The backward pass recomputes each chunk's logits instead of
    keeping them."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    return _ChunkedLogprobs.apply(hidden, weight, bias, tokens, temperature, chunk_tokens, kernels, entropy_grad)


def _logits(rows: paddle.Tensor, weight: paddle.Tensor, bias: paddle.Tensor | None, matmul) -> paddle.Tensor:
    """rows (c, H) -> (c, V) float32 raw logits, the lm_head's matmul in the weight's dtype then cast, as
    completion_logits does."""
    logits = matmul(rows, weight, False, True)
    if bias is not None:
        logits = logits + bias
    return logits.astype("float32")


class _ChunkedLogprobs(paddle.autograd.PyLayer):
    """d log p(y) / d z = onehot(y) - softmax(z) for z = logits / t, so with g the incoming gradient of the
    log-probs, G = g (onehot(y) - softmax(z)) / t (c, V) is the gradient of a chunk's raw logits, and
    grad hidden = G @ W, grad W = sum over chunks of G^T @ h, grad bias = sum over chunks and rows of G.
    The entropy H = -sum p log p has d H / d z = -p (log p + H), so with its incoming gradient e,
    G = (g onehot(y) - p (g + e (log p + H))) / t."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk_tokens, kernels, entropy_grad):
        rows = hidden.reshape([-1, hidden.shape[-1]])  # (N, H), N = B T
        targets = tokens.reshape([-1, 1])  # (N, 1)
        logprobs, entropies, normalisers = [], [], []
        for start in range(0, rows.shape[0], chunk_tokens):
            end = start + chunk_tokens
            logits = _logits(rows[start:end], weight, bias, kernels.matmul)  # (c, V)
            chunk_logprobs, chunk_entropy, normaliser = kernels.row_stats(logits, targets[start:end], temperature)  # (c, 1) each
            logprobs.append(chunk_logprobs)
            entropies.append(chunk_entropy)
            normalisers.append(normaliser)
        entropy = paddle.concat(entropies)  # (N, 1)
        entropy_out = entropy.reshape(tokens.shape)  # (B, T)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy_out)
        # saved: only (N, 1) normalisers and entropies besides the inputs, so backward gets softmax without a logsumexp
        ctx.save_for_backward(hidden, weight, bias, targets, paddle.concat(normalisers), entropy)
        ctx.temperature, ctx.chunk_tokens, ctx.kernels, ctx.entropy_grad = temperature, chunk_tokens, kernels, entropy_grad
        return paddle.concat(logprobs).reshape(tokens.shape), entropy_out

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, normalisers, entropy = ctx.saved_tensor()
        kernels, temperature = ctx.kernels, ctx.temperature
        rows = hidden.reshape([-1, hidden.shape[-1]])  # (N, H)
        scale = grad_logprobs.reshape([-1, 1]).astype("float32") / temperature  # (N, 1) g / t
        entropy_scale = None  # (N, 1) e / t
        if ctx.entropy_grad and grad_entropy is not None:
            entropy_scale = grad_entropy.reshape([-1, 1]).astype("float32") / temperature
        grad_rows = []
        grad_weight = None if weight.stop_gradient else paddle.zeros(weight.shape, "float32")  # (V, H)
        grad_bias = None if bias is None or bias.stop_gradient else paddle.zeros(bias.shape, "float32")  # (V,)
        for start in range(0, rows.shape[0], ctx.chunk_tokens):
            end = start + ctx.chunk_tokens
            chunk = rows[start:end]  # (c, H)
            grad_logits = kernels.row_grad(  # (c, V) G in place of the recomputed logits
                _logits(chunk, weight, bias, kernels.matmul),
                targets[start:end],
                normalisers[start:end],
                entropy[start:end],
                scale[start:end],
                None if entropy_scale is None else entropy_scale[start:end],
                temperature,
            ).astype(weight.dtype)
            if not hidden.stop_gradient:
                grad_rows.append(kernels.matmul(grad_logits, weight, False, False))  # (c, H)
            if grad_weight is not None:
                grad_weight.add_(kernels.matmul(grad_logits, chunk, True, False).astype("float32"))  # (V, H)
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


def importance_ratio(logprobs: paddle.Tensor, old_logprobs: paddle.Tensor, mask: paddle.Tensor, level: str = "token") -> paddle.Tensor:
    """pi / pi_old with its gradient. level "token": per token (B, T) (PPO, GRPO). level "sequence": GSPO's
    (Zheng et al. 2025) s_i = exp(mean over i's loss tokens of log pi - log pi_old) (B, 1), the geometric
    mean of the token ratios, so one sequence is clipped as a whole (TRL's importance_sampling_level)."""
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return paddle.exp(log_ratio)
    if level == "sequence":
        return paddle.exp((log_ratio * mask).sum(axis=-1, keepdim=True) / mask.sum(axis=-1, keepdim=True).clip(min=1.0))
    raise ValueError(f"importance sampling level must be token or sequence, not {level!r}")


def clipped_surrogate(ratio: paddle.Tensor, advantages: paddle.Tensor, clip_low: float, clip_high: float, dual_clip: float | None = None) -> tuple:
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
    return loss, {"clipped": paddle.expand(low | high, shape), "clipped_low": paddle.expand(low, shape), "clipped_high": paddle.expand(high, shape)}


IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_correction(
    old_logprobs: paddle.Tensor, rollout_logprobs: paddle.Tensor, mask: paddle.Tensor, mode: str = "token_truncate", cap: float = 2.0, floor: float | None = None
) -> tuple:
    """The rollout engine samples from pi_rollout, numerically not quite the trainer's pi_old (other kernels,
    other summation order, bf16 weights; with vLLM in other trainers, often more than that). Each token's policy
    loss is weighted by the ratio pi_old / pi_rollout (Yao et al. 2025), detached, per token or per sequence
    (the product of its loss tokens' ratios), and either truncated into [floor, cap] or set to 0 outside it
    ("mask": IcePop's rejection): TRL's vllm_importance_sampling_mode values.

    old_logprobs, rollout_logprobs, mask (B, T) -> (weights (B, T), outside (B, T) bool: the ratio of the token
    (or of its sequence) left [floor, cap] and was truncated or masked)."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"importance sampling mode must be one of {', '.join(IMPORTANCE_SAMPLING_MODES)}, not {mode!r}")
    log_ratio = ((old_logprobs - rollout_logprobs) * mask).detach()
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(axis=-1, keepdim=True)  # (B, 1)
    ratio = paddle.exp(log_ratio)
    outside = ratio > cap
    if floor is not None:
        outside = outside | (ratio < floor)
    if mode.endswith("truncate"):
        weights = paddle.clip(ratio, min=floor, max=cap)
    else:
        weights = paddle.where(outside, paddle.zeros_like(ratio), ratio)
    return paddle.expand(weights, mask.shape), paddle.expand(outside, mask.shape)


def entropy_threshold(entropies: np.ndarray, top_quantile: float) -> float:
    """entropies (N,) of every loss token of the step (all processes) -> the entropy at quantile 1 - top_quantile
    (linear interpolation, as torch.quantile in TRL): tokens at or above it are the top_quantile fraction with
    the highest entropy ("Beyond the 80/20 rule", Wang et al. 2025; top_quantile 0.2 there). -inf without tokens."""
    return float(np.quantile(entropies, 1.0 - top_quantile)) if len(entropies) else -math.inf


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


@dataclass(frozen=True)
class LossSettings:
    """How each token's loss is made: the config's algorithm keys, read once."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    level: str = "token"  # importance_sampling_level: token, or sequence (GSPO)
    surrogate: str = "clip"  # clip (PPO), or cispo
    kl_coeff: float = 0.0
    kl_estimator: str = "k3"
    kl_bias_correction: bool = False  # TRL's use_bias_correction_kl: the KL term times the ratio pi / pi_old


def policy_loss(
    logprobs: paddle.Tensor,
    old_logprobs: paddle.Tensor,
    advantages: paddle.Tensor,
    weights: paddle.Tensor,
    mask: paddle.Tensor,
    settings: LossSettings,
    importance_weights: paddle.Tensor | None = None,
    ref_logprobs: paddle.Tensor | None = None,
    selected: paddle.Tensor | None = None,
) -> tuple:
    """Loss of one micro-batch: sum over its tokens of weights x (surrogate x selected x importance weight
    + kl_coeff x KL [x ratio]). logprobs, old_logprobs, weights (from loss_token_weights), mask (1 on loss
    tokens), importance_weights, ref_logprobs, selected (1 on the tokens the entropy selection keeps): (B, T);
    advantages (B,). As in TRL, the selection and the importance weights touch the policy term only, never the
    KL. Summing these losses over micro-batches and processes gives the global batch's loss however the batch
    is cut.

    Returns (loss, sums): token sums over the mask of the clip flags, the KL, the selected tokens, which the
    caller divides by the global token count once all micro-batches are in."""
    ratio = importance_ratio(logprobs, old_logprobs, mask, settings.level)  # (B, T) or (B, 1)
    if settings.surrogate == "cispo":
        per_token, flags = cispo_surrogate(ratio, logprobs, advantages, settings.clip_low, settings.clip_high)
    elif settings.surrogate == "clip":
        per_token, flags = clipped_surrogate(ratio, advantages, settings.clip_low, settings.clip_high, settings.dual_clip)
    else:
        raise ValueError(f"surrogate must be clip or cispo, not {settings.surrogate!r}")
    sums = {name: float((flag.astype("float32") * mask).sum()) for name, flag in flags.items()}
    if selected is not None:
        per_token = per_token * selected
        sums["selected"] = float((selected * mask).sum())
    if importance_weights is not None:
        per_token = per_token * importance_weights
    if settings.kl_coeff > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coeff > 0 needs ref_logprobs")
        kl = kl_estimate(logprobs, ref_logprobs, settings.kl_estimator)
        sums["kl"] = float((kl * mask).sum())
        if settings.kl_bias_correction:
            kl = kl * ratio
        per_token = per_token + settings.kl_coeff * kl
    return (per_token * weights).sum(), sums


def entropy_bonus(entropy: paddle.Tensor, effective: np.ndarray, tokens: float, coeff: float) -> paddle.Tensor:
    """-coeff x the mean entropy over the tokens the policy term trains on, as a loss to add: entropy (B, T) with
    its gradient, effective (B, T) the loss mask (times the entropy selection), tokens their count over the
    global mini-batch, so the micro-batches' terms sum to the mini-batch's mean. TRL's entropy_coef: the mean
    whatever loss_type normalises the policy term by."""
    return -coeff * (entropy * paddle.to_tensor(effective.astype(np.float32))).sum() / max(tokens, 1.0)


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
