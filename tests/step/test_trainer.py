"""The trainer's phases in process: scoring with a reward that fails for some completions, and the
update that must leave those completions out (never treat them as reward 0)."""

import copy
import dataclasses

import numpy as np
import paddle
import pytest
from helpers.tiny_models import small_qwen2

from alignment.algo.advantages import group_advantages
from alignment.models.modeling import load_tokenizer
from alignment.parallel.distributed import World
from alignment.rewards import register_reward
from alignment.run.build import scoring_settings, update_settings
from alignment.run.scorer import build_scorer
from alignment.rollout import EagerEngine, Rollout, SamplingParams
from alignment.config.cli import load_config
from alignment.basics.data import EncodedPrompt, PromptRecord
from alignment.step.metrics import step_metrics
from alignment.step.scoring import score_rollout
from alignment.step.update import Learner, update_policy


@register_reward("test_fails_on_odd_length", "test only: raises for completions of odd length in characters")
def fails_on_odd_length(completion, sample):
    if len(completion) % 2:
        raise ValueError("odd length")
    return float(len(completion) % 3)


@pytest.fixture(scope="module")
def setup():
    tokenizer = load_tokenizer("data/tiny-qwen2")
    model = small_qwen2(vocab_size=len(tokenizer), seed=4)
    config = load_config(
        [
            "config/tiny/grpo_argument.json", "--reward_functions", "test_fails_on_odd_length", "format", "--rollout_n", "4",
            "--per_device_train_batch_size", "4",
        ]
    )
    prompts = [
        EncodedPrompt(
            PromptRecord(({"role": "user", "content": q},), "7"),
            tuple(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)),
        )
        for q in ("Mia has 3 apples.", "Leo has 4 coins. He finds 3 more.")
    ]
    rollout = EagerEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id).generate(
        [p.ids for p in prompts], 4, SamplingParams(max_new_tokens=9)
    )
    return tokenizer, model, config, prompts, rollout


def test_failed_rewards_are_counted_and_left_out_of_their_group(setup):
    tokenizer, _, config, prompts, rollout = setup
    scored = score_rollout(prompts, rollout, build_scorer(config), tokenizer, scoring_settings(config))
    scored.advantages = group_advantages(scored.rewards, rollout.group_size)
    failed = np.array([len(c) % 2 == 1 for c in scored.completions])
    assert failed.any() and not failed.all(), "the seeded rollout should mix odd and even lengths"
    assert np.isnan(scored.rewards[failed]).all() and np.isfinite(scored.rewards[~failed]).all()
    assert (scored.advantages[failed] == 0).all()
    assert all(("odd length" in e) == f for e, f in zip([e or "" for e in scored.errors], failed))
    timings = {"rollout": 1.0, "reward": 0.0, "train": 1.0}
    metrics = step_metrics(
        scored, {"kl": None, "clip_fraction": 0.0, "entropy": 0.0, "loss": 0.0, "grad_norm": 0.0}, 0.1, timings, World(0, 1)
    )
    assert metrics["reward_errors"] == int(failed.sum())
    assert metrics["reward_mean"] == pytest.approx(np.nanmean(scored.rewards))


def _rows(rollout: Rollout, keep: np.ndarray) -> Rollout:
    return Rollout(
        prompt_ids=[p for p, k in zip(rollout.prompt_ids, keep) if k],
        completion_ids=rollout.completion_ids[keep],
        completion_mask=rollout.completion_mask[keep],
        logprobs=rollout.logprobs[keep],
        finish_reasons=[r for r, k in zip(rollout.finish_reasons, keep) if k],
        group_size=rollout.group_size,
    )


def _sgd_step(model, scored, config, tokenizer) -> list:
    """Parameter change of one plain SGD step with learning rate 1, i.e. minus the gradient."""
    model = copy.deepcopy(model)
    before = [p.numpy().copy() for p in model.parameters()]
    update_policy(
        Learner(model, None, paddle.optimizer.SGD(1.0, parameters=model.parameters())),
        scored,
        update_settings(config),
        World(0, 1),
        tokenizer.pad_token_id,
        step=1,
    )
    return [p.numpy() - b for p, b in zip(model.parameters(), before)]


def test_update_equals_one_without_the_failed_completions(setup):
    tokenizer, model, config, prompts, rollout = setup
    scored = score_rollout(prompts, rollout, build_scorer(config), tokenizer, scoring_settings(config))
    scored.advantages = group_advantages(scored.rewards, rollout.group_size)
    keep = np.isfinite(scored.rewards)
    # The same batch with the failed rows removed outright, keeping the advantages computed above.
    reduced = copy.copy(scored)
    reduced.rollout, reduced.rewards, reduced.advantages = _rows(rollout, keep), scored.rewards[keep], scored.advantages[keep]
    one_per_micro_batch = dataclasses.replace(config, per_device_train_batch_size=1)  # and cut differently
    for full, without in zip(_sgd_step(model, scored, config, tokenizer), _sgd_step(model, reduced, one_per_micro_batch, tokenizer)):
        np.testing.assert_allclose(full, without, rtol=1e-4, atol=1e-7)
