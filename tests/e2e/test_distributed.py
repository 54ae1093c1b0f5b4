"""Data parallel over processes and nodes with paddle.distributed.launch (gloo on CPU), with and without
sharding stage1: the update does not change when the same global batch is spread over more processes,
nor when the optimizer state is split among them."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.reward_servers import free_port
from safetensors.numpy import load_file
from helpers.tiny_models import put_a_nan_in_the_final_norm

from alignment.kernels.ops import load_ops
from alignment.storage.optimizer_state import load_optimizer_state

GLOBAL_PROMPTS = 4
# A learning rate large enough that 2 steps move the weights well beyond float noise, a KL term, and a
# sampled evaluation split across ranks. Truncated importance sampling is off: its weights are
# pi_old / pi_rollout, and the fused engine's log-probs differ in their last bits with the rows decoded
# together (16 in one process, 8 in each of two: other matmul shapes), which a learning rate of 1e-2
# turns into differences of up to 5e-5 in weights whose gradient is near zero. For the same reason
# adam_epsilon is 1e-6: AdamW's step lr * g / (|g| + eps) amplifies the last-bit differences of a gradient
# summed in another order by lr / (4 eps) where |g| is near eps (2.5e5 at the default 1e-8, which moved a
# few dozen weights by up to 2e-4 on an AMD EPYC; 100x less at 1e-6). max_grad_norm 0.3 clips step 2 (norm
# about 0.6): sharding clips the owned shares by hand with the norm over all processes.
RUN = [
    "run_grpo.py", "config/tiny/grpo_argument.json", "--max_steps", "2", "--max_dec_len", "16", "--rollout_n", "4",
    "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--warmup_steps", "0", "--kl_loss_coeff", "0.05",
    "--per_device_eval_batch_size", "3", "--eval_rollout_n", "2", "--log_completions_per_step", "0",
    "--importance_sampling_correction", "false", "--max_grad_norm", "0.3", "--adam_epsilon", "1e-6",
]
# not compared between runs: wall-clock times, and the engine's gap from the actor, whose last bits depend on the threads
NOT_COMPARED = ("time/", "tokens_per_second", "rollout/weight_sync_gap", "memory/")


@pytest.fixture(scope="module", autouse=True)
def fused_ops():
    # Rows sample the same tokens in any process only in the fused engine, whose draws are keyed on the
    # row's index in the global batch; the eager engine draws from each process's own generator.
    if load_ops()[0] is None:
        pytest.skip(f"fused operators not available: {load_ops()[1]}")


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("eval") / "eval.jsonl"
    path.write_text("".join(open("data/arith/test.jsonl").readlines()[:10]))  # 5 per rank: uneven batches of 3
    return str(path)


def launch(out: Path, launcher_flags: list, processes: int, eval_file: str, log_dir: Path, *flags: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "paddle.distributed.launch", *launcher_flags, "--log_dir", str(log_dir), *RUN,
        "--per_device_prompt_batch_size", str(GLOBAL_PROMPTS // processes), "--eval_datasets", eval_file,
        "--output_dir", str(out), *flags,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, log_dir: Path) -> str:
    output, _ = process.communicate(timeout=600)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(log_dir.glob("workerlog.*")))
    assert process.returncode == 0, f"{output[-2000:]}\n{logs}"
    return output


def metrics(out: Path) -> list:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(NOT_COMPARED)} for row in rows]


def weights(out: Path) -> dict:
    return load_file(str(out / "checkpoint-2" / "model.safetensors"))


def optimizer_state(checkpoint: Path) -> dict:
    state = load_optimizer_state(checkpoint / "optimizer.safetensors")
    return {key: value if key == "LR_Scheduler" else value.numpy() for key, value in state.items()}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, eval_file) -> Path:
    tmp = tmp_path_factory.mktemp("one")
    finish(launch(tmp / "out", ["--nproc_per_node", "1"], 1, eval_file, tmp / "log"), tmp / "log")
    return tmp / "out"


def assert_same_run(out: Path, reference: Path, checkpoints: tuple = ("checkpoint-2",)) -> None:
    base = load_file("data/tiny-qwen2/model.safetensors")
    expected, got = weights(reference), weights(out)
    moved = max(float(np.abs(expected[k] - base[k]).max()) for k in base)
    assert moved > 5e-3  # so that agreement to 1e-5 says something
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-5, err_msg=name)
    reference_rows, rows = metrics(reference), metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 2]  # logged once: one record per step and per evaluation
    assert rows[0]["eval_samples"] == 10 and "eval_pass@2" in rows[0]
    for row, reference_row in zip(rows, reference_rows):
        assert row.keys() == reference_row.keys()
        for key, value in row.items():
            assert value == pytest.approx(reference_row[key], rel=1e-5, abs=1e-6), (row["step"], key)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == list(checkpoints)


def test_two_processes_train_exactly_like_one(tmp_path, one_process, eval_file):
    out, log_dir = tmp_path / "out", tmp_path / "log"
    finish(launch(out, ["--nproc_per_node", "2"], 2, eval_file, log_dir), log_dir)
    assert_same_run(out, one_process)
    # Each rank logs to its own file; only rank 0 prints the run's summary.
    assert "saved" in (log_dir / "workerlog.0").read_text() and "saved" not in (log_dir / "workerlog.1").read_text()


@pytest.mark.slow  # two launched nodes (about 23 s); two processes on one node run in make test
def test_two_nodes_on_loopback_train_like_one_process(tmp_path, one_process, eval_file):
    master = f"127.0.0.1:{free_port()}"
    nodes = [
        launch(tmp_path / "out", ["--nnodes", "2", "--master", master, "--nproc_per_node", "1"], 2, eval_file, tmp_path / f"node{i}")
        for i in range(2)
    ]
    for i, node in enumerate(nodes):
        finish(node, tmp_path / f"node{i}")
    assert_same_run(tmp_path / "out", one_process)


# ---- sharding: stage1 (paddle's DygraphShardingOptimizer): each process keeps the AdamW moments of its
# share of the parameters; checkpoints gather the whole state onto the main process.


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, eval_file) -> Path:
    tmp = tmp_path_factory.mktemp("sharded")
    flags = ["--sharding", "stage1", "--save_steps", "1"]
    finish(launch(tmp / "out", ["--nproc_per_node", "2"], 2, eval_file, tmp / "log", *flags), tmp / "log")
    log = (tmp / "log" / "workerlog.0").read_text()
    assert "AdamW state sharded over 2 processes (stage1)" in log and "saved" in log and "nccl reduce_avg" not in log
    return tmp / "out"


def test_sharded_stage1_trains_exactly_like_one_process(sharded, one_process):
    assert_same_run(sharded, one_process, checkpoints=("checkpoint-1", "checkpoint-2"))
    assert max(row.get("grad_norm", 0) for row in metrics(sharded)) > 0.3  # max_grad_norm clipped a step
    # the gathered optimizer state is the whole state, entry for entry: a checkpoint does not depend on sharding
    expected, got = optimizer_state(one_process / "checkpoint-2"), optimizer_state(sharded / "checkpoint-2")
    assert got.keys() == expected.keys() and len(got) > 100
    assert got["LR_Scheduler"] == expected["LR_Scheduler"]
    for key in expected.keys() - {"LR_Scheduler"}:
        # rtol, and an atol at the tensor's scale: a moment of a near-zero gradient differs in its last bits
        # with the gradient summed in another order (by 8e-11, in moments of about 1e-4, on an AMD EPYC)
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-4, atol=1e-6 * np.abs(expected[key]).max(), err_msg=key)


@pytest.mark.parametrize(
    "layout",
    [
        ["--nproc_per_node", "1"],
        ["--nproc_per_node", "2", "--sharding", "stage1"],
    ],
    ids=["one-process", "sharded"],
)
def test_a_sharded_checkpoint_resumes_in_any_layout(tmp_path, sharded, eval_file, layout):
    processes = int(layout[1])
    flags = ["--resume_from_checkpoint", str(sharded / "checkpoint-1"), *layout[2:]]
    finish(launch(tmp_path / "out", layout[:2], processes, eval_file, tmp_path / "log", *flags), tmp_path / "log")
    expected, got = weights(sharded), weights(tmp_path / "out")
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-5, err_msg=name)


def test_sharded_processes_skip_nan_steps_together_and_stop(tmp_path, sharded, eval_file):
    """A reference model gone bad (a NaN norm weight) behind the sharded checkpoint-1: the norm summed over
    both shares is NaN, so both processes skip steps 2 and 3 and stop at max_consecutive_skips."""
    base = tmp_path / "base"
    shutil.copytree("data/tiny-qwen2", base)
    put_a_nan_in_the_final_norm(base)
    out = tmp_path / "out"
    shutil.copytree(sharded / "checkpoint-1", out / "checkpoint-1")
    flags = ["--sharding", "stage1", "--actor_model_name_or_path", str(base), "--allow_config_change",  # the same weights, elsewhere
             "--resume_from_checkpoint", "auto", "--max_steps", "5", "--max_consecutive_skips", "2"]
    process = launch(out, ["--nproc_per_node", "2"], 2, eval_file, tmp_path / "log", *flags)
    process.communicate(timeout=300)
    logs = [(tmp_path / "log" / f"workerlog.{rank}").read_text() for rank in (0, 1)]
    assert process.returncode != 0
    for log in logs:  # each process stops by itself, with the same reason: no collective is left waiting
        assert "run_grpo: error: step 3: the reference model's log-probs not finite for 2 consecutive steps" in log, log[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"step_skipped"' in line]
    assert [(r["step"], r["step_skipped"], r["skipped_steps"]) for r in records] == [(2, 1, 1), (3, 1, 2)]


def test_a_sharding_degree_other_than_all_processes_is_refused(tmp_path, eval_file):
    flags = ["--sharding", "stage1", "--sharding_parallel_degree", "4"]
    process = launch(tmp_path / "out", ["--nproc_per_node", "2"], 2, eval_file, tmp_path / "log", *flags)
    output, _ = process.communicate(timeout=300)
    assert process.returncode != 0
    # both processes refuse it; the launcher stops the other once the first has exited, so either log may hold the line
    logs = [path.read_text() for path in sorted((tmp_path / "log").glob("workerlog.*"))]
    refused = [log for log in logs if "run_grpo: error: sharding_parallel_degree = 4 with 2 processes" in log]
    assert refused and "-1: all" in refused[0], output[-2000:] + "".join(log[-2000:] for log in logs)


@pytest.mark.slow
def test_step_wide_statistics_are_taken_over_all_processes(tmp_path, eval_file):
    """REINFORCE++'s whitening over the step's tokens, the entropy selection's quantile and the entropy bonus's
    token count are global: one step on two processes logs what it logs on one (loss, gradient norm, selected
    fraction, advantages: each would change if a process used its own statistics). Only the first step: the
    bonus's gradient is dense and mostly tiny, and at this test's learning rate AdamW turns the last-bit
    differences of its summation order into different weights by the second step."""
    flags = [
        "--max_steps", "1",
        "--advantage_estimator", "reinforce_plus_plus_baseline",
        "--top_entropy_quantile", "0.5",
        "--entropy_coeff", "0.01",
    ]
    rows = {}
    for processes in (1, 2):
        out, log_dir = tmp_path / f"out{processes}", tmp_path / f"log{processes}"
        finish(launch(out, ["--nproc_per_node", str(processes)], processes, eval_file, log_dir, *flags), log_dir)
        rows[processes] = [row for row in metrics(out) if "loss" in row]
    (one,), (two,) = rows[1], rows[2]
    assert 0.5 <= one["entropy_selected_fraction"] < 0.55 and one.keys() == two.keys()
    for key, value in one.items():
        assert two[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
