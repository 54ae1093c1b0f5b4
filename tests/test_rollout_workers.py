"""Rollout processes beside one training process (rollout_workers), under paddle.distributed.launch on loopback:
synchronous they train exactly as a colocated run, one step off (async_generate) they log every batch's
staleness and resume exactly from a checkpoint that holds the rollout in flight, and a rollout process that
dies stops the run with one line naming it, the last finished step saved."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from alignment.config import ConfigError, load_config
from alignment.rollout.ops import load_ops
from alignment.rollout_link import placement, rollout_order, worker_share, words_after

# A learning rate large enough to move the weights well past float noise in 3 steps, a KL term, a sampled
# evaluation on the training process's own engine; fp32 matmuls, importance sampling off and adam_epsilon 1e-6 as
# in test_distributed.py (last-bit differences of the engine's log-probs, amplified by AdamW, stay below 1e-5).
RUN = [
    "run_grpo.py", "config/tiny/grpo_argument.json", "--max_dec_len", "16", "--rollout_n", "4",
    "--per_device_prompt_batch_size", "4", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
    "--warmup_steps", "0", "--kl_loss_coeff", "0.05", "--per_device_eval_batch_size", "4", "--eval_rollout_n", "2",
    "--eval_steps", "2", "--max_evaluate_steps", "1", "--log_completions_per_step", "2", "--cpu_bf16_matmul", "off",
    "--importance_sampling_correction", "false", "--adam_epsilon", "1e-6", "--max_grad_norm", "0.3",
]
ROLLOUT = ["--rollout_workers", "1"]
# not compared between runs: wall-clock times, and the fused engine's gap from the actor (a rounding-level measurement)
NOT_COMPARED = ("time/", "tokens_per_second", "rollout/generate_seconds", "rollout/engine_sync_seconds", "rollout/weight_sync_gap")


@pytest.fixture(scope="module", autouse=True)
def fused_ops():
    if load_ops()[0] is None:  # rows sample alike in any process only in the fused engine
        pytest.skip(f"fused operators not available: {load_ops()[1]}")


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("eval") / "eval.jsonl"
    path.write_text("".join(open("data/arith/test.jsonl").readlines()[:8]))
    return str(path)


def launch(out: Path, processes: int, eval_file: str, *flags: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(processes), "--log_dir", str(out.parent / "log"),
        *RUN, "--eval_datasets", eval_file, "--output_dir", str(out), *flags,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, out: Path) -> str:
    output, _ = process.communicate(timeout=600)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((out.parent / "log").glob("workerlog.*")))
    assert process.returncode == 0, f"{output[-2000:]}\n{logs}"
    return output


def records(out: Path, keep_rollout_keys: bool = True) -> list:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(NOT_COMPARED) and (keep_rollout_keys or not k.startswith("rollout/"))} for row in rows]


def logged_steps(out: Path) -> set:
    metrics = out / "metrics.jsonl"
    return {json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.endswith("}")} if metrics.exists() else set()


def wait_for_step(out: Path, process: subprocess.Popen, step: int) -> None:
    deadline = time.monotonic() + 300
    while step not in logged_steps(out) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert step in logged_steps(out), f"the run ended before step {step}: {process.communicate()[0][-2000:]}"


# --- the order of rollouts and words --------------------------------------------------------------------


def events(first_step: int, total_steps: int, async_generate: bool, pending: bool, stop_after: int | None):
    """Both sides of the protocol as the trainer and a rollout process walk it -> (trainer's, worker's) sequences of
    ("rollout", step) and ("word", step), and the staleness of each step's batch (steps - 1 - weights step)."""
    trainer, held = [], {first_step + 1} if pending else set()
    for step in range(first_step + 1, total_steps + 1):
        if step not in held:
            trainer.append(("rollout", step))
        if async_generate and step + 1 <= total_steps:
            trainer.append(("rollout", step + 1))
            held.add(step + 1)
        if words_after(step, total_steps, async_generate):
            trainer.append(("word", step))
        if step == stop_after:
            break
    worker, weights, staleness = [], first_step, {}
    for step, word in rollout_order(first_step, total_steps, async_generate, pending):
        if word is not None:
            worker.append(("word", word))
            if word == stop_after:
                break
            weights = word
        worker.append(("rollout", step))
        staleness[step] = step - 1 - weights
    return trainer, worker, staleness


STARTS = [(0, 1, False), (0, 2, False), (0, 6, False), (3, 6, False), (5, 6, False)]  # (first_step, total_steps, pending)
RESUMED_ONE_STEP_OFF = [(3, 6, True), (4, 6, True)]  # only a one-step-off checkpoint holds a rollout in flight


@pytest.mark.parametrize(
    "async_generate, first_step, total_steps, pending",
    [(False, *start) for start in STARTS] + [(True, *start) for start in STARTS + RESUMED_ONE_STEP_OFF],
)
@pytest.mark.parametrize("stop_after", [None, 1, 4])
def test_both_sides_walk_the_same_order(async_generate, first_step, total_steps, pending, stop_after):
    stop_after = stop_after if stop_after is not None and first_step < stop_after < total_steps else None
    trainer, worker, staleness = events(first_step, total_steps, async_generate, pending, stop_after)
    assert trainer == worker
    # one step off, every batch but the first of a fresh start comes from weights one optimizer step old
    assert staleness == {step: int(async_generate and step > first_step + 1) for step in staleness}


def test_the_prompts_are_shared_out_contiguously():
    assert [worker_share(8, 3, w) for w in range(3)] == [(0, 3), (3, 5), (5, 8)]
    assert [worker_share(4, 1, 0)] == [(0, 4)]
    shares = [worker_share(7, 7, w) for w in range(7)]
    assert all(end - first == 1 for first, end in shares)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--async_generate", "true"], "async_generate generates beside training: it needs rollout_workers >= 1"),
        (["--rollout_workers", "1", "--dynamic_sampling", "true"], "dynamic_sampling with rollout_workers"),
        (["--rollout_workers", "1", "--sharding", "stage1"], "sharding = 'stage1' with rollout_workers"),
        (["--rollout_workers", "3", "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "8"], "rollout_workers = 3 but a step has 2 prompts"),
        (["--rollout_workers", "-1"], "rollout_workers = -1: must be >= 0"),
    ],
)
def test_settings_rollout_processes_cannot_run_are_refused(flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(["config/tiny/grpo_argument.json", *flags])


def test_a_launch_with_the_wrong_number_of_processes_is_refused(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "3")
    with pytest.raises(ConfigError, match=r"rollout_workers = 1 needs 2 processes .*--nproc_per_node 2.*not 3"):
        placement(1)
    monkeypatch.setenv("PADDLE_TRAINER_ID", "2")
    assert placement(2).is_rollout_worker and placement(2).worker_index == 1


# --- launched runs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def colocated(tmp_path_factory, eval_file) -> Path:
    out = tmp_path_factory.mktemp("colocated") / "out"
    finish(launch(out, 1, eval_file, "--max_steps", "3"), out)
    return out


def test_synchronous_rollout_process_trains_as_a_colocated_run(tmp_path, colocated, eval_file):
    out = tmp_path / "out"
    finish(launch(out, 2, eval_file, "--max_steps", "3", *ROLLOUT), out)
    base, expected, got = load_file("data/tiny-qwen2/model.safetensors"), load_file(str(colocated / "checkpoint-3" / "model.safetensors")), load_file(str(out / "checkpoint-3" / "model.safetensors"))
    assert max(float(np.abs(expected[k] - base[k]).max()) for k in base) > 5e-3  # so that agreement to 1e-5 says something
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-5, err_msg=name)
    rows, reference = records(out), records(colocated, keep_rollout_keys=False)
    assert [r["step"] for r in rows] == [0, 1, 2, 2, 3, 3]  # logged once: one record per step and per evaluation
    assert [r["rollout/staleness"] for r in rows if "reward_mean" in r] == [0, 0, 0]
    for row, reference_row in zip(records(out, keep_rollout_keys=False), reference):
        assert row.keys() == reference_row.keys()
        for key, value in row.items():
            assert value == pytest.approx(reference_row[key], rel=1e-5, abs=1e-6), (row["step"], key)
    worker_log = (tmp_path / "log" / "workerlog.1").read_text()
    assert "rollout process 1: generating with the FusedEngine from step 1" in worker_log and "step 1:" not in worker_log


@pytest.mark.slow
def test_one_step_off_logs_staleness_and_resumes_exactly(tmp_path, eval_file):
    flags = ["--max_steps", "5", "--save_steps", "2", "--learning_rate", "2e-3", *ROLLOUT, "--async_generate", "true", "--importance_sampling_correction", "true"]
    straight, killed = tmp_path / "straight" / "out", tmp_path / "killed" / "out"
    finish(launch(straight, 2, eval_file, *flags), straight)
    expected = records(straight)
    assert [r["rollout/staleness"] for r in expected if "reward_mean" in r] == [0, 1, 1, 1, 1]
    assert (straight / "checkpoint-4" / "pending_rollout.pkl").is_file()  # step 5's rollout, generated from step 3's weights

    process = launch(killed, 2, eval_file, *flags)
    wait_for_step(killed, process, 3)  # the checkpoint is at step 2 and holds step 3's rollout: step 3 is redone from it
    subprocess.run(["pkill", "-KILL", "-f", f"run_grpo.py.*{killed}"])  # the launcher and both processes
    process.wait()
    assert (killed / "checkpoint-2" / "trainer_state.json").is_file() and not (killed / "checkpoint-4").exists()
    output = finish(launch(killed, 2, eval_file, *flags, "--resume_from_checkpoint", "auto"), killed)
    assert f"resuming from {killed}/checkpoint-2 after step 2" in output + (killed.parent / "log" / "workerlog.0").read_text()

    assert records(killed) == expected
    assert (killed / "checkpoint-4" / "model.safetensors").read_bytes() == (straight / "checkpoint-4" / "model.safetensors").read_bytes()
    (due, [part]), (expected_due, [expected_part]) = (pickle.loads((out / "checkpoint-4" / "pending_rollout.pkl").read_bytes()) for out in (killed, straight))
    assert (due, part.weights_step) == (expected_due, expected_part.weights_step) == (5, 3)
    for field in ("completion_ids", "completion_mask", "logprobs"):
        np.testing.assert_array_equal(getattr(part.rollout, field), getattr(expected_part.rollout, field))
    assert (killed / "completions.jsonl").read_text() == (straight / "completions.jsonl").read_text()


def test_a_rollout_process_that_dies_stops_the_run_with_the_last_step_saved(tmp_path, eval_file):
    out = tmp_path / "out"
    process = launch(out, 2, eval_file, "--max_steps", "20", *ROLLOUT)
    wait_for_step(out, process, 2)
    worker = int(subprocess.run(["pgrep", "-n", "-f", f"run_grpo.py.*{out}"], capture_output=True, text=True).stdout)  # rank 1 starts last
    os.kill(worker, signal.SIGKILL)
    process.communicate(timeout=300)
    log = (tmp_path / "log" / "workerlog.0").read_text()
    errors = [line for line in log.splitlines() if line.startswith("run_grpo: error:")]
    assert errors == ["run_grpo: error: rollout process 1 died without a word (killed, or out of memory): its log <log_dir>/workerlog.1 and the system log may say why"], log[-3000:]
    saved = sorted(out.glob("checkpoint-*"))
    assert len(saved) == 1 and f"{saved[0]} holds the state after step {saved[0].name.split('-')[1]}" in log
    assert int(saved[0].name.split("-")[1]) in logged_steps(out) and (saved[0] / "trainer_state.json").is_file()
