"""NaN or infinity in the loss or the gradients: the step's update is skipped (the weights stay those before
it) and counted, and max_consecutive_skips skipped steps in a row stop the run naming the step and what
was not finite. The faults are real inputs: rollout log-probs with a NaN, a reference model with a NaN
weight."""

import copy
import dataclasses
import json
import shutil

import numpy as np
import paddle
import pytest
from test_variants import _config, _scored, setup  # noqa: F401  (the module fixture)
from helpers.tiny_models import put_a_nan_in_the_final_norm

from alignment.basics.errors import NonFiniteError
from alignment.parallel.distributed import World
from alignment.config.cli import load_config
from alignment.run.build import update_settings
from alignment.run.setup import set_up_run
from alignment.step.trainer import train
from alignment.step.update import Learner, update_policy


def _update(model, scored, config):
    model = copy.deepcopy(model)
    before = [p.numpy().copy() for p in model.parameters()]
    optimizer = paddle.optimizer.SGD(0.5, parameters=model.parameters())
    update = update_policy(Learner(model, None, optimizer), scored, update_settings(config), World(0, 1), 0, step=1)
    changed = any(not np.array_equal(p.numpy(), b) for p, b in zip(model.parameters(), before))
    return update, changed


def test_a_nan_rollout_logprob_skips_the_update_and_names_it(setup):  # noqa: F811
    tokenizer, model, _, _, rollout = setup
    config = _config()
    scored = _scored(setup, config)
    update, changed = _update(model, scored, config)
    assert update.skipped_phase is None and changed and np.isfinite(update.metrics["loss"])
    poisoned = rollout.logprobs.copy()
    poisoned[3, 0] = np.nan  # one token the engine reported as NaN
    bad = dataclasses.replace(scored, rollout=dataclasses.replace(rollout, logprobs=poisoned))
    update, changed = _update(model, bad, config)
    assert update.skipped_phase == "the importance weights (the rollout engine's log-probs)"
    assert not changed, "no optimizer step on NaN gradients"
    assert update.metrics["loss"] is None and update.metrics["grad_norm"] is None  # logged as null, never NaN in the JSON


def test_a_reference_model_gone_bad_skips_steps_then_stops_naming_step_and_phase(tmp_path):
    base = tmp_path / "base"
    shutil.copytree("data/tiny-qwen2", base)
    common = [
        "--actor_model_name_or_path", str(base), "--output_dir", str(tmp_path / "out"), "--eval_datasets", "",
        "--per_device_prompt_batch_size", "2", "--rollout_n", "4", "--per_device_train_batch_size", "4", "--max_dec_len", "16",
    ]
    train(set_up_run(load_config(["config/tiny/grpo_argument.json", *common, "--max_steps", "1"])))
    # The run resumes from its healthy checkpoint; the reference model, read from the base folder, now has a NaN.
    put_a_nan_in_the_final_norm(base)
    resumed = load_config([
        "config/tiny/grpo_argument.json", *common, "--max_steps", "6", "--resume_from_checkpoint", "auto",
        "--kl_loss_coeff", "0.01", "--max_consecutive_skips", "2",
    ])
    with pytest.raises(
        NonFiniteError, match=r"step 3: the reference model's log-probs not finite for 2 consecutive steps .* weights of step 1"
    ):
        train(set_up_run(resumed))
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["step_skipped"], r["skipped_steps"]) for r in records] == [(1, 0, 0), (2, 1, 1), (3, 1, 2)]
    assert records[1]["loss"] is None
