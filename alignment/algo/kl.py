"""KL(pi || pi_ref) per token (config keys kl_estimator, and kl_in_reward_estimator for the KL in the reward):
Schulman's estimators of the sampled token's d = log pi_ref - log pi, with verl's names. An estimator takes d (B, T)
and returns (B, T). A name ending in "+" (verl's straight-through variants: k1+, k3+, low_var_kl+) keeps the
estimator's value and takes the gradient of k2, whose expected gradient is that of the KL itself."""

from __future__ import annotations  # paddle.Tensor in signatures: no paddle needed to register (run_grpo.py --help)

import numpy as np
import paddle

from alignment.algo.registry import Registry

KL_ESTIMATORS = Registry("kl estimator must be {choices}, not {name!r}")
# verl's other names for the same estimators, stored as the estimators they are
KL_ESTIMATOR_SYNONYMS = {"kl": "k1", "mse": "k2"}


@KL_ESTIMATORS.register("k1")
def k1(delta: paddle.Tensor) -> paddle.Tensor:  # -d: unbiased, high variance, can be negative
    return -delta


@KL_ESTIMATORS.register("k2")
def k2(delta: paddle.Tensor) -> paddle.Tensor:  # d^2 / 2: biased, low variance; its gradient is that of the reverse KL
    return 0.5 * delta.square()


@KL_ESTIMATORS.register("k3")
def k3(delta: paddle.Tensor) -> paddle.Tensor:  # exp(d) - d - 1: unbiased, non-negative, low variance (GRPO's)
    return paddle.exp(delta) - delta - 1.0


@KL_ESTIMATORS.register("low_var_kl")
def low_var_kl(delta: paddle.Tensor) -> paddle.Tensor:
    """verl's default for the KL loss: k3 with d clamped to [-20, 20] and the estimate to [-10, 10], so one token the
    reference finds very unlikely cannot blow up the loss (its gradient is then zero)."""
    bounded = paddle.clip(delta, -20.0, 20.0)
    return paddle.clip(paddle.exp(bounded) - bounded - 1.0, -10.0, 10.0)


@KL_ESTIMATORS.register("abs")
def absolute(delta: paddle.Tensor) -> paddle.Tensor:  # |d|: verl's abs
    return delta.abs()


@KL_ESTIMATORS.register("k1+")
def k1_straight_through(delta: paddle.Tensor) -> paddle.Tensor:
    return with_k2_gradient(delta, k1(delta))


@KL_ESTIMATORS.register("k3+")
def k3_straight_through(delta: paddle.Tensor) -> paddle.Tensor:
    return with_k2_gradient(delta, k3(delta))


@KL_ESTIMATORS.register("low_var_kl+")
def low_var_kl_straight_through(delta: paddle.Tensor) -> paddle.Tensor:
    return with_k2_gradient(delta, low_var_kl(delta))


def with_k2_gradient(delta: paddle.Tensor, value: paddle.Tensor) -> paddle.Tensor:
    """value in the forward pass, k2's gradient in the backward one (verl's straight-through trick)."""
    carrier = k2(delta)
    return carrier - carrier.detach() + value.detach()


def kl_estimate(logprobs: paddle.Tensor, ref_logprobs: paddle.Tensor, estimator: str = "k3") -> paddle.Tensor:
    """(B, T), (B, T) -> (B, T) the estimate of KL(pi || pi_ref) at each sampled token."""
    return KL_ESTIMATORS.get(estimator)(ref_logprobs - logprobs)


def kl_penalized_rewards(
    rewards: np.ndarray, logprobs: np.ndarray, ref_logprobs: np.ndarray, mask: np.ndarray, coeff: float, estimator: str = "k1"
) -> tuple:
    """The KL in the reward (verl's use_kl_in_reward): rewards (B,) NaN where failed, the sampling policy's and the
    reference's log-probs and the loss mask (B, T) -> (rewards - coeff x each sequence's summed KL (B,) float64, the
    summed KL (B,)). verl puts -coeff x KL on every token's reward; the estimators that sum a sequence's token rewards
    (grpo, rloo, reinforce_plus_plus_baseline, grpo_passk, opo) see exactly this."""
    kl = kl_estimate(paddle.to_tensor(logprobs), paddle.to_tensor(ref_logprobs), estimator).numpy().astype(np.float64)
    sequence_kl = (kl * mask).sum(axis=1)
    return rewards.astype(np.float64) - coeff * sequence_kl, sequence_kl
