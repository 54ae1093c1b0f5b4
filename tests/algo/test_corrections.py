"""The rollout corrections and rejections (alignment/algo/corrections.py's registries) against hand values: truncated
importance weights and the correction modes, DeepSeek-V3.2's off-policy sequence mask, rollout rejection sampling
and its diagnostics."""

import math

import numpy as np
import paddle
import pytest

from alignment.algo.corrections import off_policy_sequence_mask, off_policy_sums, rejection_keep, rejection_rules, rollout_correction
from alignment.algo.loss import LossInputs, policy_loss
from alignment.algo.loss_settings import LossSettings


def test_truncated_importance_weights_hand_values():
    old = paddle.to_tensor([[-1.0, -1.0, -1.0]])
    rollout = paddle.to_tensor([[-1.0, -1.5, -2.0]])  # pi_old / pi_rollout = 1, e^.5 = 1.65, e = 2.72
    weights, capped = rollout_correction(old, rollout, paddle.ones([1, 3]), "token_truncate", cap=2.0)
    np.testing.assert_allclose(weights.numpy(), [[1.0, math.exp(0.5), 2.0]], rtol=1e-6)
    assert capped.numpy().tolist() == [[False, False, True]]


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
