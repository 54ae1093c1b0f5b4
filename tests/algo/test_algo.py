import math

import numpy as np
import paddle
import pytest

from alignment.algo.advantages import group_advantages
from alignment.algo.aggregation import aggregation_counts, loss_token_weights
from alignment.algo.corrections import rollout_correction
from alignment.algo.kl import kl_estimate
from alignment.algo.logprobs import token_entropy, token_logprobs
from alignment.algo.loss import LossInputs, entropy_bonus, policy_loss
from alignment.algo.loss_settings import LossSettings
from alignment.algo.objectives import clipped_surrogate
from alignment.algo.schedule import learning_rate_factor
from alignment.algo.stats import groups_with_signal, mean_and_pass_at_k


def test_group_advantages_hand_computed():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, sample std sqrt((4 * 0.25) / 3) = 0.57735 -> +-0.866025
    # group 2: 2, 0, 0, 0 -> mean 0.5, sample std sqrt((2.25 + 3 * 0.25) / 3) = 1 -> 1.5, -0.5, -0.5, -0.5
    advantages = group_advantages(np.array([1.0, 0, 0, 1, 2, 0, 0, 0]), group_size=4, eps=0.0)
    np.testing.assert_allclose(advantages, [0.866025, -0.866025, -0.866025, 0.866025, 1.5, -0.5, -0.5, -0.5], atol=1e-6)
    assert (advantages.reshape(2, 4) != 0).any(axis=1).all()  # both groups carry signal
    assert np.abs(advantages).mean() == pytest.approx((4 * 0.866025 + 3.0) / 8, abs=1e-6)


def test_identical_rewards_give_zero_advantage():
    advantages = group_advantages(np.array([0.7, 0.7, 0.7, 1.0, 0.0, 1.0]), group_size=3)
    np.testing.assert_array_equal(advantages[:3], 0.0)
    assert (advantages[3:] != 0).any()  # one group of the two has no signal


def test_failed_rewards_are_left_out_of_their_group():
    # the NaN member gets 0; the others are normalised among themselves: 1, 0 -> mean .5, std .7071
    advantages = group_advantages(np.array([1.0, np.nan, 0.0, 5.0, np.nan, np.nan]), group_size=3, eps=0.0)
    np.testing.assert_allclose(advantages, [0.707107, 0.0, -0.707107, 0.0, 0.0, 0.0], atol=1e-6)


def test_vectorised_advantages_equal_a_slow_float64_loop():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=48)
    rewards[[3, 17, 30]] = np.nan
    advantages = group_advantages(rewards, group_size=6)
    for start in range(0, 48, 6):
        group = [r for r in rewards[start : start + 6] if not math.isnan(r)]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        for i in range(start, start + 6):
            expected = 0.0 if math.isnan(rewards[i]) else (rewards[i] - mean) / (std + 1e-6)
            assert advantages[i] == pytest.approx(expected, abs=1e-5)


def test_batch_and_no_scaling_hand_computed():
    rewards = np.array([1.0, 0, 0, 1, 2, 0, 0, 0])  # group means 0.5 and 0.5
    centred = [0.5, -0.5, -0.5, 0.5, 1.5, -0.5, -0.5, -0.5]
    none = group_advantages(rewards, group_size=4, scale="none")
    np.testing.assert_allclose(none, centred, atol=1e-7)
    # batch std, ddof 1: mean .5, squares 4 x .25 + 2.25 + 3 x .25 = 4 -> sqrt(4 / 7)
    batch = group_advantages(rewards, group_size=4, scale="batch", eps=0.0)
    np.testing.assert_allclose(batch, np.array(centred) / math.sqrt(4 / 7), atol=1e-6)
    given = group_advantages(rewards, group_size=4, scale="batch", batch_std=2.0, eps=0.0)  # the global std, from the trainer
    np.testing.assert_allclose(given, np.array(centred) / 2.0, atol=1e-7)
    flat = group_advantages(np.array([3.0, 3.0, 1.0, 1.0]), group_size=2, scale="none")
    np.testing.assert_array_equal(flat, 0.0)


@pytest.mark.parametrize(
    "rewards, min_std, expected",
    [
        ([1.0, 0.0, 1.0, 1.0], 1e-4, [True, False]),  # std .707 / 0
        ([0.5, 0.50001, 0.2, 0.9], 1e-4, [False, True]),  # std 7e-6: nearly equal counts as no signal
        ([0.5, 0.50001, 0.2, 0.9], 0.0, [True, True]),  # any spread at all
        ([1.0, np.nan, 0.0, 1.0], 1e-4, [False, True]),  # one valid member is not a comparison
    ],
)
def test_groups_with_signal_use_a_std_threshold(rewards, min_std, expected):
    assert groups_with_signal(np.array(rewards), 2, min_std).tolist() == expected


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


def test_clipped_side_has_zero_gradient():
    # ratios e^0.5 = 1.65 (above 1 + 0.2) and e^-0.5 = 0.61 (below 1 - 0.2)
    old = paddle.to_tensor([[0.0, 0.0, 0.0, 0.0]])
    logp = paddle.to_tensor([[0.5, 0.5, -0.5, -0.5]], stop_gradient=False)
    advantages = paddle.to_tensor([1.0])
    loss, flags = clipped_surrogate(paddle.exp(logp - old), advantages, 0.2, 0.2)
    loss.sum().backward()
    # A > 0: the high ratio is clipped (no gradient), the low ratio keeps its gradient -A * r
    np.testing.assert_array_equal(flags["clipped"].numpy(), [[True, True, False, False]])
    np.testing.assert_array_equal(flags["clipped_high"].numpy(), [[True, True, False, False]])
    np.testing.assert_array_equal(flags["clipped_low"].numpy(), [[False, False, False, False]])
    np.testing.assert_allclose(logp.grad.numpy(), [[0.0, 0.0, -math.exp(-0.5), -math.exp(-0.5)]], rtol=1e-6)
    np.testing.assert_allclose(loss.numpy(), [[-1.2, -1.2, -math.exp(-0.5), -math.exp(-0.5)]], rtol=1e-6)


def test_negative_advantage_clips_the_low_side():
    logp = paddle.to_tensor([[0.5, -0.5]], stop_gradient=False)
    loss, flags = clipped_surrogate(paddle.exp(logp), paddle.to_tensor([-1.0]), 0.2, 0.2)
    loss.sum().backward()
    np.testing.assert_array_equal(flags["clipped"].numpy(), [[False, True]])
    np.testing.assert_array_equal(flags["clipped_low"].numpy(), [[False, True]])
    np.testing.assert_allclose(logp.grad.numpy(), [[math.exp(0.5), 0.0]], rtol=1e-6)


def test_clip_higher_widens_only_the_upper_side():
    # ratios 1.25 and 0.75 with low 0.2, high 0.28: 1.25 < 1.28 is not clipped for A > 0, 0.75 < 0.8 is for A < 0
    logp = paddle.to_tensor([[math.log(1.25), math.log(0.75)]])
    positive, flags = clipped_surrogate(paddle.exp(logp), paddle.to_tensor([1.0]), 0.2, 0.28)
    np.testing.assert_allclose(positive.numpy(), [[-1.25, -0.75]], rtol=1e-6)
    assert flags["clipped"].numpy().tolist() == [[False, False]]
    negative, flags = clipped_surrogate(paddle.exp(logp), paddle.to_tensor([-1.0]), 0.2, 0.28)
    np.testing.assert_allclose(negative.numpy(), [[1.25, 0.8]], rtol=1e-6)
    assert flags["clipped_low"].numpy().tolist() == [[False, True]]


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # A = -2, ratios e^2 = 7.39 and 2.0: -A r = 14.78 and 4.0; with c = 3 the first is bounded at -A c = 6 (no gradient)
    logp = paddle.to_tensor([[2.0, math.log(2.0)]], stop_gradient=False)
    loss, flags = clipped_surrogate(paddle.exp(logp), paddle.to_tensor([-2.0]), 0.2, 0.2, dual_clip=3.0)
    loss.sum().backward()
    np.testing.assert_allclose(loss.numpy(), [[6.0, 4.0]], rtol=1e-6)
    assert flags["dual_clipped"].numpy().tolist() == [[True, False]]
    np.testing.assert_allclose(logp.grad.numpy(), [[0.0, 4.0]], rtol=1e-6)
    # a positive advantage is never dual-clipped
    loss, flags = clipped_surrogate(paddle.exp(logp.detach()), paddle.to_tensor([2.0]), 0.2, 0.2, dual_clip=3.0)
    np.testing.assert_allclose(loss.numpy(), [[-2.4, -2.4]], rtol=1e-6)
    assert flags["dual_clipped"].numpy().tolist() == [[False, False]]


def test_truncated_importance_weights_hand_values():
    old = paddle.to_tensor([[-1.0, -1.0, -1.0]])
    rollout = paddle.to_tensor([[-1.0, -1.5, -2.0]])  # pi_old / pi_rollout = 1, e^.5 = 1.65, e = 2.72
    weights, capped = rollout_correction(old, rollout, paddle.ones([1, 3]), "token_truncate", cap=2.0)
    np.testing.assert_allclose(weights.numpy(), [[1.0, math.exp(0.5), 2.0]], rtol=1e-6)
    assert capped.numpy().tolist() == [[False, False, True]]


def test_loss_token_weights_hand_computed():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=np.float32)  # lengths 3, 1, 0 (a filtered row)
    counts = aggregation_counts(mask)
    assert counts.tolist() == [4, 2, 3]
    np.testing.assert_allclose(loss_token_weights(mask, "dapo", 4, counts), mask / 4)
    grpo = loss_token_weights(mask, "grpo", 4, counts)  # mean over each sequence's tokens, then over the 2 live sequences
    np.testing.assert_allclose(grpo[0], [1 / 6, 1 / 6, 1 / 6, 0], rtol=1e-6)
    np.testing.assert_allclose(grpo[1], [1 / 2, 0, 0, 0], rtol=1e-6)
    np.testing.assert_array_equal(grpo[2], 0.0)
    np.testing.assert_allclose(loss_token_weights(mask, "dr_grpo", 4, counts), mask / 12, rtol=1e-6)  # 3 sequences x max_dec_len 4


@pytest.mark.parametrize("loss_type, expected", [("dapo", (-2 - 2 + 1) / 3), ("grpo", (-2 + 1) / 2), ("dr_grpo", (-2 - 2 + 1) / (2 * 5))])
def test_policy_loss_aggregation_hand_computed(loss_type, expected):
    logp = paddle.to_tensor([[-1.0, -1.0], [-1.0, -1.0]])
    mask = np.array([[1.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    weights = paddle.to_tensor(loss_token_weights(mask, loss_type, 5, aggregation_counts(mask)))
    # ratio 1: each token's loss is -A
    loss, sums = policy_loss(logp, LossInputs(logp, paddle.to_tensor([2.0, -1.0]), weights, paddle.to_tensor(mask)), LossSettings())
    assert float(loss) == pytest.approx(expected)
    assert sums == {"clipped": 0.0, "clipped_low": 0.0, "clipped_high": 0.0}
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, LossInputs(logp, paddle.to_tensor([2.0, -1.0]), weights, paddle.to_tensor(mask)), LossSettings(kl_loss_coeff=0.1))


def test_importance_weights_scale_the_policy_term_only():
    logp = paddle.to_tensor([[-1.0, -1.0]])
    mask = paddle.to_tensor([[1.0, 1.0]])
    weights = paddle.to_tensor([[0.5, 0.5]])
    ref = paddle.to_tensor([[-2.0, -1.0]])  # k3: e^-1 - (-1) - 1 = e^-1, and 0
    inputs = LossInputs(logp, paddle.to_tensor([1.0]), weights, mask, importance_weights=paddle.to_tensor([[2.0, 0.5]]), ref_logprobs=ref)
    loss, sums = policy_loss(logp, inputs, LossSettings(kl_loss_coeff=0.1))
    assert float(loss) == pytest.approx(0.5 * (-2.0 - 0.5) + 0.5 * 0.1 * math.exp(-1), rel=1e-6)
    assert sums["kl"] == pytest.approx(math.exp(-1), rel=1e-6)


def _policy(seed=0):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Embedding(11, 8), paddle.nn.Linear(8, 11))


# Every loss variant, as LossSettings plus how the trainer feeds it: the importance-sampling mode, the entropy
# selection (a fixed mask, as the trainer fixes it before the update) and the entropy bonus's coefficient.
LOSS_VARIANTS = {
    "clip": ({}, "token_truncate", False, 0.0),
    "gspo": ({"importance_sampling_level": "sequence"}, "token_truncate", False, 0.0),
    "cispo": ({"surrogate": "cispo"}, "token_truncate", False, 0.0),
    "gspo_cispo": ({"importance_sampling_level": "sequence", "surrogate": "cispo"}, "token_truncate", False, 0.0),
    "sequence_mask": ({}, "sequence_mask", False, 0.0),
    "token_mask": ({}, "token_mask", False, 0.0),
    "sequence_truncate": ({"importance_sampling_level": "sequence"}, "sequence_truncate", False, 0.0),
    "bias_corrected_kl": ({"use_bias_correction_kl": True}, "token_truncate", False, 0.0),
    "entropy_bonus": ({}, "token_truncate", False, 0.02),
    "entropy_selection_and_bonus": ({}, "token_truncate", True, 0.02),
    "sapo": ({"surrogate": "sapo"}, "token_truncate", False, 0.0),
    "gmpo": ({"surrogate": "gmpo", "clip_range_ratio_low": 0.4, "clip_range_ratio_high": 0.4}, "token_truncate", False, 0.0),
    "off_policy_mask": ({"off_policy_mask_threshold": 0.05}, "token_truncate", False, 0.0),
    "low_var_kl": ({"kl_estimator": "low_var_kl"}, "token_truncate", False, 0.0),
    "k3_straight_through": ({"kl_estimator": "k3+"}, "token_truncate", False, 0.0),
}


def _batch_gradient(model, tokens, advantages, mask, micro_batch, kl_coeff, loss_type="dapo", processes=1, variant="clip"):
    """Sum of micro-batch losses, the token weights fixed over the whole batch -> gradient. With processes > 1
    the rows are split into contiguous slices, each weighted from its own mask and the summed counts, as
    the trainer does across ranks. Clip-higher, dual clip and importance weights are on."""
    extra, mode, select, bonus = LOSS_VARIANTS[variant]
    clips = {"clip_range_ratio_low": 0.2, "clip_range_ratio_high": 0.28, "dual_clip_ratio": 3.0}
    settings = LossSettings(**{**clips, "kl_loss_coeff": kl_coeff, **extra})
    rows_total = tokens.shape[0]
    rng = np.random.default_rng(1)
    ref = paddle.nn.functional.log_softmax(paddle.to_tensor(rng.normal(size=(6, 5, 11)).astype("float32")), -1)
    ref_logp = paddle.take_along_axis(ref, tokens.unsqueeze(-1), -1).squeeze(-1)
    rollout_gap = paddle.to_tensor(rng.normal(0.0, 0.4, size=(6, 5)).astype("float32"))  # log pi_old - log pi_rollout
    selected = paddle.to_tensor((rng.random((6, 5)) > 0.5).astype("float32")) * mask if select else None
    mask_np = mask.numpy()
    share = rows_total // processes
    slices = [slice(r * share, (r + 1) * share) for r in range(processes)]
    counts = sum(aggregation_counts(mask_np[s]) for s in slices)
    effective = (mask if selected is None else selected).numpy()
    weights = np.concatenate([loss_token_weights(mask_np[s], loss_type, 5, counts) for s in slices])
    for start in range(0, rows_total, micro_batch):
        rows = slice(start, start + micro_batch)
        logits = model(tokens[rows])
        logp = token_logprobs(logits, tokens[rows], temperature=0.7)
        old = logp.detach() - 0.1
        importance, _ = rollout_correction(old, old - rollout_gap[rows], mask[rows], mode, 2.0, 0.5)
        inputs = LossInputs(
            old, advantages[rows], paddle.to_tensor(weights[rows]), mask[rows], importance, ref_logp[rows],
            None if selected is None else selected[rows], old - rollout_gap[rows],
        )
        loss, _ = policy_loss(logp, inputs, settings)
        if bonus:
            loss = loss + entropy_bonus(token_entropy(logits, temperature=0.7), effective[rows], effective.sum(), bonus)
        loss.backward()
    gradient = [p.grad.numpy().copy() for p in model.parameters()]
    model.clear_gradients()
    return gradient


@pytest.mark.parametrize("variant", list(LOSS_VARIANTS))
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("kl_coeff", [0.0, 0.05])
def test_gradient_does_not_depend_on_the_micro_batch_size_or_processes(kl_coeff, loss_type, variant):
    rng = np.random.default_rng(0)
    tokens = paddle.to_tensor(rng.integers(0, 11, size=(6, 5)))
    mask = paddle.to_tensor((rng.random((6, 5)) > 0.3).astype("float32"))  # ragged lengths
    advantages = paddle.to_tensor(rng.normal(size=6).astype("float32"))
    model = _policy()
    whole = _batch_gradient(model, tokens, advantages, mask, 6, kl_coeff, loss_type, variant=variant)
    assert any(np.abs(g).max() > 1e-4 for g in whole)
    for micro, processes in ((1, 1), (2, 1), (3, 1), (1, 2), (3, 3)):
        for a, b in zip(whole, _batch_gradient(model, tokens, advantages, mask, micro, kl_coeff, loss_type, processes, variant)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


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
