"""Exact resume: a run killed with SIGKILL after its step-3 checkpoint and resumed with
resume_from_checkpoint auto ends as an uninterrupted run does (fp32, CPU, fixed seed)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Small steps, a KL term (the reference model must stay the base model after a resume), sampled
# evaluation (its random draws must not shift training's), and checkpoints every 3 steps.
RUN = [
    "run_grpo.py", "config/tiny/grpo_argument.json", "--max_steps", "6", "--save_steps", "3", "--max_dec_len", "16",
    "--per_device_prompt_batch_size", "2", "--rollout_n", "4", "--per_device_train_batch_size", "4",
    "--kl_loss_coeff", "0.05", "--eval_steps", "2", "--eval_rollout_n", "2", "--per_device_eval_batch_size", "4",
    "--max_evaluate_steps", "1", "--lr_scheduler_type", "linear", "--warmup_steps", "2", "--learning_rate", "1e-4",
]
# not compared between runs: wall-clock times, peak memory, and the fused engine's gap from the actor (a rounding-level measurement)
NOT_COMPARED = ("time/", "tokens_per_second", "rollout/weight_sync_gap", "memory/")


def records(out: Path) -> list:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(NOT_COMPARED)} for row in rows]


def run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *RUN, "--output_dir", str(out), *extra], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def logged_steps(out: Path) -> set:
    metrics = out / "metrics.jsonl"
    return {json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.endswith("}")} if metrics.exists() else set()


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("eval") / "eval.jsonl"
    path.write_text("".join(open("data/arith/test.jsonl").readlines()[:8]))
    return str(path)


@pytest.mark.slow
def test_a_killed_run_resumes_exactly(tmp_path, eval_file):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(straight, "--eval_datasets", eval_file)

    process = subprocess.Popen(
        [sys.executable, *RUN, "--output_dir", str(killed), "--eval_datasets", eval_file],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    # Kill once step 4 is logged: the checkpoint is at step 3, so step 4's records must be replaced, not repeated.
    while 4 not in logged_steps(killed) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed after step 4"
    assert (killed / "checkpoint-3" / "trainer_state.json").is_file() and not (killed / "checkpoint-6").exists()

    done = run(killed, "--eval_datasets", eval_file, "--resume_from_checkpoint", "auto")
    assert f"resuming from {killed}/checkpoint-3 after step 3" in done.stdout + done.stderr

    expected = records(straight)
    assert [r["step"] for r in expected] == [0, 1, 2, 2, 3, 4, 4, 5, 6, 6]  # evaluations at 0, 2, 4, 6
    assert records(killed) == expected  # every metric, the sampled evaluation's mean@2 / pass@2 included
    assert all(r["kl"] is not None for r in expected if "reward_mean" in r)
    assert (killed / "checkpoint-6" / "model.safetensors").read_bytes() == (straight / "checkpoint-6" / "model.safetensors").read_bytes()
    assert (killed / "completions.jsonl").read_text() == (straight / "completions.jsonl").read_text()


def test_resume_from_a_folder_that_is_not_a_checkpoint_fails_before_loading(tmp_path):
    done = subprocess.run(
        [sys.executable, *RUN, "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2
    assert f"resume_from_checkpoint: '{tmp_path}' is not a complete checkpoint folder" in done.stderr


@pytest.mark.slow
def test_a_forged_optimizer_state_stops_the_resume_in_one_line(tmp_path):
    """A checkpoint whose optimizer.safetensors holds a moment of another shape, with its checksums recomputed (whoever
    forges a checkpoint writes them too): the resume stops naming the file and the tensor (a traceback inside the
    first optimizer step before)."""
    import paddle

    from alignment.storage.optimizer_state import load_optimizer_state, save_optimizer_state
    from alignment.storage.resume import sha256

    out = tmp_path / "out"
    run(out, "--max_steps", "1", "--save_steps", "1")
    checkpoint = out / "checkpoint-1"
    state = load_optimizer_state(checkpoint / "optimizer.safetensors")
    moment = sorted(key for key in state if "_moment1_" in key)[0]
    state[moment] = paddle.zeros([7, 7])
    save_optimizer_state(state, checkpoint / "optimizer.safetensors")
    record = json.loads((checkpoint / "trainer_state.json").read_text())
    record["files"] = {name: {"size": (checkpoint / name).stat().st_size, "sha256": sha256(checkpoint / name)} for name in record["files"]}
    (checkpoint / "trainer_state.json").write_text(json.dumps(record))
    done = subprocess.run([sys.executable, *RUN, "--output_dir", str(out), "--max_steps", "2", "--resume_from_checkpoint", str(checkpoint)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"run_grpo: error: resume_from_checkpoint: {checkpoint}/optimizer.safetensors holds {moment} as float32 [7, 7]" in done.stderr
