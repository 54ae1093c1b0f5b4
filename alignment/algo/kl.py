"""KL(pi || pi_ref) per token (config key kl_estimator): Schulman's estimators of the sampled token's
d = log pi_ref - log pi. An estimator takes d (B, T) and returns (B, T)."""

import paddle

from alignment.algo.registry import Registry

KL_ESTIMATORS = Registry("kl estimator must be {choices}, not {name!r}")


@KL_ESTIMATORS.register("k1")
def k1(delta: paddle.Tensor) -> paddle.Tensor:  # -d: unbiased, high variance, can be negative
    return -delta


@KL_ESTIMATORS.register("k2")
def k2(delta: paddle.Tensor) -> paddle.Tensor:  # d^2 / 2: biased, low variance; its gradient is that of the reverse KL
    return 0.5 * delta.square()


@KL_ESTIMATORS.register("k3")
def k3(delta: paddle.Tensor) -> paddle.Tensor:  # exp(d) - d - 1: unbiased, non-negative, low variance (GRPO's)
    return paddle.exp(delta) - delta - 1.0


def kl_estimate(logprobs: paddle.Tensor, ref_logprobs: paddle.Tensor, estimator: str = "k3") -> paddle.Tensor:
    """(B, T), (B, T) -> (B, T) the estimate of KL(pi || pi_ref) at each sampled token."""
    return KL_ESTIMATORS.get(estimator)(ref_logprobs - logprobs)
