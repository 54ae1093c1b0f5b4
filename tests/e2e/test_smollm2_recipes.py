"""The SmolLM2-135M-Instruct recipes (config/smollm2/, `make train-smollm2`) on the real model: each
validates, and a shortened run of each loads, samples, scores, trains and saves as a user's run does."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.models.modeling import load_tokenizer
from alignment.config.cli import load_config
from alignment.basics.data import read_prompt_records, select_by_calculation_steps

GSM8K = Path("../shared/data/gsm8k")
RECIPES = {
    "arith": [],
    "gsm8k": ["--train_datasets", str(GSM8K / "train.jsonl"), "--eval_datasets", str(GSM8K / "test.jsonl")],
    "gsm8k_short": ["--train_datasets", str(GSM8K / "train.jsonl"), "--eval_datasets", str(GSM8K / "test.jsonl")],
    "ifeval": [],
}
# config/smollm2/<name>_system_prompt.txt; ifeval has none (SmolLM2's template's own, as IFEval is usually run)
SYSTEM_PROMPTS = {"arith": "arith", "gsm8k": "gsm8k", "gsm8k_short": "arith", "ifeval": None}
pytestmark = pytest.mark.real
# completion tokens in the one-step runs: enough for some of a group's completions to reach a reward the others miss
# (24 tokens of GSM8K reasoning all end truncated with the same format score)
ONE_STEP_TOKENS = {"arith": 24, "gsm8k": 96, "gsm8k_short": 48, "ifeval": 48}
# The untrained model rarely tells a group's completions apart at these lengths: measured over 16 groups of 4, 13 had
# one reward throughout for arith and gsm8k_short, 6 for gsm8k even at 160 tokens, so two groups drawn once left step 1
# without a gradient on some CPUs (whose rounding samples other completions). DAPO's dynamic sampling refills such
# groups; up to 1 + 24 rounds of 2 groups leave none with signal with a chance of about 0.81 ** 50 = 3e-5.
RESAMPLE_ROUNDS = 24


def recipe_args(recipe: str, model: Path) -> list:
    if recipe.startswith("gsm8k") and not GSM8K.is_dir():
        pytest.skip(f"GSM8K is not at {GSM8K} (the shared data folder beside the checkout)")
    return [f"config/smollm2/grpo_{recipe}.json", "--actor_model_name_or_path", str(model), *RECIPES[recipe]]


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_validates_against_the_imported_model(recipe, smollm2):
    config = load_config(recipe_args(recipe, smollm2))
    assert config.use_fusemt and config.use_fused_train_ops and config.kl_loss_coeff == 0.0
    system = SYSTEM_PROMPTS[recipe]
    assert config.system_prompt == (system and Path(f"config/smollm2/{system}_system_prompt.txt").read_text())
    if recipe == "ifeval":  # the instruction rewards (the share followed with credit for a letter's case, all followed), a
        # floor on substance, no loops, no format nobody asked for, answers that end within the budget; correctness as
        # IFEval's prompt-level loose accuracy
        assert config.reward_functions == ["ifeval_graded", "ifeval_all", "substance", "repetition", "unasked_format", "soft_overlong"]
        assert config.accuracy_function == "ifeval_all_loose" and config.reward_function_weights == [1.0] * 6
        assert config.substance_min_words == 20 and (config.soft_max_length, config.soft_cache_length) == (256, 64)
    if recipe == "gsm8k_short":  # SmolLM2's ChatML, a one-step and a two-step worked exchange, each ending "The answer is N."
        assert config.calculation_steps == "1-2"
        tokenizer = load_tokenizer(str(smollm2), config.chat_template)
        turns = [{"role": "system", "content": config.system_prompt}, {"role": "user", "content": "2+2?"}]
        prompt = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        assert prompt.startswith("<|im_start|>system\n" + config.system_prompt + "<|im_end|>\n<|im_start|>user\nA baker makes 24 muffins")
        assert prompt.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
        assert "24 - 15 = 9 muffins left.\nThe answer is 9.<|im_end|>" in prompt
        assert "12 + 2 = 14 dollars.\nThe answer is 14.<|im_end|>" in prompt
    if recipe == "gsm8k":  # SmolLM2's ChatML, two worked exchanges, the assistant's turn opened with the first tag
        tokenizer = load_tokenizer(str(smollm2), config.chat_template)
        for system in ([], [{"role": "system", "content": config.system_prompt}]):
            prompt = tokenizer.apply_chat_template(
                [*system, {"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False
            )
            assert prompt.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<reasoning>\n")
            assert prompt.count("<|im_start|>assistant\n<reasoning>\n") == 3
            assert "\n<answer>\n8\n</answer>\n<|im_end|>\n" in prompt and "\n<answer>\n14\n</answer>\n<|im_end|>\n" in prompt
            assert prompt.startswith(
                "<|im_start|>system\n" + (config.system_prompt if system else "You are a helpful AI assistant named SmolLM")
            )


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_and_saves_a_step_of_the_real_model(recipe, smollm2, tmp_path):
    eval_file = tmp_path / "eval.jsonl"  # the recipe's evaluation set (its calculation_steps applied), cut to 4 prompts
    config = load_config(recipe_args(recipe, smollm2))
    rows = select_by_calculation_steps(read_prompt_records(config.eval_datasets), config.calculation_steps, config.eval_datasets)
    eval_file.write_text("".join(json.dumps(record.columns) + "\n" for record in rows[:4]))
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir", str(tmp_path / "launch"),
        "run_grpo.py", *recipe_args(recipe, smollm2), "--output_dir", str(tmp_path / "out"), "--eval_datasets", str(eval_file),
        "--max_steps", "1", "--per_device_prompt_batch_size", "2", "--rollout_n", "4", "--per_device_train_batch_size", "8",
        "--max_dec_len", str(ONE_STEP_TOKENS[recipe]), "--per_device_eval_batch_size", "4", "--save_steps", "1",
        "--warmup_steps", "0",  # the recipes warm up from a learning rate of 0, which would leave step 1's weights alone
        "--dynamic_sampling", "true", "--max_resample_times", str(RESAMPLE_ROUNDS),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rollout with the FusedEngine" in done.stdout + done.stderr
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    evals, steps = [m for m in metrics if "eval_accuracy" in m], [m for m in metrics if "reward_mean" in m]
    assert [m["step"] for m in evals] == [0, 1] and evals[0]["eval_samples"] == 4
    assert {f"reward/{name}" for name in config.reward_functions} <= set(steps[0]) and steps[0]["reward_errors"] == 0
    assert steps[0]["dynamic_sampling/unfilled_groups"] < 2, steps[0]  # at least one group whose rewards differ
    assert steps[0]["grad_norm"] > 0 and steps[0]["response_length_max"] <= ONE_STEP_TOKENS[recipe]
    # every weight moved, by about one AdamW step of the learning rate
    start, trained = load_file(str(smollm2 / "model.safetensors")), load_file(str(tmp_path / "out" / "checkpoint-1" / "model.safetensors"))
    assert start.keys() <= trained.keys()  # with lm_head.weight, which a checkpoint also saves where it is tied
    moved = {name: float(np.abs(trained[name] - start[name]).max()) for name in start}
    print(
        f"{recipe}: {steps[0]['dynamic_sampling/rounds']} refill rounds, grad_norm {steps[0]['grad_norm']:.4g}, "
        f"weights moved by {min(moved.values()):.3g} to {max(moved.values()):.3g}"
    )
    assert min(moved.values()) > 0, [name for name, change in moved.items() if change == 0][:5]
    assert max(moved.values()) < 10 * config.learning_rate, max(moved.values())
