"""Data parallel over processes and nodes with paddle.distributed.launch (gloo on CPU): the update does
not change when the same global batch is spread over more processes."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from reward_servers import free_port
from safetensors.numpy import load_file

from alignment.rollout.ops import load_ops

GLOBAL_PROMPTS = 4
# A learning rate large enough that 2 steps move the weights well beyond float noise, a KL term, and a
# sampled evaluation split across ranks. Truncated importance sampling is off: its weights are
# pi_old / pi_rollout, and the fused engine's log-probs differ in their last bits with the rows decoded
# together (16 in one process, 8 in each of two: other matmul shapes), which a learning rate of 1e-2
# turns into differences of up to 5e-5 in weights whose gradient is near zero.
RUN = [
    "run_grpo.py", "config/tiny/grpo_argument.json", "--max_steps", "2", "--max_dec_len", "16", "--rollout_n", "4",
    "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--warmup_steps", "0", "--kl_loss_coeff", "0.05",
    "--per_device_eval_batch_size", "3", "--eval_rollout_n", "2", "--log_completions_per_step", "0",
    "--importance_sampling_correction", "false",
]
WALL_CLOCK = ("time/", "tokens_per_second")


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


def launch(out: Path, launcher_flags: list, processes: int, eval_file: str, log_dir: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "paddle.distributed.launch", *launcher_flags, "--log_dir", str(log_dir), *RUN,
        "--per_device_prompt_batch_size", str(GLOBAL_PROMPTS // processes), "--eval_datasets", eval_file,
        "--output_dir", str(out),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, log_dir: Path) -> str:
    output, _ = process.communicate(timeout=600)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(log_dir.glob("workerlog.*")))
    assert process.returncode == 0, f"{output[-2000:]}\n{logs}"
    return output


def metrics(out: Path) -> list:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(WALL_CLOCK)} for row in rows]


def weights(out: Path) -> dict:
    return load_file(str(out / "checkpoint-2" / "model.safetensors"))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, eval_file) -> Path:
    tmp = tmp_path_factory.mktemp("one")
    finish(launch(tmp / "out", ["--nproc_per_node", "1"], 1, eval_file, tmp / "log"), tmp / "log")
    return tmp / "out"


def assert_same_run(out: Path, reference: Path) -> None:
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
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]


def test_two_processes_train_exactly_like_one(tmp_path, one_process, eval_file):
    out, log_dir = tmp_path / "out", tmp_path / "log"
    finish(launch(out, ["--nproc_per_node", "2"], 2, eval_file, log_dir), log_dir)
    assert_same_run(out, one_process)
    # Each rank logs to its own file; only rank 0 prints the run's summary.
    assert "saved" in (log_dir / "workerlog.0").read_text() and "saved" not in (log_dir / "workerlog.1").read_text()


def test_two_nodes_on_loopback_train_like_one_process(tmp_path, one_process, eval_file):
    master = f"127.0.0.1:{free_port()}"
    nodes = [
        launch(tmp_path / "out", ["--nnodes", "2", "--master", master, "--nproc_per_node", "1"], 2, eval_file, tmp_path / f"node{i}")
        for i in range(2)
    ]
    for i, node in enumerate(nodes):
        finish(node, tmp_path / f"node{i}")
    assert_same_run(tmp_path / "out", one_process)
