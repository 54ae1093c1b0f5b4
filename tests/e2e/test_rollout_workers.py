"""Rollout processes beside one training process (rollout_workers), under paddle.distributed.launch on loopback:
synchronous they train exactly as a colocated run, one step off (async_generate) they log every batch's
staleness and resume exactly from a checkpoint that holds the rollout in flight, and a rollout process that
dies stops the run with one line naming it, the last finished step saved."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

# A learning rate large enough to move the weights well past float noise in 3 steps, a KL term, a sampled
from alignment.basics.errors import ConfigError
from alignment.rollout.link import placement, rollout_order, words_after, worker_share
from alignment.kernels.ops import load_ops
from alignment.rollout.wire import load_parts
from alignment.config.cli import load_config

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
NOT_COMPARED = (
    "time/", "tokens_per_second", "rollout/generate_seconds", "rollout/engine_sync_seconds", "rollout/weight_sync_gap", "memory/",
)


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
    return [
        {k: v for k, v in row.items() if not k.startswith(NOT_COMPARED) and (keep_rollout_keys or not k.startswith("rollout/"))}
        for row in rows
    ]


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
        (["--rollout_workers", "3", "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "8"],
         "rollout_workers = 3 but a step has 2 prompts"),
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


def handshake(trainer_key: bytes, worker_key: bytes, silent_worker: bool = False) -> tuple:
    """Both ends of one connection over loopback -> (the trainer's outcome, the rollout process's): "ok" or the error."""
    from multiprocessing.connection import Connection

    from alignment.rollout.link_handshake import _handshake

    server = socket.create_server(("127.0.0.1", 0))
    outcomes = {}

    def side(name, make, key, trainer):
        connection = make()
        try:
            if not (silent_worker and not trainer):
                _handshake(connection, key, trainer)
            outcomes[name] = "ok"
        except Exception as error:
            outcomes[name] = type(error).__name__
        finally:
            if not (silent_worker and not trainer):
                connection.close()

    worker = threading.Thread(
        target=side, args=("worker", lambda: Connection(socket.create_connection(server.getsockname()).detach()), worker_key, False)
    )
    worker.start()
    side("trainer", lambda: Connection(server.accept()[0].detach()), trainer_key, True)
    worker.join(timeout=30)
    server.close()
    return outcomes["trainer"], outcomes["worker"]


def test_the_link_handshake_needs_the_runs_key_bound_to_the_trainers_address(monkeypatch):
    from alignment.rollout import link_handshake
    from alignment.rollout.link_handshake import address_bound_key

    key = b"k" * 32
    genuine = address_bound_key(key, "127.0.0.1", 4000)
    assert handshake(genuine, genuine) == ("ok", "ok")
    assert handshake(genuine, address_bound_key(b"x" * 32, "127.0.0.1", 4000)) == ("AuthenticationError", "AuthenticationError")
    # a process relaying between the trainer and a rollout process that connected to the relay's address fails too
    assert handshake(genuine, address_bound_key(key, "127.0.0.1", 4001)) == ("AuthenticationError", "AuthenticationError")
    monkeypatch.setattr(link_handshake, "HANDSHAKE_SECONDS", 0.5)
    started = time.monotonic()
    # cut off, not waited for: EOF, or an OSError (a reset where the silent end's socket closed with data unread)
    assert handshake(genuine, genuine, silent_worker=True)[0] in ("EOFError", "OSError", "ConnectionResetError")
    assert time.monotonic() - started < 30


def test_silent_or_failing_connections_do_not_hold_up_the_rollout_processes():
    """Two connections that never say a word and one with a wrong key reach the trainer's port first; the rollout
    process behind them is taken in at once (served one at a time, each silent one held the start for a minute)."""
    from alignment.rollout.link_handshake import HANDSHAKE_SECONDS, accept_workers, address_bound_key, join_trainer
    from alignment.rollout.wire import receive_message, send_message

    key, server = b"k" * 32, socket.create_server(("127.0.0.1", 0))
    host, port = server.getsockname()
    silent = [socket.create_connection((host, port)) for _ in range(2)]
    wrong = threading.Thread(target=handshake_with, args=(host, port, address_bound_key(b"x" * 32, host, port)), daemon=True)
    wrong.start()
    joined = []
    worker = threading.Thread(target=lambda: joined.append(join_trainer(host, port, key, 1)), daemon=True)
    worker.start()
    started = time.monotonic()
    with pytest.warns(UserWarning, match="rollout link: turned away a connection from 127.0.0.1") as warned:
        (connection,) = accept_workers(server, address_bound_key(key, host, port), 1)
        waited = time.monotonic() - started
        wrong.join(timeout=30)
        # the trainer's side turns the wrong key away in a thread of its own, which can end after the peer's: wait for it
        deadline = time.monotonic() + 30
        while not any("turned away" in str(w.message) for w in warned) and time.monotonic() < deadline:
            time.sleep(0.01)
    worker.join(timeout=30)
    send_message(connection, "plan", {"first_step": 0})
    assert receive_message(joined[0])[:2] == ("plan", {"first_step": 0})
    assert waited < HANDSHAKE_SECONDS / 2, f"the rollout process waited {waited:.1f} s behind connections that proved nothing"
    for sock in silent:
        sock.close()


def handshake_with(host: str, port: int, authkey: bytes) -> str:
    """A peer's side of the handshake with `authkey` -> "ok" or the error's name."""
    from multiprocessing.connection import Connection

    from alignment.rollout.link_handshake import _handshake

    connection = Connection(socket.create_connection((host, port)).detach())
    try:
        _handshake(connection, authkey, trainer=False)
        return "ok"
    except Exception as error:
        return type(error).__name__
    finally:
        connection.close()


SEVERAL_MACHINES, ONE_MACHINE = "10.0.0.1:6170,10.0.0.2:6170", "127.0.0.1:6170,127.0.0.1:6171"


@pytest.mark.parametrize(
    "endpoints, key, mode, plain, message",
    [
        (SEVERAL_MACHINES, None, None, None, "rollout_workers on several machines: set GRPO_ROLLOUT_LINK_KEY_FILE to a file only you"),
        (SEVERAL_MACHINES, "short", 0o600, None, r"GRPO_ROLLOUT_LINK_KEY_FILE = \S+: the key is 5 characters long: use at least 16"),
        (SEVERAL_MACHINES, "a" * 32, 0o640, None, r"the key file must be this user's and readable by nobody else \(owner \d+, mode 640\)"),
        (SEVERAL_MACHINES, "", 0o600, None, "the key file is empty"),
        # the key itself in the environment: the launcher has written it to envlog.N and backup_env.N.json, file or not
        (SEVERAL_MACHINES, "a" * 32, 0o600, "b" * 32, "GRPO_ROLLOUT_LINK_KEY is set: paddle.distributed.launch writes the environment"),
        (ONE_MACHINE, None, None, "b" * 32, "GRPO_ROLLOUT_LINK_KEY is set: .* set GRPO_ROLLOUT_LINK_KEY_FILE to the file's path"),
    ],
    ids=["no key", "short", "others may read", "empty", "the key in the environment", "the key in the environment, one machine"],
)
def test_a_link_across_machines_needs_a_key_file_of_the_users(monkeypatch, tmp_path, endpoints, key, mode, plain, message):
    from alignment.rollout.link_handshake import shared_key

    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", endpoints)
    monkeypatch.delenv("GRPO_ROLLOUT_LINK_KEY_FILE", raising=False)
    monkeypatch.delenv("GRPO_ROLLOUT_LINK_KEY", raising=False)
    if plain is not None:
        monkeypatch.setenv("GRPO_ROLLOUT_LINK_KEY", plain)
    if key is not None:
        monkeypatch.setenv("GRPO_ROLLOUT_LINK_KEY_FILE", str(tmp_path / "link.key"))
        (tmp_path / "link.key").write_text(key + "\n")
        (tmp_path / "link.key").chmod(mode)
    with pytest.raises(ConfigError, match=message):
        shared_key()
    monkeypatch.delenv("GRPO_ROLLOUT_LINK_KEY", raising=False)
    monkeypatch.setenv("GRPO_ROLLOUT_LINK_KEY_FILE", str(tmp_path / "good.key"))
    (tmp_path / "good.key").write_text("a" * 32 + "\n")
    (tmp_path / "good.key").chmod(0o600)
    assert shared_key() == b"a" * 32
    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", ONE_MACHINE)  # one machine: the run makes its own
    monkeypatch.delenv("GRPO_ROLLOUT_LINK_KEY_FILE")
    assert shared_key() is None


@pytest.mark.slow  # two launches: one refused after the models load, one step trained with a rollout process (about 40 s)
def test_the_link_key_reaches_the_processes_through_a_file_never_the_launchers_logs(tmp_path, eval_file):
    """paddle.distributed.launch writes every environment variable to <log_dir>/envlog.N and backup_env.N.json: a key in
    GRPO_ROLLOUT_LINK_KEY lands there, and the run refuses it (one line saying to use the file); with the key in a 0600
    file named by GRPO_ROLLOUT_LINK_KEY_FILE the run trains and the key is in no file of the log folder nor of output_dir."""
    plain, key = os.urandom(32).hex(), os.urandom(32).hex()
    key_file = tmp_path / "link.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    environment = {name: value for name, value in os.environ.items() if not name.startswith("GRPO_ROLLOUT_LINK_KEY")}
    for case, variables in (("plain", {"GRPO_ROLLOUT_LINK_KEY": plain}), ("file", {"GRPO_ROLLOUT_LINK_KEY_FILE": str(key_file)})):
        out, log_dir = tmp_path / case / "out", tmp_path / case / "log"
        command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir),
                   *RUN, "--eval_datasets", eval_file, "--output_dir", str(out), "--max_steps", "1", "--eval_on_start", "false", *ROLLOUT]
        done = subprocess.run(command, env=environment | variables, capture_output=True, text=True, timeout=600)
        logged = [path for path in log_dir.rglob("*") if path.is_file()]
        if case == "plain":
            assert done.returncode != 0 and any(plain in path.read_text() for path in logged)  # what the refusal is about
            assert "GRPO_ROLLOUT_LINK_KEY is set: paddle.distributed.launch writes the environment" in (log_dir / "workerlog.0").read_text()
            continue
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert [r["step"] for r in records(out) if "reward_mean" in r] == [1]
        assert str(key_file) in (log_dir / "envlog.0").read_text()  # the launcher logged the environment: the file's name only
        leaked = [path for path in logged + [path for path in out.rglob("*") if path.is_file()] if key.encode() in path.read_bytes()]
        assert leaked == []


def test_the_link_file_must_be_private_to_its_user(tmp_path):
    from alignment.basics.errors import RolloutWorkerError
    from alignment.rollout.link_handshake import read_private, write_private

    path = tmp_path / "link.json"
    write_private(path, {"address": ["127.0.0.1", 1], "key": "00"})
    assert oct(path.stat().st_mode & 0o777) == "0o600" and read_private(path)["key"] == "00"
    path.chmod(0o644)
    with pytest.raises(RolloutWorkerError, match="is not private to this user .*mode 644"):
        read_private(path)


# --- launched runs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def colocated(tmp_path_factory, eval_file) -> Path:
    out = tmp_path_factory.mktemp("colocated") / "out"
    finish(launch(out, 1, eval_file, "--max_steps", "3"), out)
    return out


@pytest.mark.slow  # a launched run with a rollout process (about 25 s)
def test_synchronous_rollout_process_trains_as_a_colocated_run(tmp_path, colocated, eval_file):
    out = tmp_path / "out"
    finish(launch(out, 2, eval_file, "--max_steps", "3", *ROLLOUT), out)
    base, expected, got = (
        load_file("data/tiny-qwen2/model.safetensors"),
        load_file(str(colocated / "checkpoint-3" / "model.safetensors")),
        load_file(str(out / "checkpoint-3" / "model.safetensors")),
    )
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
    flags = [
        "--max_steps", "5", "--save_steps", "2", "--learning_rate", "2e-3", *ROLLOUT,
        "--async_generate", "true", "--importance_sampling_correction", "true",
    ]
    straight, killed = tmp_path / "straight" / "out", tmp_path / "killed" / "out"
    finish(launch(straight, 2, eval_file, *flags), straight)
    expected = records(straight)
    assert [r["rollout/staleness"] for r in expected if "reward_mean" in r] == [0, 1, 1, 1, 1]
    assert (straight / "checkpoint-4" / "pending_rollout.safetensors").is_file()  # step 5's rollout, generated from step 3's weights

    process = launch(killed, 2, eval_file, *flags)
    wait_for_step(killed, process, 3)  # the checkpoint is at step 2 and holds step 3's rollout: step 3 is redone from it
    subprocess.run(["pkill", "-KILL", "-f", f"run_grpo.py.*{killed}"])  # the launcher and both processes
    process.wait()
    assert (killed / "checkpoint-2" / "trainer_state.json").is_file() and not (killed / "checkpoint-4").exists()
    output = finish(launch(killed, 2, eval_file, *flags, "--resume_from_checkpoint", "auto"), killed)
    assert f"resuming from {killed}/checkpoint-2 after step 2" in output + (killed.parent / "log" / "workerlog.0").read_text()

    assert records(killed) == expected
    assert (killed / "checkpoint-4" / "model.safetensors").read_bytes() == (straight / "checkpoint-4" / "model.safetensors").read_bytes()
    (due, [part]), (expected_due, [expected_part]) = (
        load_parts(out / "checkpoint-4" / "pending_rollout.safetensors") for out in (killed, straight)
    )
    assert (due, part.weights_step) == (expected_due, expected_part.weights_step) == (5, 3)
    for field in ("completion_ids", "completion_mask", "logprobs"):
        np.testing.assert_array_equal(getattr(part.rollout, field), getattr(expected_part.rollout, field))
    assert (killed / "completions.jsonl").read_text() == (straight / "completions.jsonl").read_text()


def wait_until(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def hand_over(path: Path, text: str) -> None:
    """Written whole before the attacker can see it."""
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").replace(path)


def test_a_process_that_reads_the_store_can_neither_connect_nor_inject_nor_run_code(tmp_path, eval_file):
    """tests/helpers/link_attacker.py reads the launcher's store and writes its own address and key there over the run's, so
    that whoever takes the link from the store connects to it and is sent a pickle whose loading would create a file;
    it also knocks on the trainer's port with a wrong proof and that pickle. The run trains on as if alone."""
    out, marker, report, address, store = (tmp_path / name for name in ("out", "code-ran", "report.json", "address.json", "store"))
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
               *RUN, "--eval_datasets", eval_file, "--output_dir", str(out), "--max_steps", "2", *ROLLOUT]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    attacker = subprocess.Popen([sys.executable, "tests/helpers/link_attacker.py", str(store), str(address), str(marker), str(report)])
    # ports are no secret (any local user can list the listening ones): the test hands over the store's and the trainer's
    environment, link_file = tmp_path / "log" / "envlog.0", out / ".rollout_link.json"
    wait_until(lambda: environment.is_file() and "PADDLE_MASTER=" in environment.read_text() or run.poll() is not None)
    hand_over(store, re.search(r"PADDLE_MASTER=(\S+)", environment.read_text())[1])
    wait_until(lambda: link_file.exists() or run.poll() is not None)
    hand_over(address, json.dumps(json.loads(link_file.read_text())["address"]))
    assert oct(link_file.stat().st_mode & 0o777) == "0o600"
    finish(run, out)
    attacker.wait(timeout=300)
    found = json.loads(report.read_text())
    assert not marker.exists(), found
    assert found["listener"] == [], found  # no process of the run took the attacker's address from the store
    assert set(found["store"]) <= {"grpo/link_ready"}, found  # a counter: neither address nor key
    # the knock met the handshake and failed it, or came after the trainer had stopped listening (its rollout process in)
    (knocked,) = found["knocked"]
    turned_away = "rollout link: turned away a connection from 127.0.0.1" in (tmp_path / "log" / "workerlog.0").read_text()
    assert "challenged; answered wrongly" in knocked and "#FAILURE#" in knocked and turned_away or "Connection" in knocked, knocked
    assert [r["step"] for r in records(out) if "reward_mean" in r] == [1, 2] and not link_file.exists()


def test_a_rollout_process_that_dies_stops_the_run_with_the_last_step_saved(tmp_path, eval_file):
    out = tmp_path / "out"
    process = launch(out, 2, eval_file, "--max_steps", "20", *ROLLOUT)
    wait_for_step(out, process, 2)
    worker = int(subprocess.run(["pgrep", "-n", "-f", f"run_grpo.py.*{out}"], capture_output=True, text=True).stdout)  # rank 1 starts last
    os.kill(worker, signal.SIGKILL)
    process.communicate(timeout=300)
    log = (tmp_path / "log" / "workerlog.0").read_text()
    errors = [line for line in log.splitlines() if line.startswith("run_grpo: error:")]
    assert errors == [
        "run_grpo: error: rollout process 1 died without a word (killed, or out of memory): "
        "its log <log_dir>/workerlog.1 and the system log may say why"
    ], log[-3000:]
    saved = sorted(out.glob("checkpoint-*"))
    assert len(saved) == 1 and f"{saved[0]} holds the state after step {saved[0].name.split('-')[1]}" in log
    assert int(saved[0].name.split("-")[1]) in logged_steps(out) and (saved[0] / "trainer_state.json").is_file()
