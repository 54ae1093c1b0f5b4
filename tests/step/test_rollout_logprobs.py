"""use_rollout_logprobs (alignment/step/update.py): before several optimizer steps, the rollout engine's log-probs are
the old policy's, and the trainer's pass that would recompute them does not run."""

import copy
import dataclasses

import numpy as np
import paddle
import pytest
from helpers.tiny_models import two_sampled_groups

import alignment.step.update as update
from alignment.config.cli import load_config
from alignment.parallel.distributed import World
from alignment.run.build import update_settings
from alignment.step.records import ScoredBatch
from alignment.step.update import Learner, update_policy

FIXED_LOGPROBS = update.fixed_logprobs  # the real pass, which the tests wrap to count its calls
ADVANTAGES = np.linspace(-1.5, 1.5, 8, dtype=np.float32)  # the first prompt's four rows negative, the second's positive


@pytest.fixture(scope="module")
def setup():
    return two_sampled_groups(model_seed=6, sample_seed=7, max_new_tokens=6)  # temperature 1, as config/tiny's


def _update(setup, rollout, advantages: np.ndarray, monkeypatch, *keys: str) -> tuple:
    """Two optimizer steps (mini-batches of 4 rows: one prompt each, in order) of SGD
    -> (the parameters' change, how many times the trainer's old log-prob pass ran)."""
    tokenizer, model, prompts, _ = setup
    config = load_config([
        "config/tiny/grpo_argument.json", "--rollout_n", "4", "--per_device_prompt_batch_size", "2",
        "--per_device_train_batch_size", "2", "--mini_batch_size", "4", "--loss_type", "grpo",
        "--importance_sampling_correction", "false", *keys,
    ])
    rows = len(advantages)  # the advantages given, so no rewards are scored
    scored = ScoredBatch(prompts, rollout, [""] * rows, np.zeros(rows), {}, [None] * rows, np.zeros(rows, bool), advantages)
    passes = []
    monkeypatch.setattr(update, "fixed_logprobs", lambda *args: passes.append(1) or FIXED_LOGPROBS(*args))
    policy = copy.deepcopy(model)
    before = [p.numpy().copy() for p in policy.parameters()]
    learner = Learner(policy, None, paddle.optimizer.SGD(0.5, parameters=policy.parameters()))
    update_policy(learner, scored, update_settings(config), World(0, 1), tokenizer.pad_token_id, step=1)
    return [p.numpy() - b for p, b in zip(policy.parameters(), before)], len(passes)


def test_the_engines_logprobs_stand_for_the_recomputed_ones_without_the_pass(setup, monkeypatch):
    rollout = setup[3]
    recomputed, passes = _update(setup, rollout, ADVANTAGES, monkeypatch)
    assert passes == 1
    bypassed, passes = _update(setup, rollout, ADVANTAGES, monkeypatch, "--use_rollout_logprobs", "true")
    assert passes == 0
    assert max(float(np.abs(d).max()) for d in recomputed) > 1e-3, "the update should move the weights"
    for b, r in zip(bypassed, recomputed):  # the eager engine's log-probs are the trainer's, to float32 rounding
        np.testing.assert_allclose(b, r, rtol=1e-4, atol=2e-6)


def test_the_ratio_is_taken_against_the_engines_logprobs(setup, monkeypatch):
    """An engine 0.5 nats more sure of every sampled token: the ratio is e^-0.5 = 0.61, below the clip's 0.8. The first
    prompt's rows (A < 0) are clipped, so no gradient and no change before the second mini-batch; the second's (A > 0)
    keep the unclipped 0.61 A grad log pi. That is the on-policy update with advantages (0, 0, 0, 0, 0.61 A)."""
    rollout = setup[3]
    shifted = dataclasses.replace(rollout, logprobs=rollout.logprobs + 0.5 * rollout.completion_mask)
    bypassed, _ = _update(setup, shifted, ADVANTAGES, monkeypatch, "--bypass_mode", "true")
    expected_advantages = np.where(ADVANTAGES > 0, np.exp(-0.5) * ADVANTAGES, 0).astype(np.float32)
    expected, _ = _update(setup, rollout, expected_advantages, monkeypatch)
    assert max(float(np.abs(d).max()) for d in expected) > 1e-3, "the second mini-batch should move the weights"
    for b, e in zip(bypassed, expected):
        np.testing.assert_allclose(b, e, rtol=1e-4, atol=2e-6)
