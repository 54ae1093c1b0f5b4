"""The variants in alignment/algo/ against hand-computed values. Issue 19's: GSPO's sequence ratio, CISPO, the
rollout-correction modes, entropy-based token selection and the entropy bonus, TRL's bias-corrected KL, and the
advantage estimators (RLOO, REINFORCE++ with and without baseline, GDPO's per-function normalisation). Issue 34's:
SAPO's gate, GMPO's geometric mean, BNPO's per-micro-batch mean, DeepSeek-V3.2's off-policy sequence mask, verl's
KL estimators and the KL in the reward, rollout rejection sampling and its diagnostics, pass@k and OPO advantages.
The micro-batch and process invariance of every loss variant is in tests/algo/test_algo.py."""

import math

import numpy as np
import paddle
import pytest

from alignment.algo.advantages import (
    baseline_subtracted,
    group_advantages,
    normalized_per_function,
    opo_advantages,
    passk_advantages,
    rloo_advantages,
    whiten,
)
from alignment.algo.aggregation import aggregation_counts, loss_token_weights
from alignment.algo.corrections import off_policy_sequence_mask, off_policy_sums, rejection_keep, rejection_rules, rollout_correction
from alignment.algo.kl import kl_estimate, kl_penalized_rewards
from alignment.algo.loss import LossInputs, entropy_bonus, entropy_threshold, policy_loss
from alignment.algo.loss_settings import LossSettings
from alignment.algo.objectives import cispo_surrogate, clipped_surrogate, gmpo_surrogate, importance_ratio, sapo_surrogate
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
        loss, _ = policy_loss(logp, inputs, LossSettings(importance_sampling_level=level))
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
    settings = LossSettings(kl_loss_coeff=0.1)
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
        settings = LossSettings(kl_loss_coeff=0.1, use_bias_correction_kl=correction)
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


# Issue 34's variants


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("advantage, tau", [(2.0, 1.0), (-1.5, 1.05)])  # tau_pos for A > 0, tau_neg for A <= 0
def test_sapo_gate_hand_values(advantage, tau):
    log_ratios = [0.5, 0.0, -0.3]
    logp = paddle.to_tensor([log_ratios], stop_gradient=False)
    ratio = importance_ratio(logp, paddle.zeros([1, 3]), paddle.ones([1, 3]))
    loss, flags = sapo_surrogate(ratio, paddle.to_tensor([advantage]), 1.0, 1.05)
    loss.sum().backward()
    for t, x in enumerate(log_ratios):
        r, s = math.exp(x), _sigmoid(tau * (math.exp(x) - 1))
        assert float(loss[0, t]) == pytest.approx(-advantage * s * 4 / tau, rel=1e-6)
        # d/d log pi of -A f(r) = -A 4 s (1 - s) r: at r = 1 exactly -A, GRPO's gradient
        assert float(logp.grad[0, t]) == pytest.approx(-advantage * 4 * s * (1 - s) * r, rel=1e-5)
    assert float(logp.grad[0, 1]) == pytest.approx(-advantage, rel=1e-6)
    assert not any(flag.numpy().any() for flag in flags.values())


def test_gmpo_clips_token_log_ratios_by_the_sign_of_the_advantage_then_takes_the_geometric_mean():
    # log ratios 0.5, 0 and -0.5 on three loss tokens and 0.9 on padding; clip 0.4 both sides (the paper's e^-0.4, e^0.4)
    logp = paddle.to_tensor([[0.5, 0.0, -0.5, 0.9], [0.5, 0.0, -0.5, 0.9]], stop_gradient=False)
    mask = paddle.to_tensor([[1.0, 1.0, 1.0, 0.0]] * 2)
    loss, flags = gmpo_surrogate(logp - paddle.zeros([2, 4]), mask, paddle.to_tensor([1.0, -1.0]), 0.4, 0.4)
    # A > 0: min(x, clip(x)) = 0.4, 0, -0.5, mean -0.1 / 3; A < 0: max(x, clip(x)) = 0.5, 0, -0.4, mean 0.1 / 3
    np.testing.assert_allclose(loss.numpy(), [[-math.exp(-0.1 / 3)], [math.exp(0.1 / 3)]], rtol=1e-6)
    loss.sum().backward()
    g_pos, g_neg = -math.exp(-0.1 / 3) / 3, math.exp(0.1 / 3) / 3  # the clipped token and the padding get none
    np.testing.assert_allclose(logp.grad.numpy(), [[0.0, g_pos, g_pos, 0.0], [g_neg, g_neg, 0.0, 0.0]], rtol=1e-5)
    assert flags["clipped_high"].numpy().tolist() == [[True, False, False, True], [False] * 4]
    assert flags["clipped_low"].numpy().tolist() == [[False] * 4, [False, False, True, False]]
    assert flags["clipped"].numpy().tolist() == [[True, False, False, True], [False, False, True, False]]


def test_gmpo_damps_an_outlier_token_that_the_arithmetic_mean_follows():
    log_ratios = paddle.to_tensor([[2.0, 0.0, 0.0, 0.0]])  # one token 7.4x likelier, unclipped (clip 10)
    loss, _ = gmpo_surrogate(log_ratios, paddle.ones([1, 4]), paddle.to_tensor([1.0]), 10.0, 10.0)
    assert float(loss) == pytest.approx(-math.exp(0.5), rel=1e-6)  # against -(e^2 + 3) / 4 = -2.6 for the token mean


def test_bnpo_is_the_token_mean_of_each_micro_batch_averaged():
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=np.float32)
    counts = aggregation_counts(mask)
    # micro-batches of 2 rows: 4 tokens, then 1; each weighs 1/2 of the step
    expected = np.array([[1 / 8] * 3, [1 / 8, 0, 0], [1 / 2, 0, 0]]) * mask
    np.testing.assert_allclose(loss_token_weights(mask, "bnpo", 3, counts, micro_batch_size=2), expected, rtol=1e-6)
    np.testing.assert_allclose(loss_token_weights(mask, "bnpo", 3, counts, micro_batch_size=2, processes=2), expected / 2, rtol=1e-6)
    # one micro-batch in one process: dapo
    np.testing.assert_allclose(loss_token_weights(mask, "bnpo", 3, counts, micro_batch_size=3), loss_token_weights(mask, "dapo", 3, counts))


def test_off_policy_mask_drops_negative_sequences_that_drifted():
    logp = paddle.to_tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    # mean log pi_sampling - log pi over the loss tokens: 0.6, 0.2, 1.0, 0.6 (the last over its one loss token)
    sampling = paddle.to_tensor([[-0.4, -0.4], [-0.9, -0.7], [0.0, 0.0], [-0.4, 5.0]])
    mask = paddle.to_tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    kept = off_policy_sequence_mask(paddle.to_tensor([-1.0, -1.0, 1.0, 0.0]), logp, sampling, mask, 0.5)
    assert kept.numpy().tolist() == [[0.0], [1.0], [1.0], [1.0]]  # A >= 0 is always kept, however far it drifted


def test_off_policy_mask_touches_the_policy_term_not_the_kl():
    logp = paddle.to_tensor([[-1.0, -1.0]], stop_gradient=False)
    ref = paddle.to_tensor([[-2.0, -2.0]])  # k3 = e^-1 per token
    inputs = LossInputs(logp.detach(), paddle.to_tensor([-1.0]), paddle.to_tensor([[0.5, 0.5]]), paddle.ones([1, 2]), ref_logprobs=ref,
                        sampling_logprobs=paddle.to_tensor([[0.0, 0.0]]))  # drifted by 1 per token
    loss, sums = policy_loss(logp, inputs, LossSettings(kl_loss_coeff=0.1, off_policy_mask_threshold=0.5))
    assert float(loss) == pytest.approx(0.1 * math.exp(-1), rel=1e-6)  # the policy term (+1) is gone, the KL stays
    assert sums["off_policy_masked"] == 2.0
    loss, sums = policy_loss(logp, inputs, LossSettings(kl_loss_coeff=0.1, off_policy_mask_threshold=1.5))
    assert float(loss) == pytest.approx(1.0 + 0.1 * math.exp(-1), rel=1e-6) and sums["off_policy_masked"] == 0.0


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


@pytest.mark.parametrize("options, thresholds, kept", [
    # log pi_old - log pi_rollout = 0, 1, -1 on the three loss tokens of one sequence, 3 on its padding
    ("token_k1", "0.5_2.0", [1, 0, 0]),  # k1 = -x must lie in [log 0.5, log 2]
    ("token", "2.0", [1, 0, 0]),  # one number u: [1/u, u]
    ("token_k2", "0.4", [1, 0, 0]),  # x^2 / 2 = 0, 0.5, 0.5
    ("token_k3", "0.5", [1, 0, 1]),  # e^x - 1 - x = 0, 0.718, 0.368
    ("geometric", "0.9_1.1", [1, 1, 1]),  # the mean of -x is 0
    ("sequence", "2.0", [1, 1, 1]),  # the sum of -x is 0
    ("seq_sum_k3", "1.0", [0, 0, 0]),  # 1.086 > 1
    ("seq_mean_k3", "0.4", [1, 1, 1]),  # 0.362
    ("seq_max_k2", "0.4", [0, 0, 0]),  # 0.5
    ("seq_mean_k2,token_k3", "0.4,0.5", [1, 0, 1]),  # both must pass: 0.333 <= 0.4, and token_k3's
])
def test_rejection_sampling_options_hand_values(options, thresholds, kept):
    old = np.array([[-1.0, -1.0, -1.0, 2.0]])
    rollout = np.array([[-1.0, -2.0, 0.0, -1.0]])
    mask = np.array([[1.0, 1.0, 1.0, 0.0]])
    keep = rejection_keep(old, rollout, mask, rejection_rules(options, thresholds))
    assert (keep * mask)[0, :3].tolist() == kept


@pytest.mark.parametrize("options, thresholds, message", [
    ("token_k2", "0.5_2", "only the k1 options take lower_upper"),
    ("token_k1,seq_sum_k3", "1,2,3", "gives 3 thresholds for 2 options"),
    ("token_k4", "1", "must be one of token_k1, token_k2"),
    ("token_k1", "two", "'two' for token_k1 is not a number"),
    ("token_k1", "2_1", "lower <= upper"),
])
def test_rejection_sampling_refuses_what_it_cannot_read(options, thresholds, message):
    with pytest.raises(ValueError, match=message):
        rejection_rules(options, thresholds)


def test_off_policy_sums_hand_values():
    old, rollout = np.array([[0.0, math.log(2.0)], [0.0, 0.0]]), np.zeros((2, 2))
    weights, mask = np.array([[1.0, 2.0], [1.0, 1.0]]), np.array([[1.0, 1.0], [1.0, 0.0]])
    sums = off_policy_sums(old, rollout, weights, mask)
    assert sums == pytest.approx({"tokens": 3, "weight": 4, "weight_squared": 6, "rho_squared": 6, "sequences": 2,
                                  "rho_squared_sequence": 4 + 1})
    # effective sample size 16 / (3 x 6) = 0.889, chi2 per token 6 / 3 - 1 = 1, per sequence 5 / 2 - 1 = 1.5


@pytest.mark.parametrize("rewards, scale, expected", [
    ([0.2, 1.0, 0.5, 0.0], "none", [0.0, 0.5, 0.0, 0.0]),  # the best gets best - second best
    ([0.2, 1.0, 0.5, 0.0], "group", [0.0, 0.5 / (math.sqrt(0.5675 / 3) + 1e-6), 0.0, 0.0]),  # over the group's sample std
    ([0.0, 1.0, 1.0, 0.0], "group", [0.0] * 4),  # two right answers: the best's marginal value is 0
    ([np.nan, 1.0, np.nan, 0.0], "none", [0.0, 1.0, 0.0, 0.0]),  # failed members are not candidates
    ([np.nan, np.nan, np.nan, 1.0], "none", [0.0] * 4),  # one valid member: nothing to compare
])
def test_passk_advantages_hand_values(rewards, scale, expected):
    np.testing.assert_allclose(passk_advantages(np.array(rewards), 4, scale), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("rewards, lengths, expected", [
    ([1.0, 0.0, 1.0, 0.0], [1, 3, 2, 2], [5 / 8, -3 / 8, 5 / 8, -3 / 8]),  # baseline (1 + 2) / 8: long answers weigh more
    ([1.0, 0.0, 1.0, 0.0], [2, 2, 2, 2], [0.5, -0.5, 0.5, -0.5]),  # equal lengths: the group mean
    ([1.0, np.nan, 0.0, 0.0], [1, 5, 1, 2], [0.75, 0.0, -0.25, -0.25]),  # a failed member is out of the baseline
    ([np.nan, np.nan, 0.5, np.nan], [1, 1, 1, 1], [0.0, 0.0, 0.5, 0.0]),  # one valid member: baseline 0, as verl
])
def test_opo_advantages_hand_values(rewards, lengths, expected):
    np.testing.assert_allclose(opo_advantages(np.array(rewards), 4, np.array(lengths)), expected, rtol=1e-6)
