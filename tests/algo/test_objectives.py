"""The surrogates and importance ratios (alignment/algo/objectives.py's registries) against hand-computed values and
their gradients: PPO's clip with clip-higher and dual clip, GSPO's sequence ratio, CISPO, SAPO's gate, GMPO's
geometric mean."""

import math

import numpy as np
import paddle
import pytest

from alignment.algo.corrections import rollout_correction
from alignment.algo.loss import LossInputs, policy_loss
from alignment.algo.loss_settings import LossSettings
from alignment.algo.objectives import cispo_surrogate, clipped_surrogate, gmpo_surrogate, importance_ratio, sapo_surrogate


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


def test_a_sequence_ratio_counts_only_its_loss_tokens():
    old, rollout = paddle.to_tensor([[-1.0, -1.0, -1.0]]), paddle.to_tensor([[-1.0, -1.5, -2.0]])
    weights, _ = rollout_correction(old, rollout, paddle.to_tensor([[1.0, 1.0, 0.0]]), "sequence_truncate", 5.0)
    np.testing.assert_allclose(weights.numpy(), [[math.exp(0.5)] * 3], rtol=1e-6)
    with pytest.raises(ValueError, match="token_truncate, token_mask, sequence_truncate, sequence_mask, not 'token'"):
        rollout_correction(old, rollout, paddle.ones([1, 3]), "token")


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
