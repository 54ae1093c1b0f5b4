"""The bundled tiny config run as a user runs it: python -m paddle.distributed.launch ... run_grpo.py."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.reward_servers import free_port, reward_server

from alignment.models.cpu_bf16 import cpu_bf16_flags
from alignment.rewards import score_completions
from alignment.rollout.fused import BF16_TOLERANCE, FP32_TOLERANCE
from alignment.kernels.ops import load_ops

TINY = "config/tiny/grpo_argument.json"
STEP_KEYS = [
    "step", "reward_mean", "reward_std", "reward/accuracy", "reward/format", "accuracy", "advantage_abs_mean", "kl",
    "clip_fraction", "entropy", "response_length_mean", "response_length_max", "truncated_fraction", "loss", "lr",
    "grad_norm", "tokens_per_second", "time/rollout", "time/reward", "time/train", "time/sync",
]


def launch(tmp_path: Path, *overrides: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir", str(tmp_path / "launch"),
        "run_grpo.py", TINY, "--output_dir", str(tmp_path / "out"), *overrides,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500, env=None if env is None else {**os.environ, **env})
    if check and done.returncode != 0:
        pytest.fail(f"run_grpo failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("three_steps")
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(open("data/arith/test.jsonl").readlines()[:16]))
    done = launch(tmp_path, "--max_steps", "3", "--save_steps", "1", "--save_total_limit", "2", "--eval_datasets", str(eval_file))
    return tmp_path / "out", done


def test_run_writes_metrics_for_every_step(three_steps):
    out, done = three_steps
    lines = read_jsonl(out / "metrics.jsonl")
    steps = [line for line in lines if "reward_mean" in line]
    evals = [line for line in lines if "eval_accuracy" in line]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert [e["step"] for e in evals] == [0, 3] and evals[0]["eval_samples"] == 16
    for step in steps:
        assert set(STEP_KEYS) <= set(step), set(STEP_KEYS) - set(step)
        assert step["kl"] is None  # kl_loss_coeff 0: no reference model, so no KL to report
        assert 0.0 <= step["accuracy"] <= 1.0 and step["grad_norm"] > 0 and step["tokens_per_second"] > 0
    completions = read_jsonl(out / "completions.jsonl")
    assert len(completions) == 3 * 4 and {"prompt", "completion", "rewards", "advantage"} <= set(completions[0])
    assert f"checkpoint: {out}/checkpoint-3" in done.stdout and f"visualdl --logdir {out}/vdl_log" in done.stdout
    first_line = next(line for line in done.stdout.splitlines() if line.startswith("compute: "))  # the run's first line
    if load_ops()[0] is not None and hasattr(load_ops()[0], "grpo_bf16_linear"):  # cpu_bf16_matmul auto chose by the CPU
        assert first_line.startswith("compute: bf16 matmuls" if cpu_bf16_flags() else "compute: float32 matmuls"), first_line


def test_a_cpu_without_bf16_trains_in_float32(tmp_path):
    """GRPO_CPU_BF16=0 hides the CPU's bf16 flags, as on a CPU without them: auto falls back and says why."""
    done = launch(tmp_path, "--max_steps", "1", "--eval_datasets", "", env={"GRPO_CPU_BF16": "0"})
    assert "compute: float32 matmuls (cpu_bf16_matmul auto: this CPU lists neither amx_bf16 nor avx512_bf16" in done.stdout
    assert [s["step"] for s in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "reward_mean" in s] == [1]


def test_visualdl_log_reads_back(three_steps):
    from visualdl import LogReader

    out, _ = three_steps
    (log_file,) = glob.glob(str(out / "vdl_log" / "vdlrecords.*.log"))
    reader = LogReader(file_path=log_file)
    rewards = reader.get_data("scalar", "train/reward_mean")
    assert [r.id for r in rewards] == [1, 2, 3]
    written = [s["reward_mean"] for s in read_jsonl(out / "metrics.jsonl") if "reward_mean" in s]
    np.testing.assert_allclose([r.value for r in rewards], written, rtol=1e-6)
    assert [r.id for r in reader.get_data("scalar", "validation/accuracy")] == [0, 3]


def test_checkpoints_are_complete_and_limited(three_steps):
    out, _ = three_steps
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-2", "checkpoint-3"]
    last = out / "checkpoint-3"
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["total_steps"] == 3
    assert json.loads((last / "grpo_config.json").read_text())["max_steps"] == 3
    assert (last / "optimizer.safetensors").is_file() and (last / "tokenizer.json").is_file()


def test_checkpoint_loads_with_from_pretrained_and_generates(three_steps):
    # A separate interpreter with paddleformers' defaults: the path a user takes with the result.
    out, _ = three_steps
    script = f"""
import paddle
from paddleformers.transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained({str(out / 'checkpoint-3')!r})
tokenizer = AutoTokenizer.from_pretrained({str(out / 'checkpoint-3')!r})
messages = [{{"role": "user", "content": "Mia has 12 apples. She buys 7 more. How many apples does Mia have now?"}}]
ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
ids, _ = model.generate(paddle.to_tensor([ids]), max_new_tokens=24, decode_strategy="greedy_search")
print("GENERATED", repr(tokenizer.decode(ids[0].tolist())))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GENERATED '<think>" in done.stdout, done.stdout[-500:]


@pytest.mark.slow
def test_kl_penalty_loads_a_reference_model(tmp_path):
    """The reference is the starting policy, held apart from the actor: the KL is nought in step 1 (the update runs
    on the starting weights) and grows once the actor has moved. A missing reference (no KL) fails, and so does one
    that is the actor itself (a KL of nought throughout). float32, so that the two models' products agree exactly."""
    launch(tmp_path, "--max_steps", "2", "--kl_loss_coeff", "0.05", "--learning_rate", "1e-4", "--warmup_steps", "0", "--eval_datasets", "",
           "--cpu_bf16_matmul", "off")
    first, second = [s["kl"] for s in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "reward_mean" in s]
    print(f"kl: {first!r} at step 1, {second!r} at step 2")
    assert first is not None and abs(first) < 1e-9, first
    assert second > 1e-6, second


def test_bad_config_fails_before_loading_anything(tmp_path):
    done = launch(tmp_path, "--max_step", "3", check=False)
    assert done.returncode != 0
    assert "unknown key 'max_step'; did you mean 'max_steps'" in done.stdout + done.stderr
    assert not (tmp_path / "out").exists()


def test_training_reward_rises_within_a_few_steps(tmp_path):
    # 2.5x the bundled learning rate, so that the rise shows within 16 steps
    launch(tmp_path, "--max_steps", "16", "--learning_rate", "1e-4", "--eval_datasets", "", "--log_completions_per_step", "0")
    rewards = [s["reward_mean"] for s in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "reward_mean" in s]
    first, last = np.mean(rewards[:4]), np.mean(rewards[-4:])
    # Each 4-step mean averages 256 rewards of spread ~0.5, so the difference of two has a standard error
    # of about 0.045: a rise of 0.10 is over 2 standard errors (learning runs measured +0.15 to +0.2).
    assert last >= first + 0.10, f"training reward went from {first:.3f} (steps 1-4) to {last:.3f} (steps 13-16)"


@pytest.mark.slow
def test_bundled_run_gains_25_points_of_held_out_accuracy(tmp_path):
    """The README's claim: the whole `make train` run, greedy accuracy on data/arith/test.jsonl."""
    launch(tmp_path)
    evals = [s for s in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "eval_accuracy" in s]
    before, after = evals[0]["eval_accuracy"], evals[-1]["eval_accuracy"]
    print(f"held-out greedy accuracy: {before:.3f} before the first step, {after:.3f} after the last")
    assert evals[0]["step"] == 0 and after - before >= 0.25, f"{before:.3f} -> {after:.3f}"


def test_fused_and_eager_runs_evaluate_alike(tmp_path, three_steps):
    """config/tiny uses the fused engine; the same run with the eager engine must evaluate identically
    before the first step, since greedy decoding of the bundled model is token-identical."""
    if load_ops()[0] is None:
        pytest.skip(f"fused operators not available: {load_ops()[1]}")
    fused_out, fused_done = three_steps
    assert "rollout with the FusedEngine" in fused_done.stdout + fused_done.stderr
    gaps = [s.get("rollout/weight_sync_gap") for s in read_jsonl(fused_out / "metrics.jsonl") if "reward_mean" in s]
    # the refresh's check ran every step, within the run's tolerance: rounding, 6e-6 measured in float32 and exactly 0
    # with bf16 matmuls on an AMX Xeon; that it catches a stale engine is test_fused_engine's stale-refresh test
    tolerance = BF16_TOLERANCE if "compute: bf16 matmuls" in fused_done.stdout else FP32_TOLERANCE
    assert len(gaps) == 3 and all(0 <= gap <= tolerance for gap in gaps), (gaps, tolerance)
    done = launch(tmp_path, "--max_steps", "1", "--use_fusemt", "false", "--eval_datasets", str(fused_out.parent / "eval.jsonl"))
    assert "rollout with the EagerEngine" in done.stdout + done.stderr
    eager_start = next(s for s in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "eval_accuracy" in s)
    fused_start = next(s for s in read_jsonl(fused_out / "metrics.jsonl") if "eval_accuracy" in s)
    assert fused_start["step"] == eager_start["step"] == 0
    for key in ("eval_accuracy", "eval_reward_mean", "eval_response_length_mean"):
        assert fused_start[key] == eager_start[key], key


def test_the_evaluation_command_scores_a_checkpoint_as_its_runs_evaluation_did(tmp_path, three_steps):
    """python -m alignment.evaluate on checkpoint-3 decodes the 16 problems as the run's evaluation at step 3 did: the same
    matmuls (bf16 where the run chose them; it decoded in float32 before, one problem of 200 apart on an AMX Xeon) and
    the same batches (the run's per_device_eval_batch_size), so every figure is equal, to the last bit of the mean length."""
    out, done = three_steps
    output = tmp_path / "eval"
    command = ["-m", "alignment.evaluate", str(out / "checkpoint-3"), "--data", str(out.parent / "eval.jsonl"), "--output", str(output)]
    evaluated = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (model,) = json.loads((output / "summary.json").read_text())["models"]
    run = next(s for s in read_jsonl(out / "metrics.jsonl") if "eval_accuracy" in s and s["step"] == 3)
    assert f"compute: {model['settings']['compute']}\n" in done.stdout + done.stderr  # the run's first line: the same choice of matmuls
    assert (model["problems"], model["greedy_accuracy"]["value"]) == (run["eval_samples"], run["eval_accuracy"])
    assert (model["reward_mean"], model["length_mean"]) == (run["eval_reward_mean"], run["eval_response_length_mean"])
    assert model["truncated_fraction"] == run["eval_truncated_fraction"]


def test_a_failed_weight_sync_check_stops_the_run_with_a_clear_error(tmp_path):
    if load_ops()[0] is None:
        pytest.skip(f"fused operators not available: {load_ops()[1]}")
    # The engine's bfloat16 cache against the float32 actor: apart on any CPU (keys and values rounded to bf16;
    # 0.022 measured), over float32's tolerance, so the check at the first refresh fails. (A tolerance of 1e-12
    # with the defaults counted on rounding: with bf16 matmuls on an AMX Xeon the engine and the actor agree to the bit.)
    overrides = ("--cpu_bf16_matmul", "off", "--kv_cache_dtype", "bfloat16", "--weight_sync_tolerance", str(FP32_TOLERANCE))
    done = launch(tmp_path, "--use_fusemt", "true", *overrides, check=False)
    assert done.returncode != 0
    assert "run_grpo: error: the fused rollout engine disagrees with the actor" in done.stderr + done.stdout
    assert "weight_sync_tolerance" in done.stderr + done.stdout
    assert not list((tmp_path / "out").glob("checkpoint-*"))


@pytest.mark.parametrize("protocol", ["v1", "paddlenlp"])
def test_scoring_through_the_reward_server_equals_in_process_scoring(tmp_path, three_steps, protocol):
    config = json.loads(open(TINY).read())
    names, weights = config["reward_functions"], config["reward_function_weights"]
    # The server's own --reward_funcs / --reward_weights are what PaddleNLP's POST / applies.
    flags = ["--workers", "1", "--reward_funcs", *names, "--reward_weights", *map(str, weights)]
    with reward_server(tmp_path, *flags) as server:
        launch(tmp_path, "--max_steps", "3", "--use_rm_server", "true", "--reward_server", server.url,
               "--reward_server_protocol", protocol, "--log_completions_per_step", "64", "--eval_datasets", "")
    rows = read_jsonl(tmp_path / "out" / "completions.jsonl")
    assert len(rows) == 3 * 64
    samples = [{"prompt": r["prompt"], "answer": r["answer"], "tgt": r["answer"]} for r in rows]
    local = score_completions([r["completion"] for r in rows], samples, names, weights)
    np.testing.assert_allclose([r["reward"] for r in rows], local.totals, rtol=1e-12)
    if protocol == "v1":
        for name in names:
            assert [r["rewards"][name] for r in rows] == local.columns[name]
    # Same seed, same prompts, same samples: the step metrics match the in-process run's.
    served = [s for s in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "reward_mean" in s]
    in_process = [s for s in read_jsonl(three_steps[0] / "metrics.jsonl") if "reward_mean" in s]
    assert [s["reward_mean"] for s in served] == pytest.approx([s["reward_mean"] for s in in_process], abs=1e-9)


def test_unreachable_reward_server_stops_the_run_naming_it(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = launch(tmp_path, "--max_steps", "1", "--use_rm_server", "true", "--reward_server", url,
                  "--reward_server_retries", "1", "--eval_datasets", "", check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"reward server {url}/v1/score failed 2 attempt(s)" in output, output[-2000:]
    assert not list((tmp_path / "out").glob("checkpoint-*"))
