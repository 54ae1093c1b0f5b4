import math

import numpy as np
import paddle
import pytest

from alignment.algo import (
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    kl_k3,
    learning_rate_factor,
    mean_and_pass_at_k,
    token_entropy,
    token_logprobs,
)


def test_group_advantages_hand_computed():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, sample std sqrt((4 * 0.25) / 3) = 0.57735 -> +-0.866025
    # group 2: 2, 0, 0, 0 -> mean 0.5, sample std sqrt((2.25 + 3 * 0.25) / 3) = 1 -> 1.5, -0.5, -0.5, -0.5
    advantages, metrics = group_advantages(np.array([1.0, 0, 0, 1, 2, 0, 0, 0]), group_size=4, eps=0.0)
    np.testing.assert_allclose(advantages, [0.866025, -0.866025, -0.866025, 0.866025, 1.5, -0.5, -0.5, -0.5], atol=1e-6)
    assert metrics["groups_without_signal"] == 0.0
    assert metrics["advantage_abs_mean"] == pytest.approx((4 * 0.866025 + 3.0) / 8, abs=1e-6)


def test_identical_rewards_give_zero_advantage():
    advantages, metrics = group_advantages(np.array([0.7, 0.7, 0.7, 1.0, 0.0, 1.0]), group_size=3)
    np.testing.assert_array_equal(advantages[:3], 0.0)
    assert metrics["groups_without_signal"] == pytest.approx(0.5)


def test_failed_rewards_are_left_out_of_their_group():
    # the NaN member gets 0; the others are normalised among themselves: 1, 0 -> mean .5, std .7071
    advantages, _ = group_advantages(np.array([1.0, np.nan, 0.0, 5.0, np.nan, np.nan]), group_size=3, eps=0.0)
    np.testing.assert_allclose(advantages, [0.707107, 0.0, -0.707107, 0.0, 0.0, 0.0], atol=1e-6)


def test_vectorised_advantages_equal_a_slow_float64_loop():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=48)
    rewards[[3, 17, 30]] = np.nan
    advantages, _ = group_advantages(rewards, group_size=6)
    for start in range(0, 48, 6):
        group = [r for r in rewards[start : start + 6] if not math.isnan(r)]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        for i in range(start, start + 6):
            expected = 0.0 if math.isnan(rewards[i]) else (rewards[i] - mean) / (std + 1e-6)
            assert advantages[i] == pytest.approx(expected, abs=1e-5)


def test_k3_hand_values():
    logp = paddle.to_tensor([[-1.0, -2.0, -0.5]])
    ref = paddle.to_tensor([[-1.0, -1.0, -1.5]])
    # d = ref - logp = 0, 1, -1 -> e^d - d - 1 = 0, e - 2, e^-1
    np.testing.assert_allclose(kl_k3(logp, ref).numpy(), [[0.0, math.e - 2, math.exp(-1)]], rtol=1e-6)


def test_clipped_side_has_zero_gradient():
    # ratios e^0.5 = 1.65 (above 1 + 0.2) and e^-0.5 = 0.61 (below 1 - 0.2)
    old = paddle.to_tensor([[0.0, 0.0, 0.0, 0.0]])
    logp = paddle.to_tensor([[0.5, 0.5, -0.5, -0.5]], stop_gradient=False)
    advantages = paddle.to_tensor([1.0])
    loss, clipped = clipped_surrogate(logp, old, advantages, 0.2, 0.2)
    loss.sum().backward()
    # A > 0: the high ratio is clipped (no gradient), the low ratio keeps its gradient -A * r
    np.testing.assert_array_equal(clipped.numpy(), [[True, True, False, False]])
    np.testing.assert_allclose(logp.grad.numpy(), [[0.0, 0.0, -math.exp(-0.5), -math.exp(-0.5)]], rtol=1e-6)
    np.testing.assert_allclose(loss.numpy(), [[-1.2, -1.2, -math.exp(-0.5), -math.exp(-0.5)]], rtol=1e-6)


def test_negative_advantage_clips_the_low_side():
    logp = paddle.to_tensor([[0.5, -0.5]], stop_gradient=False)
    loss, clipped = clipped_surrogate(logp, paddle.zeros([1, 2]), paddle.to_tensor([-1.0]), 0.2, 0.2)
    loss.sum().backward()
    np.testing.assert_array_equal(clipped.numpy(), [[False, True]])
    np.testing.assert_allclose(logp.grad.numpy(), [[math.exp(0.5), 0.0]], rtol=1e-6)


def _policy(seed=0):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Embedding(11, 8), paddle.nn.Linear(8, 11))


def _batch_gradient(model, tokens, advantages, mask, micro_batch, kl_coeff):
    """Sum of micro-batch losses, each normalised by the global token count -> gradient."""
    token_count = float(mask.sum())
    ref = paddle.nn.functional.log_softmax(paddle.to_tensor(np.random.default_rng(1).normal(size=(6, 5, 11)).astype("float32")), -1)
    ref_logp = paddle.take_along_axis(ref, tokens.unsqueeze(-1), -1).squeeze(-1)
    for start in range(0, tokens.shape[0], micro_batch):
        rows = slice(start, start + micro_batch)
        logp = token_logprobs(model(tokens[rows]), tokens[rows], temperature=0.7)
        loss, _ = grpo_loss(logp, logp.detach() - 0.1, advantages[rows], mask[rows], token_count, 0.2, kl_coeff, ref_logp[rows])
        loss.backward()
    gradient = [p.grad.numpy().copy() for p in model.parameters()]
    model.clear_gradients()
    return gradient


@pytest.mark.parametrize("kl_coeff", [0.0, 0.05])
def test_gradient_does_not_depend_on_the_micro_batch_size(kl_coeff):
    rng = np.random.default_rng(0)
    tokens = paddle.to_tensor(rng.integers(0, 11, size=(6, 5)))
    mask = paddle.to_tensor((rng.random((6, 5)) > 0.3).astype("float32"))  # ragged lengths
    advantages = paddle.to_tensor(rng.normal(size=6).astype("float32"))
    model = _policy()
    whole = _batch_gradient(model, tokens, advantages, mask, 6, kl_coeff)
    for micro in (1, 2, 3):
        for a, b in zip(whole, _batch_gradient(model, tokens, advantages, mask, micro, kl_coeff)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_grpo_loss_is_the_token_mean_over_the_batch():
    logp = paddle.to_tensor([[-1.0, -1.0], [-1.0, -1.0]])
    mask = paddle.to_tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, sums = grpo_loss(logp, logp, paddle.to_tensor([2.0, -1.0]), mask, 3.0, 0.2)
    # ratio 1: per token -A -> (-2 - 2 + 1) / 3 tokens
    assert float(loss) == pytest.approx(-1.0)
    assert sums == {"clipped": 0.0}
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logp, logp, paddle.to_tensor([2.0, -1.0]), mask, 3.0, 0.2, kl_coeff=0.1)


def test_logprobs_and_entropy_against_float64():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 7))
    tokens = rng.integers(0, 7, size=(2, 3))
    scaled = logits / 0.6
    logp64 = scaled - np.log(np.exp(scaled).sum(-1, keepdims=True))
    expected = np.take_along_axis(logp64, tokens[..., None], -1)[..., 0]
    got = token_logprobs(paddle.to_tensor(logits.astype("float32")), paddle.to_tensor(tokens), 0.6).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    entropy = -(np.exp(logp64) * logp64).sum(-1)
    np.testing.assert_allclose(token_entropy(paddle.to_tensor(logits.astype("float32")), 0.6).numpy(), entropy, atol=1e-5)


@pytest.mark.parametrize(
    "step, schedule, expected",
    [
        (0, "linear", 0.0),  # warmup starts at 0, as in Hugging Face
        (2, "linear", 0.5),
        (4, "linear", 1.0),
        (9, "linear", 0.1 + 0.9 * 0.5),  # halfway through decay: floor + (1 - floor) / 2
        (14, "linear", 0.1),
        (9, "cosine", 0.1 + 0.9 * 0.5),
        (6, "cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2))),
        (12, "constant", 1.0),
    ],
)
def test_learning_rate_schedule(step, schedule, expected):
    assert learning_rate_factor(step, total_steps=14, warmup_steps=4, schedule=schedule, floor=0.1) == pytest.approx(expected)


@pytest.mark.parametrize(
    "correct, mean_at_k, pass_at_k",
    [
        ([[1, 0, 0, 1]], [0.5], [1.0]),
        ([[0, 0, 0, 0]], [0.0], [0.0]),
        ([[1, 1, 1, 1]], [1.0], [1.0]),
        ([[0, 0, 1], [0, 0, 0]], [1 / 3, 0.0], [1.0, 0.0]),
    ],
)
def test_mean_and_pass_at_k_hand_computed(correct, mean_at_k, pass_at_k):
    means, passes = mean_and_pass_at_k(np.array(correct))
    np.testing.assert_allclose(means, mean_at_k)
    np.testing.assert_array_equal(passes, pass_at_k)


def test_pass_at_k_is_the_unbiased_estimator_with_k_of_k_samples():
    rng = np.random.default_rng(0)
    correct = rng.random((50, 6)) < 0.2
    _, passes = mean_and_pass_at_k(correct)
    n = k = 6
    unbiased = [1 - math.comb(n - c, k) / math.comb(n, k) for c in correct.sum(axis=1)]
    np.testing.assert_allclose(passes, unbiased)
