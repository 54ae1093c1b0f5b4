"""The KL estimators (alignment/algo/kl.py's registry) against hand values and the exact KL, TRL's bias-corrected KL,
verl's estimators, and the KL in the reward."""

import math

import numpy as np
import paddle
import pytest

from alignment.algo.kl import kl_estimate, kl_penalized_rewards
from alignment.algo.loss import LossInputs, policy_loss
from alignment.algo.loss_settings import LossSettings


def test_kl_estimators_hand_values():
    logp = paddle.to_tensor([[-1.0, -2.0, -0.5]])
    ref = paddle.to_tensor([[-1.0, -1.0, -1.5]])
    # d = ref - logp = 0, 1, -1
    np.testing.assert_allclose(kl_estimate(logp, ref, "k1").numpy(), [[0.0, -1.0, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(logp, ref, "k2").numpy(), [[0.0, 0.5, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(logp, ref, "k3").numpy(), [[0.0, math.e - 2, math.exp(-1)]], rtol=1e-6)
    with pytest.raises(ValueError, match=r"k1, k2, k3, low_var_kl, abs, k1\+, k3\+ or low_var_kl\+, not .k4."):
        kl_estimate(logp, ref, "k4")


def test_kl_estimators_against_the_exact_kl_by_sampling():
    # pi and pi_ref over 5 words: k1 and k3 are unbiased for KL(pi || pi_ref) on tokens drawn from pi
    rng = np.random.default_rng(0)
    pi, ref = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    exact = float((pi * np.log(pi / ref)).sum())
    tokens = rng.choice(5, size=200_000, p=pi)
    logp, ref_logp = paddle.to_tensor(np.log(pi)[tokens][None]), paddle.to_tensor(np.log(ref)[tokens][None])
    for estimator in ("k1", "k3"):
        assert float(kl_estimate(logp, ref_logp, estimator).mean()) == pytest.approx(exact, abs=0.01)


def test_bias_corrected_kl_is_the_kl_times_the_ratio():
    logp = paddle.to_tensor([[-1.0]], stop_gradient=False)
    old, ref = paddle.to_tensor([[-1.5]]), paddle.to_tensor([[-2.0]])  # ratio e^0.5, k3 = e^-1
    for correction, factor in ((False, 1.0), (True, math.exp(0.5))):
        settings = LossSettings(kl_loss_coeff=0.1, use_bias_correction_kl=correction)
        inputs = LossInputs(old, paddle.to_tensor([0.0]), paddle.ones([1, 1]), paddle.ones([1, 1]), ref_logprobs=ref)
        loss, sums = policy_loss(logp, inputs, settings)
        assert float(loss) == pytest.approx(0.1 * math.exp(-1) * factor, rel=1e-6)
        assert sums["kl"] == pytest.approx(math.exp(-1), rel=1e-6)  # the logged KL is the estimate itself


def test_kl_estimators_of_verl_hand_values():
    logp = paddle.to_tensor([[-1.0, -1.0, -1.0, -30.0]], stop_gradient=False)
    ref = paddle.to_tensor([[-1.0, 0.0, -2.0, -3.0]])  # d = 0, 1, -1, 27
    low_var = kl_estimate(logp, ref, "low_var_kl").numpy()
    np.testing.assert_allclose(low_var[0, :3], [0.0, math.e - 2, math.exp(-1)], rtol=1e-6)  # k3 where nothing is clamped
    assert low_var[0, 3] == 10.0  # exp(20) - 21 clamped to 10
    np.testing.assert_allclose(kl_estimate(logp, ref, "abs").numpy(), [[0.0, 1.0, 1.0, 27.0]])
    for name, value in (("k1+", [0.0, -1.0, 1.0, -27.0]), ("k3+", [0.0, math.e - 2, math.exp(-1), math.exp(27) - 28])):
        logp.clear_gradient()
        estimate = kl_estimate(logp, ref, name)
        np.testing.assert_allclose(estimate.numpy(), [value], rtol=1e-5)
        estimate.sum().backward()  # k2's gradient: d/d log pi of (log pi_ref - log pi)^2 / 2 = -d
        np.testing.assert_allclose(logp.grad.numpy(), [[0.0, -1.0, 1.0, -27.0]], rtol=1e-6)


def test_kl_in_the_reward_subtracts_each_sequences_summed_kl():
    logprobs = np.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    ref = np.array([[-1.5, -1.0, -0.5], [-1.0, -1.0, -9.0]])
    mask = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # k1 = log pi - log pi_ref: 0.5, -1, 0 and 0, 0 (padding 8 left out)
    rewards, kl = kl_penalized_rewards(np.array([1.0, np.nan]), logprobs, ref, mask, 0.1, "k1")
    np.testing.assert_allclose(kl, [-0.5, 0.0])
    np.testing.assert_allclose(rewards, [1.05, np.nan])
    _, kl3 = kl_penalized_rewards(np.array([1.0, 0.0]), logprobs, ref, mask, 0.1, "k3")
    assert kl3[0] == pytest.approx((math.exp(-0.5) + 0.5 - 1) + (math.exp(1) - 2), rel=1e-6)
