"""Issue 19's variants against TRL's and verl's own code on one fixed batch (the hf group: make test-hf).

tests/helpers/trl_verl_side.py runs in GRPO_TORCH_PYTHON's interpreter (.venv-torch: TRL 1.16.0, verl 0.9.1): TRL's
GRPOTrainer._compute_loss in a real trainer whose forward pass returns this batch's log-probs and entropies,
verl's policy losses, advantage estimators and rollout correction. Here the same batch goes through
alignment/algo/ in paddle; the losses, their gradients with respect to the log-probs (and the entropies),
the advantages and the weights must agree to float32 rounding. Where the definitions differ, the comment of
each case says how the two are set to mean the same thing (docs/architecture.md, "GRPO variants").
"""

import os
import subprocess
from pathlib import Path

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
from alignment.algo.corrections import (
    off_policy_diagnostics,
    off_policy_sums,
    rejection_counts,
    rejection_keep,
    rejection_rules,
    rollout_correction,
)
from alignment.algo.kl import kl_estimate, kl_penalized_rewards
from alignment.algo.loss import LossInputs, entropy_bonus, entropy_threshold, policy_loss
from alignment.algo.loss_settings import LossSettings
from alignment.algo.stats import whitening_sums

REPO = Path(__file__).resolve().parents[2]
TORCH_PYTHON = os.environ.get("GRPO_TORCH_PYTHON")
pytestmark = [
    pytest.mark.hf,
    pytest.mark.skipif(not TORCH_PYTHON, reason="set GRPO_TORCH_PYTHON to a Python with torch, TRL and verl, e.g. make test-hf"),
]
B, T, G = 6, 5, 3
# verl's rollout_rs options with their thresholds (tests/helpers/trl_verl_side.py runs verl's on the same)
VERL_REJECTIONS = {
    "token_k1": "0.5_2.0", "token_k2": "0.1", "token_k3": "0.1", "seq_sum_k1": "0.3_3.0", "seq_sum_k3": "0.5", "seq_mean_k1": "0.8_1.25",
    "seq_mean_k2": "0.1", "seq_max_k2": "0.3", "seq_max_k3": "0.3", "token_k2,seq_mean_k3": "0.2,0.1",
}


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
        "passk_rewards": np.array([0.2, 1.0, 0.5, 0.0, 0.7, 0.3]),  # a distinct best in each group (ties would give 0)
        # d = log pi_ref - log pi from -25 to 25: low_var_kl's clamps act at both ends
        "kl_logp": -np.abs(rng.normal(2.0, 1.0, size=(B, T))),
        "kl_ref": np.linspace(-25, 25, B * T).reshape(B, T),
        "columns": np.array([[1.0, 0.0, 1.0, 0.0, 1.0, 1.0], [0.2, 0.0, 0.0, 0.2, 0.2, 0.0]]),
        "column_weights": np.array([1.0, 0.5]),
    }
    batch["kl_ref"] = batch["kl_ref"] + batch["kl_logp"]
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
        [TORCH_PYTHON, str(REPO / "tests/helpers/trl_verl_side.py"), str(folder / "batch.npz"), str(folder / "out.npz"),
         str(REPO / "data/tiny-qwen2")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return batch, dict(np.load(folder / "out.npz"))


def ours(
    batch: dict, settings: LossSettings, loss_type: str, importance: bool = False, selection: float = 1.0, entropy_coeff: float = 0.0,
    micro_batch_size: int | None = None,
) -> dict:
    """The trainer's loss on the batch, its token weights for micro-batches of micro_batch_size rows (None: one), the
    engine's log-probs being the batch's rollout ones -> loss, gradient of the log-probs and of the entropies."""
    mask = batch["mask"]
    logp = paddle.to_tensor(batch["logp"], stop_gradient=False)
    entropy = paddle.to_tensor(batch["entropy"], stop_gradient=False)
    weights = loss_token_weights(mask, loss_type, T, aggregation_counts(mask), micro_batch_size)
    selected = None
    if selection < 1:
        threshold = entropy_threshold(batch["entropy"][mask > 0], selection)
        selected = ((batch["entropy"] >= threshold) & (mask > 0)).astype(np.float32)
    inputs = LossInputs(
        paddle.to_tensor(batch["old"]), paddle.to_tensor(batch["advantages"]), paddle.to_tensor(weights), paddle.to_tensor(mask),
        paddle.to_tensor(batch["is_weights"]) if importance else None, paddle.to_tensor(batch["ref"]),
        None if selected is None else paddle.to_tensor(selected), paddle.to_tensor(batch["rollout"]),
    )
    loss, sums = policy_loss(logp, inputs, settings)
    if entropy_coeff:
        effective = mask if selected is None else selected
        loss = loss + entropy_bonus(entropy, effective, effective.sum(), entropy_coeff)
    loss.backward()
    return {"loss": float(loss), "grad_logp": logp.grad.numpy(), "grad_entropy": None if entropy.grad is None else entropy.grad.numpy(),
            "sums": sums}


# case -> (our LossSettings, loss_type, importance weights, entropy selection quantile, entropy_coeff); TRL's keys in
# tests/helpers/trl_verl_side.py
TRL = {
    # delta = our dual_clip_ratio; the importance weights are ours (token_truncate, cap 2), given to TRL as vLLM's
    "trl_dapo_delta_bias_corrected_kl_is": (
        LossSettings(0.2, 0.28, 3.0, kl_loss_coeff=0.05, use_bias_correction_kl=True), "dapo", True, 1.0, 0.0
    ),
    "trl_grpo_gspo": (LossSettings(3e-4, 4e-4, importance_sampling_level="sequence"), "grpo", False, 1.0, 0.0),
    "trl_dr_grpo_kl": (LossSettings(0.2, 0.2, kl_loss_coeff=0.05), "dr_grpo", False, 1.0, 0.0),
    # TRL's cispo: the weight min(r, epsilon_high = 5); ours clip(r, 1 - 1, 1 + 4), aggregated as dapo
    "trl_cispo": (LossSettings(1.0, 4.0, surrogate="cispo"), "dapo", False, 1.0, 0.0),
    "trl_cispo_gspo": (LossSettings(1.0, 4.0, surrogate="cispo", importance_sampling_level="sequence"), "dapo", False, 1.0, 0.0),
    "trl_dapo_entropy_selection_and_bonus": (LossSettings(0.2, 0.2), "dapo", False, 0.5, 0.05),
    # TRL's loss_type sapo: our surrogate sapo, aggregated per sequence as TRL's is (loss_type grpo)
    "trl_sapo": (LossSettings(surrogate="sapo"), "grpo", False, 1.0, 0.0),
    "trl_sapo_hot": (LossSettings(surrogate="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=3.0), "grpo", False, 1.0, 0.0),
    # TRL's bnpo over two micro-batches of 3 rows (gradient accumulation 2): each micro-batch's own token mean
    "trl_bnpo_two_micro_batches": (LossSettings(0.2, 0.2), "bnpo", False, 1.0, 0.0),
    # the engine's log-probs are the batch's rollout ones on both sides (TRL's sampling_per_token_logps)
    "trl_dapo_off_policy_mask": (LossSettings(0.2, 0.2, off_policy_mask_threshold=0.0), "dapo", False, 1.0, 0.0),
}
TRL_MICRO_BATCH_SIZE = {"trl_bnpo_two_micro_batches": 3}
VERL = {
    # verl's loss_agg_mode: token-mean is our dapo, seq-mean-token-mean our grpo
    "verl_gspo_seq_mean_token_mean": (LossSettings(3e-4, 4e-4, importance_sampling_level="sequence"), "grpo"),
    "verl_gspo_token_mean": (LossSettings(3e-4, 4e-4, importance_sampling_level="sequence"), "dapo"),
    "verl_cispo_token_mean": (LossSettings(0.2, 0.28, surrogate="cispo"), "dapo"),
    "verl_cispo_seq_mean_token_mean": (LossSettings(0.2, 0.28, surrogate="cispo"), "grpo"),
    "verl_sapo": (LossSettings(surrogate="sapo"), "grpo"),  # verl aggregates sapo per sequence whatever loss_agg_mode says
    # geo_mean: the mean over sequences of per-sequence losses, our loss_type grpo; the clip bounds in log space
    "verl_geo_mean": (LossSettings(0.4, 0.4, surrogate="gmpo"), "grpo"),
    "verl_geo_mean_narrow": (LossSettings(0.05, 0.1, surrogate="gmpo"), "grpo"),
}


@pytest.mark.parametrize("case", list(TRL))
def test_losses_and_gradients_equal_trls(sides, case):
    batch, theirs = sides
    settings, loss_type, importance, selection, entropy_coeff = TRL[case]
    got = ours(batch, settings, loss_type, importance, selection, entropy_coeff, TRL_MICRO_BATCH_SIZE.get(case))
    assert np.abs(got["grad_logp"]).max() > 1e-3  # the case trains something
    if settings.off_policy_mask_threshold is not None:  # the mask drops some sequences and keeps others
        assert 0 < got["sums"]["off_policy_masked"] < batch["mask"].sum()
    np.testing.assert_allclose(got["loss"], theirs[f"{case}/loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["grad_logp"], theirs[f"{case}/grad_logp"], rtol=1e-4, atol=1e-7)
    if entropy_coeff:
        np.testing.assert_allclose(got["grad_entropy"], theirs[f"{case}/grad_entropy"], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("case", list(VERL))
def test_losses_and_gradients_equal_verls(sides, case):
    batch, theirs = sides
    settings, loss_type = VERL[case]
    got = ours(batch, LossSettings(**{**settings.__dict__, "kl_loss_coeff": 0.0}), loss_type)
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


# verl's names -> ours: kl and mse are k1 and k2; verl's k3 clamps as its low_var_kl does (ours is TRL's and the GRPO
# paper's, unclamped: tests/algo/test_kl.py), so verl's k3 and k3+ are our low_var_kl and low_var_kl+
VERL_KL_NAMES = {"kl": "k1", "mse": "k2", "k3": "low_var_kl", "k3+": "low_var_kl+"}


@pytest.mark.parametrize("name", ["kl", "k1", "mse", "k2", "k3", "low_var_kl", "abs", "k1+", "k3+", "low_var_kl+"])
def test_kl_estimators_equal_verls(sides, name):
    batch, theirs = sides
    logp = paddle.to_tensor(batch["kl_logp"], stop_gradient=False)
    kl = kl_estimate(logp, paddle.to_tensor(batch["kl_ref"]), VERL_KL_NAMES.get(name, name))
    (kl * paddle.to_tensor(batch["mask"])).sum().backward()
    np.testing.assert_allclose(kl.numpy(), theirs[f"verl_kl_{name}/values"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp.grad.numpy(), theirs[f"verl_kl_{name}/grad_logp"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["kl", "low_var_kl"])
def test_kl_in_the_reward_equals_verls(sides, name):
    """verl's apply_kl_penalty then its grpo advantages; the trainer's log-probs of the sampling policy are old here."""
    batch, theirs = sides
    mask = batch["mask"]
    rewards, _ = kl_penalized_rewards(batch["rewards"], batch["old"], batch["ref"], mask, 0.1, VERL_KL_NAMES.get(name, name))
    np.testing.assert_allclose(
        group_advantages(rewards, G)[:, None] * mask, theirs[f"verl_kl_in_reward_{name}/advantages"], rtol=1e-5, atol=1e-6
    )


def test_passk_and_opo_advantages_equal_verls(sides):
    batch, theirs = sides
    mask = batch["mask"]
    for scale in ("group", "none"):
        got = passk_advantages(batch["passk_rewards"].astype(np.float64), G, scale)
        assert np.count_nonzero(got) == B // G  # one best per group
        np.testing.assert_allclose(got[:, None] * mask, theirs[f"verl_grpo_passk_{scale}/advantages"], rtol=1e-5, atol=1e-6)
    got = opo_advantages(batch["rewards"].astype(np.float64), G, mask.sum(axis=1))
    np.testing.assert_allclose(got[:, None] * mask, theirs["verl_opo/advantages"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", list(VERL_REJECTIONS))
def test_rejection_sampling_equals_verls(sides, options):
    batch, theirs = sides
    mask = batch["mask"]
    keep = rejection_keep(batch["old"], batch["rollout"], mask, rejection_rules(options, VERL_REJECTIONS[options]))
    np.testing.assert_array_equal(keep * mask, theirs[f"verl_rs_{options}/mask"])
    tokens, rejected, sequences, rejected_sequences = rejection_counts(mask, keep)
    assert 0 < rejected < tokens or 0 < rejected_sequences < sequences or options == "seq_mean_k1"  # each rejects some, not all
    assert rejected / tokens == pytest.approx(float(theirs[f"verl_rs_{options}/masked_fraction"]), rel=1e-6)
    assert rejected_sequences / sequences == pytest.approx(float(theirs[f"verl_rs_{options}/seq_masked_fraction"]), rel=1e-6)


def test_off_policy_diagnostics_equal_verls(sides):
    batch, theirs = sides
    got = off_policy_diagnostics(off_policy_sums(batch["old"], batch["rollout"], batch["is_weights"], batch["mask"]))
    for name in ("chi2_token", "chi2_seq", "eff_sample_size"):
        assert got[name] == pytest.approx(float(theirs[f"verl_offpolicy/{name}"]), rel=1e-5), name
