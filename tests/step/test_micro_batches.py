"""The update's micro-batches (alignment/step/micro_batches.py): rows longest first, each micro-batch cut to its own
longest completion, and the same update as one micro-batch over the whole padded batch."""

import copy
import dataclasses

import numpy as np
import paddle
import pytest
from helpers.tiny_models import two_sampled_groups

import alignment.step.update as update
from alignment.config.cli import load_config
from alignment.parallel.distributed import World
from alignment.rewards import register_reward
from alignment.run.build import scoring_settings, update_settings
from alignment.run.scorer import build_scorer
from alignment.step.micro_batches import MicroBatch, completion_widths, longest_first
from alignment.step.scoring import score_rollout
from alignment.step.update import Learner, update_policy

LENGTHS = [9, 2, 5, 1, 7, 3, 9, 4]  # completion tokens of the 8 rows (2 prompts x 4)
MAKE_TOKEN_BATCH = update.make_token_batch  # the real one, which the tests wrap to record shapes


@register_reward("test_length_parity", "test only: 1.0 for a completion of an even number of characters, else 0.0")
def length_parity(completion, sample):
    return float(len(completion) % 2 == 0)


@pytest.mark.parametrize(
    "mask, widths",
    [
        ([[1, 1, 0], [1, 1, 1], [0, 0, 0]], [2, 3, 0]),
        ([[1, 0, 0], [1, 1, 0]], [1, 2]),
        ([[1, 1, 1, 1]], [4]),
    ],
)
def test_completion_widths(mask, widths):
    assert completion_widths(np.array(mask, dtype=np.float32)).tolist() == widths


def test_longest_first_keeps_the_order_of_equal_lengths():
    widths = np.array([3, 9, 3, 1, 9])
    assert longest_first(np.arange(5), widths).tolist() == [1, 4, 0, 2, 3]
    assert longest_first(np.array([3, 2, 0]), widths).tolist() == [2, 0, 3]  # a mini-batch's rows: only those


def test_a_micro_batch_takes_its_rows_up_to_its_longest_completion():
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    micro = MicroBatch.of(np.array([2, 0]), np.array([2, 4, 1]))
    assert micro.width == 2
    np.testing.assert_array_equal(micro.take(values), [[8, 9], [0, 1]])
    assert MicroBatch.of(np.array([0]), np.array([0])).width == 1  # an empty row still runs one column


@pytest.fixture(scope="module")
def setup():
    tokenizer, model, prompts, rollout = two_sampled_groups(model_seed=4, sample_seed=5, max_new_tokens=9)
    keep = (np.arange(9)[None, :] < np.array(LENGTHS)[:, None]).astype(np.float32)  # completions that ended early
    rollout = dataclasses.replace(
        rollout,
        completion_ids=np.where(keep > 0, rollout.completion_ids, tokenizer.pad_token_id),
        completion_mask=rollout.completion_mask * keep,
        logprobs=rollout.logprobs * keep,
        finish_reasons=["eos" if length < 9 else "length" for length in LENGTHS],
    )
    return tokenizer, model, prompts, rollout


def _update(setup, micro_batch_rows: int, loss_type: str, monkeypatch) -> tuple:
    """-> (the parameters' change after one SGD step, the (rows, completion columns) of each micro-batch's forward)."""
    tokenizer, model, prompts, rollout = setup
    config = load_config([
        "config/tiny/grpo_argument.json", "--reward_functions", "test_length_parity", "--reward_function_weights", "1",
        "--rollout_n", "4", "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", str(micro_batch_rows),
        "--loss_type", loss_type, "--importance_sampling_correction", "false",
    ])
    scored = score_rollout(prompts, rollout, build_scorer(config), tokenizer, scoring_settings(config))
    scored.advantages = np.linspace(-1.5, 1.5, 8, dtype=np.float32)  # every row with its own advantage
    shapes = []  # each micro-batch's (rows, completion columns), recorded on the way to the real function
    monkeypatch.setattr(update, "make_token_batch", lambda *args: shapes.append(args[1].shape) or MAKE_TOKEN_BATCH(*args))
    policy = copy.deepcopy(model)
    before = [p.numpy().copy() for p in policy.parameters()]
    learner = Learner(policy, None, paddle.optimizer.SGD(0.5, parameters=policy.parameters()))
    update_policy(learner, scored, update_settings(config), World(0, 1), tokenizer.pad_token_id, step=1)
    return [p.numpy() - b for p, b in zip(policy.parameters(), before)], shapes


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_micro_batches_cut_to_their_longest_completion_give_the_update_of_one_whole_batch(setup, loss_type, monkeypatch):
    whole, whole_shapes = _update(setup, 8, loss_type, monkeypatch)
    assert whole_shapes == [(8, 9)]
    cut, cut_shapes = _update(setup, 2, loss_type, monkeypatch)
    assert cut_shapes == [(2, 9), (2, 7), (2, 4), (2, 2)]  # lengths 9 9 | 7 5 | 4 3 | 2 1, longest first
    assert max(float(np.abs(d).max()) for d in whole) > 1e-3, "the update should move the weights"
    for c, w in zip(cut, whole):
        np.testing.assert_allclose(c, w, rtol=1e-4, atol=2e-6)


def test_bnpo_keeps_the_rows_in_their_order_and_cuts_only_the_padding(setup, monkeypatch):
    _, shapes = _update(setup, 2, "bnpo", monkeypatch)
    assert shapes == [(2, 9), (2, 5), (2, 7), (2, 9)]  # rows 0-1 (lengths 9 2), 2-3 (5 1), 4-5 (7 3), 6-7 (9 4)
