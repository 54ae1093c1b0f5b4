"""Log-probabilities and entropies of the sampled tokens under softmax(logits / temperature): from full logits,
or chunked from the final hidden states and lm_head (a PyLayer that never holds more than a chunk of logits).

Shapes: B sequences, T completion tokens, V vocabulary, H hidden size.
"""

from collections.abc import Callable
from dataclasses import dataclass

import paddle


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
    # the logits' gradient G (c, V) float32 -> what backward's two products with it (G W, G^T h) read: None, G in the
    # weight's dtype; the bf16 products' conversion (cpu_bf16), made once for both instead of once in each
    grad_operand: Callable | None = None


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
        scale = grad_logprobs.reshape([-1, 1]).astype("float32") / temperature  # (N, 1) g / t
        entropy_scale = None  # (N, 1) e / t
        if ctx.entropy_grad and grad_entropy is not None:
            entropy_scale = grad_entropy.reshape([-1, 1]).astype("float32") / temperature

        def grad_of(chunk, rows):  # G (c, V) in place of the recomputed logits
            return kernels.row_grad(
                _logits(chunk, weight, bias, kernels.matmul),
                targets[rows],
                normalisers[rows],
                entropy[rows],
                scale[rows],
                None if entropy_scale is None else entropy_scale[rows],
                temperature,
            )

        return (*_head_gradients(hidden, weight, bias, kernels, ctx.chunk_tokens, grad_of), None)  # tokens


def _head_gradients(hidden, weight, bias, kernels: HeadKernels, chunk_tokens: int, grad_of: Callable) -> list:
    """The backward pass of a chunked lm_head: grad_of(chunk (c, H), its rows' slice) gives G (c, V), the gradient of
    the chunk's raw logits, and grad hidden = G @ W, grad W = sum over chunks of G^T @ h, grad bias = sum over chunks
    and rows of G (both sums in float32) -> the gradients of hidden, weight and (where there is one) bias, None
    exactly where that input has stop_gradient (paddle checks). The products are kernels.matmul's, on
    kernels.grad_operand(G)."""
    rows = hidden.reshape([-1, hidden.shape[-1]])  # (N, H)
    grad_rows = []
    grad_weight = None if weight.stop_gradient else paddle.zeros(weight.shape, "float32")  # (V, H)
    grad_bias = None if bias is None or bias.stop_gradient else paddle.zeros(bias.shape, "float32")  # (V,)
    for start in range(0, rows.shape[0], chunk_tokens):
        chunk_rows = slice(start, start + chunk_tokens)
        chunk = rows[chunk_rows]  # (c, H)
        grad_logits = grad_of(chunk, chunk_rows)  # (c, V) float32
        operand = grad_logits.astype(weight.dtype) if kernels.grad_operand is None else kernels.grad_operand(grad_logits)
        if not hidden.stop_gradient:
            grad_rows.append(kernels.matmul(operand, weight, False, False))  # (c, H)
        if grad_weight is not None:
            grad_weight.add_(kernels.matmul(operand, chunk, True, False).astype("float32"))  # (V, H)
        if grad_bias is not None:
            grad_bias.add_(grad_logits.astype("float32").sum(axis=0))
    grads = [
        None if hidden.stop_gradient else paddle.concat(grad_rows).reshape(hidden.shape),
        None if grad_weight is None else grad_weight.astype(weight.dtype),
    ]
    if bias is not None:  # one gradient per tensor input
        grads.append(None if grad_bias is None else grad_bias.astype(bias.dtype))
    return grads


@dataclass(frozen=True)
class ReferenceHead:
    """The reference model's side of chunked_full_kl: its final hidden states (B, T, H) and lm_head, without gradient."""

    hidden: paddle.Tensor
    weight: paddle.Tensor
    bias: paddle.Tensor | None
    matmul: Callable = paddle.matmul


def chunked_full_kl(
    hidden: paddle.Tensor,
    weight: paddle.Tensor,
    bias: paddle.Tensor | None,
    reference: ReferenceHead,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    matmul: Callable = paddle.matmul,
) -> paddle.Tensor:
    """The exact KL(pi || pi_ref) = sum over the vocabulary of p (log p - log q) at each completion position, p and q
    softmax(logits / temperature) of the policy (hidden, weight, bias, as chunked_token_logprobs takes them) and of the
    reference -> (B, T) float32, differentiable with respect to the policy's hidden, weight and bias. No sampled-token
    estimator's variance, at the price of the reference's hidden states in every micro-batch and two chunks of logits
    at a time (kl_estimator full)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
    ref_bias = None if reference.bias is None else reference.bias.detach()
    return _ChunkedFullKL.apply(
        hidden, weight, bias, reference.hidden.detach(), reference.weight.detach(), ref_bias, temperature, chunk_tokens, matmul,
        reference.matmul,
    )


def _log_softmax_rows(rows, weight, bias, matmul, temperature: float) -> paddle.Tensor:  # (c, H) -> (c, V)
    return log_softmax(_logits(rows, weight, bias, matmul), temperature)


class _ChunkedFullKL(paddle.autograd.PyLayer):
    """KL = sum_v p_v (log p_v - log q_v); with x = z / t, d KL / d x_v = p_v (log p_v - log q_v - KL), so the incoming
    gradient g gives G = g p (log p - log q - KL) / t (c, V) for a chunk's raw logits, recomputed in backward, and
    grad hidden = G @ W, grad W = sum of G^T @ h, grad bias = sum of G, as in _ChunkedLogprobs."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, ref_hidden, ref_weight, ref_bias, temperature, chunk_tokens, matmul, ref_matmul):
        rows, ref_rows = hidden.reshape([-1, hidden.shape[-1]]), ref_hidden.reshape([-1, ref_hidden.shape[-1]])  # (N, H)
        parts = []
        for start in range(0, rows.shape[0], chunk_tokens):
            end = start + chunk_tokens
            logp = _log_softmax_rows(rows[start:end], weight, bias, matmul, temperature)  # (c, V)
            logq = _log_softmax_rows(ref_rows[start:end], ref_weight, ref_bias, ref_matmul, temperature)
            parts.append((logp.exp() * (logp - logq)).sum(axis=-1, keepdim=True))  # (c, 1)
        kl = paddle.concat(parts)  # (N, 1)
        ctx.save_for_backward(hidden, weight, bias, ref_hidden, ref_weight, ref_bias, kl)
        ctx.temperature, ctx.chunk_tokens, ctx.matmul, ctx.ref_matmul = temperature, chunk_tokens, matmul, ref_matmul
        return kl.reshape(hidden.shape[:-1])

    @staticmethod
    def backward(ctx, grad_kl):
        hidden, weight, bias, ref_hidden, ref_weight, ref_bias, kl = ctx.saved_tensor()
        ref_rows = ref_hidden.reshape([-1, ref_hidden.shape[-1]])  # (N, H)
        scale = grad_kl.reshape([-1, 1]).astype("float32") / ctx.temperature  # (N, 1)

        def grad_of(chunk, rows):  # G (c, V)
            logp = _log_softmax_rows(chunk, weight, bias, ctx.matmul, ctx.temperature)
            logq = _log_softmax_rows(ref_rows[rows], ref_weight, ref_bias, ctx.ref_matmul, ctx.temperature)
            return logp.exp() * (logp - logq - kl[rows]) * scale[rows]

        grads = _head_gradients(hidden, weight, bias, HeadKernels(matmul=ctx.matmul), ctx.chunk_tokens, grad_of)
        grads += [None, None] + ([None] if ref_bias is not None else [])  # the reference's hidden states and head: constants
        return tuple(grads)
