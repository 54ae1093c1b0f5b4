"""The GRPO variants of issue 6 in the trainer: multi-iteration mini-batch updates against a plain
re-implementation, truncated importance sampling, overlong filtering, dynamic sampling, and a short run of
the tiny config with each option."""

import copy
import dataclasses
import json
import math

import numpy as np
import paddle
import pytest
from helpers.tiny_models import small_qwen2

from alignment.algo.advantages import group_advantages
from alignment.algo.logprobs import token_logprobs
from alignment.models.modeling import completion_logits, load_tokenizer, make_token_batch
from alignment.parallel.distributed import World
from alignment.rewards import register_reward
from alignment.run.build import rollout_settings, scoring_settings, update_settings
from alignment.run.scorer import build_scorer
from alignment.rollout import EagerEngine, SamplingParams
from alignment.config.cli import load_config
from alignment.basics.data import EncodedPrompt, PromptRecord
from alignment.step.rollout import Sampler, keep_groups_with_signal
from alignment.step.scoring import score_rollout
from alignment.run.setup import set_up_run
from alignment.step.trainer import train
from alignment.step.update import Learner, update_policy

QUESTIONS = ("Mia has 3 apples.", "Leo has 4 coins. He finds 3 more.", "Ann has 2 pens.", "Tom has 9 cards.")


@register_reward("test_flat_for_mia", "test only: 1.0 for every completion of a question about Mia, else the length mod 3")
def flat_for_mia(completion, sample):
    return 1.0 if "Mia" in sample["prompt"] else float(len(completion) % 3)


@pytest.fixture(scope="module")
def setup():
    tokenizer = load_tokenizer("data/tiny-qwen2")
    model = small_qwen2(vocab_size=len(tokenizer), seed=4)
    prompts = []
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        ids = tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        prompts.append(EncodedPrompt(PromptRecord(tuple(messages), "7"), ids))
    engine = EagerEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    paddle.seed(5)
    rollout = engine.generate([p.ids for p in prompts[:2]], 4, SamplingParams(max_new_tokens=9))
    return tokenizer, model, engine, prompts, rollout


def _config(*overrides):
    return load_config(["config/tiny/grpo_argument.json", "--reward_functions", "test_flat_for_mia", "--reward_function_weights", "1",
                        "--rollout_n", "4", "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "2", *overrides])


def _scored(setup, config, rollout=None):
    tokenizer, _, _, prompts, default_rollout = setup
    scored = score_rollout(prompts[:2], rollout or default_rollout, build_scorer(config), tokenizer, scoring_settings(config))
    scored.advantages = group_advantages(scored.rewards, 4)
    return scored


def _sgd_delta(model, scored, config, pad_token_id, lr=0.5) -> list:
    """Parameter change of update_policy with plain SGD."""
    model = copy.deepcopy(model)
    before = [p.numpy().copy() for p in model.parameters()]
    update_policy(
        Learner(model, None, paddle.optimizer.SGD(lr, parameters=model.parameters())), scored, update_settings(config), World(0, 1),
        pad_token_id, step=1,
    )
    return [p.numpy() - b for p, b in zip(model.parameters(), before)]


def test_several_iterations_and_mini_batches_equal_a_plain_reimplementation(setup):
    """num_iterations 2 x 2 mini-batches: four SGD steps, each on a mini-batch's DAPO token mean of the clipped
    surrogate with the old log-probs fixed before the first step; here recomputed through the full-logits path."""
    tokenizer, model, _, _, rollout = setup
    config = _config("--num_iterations", "2", "--mini_batch_size", "4", "--importance_sampling_correction", "false")
    scored = _scored(setup, config)
    got = _sgd_delta(model, scored, config, tokenizer.pad_token_id)

    reference = copy.deepcopy(model)
    before = [p.numpy().copy() for p in reference.parameters()]

    def logprobs(rows):
        batch = make_token_batch(
            [rollout.prompt_ids[r] for r in rows], rollout.completion_ids[rows], rollout.completion_mask[rows], tokenizer.pad_token_id
        )
        return token_logprobs(completion_logits(reference, batch), batch.completion_ids, config.temperature)

    with paddle.no_grad():
        old = logprobs(list(range(8))).numpy()
    for _ in range(2):
        for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):
            mask = paddle.to_tensor(rollout.completion_mask[rows])
            ratio = paddle.exp(logprobs(rows) - paddle.to_tensor(old[rows]))
            advantage = paddle.to_tensor(scored.advantages[rows]).unsqueeze(-1)
            per_token = paddle.maximum(-advantage * ratio, -advantage * paddle.clip(ratio, 0.8, 1.2))
            ((per_token * mask).sum() / mask.sum()).backward()
            with paddle.no_grad():
                for parameter in reference.parameters():
                    parameter.set_value(parameter - 0.5 * parameter.grad)
            reference.clear_gradients()
    expected = [p.numpy() - b for p, b in zip(reference.parameters(), before)]
    assert max(float(np.abs(e).max()) for e in expected) > 1e-3, "the updates should move the weights"
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-6)


def test_the_exact_kl_update_equals_autograd_through_both_models_full_logits(setup):
    """kl_estimator full with zero advantages: the update is the gradient of the DAPO token mean of KL(pi || pi_ref) over
    the vocabulary alone, with two micro-batches; here through both models' (B, T, V) logits and paddle's autograd."""
    tokenizer, model, _, _, rollout = setup
    config = _config("--kl_estimator", "full", "--kl_loss_coeff", "1.0", "--importance_sampling_correction", "false")
    scored = _scored(setup, config)
    scored.advantages = np.zeros_like(scored.advantages)
    ref_model = copy.deepcopy(model)
    with paddle.no_grad():
        for parameter in ref_model.parameters():
            parameter.set_value(parameter + 0.05 * paddle.randn(parameter.shape))
    policy = copy.deepcopy(model)
    before = [p.numpy().copy() for p in policy.parameters()]
    learner = Learner(policy, ref_model, paddle.optimizer.SGD(0.5, parameters=policy.parameters()))
    metrics = update_policy(learner, scored, update_settings(config), World(0, 1), tokenizer.pad_token_id, step=1).metrics
    got = [p.numpy() - b for p, b in zip(policy.parameters(), before)]

    reference = copy.deepcopy(model)
    batch = make_token_batch(list(rollout.prompt_ids), rollout.completion_ids, rollout.completion_mask, tokenizer.pad_token_id)
    logp = paddle.nn.functional.log_softmax(completion_logits(reference, batch) / config.temperature, -1)
    with paddle.no_grad():
        logq = paddle.nn.functional.log_softmax(completion_logits(ref_model, batch) / config.temperature, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # (B, T)
    mask = paddle.to_tensor(rollout.completion_mask)
    loss = (kl * mask).sum() / mask.sum()
    loss.backward()
    assert metrics["kl"] == pytest.approx(float(loss), rel=1e-5)  # the logged KL is the exact one
    for g, parameter in zip(got, reference.parameters()):
        np.testing.assert_allclose(g, -0.5 * parameter.grad.numpy(), rtol=1e-4, atol=2e-6)
    assert max(float(np.abs(g).max()) for g in got) > 1e-4


@pytest.mark.parametrize("shift, factor", [(0.3, math.exp(0.3)), (1.0, 2.0)])  # pi_old / pi_rollout = e^shift, capped at 2
def test_importance_weights_scale_the_update(setup, shift, factor):
    tokenizer, model, _, _, rollout = setup
    config = _config("--importance_sampling_correction", "false")
    scored = _scored(setup, config)
    plain = _sgd_delta(model, scored, config, tokenizer.pad_token_id, lr=1.0)
    # the rollout engine's log-probs, made lower by `shift` on every token: the trainer's now exceed them
    shifted = dataclasses.replace(rollout, logprobs=rollout.logprobs - shift * rollout.completion_mask)
    corrected = _sgd_delta(model, dataclasses.replace(scored, rollout=shifted), _config(), tokenizer.pad_token_id, lr=1.0)
    for a, b in zip(plain, corrected):
        np.testing.assert_allclose(b, factor * a, rtol=1e-4, atol=1e-5)  # the engine and the trainer agree to ~1e-6 in log-prob


def test_overlong_filter_equals_leaving_the_truncated_completions_out(setup):
    tokenizer, model, _, _, rollout = setup
    truncated = np.array([True, False, False, True, False, True, False, False])
    cut = dataclasses.replace(rollout, finish_reasons=["length" if t else "eos" for t in truncated])
    config = _config("--overlong_filter", "true")
    scored = dataclasses.replace(_scored(setup, config), rollout=cut)
    filtered = _sgd_delta(model, scored, config, tokenizer.pad_token_id)
    # the same batch with those rows' loss masked by hand (the advantages are those of the whole group, as in DAPO)
    masked = dataclasses.replace(scored, rewards=np.where(truncated, np.nan, scored.rewards))
    by_hand = _sgd_delta(model, masked, _config(), tokenizer.pad_token_id)
    for a, b in zip(filtered, by_hand):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)


def test_dynamic_sampling_replaces_groups_without_signal(setup):
    tokenizer, _, engine, prompts, _ = setup
    config = _config("--dynamic_sampling", "true", "--max_resample_times", "3")
    sampling = SamplingParams(max_new_tokens=9)
    paddle.seed(6)  # the eager engine draws from paddle's generator: the same completions whatever ran before
    first = score_rollout(prompts[:2], engine.generate([p.ids for p in prompts[:2]], 4, sampling), build_scorer(config), tokenizer,
                          scoring_settings(config))
    assert np.ptp(first.rewards[:4]) == 0, "the Mia group's rewards are all 1.0: no signal"

    def refill():
        timings = {"rollout": 0.0, "reward": 0.0}
        return keep_groups_with_signal(
            Sampler(engine, build_scorer(config), tokenizer, rollout_settings(config), World(0, 1), sampling), first, prompts, 3, timings
        )

    kept, counts = refill()
    assert counts["dropped_groups"] >= 1 and counts["unfilled_groups"] == 0
    assert len(kept.prompts) == 2 and len(kept.completions) == 8 and kept.rollout.completion_ids.shape[0] == 8
    for group in range(2):
        assert np.ptp(kept.rewards[group * 4 : (group + 1) * 4]) > 0
        assert all(kept.prompts[group].ids == tuple(ids) for ids in kept.rollout.prompt_ids[group * 4 : (group + 1) * 4])
    again, _ = refill()  # refill prompts and samples are seeded by (seed, step, round): a resumed run draws the same
    assert again.completions == kept.completions

    no_rounds = dataclasses.replace(config, max_resample_times=0)
    timings = {"rollout": 0.0, "reward": 0.0}
    filled, counts = keep_groups_with_signal(
        Sampler(engine, build_scorer(no_rounds), tokenizer, rollout_settings(no_rounds), World(0, 1), sampling), first, prompts, 3, timings
    )
    assert counts == {"dropped_groups": 1, "unfilled_groups": 1, "rounds": 0}
    assert (
        filled.completions[:4] == first.completions[4:] and filled.completions[4:] == first.completions[:4]
    )  # kept first, then the filler


RUN_OPTIONS = {
    "grpo loss, batch-scaled": ["--loss_type", "grpo", "--scale_rewards", "batch"],
    "dr_grpo loss, unscaled": ["--loss_type", "dr_grpo", "--scale_rewards", "none"],
    "clip-higher, dual clip, k1": [
        "--epsilon", "0.2", "--epsilon_high", "0.28", "--dual_clip_ratio", "3", "--kl_loss_coeff", "0.01", "--kl_estimator", "k1"
    ],
    "iterations, shuffled mini-batches, k2": [
        "--num_iterations", "2", "--mini_batch_size", "4", "--shuffle_minibatch", "true", "--kl_loss_coeff", "0.01", "--kl_estimator", "k2"
    ],
    "dynamic sampling, overlong filter": ["--dynamic_sampling", "true", "--overlong_filter", "true", "--max_dec_len", "12"],
    "no importance sampling": ["--importance_sampling_correction", "false"],
    "LoRA with KL to the base": ["--lora", "true", "--lora_rank", "4", "--kl_loss_coeff", "0.01", "--num_iterations", "2"],
    "length and repetition rewards": [
        "--reward_functions", "accuracy", "cosine", "repetition", "soft_overlong", "--reward_function_weights", "1", "0.5", "0.5", "0.5",
        "--soft_cache_length", "8",
    ],
    # issue 19's variants, each with the names users bring
    "GSPO over two mini-batches": [
        "--importance_sampling_level", "sequence", "--epsilon", "3e-4", "--epsilon_high", "4e-4", "--loss_type", "grpo",
        "--mini_batch_size", "4",
    ],
    "CISPO, TRL's sequence_mask": [
        "--surrogate", "cispo", "--epsilon_high", "4.0", "--vllm_importance_sampling_mode", "sequence_mask",
        "--vllm_importance_sampling_clip_max", "3",
    ],
    "RLOO, entropy selection and bonus": ["--advantage_estimator", "rloo", "--top_entropy_quantile", "0.2", "--entropy_coef", "0.01"],
    "REINFORCE++, bias-corrected KL": [
        "--adv_estimator", "reinforce_plus_plus", "--kl_loss_coeff", "0.01", "--use_bias_correction_kl", "true", "--num_iterations", "2"
    ],
    "REINFORCE++-baseline, verl's token IS": [
        "--advantage_estimator", "reinforce_plus_plus_baseline", "--rollout_is", "token", "--importance_sampling_min", "0.5"
    ],
    "GDPO": ["--multi_objective_aggregation", "normalize_then_sum"],
    # issue 34's, each with the names users bring (tests/algo/test_variant_names.py reads every spelling)
    "SAPO as TRL spells it, the off-policy mask, verl's rejection sampling, two iterations": [
        "--loss_type", "sapo", "--off_policy_mask_threshold", "0.0", "--rollout_rs", "geometric,token_k2",
        "--rollout_rs_threshold", "0.999_1.001,0.5", "--num_iterations", "2",
    ],
    "GMPO as verl spells it, pass@k advantages": [
        "--loss_mode", "geo_mean", "--clip_ratio_low", "0.4", "--clip_ratio_high", "0.4", "--loss_type", "grpo", "--mini_batch_size", "4",
        "--adv_estimator", "grpo_passk",
    ],
    "BNPO over micro-batches of 2, OPO, the KL in the reward by k3+": [
        "--loss_type", "bnpo", "--per_device_train_batch_size", "2", "--adv_estimator", "opo", "--use_kl_in_reward", "true",
        "--kl_penalty", "k3+",
    ],
    "low_var_kl loss and verl's KL in the reward": [
        "--kl_loss_type", "low_var_kl", "--beta", "0.01", "--use_kl_in_reward", "true", "--kl_penalty", "kl", "--kl_coef", "0.01"
    ],
    "exact KL over the vocabulary, two iterations": ["--kl_loss_type", "full", "--beta", "0.05", "--num_iterations", "2"],
    "exact KL to the base under LoRA": ["--lora", "true", "--lora_rank", "4", "--kl_estimator", "full", "--kl_loss_coeff", "0.05"],
}


@pytest.mark.parametrize("name", list(RUN_OPTIONS))
def test_a_short_run_with_each_option(tmp_path, name):
    config = load_config([
        "config/tiny/grpo_argument.json", "--output_dir", str(tmp_path), "--max_steps", "2", "--eval_datasets", "",
        "--per_device_prompt_batch_size", "2", "--rollout_n", "4", "--per_device_train_batch_size", "4", "--max_dec_len", "24",
        "--save_steps", "0", "--learning_rate", "1e-4", *RUN_OPTIONS[name],
    ])
    train(set_up_run(config))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])
        assert record["optimizer_steps"] == config.num_iterations * 8 // config.mini_batch_size
        assert ("kl" in record and record["kl"] is not None) == (config.kl_loss_coeff > 0)
        assert ("is/weight_mean" in record) == config.importance_sampling_correction
        assert ("dynamic_sampling/dropped_groups" in record) == config.dynamic_sampling
        assert ("entropy_selected_fraction" in record) == (config.top_entropy_quantile < 1)
        assert ("kl_in_reward/kl" in record) == config.use_kl_in_reward
        assert ("rs/masked_fraction" in record) == (config.rejection_sampling is not None)
        assert ("off_policy_masked_fraction" in record) == (config.off_policy_mask_threshold is not None)
        assert ("is/eff_sample_size" in record) == config.importance_sampling_correction
        if config.top_entropy_quantile < 1:  # at least the fraction asked for (ties at the threshold are kept)
            assert config.top_entropy_quantile <= record["entropy_selected_fraction"] < config.top_entropy_quantile + 0.05
        for reward in config.reward_functions:
            assert math.isfinite(record[f"reward/{reward}"])
    saved = "adapter_model.safetensors" if config.lora else "model.safetensors"
    assert (tmp_path / "checkpoint-2" / saved).is_file()


def _short_run(tmp_path, *overrides):
    config = load_config([
        "config/tiny/grpo_argument.json", "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--eval_datasets", "",
        "--per_device_prompt_batch_size", "2", "--rollout_n", "4", "--per_device_train_batch_size", "4", "--max_dec_len", "24",
        "--log_completions_per_step", "8", *overrides,
    ])
    train(set_up_run(config))
    metrics = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    completions = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    return metrics, completions


def test_a_plugin_reward_sees_every_dataset_column(tmp_path):
    plugin = tmp_path / "my_rewards.py"
    plugin.write_text(
        "from alignment.rewards import register_reward\n\n"
        "@register_reward('test_plugin_columns', 'test only: the length of the row\\'s src column over 100')\n"
        "def columns(completion, sample):\n"
        "    return len(sample['src']) / 100 + 0 * sample['completion_tokens']\n"
    )
    metrics, completions = _short_run(
        tmp_path,
        "--external_plugins", str(plugin),
        "--reward_functions", "accuracy", "test_plugin_columns",
        "--reward_function_weights", "1", "1",
    )
    for row in completions:
        assert row["rewards"]["test_plugin_columns"] == pytest.approx(len(row["prompt"]) / 100)
    assert math.isfinite(metrics["reward/test_plugin_columns"])


def test_a_missing_plugin_file_is_a_config_error(tmp_path):
    from alignment.basics.errors import ConfigError

    with pytest.raises(ConfigError, match="external_plugins: plugin nowhere.py: no such file"):
        load_config(["config/tiny/grpo_argument.json", "--external_plugins", "nowhere.py"])


def test_reward_model_scores_in_the_run_equal_scoring_it_directly(tmp_path):
    from helpers.tiny_models import save_with_tokenizer, tiny_classifier

    from alignment.rewards.reward_model import RewardModel

    folder = save_with_tokenizer(tiny_classifier(), tmp_path / "rm")
    metrics, completions = _short_run(
        tmp_path,
        "--reward_functions", "accuracy", "reward_model",
        "--reward_function_weights", "1", "0.5",
        "--reward_model_name_or_path", str(folder),
    )
    direct = RewardModel.load(str(folder)).score(
        [{"prompt": row["prompt"]} for row in completions], [row["completion"] for row in completions]
    )
    logged = [row["rewards"]["reward_model"] for row in completions]
    np.testing.assert_allclose(logged, direct, rtol=1e-5, atol=1e-6)
    totals = [row["rewards"]["accuracy"] + 0.5 * row["rewards"]["reward_model"] for row in completions]
    np.testing.assert_allclose([row["reward"] for row in completions], totals, rtol=1e-6)
    assert metrics["reward/reward_model"] == pytest.approx(np.mean(logged), rel=1e-5)
    from alignment.basics.errors import ConfigError

    with pytest.raises(ConfigError, match="reward_functions names reward_model but reward_model_name_or_path is not set"):
        load_config(["config/tiny/grpo_argument.json", "--reward_functions", "reward_model", "--reward_function_weights", "1"])
