"""Issue 19's variants in alignment/algo/ against hand-computed values: GSPO's sequence ratio, CISPO, the
rollout-correction modes, entropy-based token selection and the entropy bonus, TRL's bias-corrected KL,
and the advantage estimators (RLOO, REINFORCE++ with and without baseline, GDPO's per-function
normalisation). The micro-batch and process invariance of every loss variant is in tests/test_algo.py."""

import math

import numpy as np
import paddle
import pytest

from alignment.algo.advantages import baseline_subtracted, group_advantages, normalized_per_function, rloo_advantages, whiten
from alignment.algo.corrections import rollout_correction
from alignment.algo.loss import LossInputs, LossSettings, entropy_bonus, entropy_threshold, policy_loss
from alignment.algo.objectives import cispo_surrogate, clipped_surrogate, importance_ratio
from alignment.algo.stats import whitening_sums


def test_gspo_ratio_is_the_geometric_mean_of_the_loss_tokens_ratios():
    logp = paddle.to_tensor([[-1.0, -2.0, -3.0]], stop_gradient=False)
    old = paddle.to_tensor([[-1.2, -1.9, -3.3]])  # log ratios 0.2, -0.1 and 0.3 on a token outside the loss
    mask = paddle.to_tensor([[1.0, 1.0, 0.0]])
    ratio = importance_ratio(logp, old, mask, "sequence")
    assert ratio.shape == [1, 1]
    assert float(ratio) == pytest.approx(math.exp(0.05), rel=1e-6)
    ratio.sum().backward()  # d s / d log pi_t = s / |y| on the loss tokens
    np.testing.assert_allclose(logp.grad.numpy(), [[math.exp(0.05) / 2, math.exp(0.05) / 2, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(importance_ratio(logp, old, mask, "token").numpy(), np.exp([[0.2, -0.1, 0.3]]), rtol=1e-5)


def test_gspo_clips_a_whole_sequence():
    # sequence ratios e^0.3 = 1.35 (A > 0: above 1 + 0.2, clipped: no gradient anywhere) and e^0.1 = 1.105 (kept)
    logp = paddle.to_tensor([[0.5, 0.1], [0.1, 0.1]], stop_gradient=False)
    mask = paddle.ones([2, 2])
    ratio = importance_ratio(logp, paddle.zeros([2, 2]), mask, "sequence")
    loss, flags = clipped_surrogate(ratio, paddle.to_tensor([1.0, 1.0]), 0.2, 0.2)
    (loss * paddle.full([2, 2], 0.25)).sum().backward()
    assert flags["clipped"].numpy().tolist() == [[True], [False]]
    np.testing.assert_allclose(logp.grad.numpy(), [[0.0, 0.0], [-math.exp(0.1) / 4, -math.exp(0.1) / 4]], rtol=1e-6)


@pytest.mark.parametrize("loss_type_weights", ["dapo", "grpo"])
def test_at_one_update_per_batch_gspo_gives_the_token_level_gradient(loss_type_weights):
    """Ratio 1 in value: the sequence ratio's gradient, spread as s / |y| over |y| equally weighted tokens, is
    the token-level one whenever a sequence's tokens share one weight (every loss_type's do)."""
    rng = np.random.default_rng(0)
    mask_np = (rng.random((3, 4)) > 0.3).astype(np.float32)
    mask_np[:, 0] = 1
    lengths = mask_np.sum(1, keepdims=True)
    weights = mask_np / mask_np.sum() if loss_type_weights == "dapo" else mask_np / lengths / 3
    advantages = paddle.to_tensor([1.0, -0.5, 2.0])
    values, grads = rng.normal(-2, 1, size=(3, 4)).astype(np.float32), []
    for level in ("token", "sequence"):
        logp = paddle.to_tensor(values, stop_gradient=False)
        inputs = LossInputs(logp.detach(), advantages, paddle.to_tensor(weights), paddle.to_tensor(mask_np))
        loss, _ = policy_loss(logp, inputs, LossSettings(level=level))
        loss.backward()
        grads.append(logp.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-8)


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    # ratios e^0.5 = 1.65, 1 and e^-0.5 = 0.61 with low 0.2, high 0.28 -> weights 1.28, 1, 0.8; A = 2
    old = paddle.zeros([1, 3])
    logp = paddle.to_tensor([[0.5, 0.0, -0.5]], stop_gradient=False)
    ratio = importance_ratio(logp, old, paddle.ones([1, 3]))
    loss, flags = cispo_surrogate(ratio, logp, paddle.to_tensor([2.0]), 0.2, 0.28)
    loss.sum().backward()
    np.testing.assert_allclose(loss.numpy(), [[-1.28 * 2 * 0.5, 0.0, -0.8 * 2 * -0.5]], rtol=1e-6)
    np.testing.assert_allclose(logp.grad.numpy(), [[-2.56, -2.0, -1.6]], rtol=1e-6)  # -w A: the clipped tokens learn too
    assert flags["clipped"].numpy().tolist() == [[True, False, True]]
    assert flags["clipped_high"].numpy().tolist() == [[True, False, False]]
    assert flags["clipped_low"].numpy().tolist() == [[False, False, True]]
    # PPO's clip on the same tokens: the clipped one above 1 + high gets no gradient
    logp.clear_gradient()
    clipped, _ = clipped_surrogate(importance_ratio(logp, old, paddle.ones([1, 3])), paddle.to_tensor([2.0]), 0.2, 0.28)
    clipped.sum().backward()
    np.testing.assert_allclose(logp.grad.numpy(), [[0.0, -2.0, -2.0 * math.exp(-0.5)]], rtol=1e-6)


E15 = math.exp(1.5)  # the sequence's ratio: token ratios 1, e^0.5 and e^1
ROLLOUT_MODES = [
    # (mode, cap, floor, weights, outside)
    ("token_truncate", 2.0, None, [1.0, math.exp(0.5), 2.0], [False, False, True]),
    ("token_mask", 2.0, None, [1.0, math.exp(0.5), 0.0], [False, False, True]),
    ("sequence_truncate", 2.0, None, [2.0] * 3, [True] * 3),
    ("sequence_mask", 2.0, None, [0.0] * 3, [True] * 3),
    ("sequence_truncate", 5.0, None, [E15] * 3, [False] * 3),
    ("sequence_mask", 5.0, None, [E15] * 3, [False] * 3),
    ("token_truncate", 2.0, 1.2, [1.2, math.exp(0.5), 2.0], [True, False, True]),
    ("token_mask", 2.0, 1.2, [0.0, math.exp(0.5), 0.0], [True, False, True]),
    ("sequence_mask", 5.0, 4.5, [0.0] * 3, [True] * 3),
]


@pytest.mark.parametrize("mode, cap, floor, weights, outside", ROLLOUT_MODES)
def test_rollout_correction_modes_hand_values(mode, cap, floor, weights, outside):
    old = paddle.to_tensor([[-1.0, -1.0, -1.0]])
    rollout = paddle.to_tensor([[-1.0, -1.5, -2.0]])
    got, flags = rollout_correction(old, rollout, paddle.ones([1, 3]), mode, cap, floor)
    np.testing.assert_allclose(got.numpy(), [weights], rtol=1e-6)
    assert flags.numpy().tolist() == [outside]


def test_a_sequence_ratio_counts_only_its_loss_tokens():
    old, rollout = paddle.to_tensor([[-1.0, -1.0, -1.0]]), paddle.to_tensor([[-1.0, -1.5, -2.0]])
    weights, _ = rollout_correction(old, rollout, paddle.to_tensor([[1.0, 1.0, 0.0]]), "sequence_truncate", 5.0)
    np.testing.assert_allclose(weights.numpy(), [[math.exp(0.5)] * 3], rtol=1e-6)
    with pytest.raises(ValueError, match="token_truncate, token_mask, sequence_truncate, sequence_mask, not 'token'"):
        rollout_correction(old, rollout, paddle.ones([1, 3]), "token")


@pytest.mark.parametrize("top, threshold, kept", [
    (0.4, 0.9 + 0.4 * (1.3 - 0.9), [1.3, 2.0]),  # quantile 0.6: position 2.4 between 0.9 and 1.3
    (1.0, 0.1, [0.1, 0.5, 0.9, 1.3, 2.0]),  # every token
    (0.0, 2.0, [2.0]),  # only the highest, as TRL's 0.0
])
def test_entropy_threshold_hand_values(top, threshold, kept):
    entropies = np.array([0.9, 0.1, 2.0, 0.5, 1.3])
    got = entropy_threshold(entropies, top)
    assert got == pytest.approx(threshold)
    assert sorted(entropies[entropies >= got].tolist()) == kept
    assert entropy_threshold(np.array([]), 0.2) == -math.inf


def test_entropy_selection_touches_the_policy_term_not_the_kl():
    logp = paddle.to_tensor([[-1.0, -1.0]])
    mask, weights = paddle.ones([1, 2]), paddle.to_tensor([[0.5, 0.5]])
    ref = paddle.to_tensor([[-2.0, -2.0]])  # k3 = e^-1 on both tokens
    settings = LossSettings(kl_coeff=0.1)
    selected = paddle.to_tensor([[0.0, 1.0]])  # the second token only; A = 1, ratio 1: policy term -1 per token
    loss, sums = policy_loss(logp, LossInputs(logp, paddle.to_tensor([1.0]), weights, mask, ref_logprobs=ref, selected=selected), settings)
    assert float(loss) == pytest.approx(0.5 * (0.1 * math.exp(-1)) + 0.5 * (-1 + 0.1 * math.exp(-1)), rel=1e-6)
    assert sums["selected"] == 1.0


def test_entropy_bonus_is_the_mean_entropy_of_the_trained_tokens():
    entropy = paddle.to_tensor([[1.0, 2.0, 4.0]], stop_gradient=False)
    effective = np.array([[1.0, 1.0, 0.0]])  # 2 tokens here, of 4 in the whole mini-batch
    bonus = entropy_bonus(entropy, effective, 4.0, 0.1)
    assert float(bonus) == pytest.approx(-0.1 * 3.0 / 4)
    bonus.backward()
    np.testing.assert_allclose(entropy.grad.numpy(), [[-0.025, -0.025, 0.0]])


def test_bias_corrected_kl_is_the_kl_times_the_ratio():
    logp = paddle.to_tensor([[-1.0]], stop_gradient=False)
    old, ref = paddle.to_tensor([[-1.5]]), paddle.to_tensor([[-2.0]])  # ratio e^0.5, k3 = e^-1
    for correction, factor in ((False, 1.0), (True, math.exp(0.5))):
        settings = LossSettings(kl_coeff=0.1, kl_bias_correction=correction)
        inputs = LossInputs(old, paddle.to_tensor([0.0]), paddle.ones([1, 1]), paddle.ones([1, 1]), ref_logprobs=ref)
        loss, sums = policy_loss(logp, inputs, settings)
        assert float(loss) == pytest.approx(0.1 * math.exp(-1) * factor, rel=1e-6)
        assert sums["kl"] == pytest.approx(math.exp(-1), rel=1e-6)  # the logged KL is the estimate itself


@pytest.mark.parametrize("rewards, expected", [
    ([1, 0, 0, 1], [2 / 3, -2 / 3, -2 / 3, 2 / 3]),  # 1 - (0 + 0 + 1) / 3 and 0 - (1 + 0 + 1) / 3
    ([1, np.nan, 0, 0], [1.0, 0.0, -0.5, -0.5]),  # a failed member is left out of the others' mean
    ([3, 3, 3, 3], [0, 0, 0, 0]),
    ([np.nan, np.nan, np.nan, 2], [0, 0, 0, 0]),  # one valid member: nothing to compare with
])
def test_rloo_hand_values(rewards, expected):
    advantages = rloo_advantages(np.array(rewards, dtype=np.float64), 4)
    np.testing.assert_allclose(advantages, expected, rtol=1e-6, atol=1e-7)


def test_rloo_equals_a_float64_loop_and_is_grpo_unscaled_times_n_over_n_minus_1():
    rewards = np.random.default_rng(3).normal(size=24)
    rewards[[2, 9]] = np.nan
    loop = np.zeros(24)
    for group in range(4):
        rows = range(group * 6, group * 6 + 6)
        valid = [r for r in rows if np.isfinite(rewards[r])]
        for r in valid:
            loop[r] = rewards[r] - np.mean([rewards[o] for o in valid if o != r])
    np.testing.assert_allclose(rloo_advantages(rewards, 6), loop, rtol=1e-5, atol=1e-6)
    full = np.random.default_rng(4).normal(size=12)
    np.testing.assert_allclose(rloo_advantages(full, 4), group_advantages(full, 4, "none") * 4 / 3, rtol=1e-5)


def test_reinforce_plus_plus_whitens_over_the_loss_tokens():
    # rewards 1, 0, 1, 1 on 2, 1, 1 and 0 tokens: token mean 0.75, unbiased token variance 0.75 / 3, std 0.5
    rewards, tokens = np.array([1.0, 0.0, 1.0, 1.0]), np.array([2, 1, 1, 0])
    advantages = whiten(rewards, whitening_sums(rewards, tokens))
    np.testing.assert_allclose(advantages, [0.5, -1.5, 0.5, 0.5], rtol=1e-5)
    with_nan = np.array([1.0, 0.0, 1.0, 1.0, np.nan])
    advantages = whiten(with_nan, whitening_sums(with_nan, np.array([2, 1, 1, 0, 5])))
    np.testing.assert_allclose(advantages, [0.5, -1.5, 0.5, 0.5, 0.0], rtol=1e-5)  # a failed reward: 0, out of the statistics


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_then_whitens():
    rewards, tokens = np.array([1.0, 0.0, 1.0, 1.0]), np.array([2, 1, 1, 0])
    centred = baseline_subtracted(rewards, 2)
    np.testing.assert_allclose(centred, [0.5, -0.5, 0.0, 0.0])
    values = np.repeat(centred, tokens)  # every loss token carries its sequence's value (verl's masked_whiten)
    expected = (centred - values.mean()) / values.std(ddof=1)
    np.testing.assert_allclose(whiten(centred, whitening_sums(centred, tokens)), expected, rtol=1e-5)


def test_whitening_over_processes_equals_whitening_the_whole_batch():
    rng = np.random.default_rng(5)
    values, tokens = rng.normal(size=12), rng.integers(0, 9, size=12)
    whole = whiten(values, whitening_sums(values, tokens))
    slices = [slice(0, 4), slice(4, 8), slice(8, 12)]
    summed = sum(whitening_sums(values[s], tokens[s]) for s in slices)
    for s in slices:
        np.testing.assert_allclose(whiten(values[s], summed), whole[s], rtol=1e-6)


def test_gdpo_normalises_each_function_in_its_group_before_the_sum():
    # two groups of 2; the format reward's 0.2 scale does not shrink its say: normalised, it is +-0.707 like the answer's
    answer, format_ = [1.0, 0.0, 1.0, 1.0], [0.2, 0.0, 0.0, 0.2]
    combined = normalized_per_function([np.array(answer), np.array(format_)], [1.0, 0.5], 2)
    half = 1 / math.sqrt(2)
    np.testing.assert_allclose(combined, [half + 0.5 * half, -half - 0.5 * half, -0.5 * half, 0.5 * half], rtol=1e-5)
    advantages = whiten(combined, whitening_sums(combined, np.ones(4)))
    np.testing.assert_allclose(advantages, combined / math.sqrt((combined**2).sum() / 3), rtol=1e-5)  # mean 0 already


def test_gdpo_leaves_a_row_with_a_failed_function_out():
    answer, format_ = np.array([1.0, 0.0, 0.0, 1.0]), np.array([0.0, np.nan, 1.0, 1.0])
    combined = normalized_per_function([answer, format_], [1.0, 1.0], 4)
    assert np.isnan(combined[1])
    # the other three rows are normalised among themselves: answer (1, 0, 1), format (0, 1, 1)
    rows = [0, 2, 3]
    expected = sum((c[rows] - c[rows].mean()) / (c[rows].std(ddof=1) + 1e-6) for c in (answer, format_))
    np.testing.assert_allclose(combined[rows], expected, rtol=1e-5)
