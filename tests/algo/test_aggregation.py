"""The loss aggregations (alignment/algo/aggregation.py's registry) against hand-computed values: the token weights of
dapo, grpo, dr_grpo and BNPO's per-micro-batch mean."""


import numpy as np
import paddle
import pytest

from alignment.algo.aggregation import aggregation_counts, loss_token_weights
from alignment.algo.loss import LossInputs, policy_loss
from alignment.algo.loss_settings import LossSettings


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


def test_bnpo_is_the_token_mean_of_each_micro_batch_averaged():
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=np.float32)
    counts = aggregation_counts(mask)
    # micro-batches of 2 rows: 4 tokens, then 1; each weighs 1/2 of the step
    expected = np.array([[1 / 8] * 3, [1 / 8, 0, 0], [1 / 2, 0, 0]]) * mask
    np.testing.assert_allclose(loss_token_weights(mask, "bnpo", 3, counts, micro_batch_size=2), expected, rtol=1e-6)
    np.testing.assert_allclose(loss_token_weights(mask, "bnpo", 3, counts, micro_batch_size=2, processes=2), expected / 2, rtol=1e-6)
    # one micro-batch in one process: dapo
    np.testing.assert_allclose(loss_token_weights(mask, "bnpo", 3, counts, micro_batch_size=3), loss_token_weights(mask, "dapo", 3, counts))
