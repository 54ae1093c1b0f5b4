"""Issue 19's variants against TRL's and verl's own code on one fixed batch (the hf group: make test-hf).

tests/trl_verl_side.py runs in GRPO_TORCH_PYTHON's interpreter (.venv-torch: TRL 1.16.0, verl 0.9.1): TRL's
GRPOTrainer._compute_loss in a real trainer whose forward pass returns this batch's log-probs and entropies,
verl's policy losses, advantage estimators and rollout correction. Here the same batch goes through
alignment/algo/ in paddle; the losses, their gradients with respect to the log-probs (and the entropies),
the advantages and the weights must agree to float32 rounding. Where the definitions differ, the comment of
each case says how the two are set to mean the same thing (README, "GRPO variants").
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import paddle
import pytest

from alignment.algo.advantages import baseline_subtracted, group_advantages, normalized_per_function, rloo_advantages, whiten
from alignment.algo.aggregation import aggregation_counts, loss_token_weights
from alignment.algo.corrections import rollout_correction
from alignment.algo.loss import LossInputs, LossSettings, entropy_bonus, entropy_threshold, policy_loss
from alignment.algo.stats import whitening_sums

REPO = Path(__file__).resolve().parents[1]
TORCH_PYTHON = os.environ.get("GRPO_TORCH_PYTHON")
pytestmark = [
    pytest.mark.hf,
    pytest.mark.skipif(not TORCH_PYTHON, reason="set GRPO_TORCH_PYTHON to a Python with torch, TRL and verl, e.g. make test-hf"),
]
B, T, G = 6, 5, 3


def make_batch() -> dict:
    rng = np.random.default_rng(19)
    lengths = np.array([5, 2, 4, 1, 3, 5])  # ragged, every row with a loss token (TRL's grpo then equals ours)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    logp = -np.abs(rng.normal(1.5, 0.6, size=(B, T)))
    # rows 1 and 5 on-policy, row 3 barely off it: under GSPO's 3e-4 clip some sequences stay unclipped
    drift = np.array([0.15, 0.0, 0.15, 1e-4, 0.15, 0.0])[:, None]
    old = logp + rng.normal(size=(B, T)) * drift
    batch = {
        "mask": mask,
        "logp": logp,
        "old": old,
        "ref": logp + rng.normal(0, 0.3, size=(B, T)),
        "rollout": old + rng.normal(0, 0.5, size=(B, T)),
        "entropy": rng.uniform(0.1, 3.0, size=(B, T)),
        "advantages": rng.normal(size=B),
        "rewards": np.array([1.0, 0.0, 1.0, 0.5, 0.5, 0.0]),
        "columns": np.array([[1.0, 0.0, 1.0, 0.0, 1.0, 1.0], [0.2, 0.0, 0.0, 0.2, 0.2, 0.0]]),
        "column_weights": np.array([1.0, 0.5]),
    }
    batch = {name: value.astype(np.float32) for name, value in batch.items()}
    batch["is_weights"] = rollout_correction(
        *(paddle.to_tensor(batch[k]) for k in ("old", "rollout", "mask")), "token_truncate", 2.0
    )[0].numpy()
    batch["group_size"] = np.array(G)
    return batch


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trl_verl")
    batch = make_batch()
    np.savez(folder / "batch.npz", **batch)
    done = subprocess.run(
        [TORCH_PYTHON, str(REPO / "tests/trl_verl_side.py"), str(folder / "batch.npz"), str(folder / "out.npz"),
         str(REPO / "data/tiny-qwen2")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return batch, dict(np.load(folder / "out.npz"))


def ours(
    batch: dict, settings: LossSettings, loss_type: str, importance: bool = False, selection: float = 1.0, entropy_coeff: float = 0.0
) -> dict:
    """The trainer's loss on the batch as one micro-batch -> loss, gradient of the log-probs and of the entropies."""
    mask = batch["mask"]
    logp = paddle.to_tensor(batch["logp"], stop_gradient=False)
    entropy = paddle.to_tensor(batch["entropy"], stop_gradient=False)
    weights = loss_token_weights(mask, loss_type, T, aggregation_counts(mask))
    selected = None
    if selection < 1:
        threshold = entropy_threshold(batch["entropy"][mask > 0], selection)
        selected = ((batch["entropy"] >= threshold) & (mask > 0)).astype(np.float32)
    inputs = LossInputs(
        paddle.to_tensor(batch["old"]), paddle.to_tensor(batch["advantages"]), paddle.to_tensor(weights), paddle.to_tensor(mask),
        paddle.to_tensor(batch["is_weights"]) if importance else None, paddle.to_tensor(batch["ref"]),
        None if selected is None else paddle.to_tensor(selected),
    )
    loss, _ = policy_loss(logp, inputs, settings)
    if entropy_coeff:
        effective = mask if selected is None else selected
        loss = loss + entropy_bonus(entropy, effective, effective.sum(), entropy_coeff)
    loss.backward()
    return {"loss": float(loss), "grad_logp": logp.grad.numpy(), "grad_entropy": None if entropy.grad is None else entropy.grad.numpy()}


# case -> (our LossSettings, loss_type, importance weights, entropy selection quantile, entropy_coeff); TRL's keys in
# tests/trl_verl_side.py
TRL = {
    # delta = our dual_clip_ratio; the importance weights are ours (token_truncate, cap 2), given to TRL as vLLM's
    "trl_dapo_delta_bias_corrected_kl_is": (LossSettings(0.2, 0.28, 3.0, kl_coeff=0.05, kl_bias_correction=True), "dapo", True, 1.0, 0.0),
    "trl_grpo_gspo": (LossSettings(3e-4, 4e-4, level="sequence"), "grpo", False, 1.0, 0.0),
    "trl_dr_grpo_kl": (LossSettings(0.2, 0.2, kl_coeff=0.05), "dr_grpo", False, 1.0, 0.0),
    # TRL's cispo: the weight min(r, epsilon_high = 5); ours clip(r, 1 - 1, 1 + 4), aggregated as dapo
    "trl_cispo": (LossSettings(1.0, 4.0, surrogate="cispo"), "dapo", False, 1.0, 0.0),
    "trl_cispo_gspo": (LossSettings(1.0, 4.0, surrogate="cispo", level="sequence"), "dapo", False, 1.0, 0.0),
    "trl_dapo_entropy_selection_and_bonus": (LossSettings(0.2, 0.2), "dapo", False, 0.5, 0.05),
}
VERL = {
    # verl's loss_agg_mode: token-mean is our dapo, seq-mean-token-mean our grpo
    "verl_gspo_seq_mean_token_mean": (LossSettings(3e-4, 4e-4, level="sequence"), "grpo"),
    "verl_gspo_token_mean": (LossSettings(3e-4, 4e-4, level="sequence"), "dapo"),
    "verl_cispo_token_mean": (LossSettings(0.2, 0.28, surrogate="cispo"), "dapo"),
    "verl_cispo_seq_mean_token_mean": (LossSettings(0.2, 0.28, surrogate="cispo"), "grpo"),
}


@pytest.mark.parametrize("case", list(TRL))
def test_losses_and_gradients_equal_trls(sides, case):
    batch, theirs = sides
    settings, loss_type, importance, selection, entropy_coeff = TRL[case]
    got = ours(batch, settings, loss_type, importance, selection, entropy_coeff)
    assert np.abs(got["grad_logp"]).max() > 1e-3  # the case trains something
    np.testing.assert_allclose(got["loss"], theirs[f"{case}/loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["grad_logp"], theirs[f"{case}/grad_logp"], rtol=1e-4, atol=1e-7)
    if entropy_coeff:
        np.testing.assert_allclose(got["grad_entropy"], theirs[f"{case}/grad_entropy"], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("case", list(VERL))
def test_losses_and_gradients_equal_verls(sides, case):
    batch, theirs = sides
    settings, loss_type = VERL[case]
    got = ours(batch, LossSettings(**{**settings.__dict__, "kl_coeff": 0.0}), loss_type)
    assert np.abs(got["grad_logp"]).max() > 1e-3
    np.testing.assert_allclose(got["loss"], theirs[f"{case}/loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["grad_logp"], theirs[f"{case}/grad_logp"], rtol=1e-4, atol=1e-7)


def test_advantage_estimators_equal_verls(sides):
    batch, theirs = sides
    rewards, mask = batch["rewards"].astype(np.float64), batch["mask"]
    tokens = mask.sum(axis=1)
    expected = {
        "verl_grpo": group_advantages(rewards, G, "group"),
        "verl_rloo": rloo_advantages(rewards, G),
        "verl_reinforce_plus_plus": whiten(rewards, whitening_sums(rewards, tokens)),
        "verl_reinforce_plus_plus_baseline": whiten(
            baseline_subtracted(rewards, G), whitening_sums(baseline_subtracted(rewards, G), tokens)
        ),
    }
    for name, values in expected.items():
        np.testing.assert_allclose(values[:, None] * mask, theirs[f"{name}/advantages"], rtol=1e-5, atol=1e-6, err_msg=name)
    combined = normalized_per_function(list(batch["columns"].astype(np.float64)), batch["column_weights"].tolist(), G)
    np.testing.assert_allclose(
        whiten(combined, whitening_sums(combined, np.ones(B))), theirs["verl_gdpo/advantages"], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("kind", ["truncate", "mask"])
def test_rollout_correction_equals_verls(sides, level, kind):
    """verl's rollout_is level with a number (truncation at it) or "lower_upper" (IcePop: zero outside)."""
    batch, theirs = sides
    floor = 0.5 if kind == "mask" else None
    weights, outside = rollout_correction(*(paddle.to_tensor(batch[k]) for k in ("old", "rollout", "mask")), f"{level}_{kind}", 2.0, floor)
    assert outside.numpy()[batch["mask"] > 0].any()  # the cap or the floor acts somewhere
    np.testing.assert_allclose(weights.numpy() * batch["mask"], theirs[f"verl_{level}_{kind}/weights"], rtol=1e-5, atol=1e-7)
