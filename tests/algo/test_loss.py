"""policy_loss (alignment/algo/loss.py): what the importance weights, the entropy selection and the entropy bonus touch,
and every loss variant's gradient, which depends neither on the micro-batch size nor on the number of processes; the
log-probs and entropies it reads (alignment/algo/logprobs.py) against float64."""

import math

import numpy as np
import paddle
import pytest

from alignment.algo.aggregation import aggregation_counts, loss_token_weights
from alignment.algo.corrections import rollout_correction
from alignment.algo.logprobs import token_entropy, token_logprobs
from alignment.algo.loss import LossInputs, entropy_bonus, entropy_threshold, policy_loss
from alignment.algo.loss_settings import LossSettings


def test_importance_weights_scale_the_policy_term_only():
    logp = paddle.to_tensor([[-1.0, -1.0]])
    mask = paddle.to_tensor([[1.0, 1.0]])
    weights = paddle.to_tensor([[0.5, 0.5]])
    ref = paddle.to_tensor([[-2.0, -1.0]])  # k3: e^-1 - (-1) - 1 = e^-1, and 0
    inputs = LossInputs(logp, paddle.to_tensor([1.0]), weights, mask, importance_weights=paddle.to_tensor([[2.0, 0.5]]), ref_logprobs=ref)
    loss, sums = policy_loss(logp, inputs, LossSettings(kl_loss_coeff=0.1))
    assert float(loss) == pytest.approx(0.5 * (-2.0 - 0.5) + 0.5 * 0.1 * math.exp(-1), rel=1e-6)
    assert sums["kl"] == pytest.approx(math.exp(-1), rel=1e-6)


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
