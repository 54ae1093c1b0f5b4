"""The faults a long run meets, each provoked for real on the tiny run: a full disk and an unwritable
output_dir during a save, a slow and a dead reward server, SIGTERM, and a rank that dies in a two-process
run. Each run must stop with a clear message (or finish), lose at most what its message says, and leave a
checkpoint that resume_from_checkpoint auto continues from. SIGKILL is tests/e2e/test_resume.py's."""

import ctypes
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.reward_servers import foreign_server, free_port, reward_server

from alignment.basics.errors import RewardServerError
from alignment.rewards.remote import RewardServer, score_remote
from alignment.storage.resume import resolve_resume
from alignment.step.termination import resume_command

PLUGINS = "tests/plugins/fault_rewards.py"
RUN = [
    "run_grpo.py", "config/tiny/grpo_argument.json", "--max_dec_len", "16", "--per_device_prompt_batch_size", "2",
    "--rollout_n", "4", "--per_device_train_batch_size", "4", "--eval_datasets", "",
]
# Above what a run appends to its logs (a few kB), below model.safetensors (13.5 MB): only the save fails.
FILE_SIZE_LIMIT = 2**20
RUN_TIMEOUT_S = 300


def run(out: Path, *flags: str, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *RUN, "--output_dir", str(out), *flags],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, preexec_fn=preexec_fn,
    )


def start(out: Path, *flags: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}-output.txt", "w") as output:  # a file, not a pipe nobody reads while it runs
        return subprocess.Popen(
            [sys.executable, *RUN, "--output_dir", str(out), *flags], stdout=output, stderr=subprocess.STDOUT, text=True
        )


def output_of(out: Path) -> str:
    return (out.parent / f"{out.name}-output.txt").read_text()


def logged_steps(out: Path) -> list:
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return [json.loads(line)["step"] for line in lines if line.endswith("}")]


def wait_for_step(out: Path, step: int, process: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while step not in logged_steps(out):
        assert process.poll() is None, f"the run ended ({process.returncode}) before step {step}:\n{output_of(out)[-3000:]}"
        assert time.monotonic() < deadline, f"no step {step} within {timeout} s"
        time.sleep(0.02)


def contents(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def assert_complete(checkpoint: Path, step: int) -> None:
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == step
    assert {"model.safetensors", "config.json", "optimizer.safetensors", "tokenizer.json", "grpo_config.json"} <= set(contents(checkpoint))


def assert_resumes_to_the_end(out: Path, resumed_after: int, max_steps: int, *flags: str) -> None:
    done = run(out, "--max_steps", str(max_steps), "--resume_from_checkpoint", "auto", *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {out}/checkpoint-{resumed_after} after step {resumed_after}" in done.stdout + done.stderr
    assert logged_steps(out) == list(range(1, max_steps + 1))  # the steps after the checkpoint replaced, none repeated
    assert_complete(out / f"checkpoint-{max_steps}", max_steps)


@pytest.fixture(scope="module")
def saved_at_2(tmp_path_factory) -> Path:
    """A run that saved checkpoint-2 and ended; each test continues a copy of it."""
    out = tmp_path_factory.mktemp("saved") / "out"
    done = run(out, "--max_steps", "2", "--save_steps", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def a_copy(saved: Path, tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "out"
    shutil.copytree(saved, out)
    return out, contents(out / "checkpoint-2")


def assert_save_failed_cleanly(done: subprocess.CompletedProcess, out: Path, before: dict, cause: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"run_grpo: error: could not save checkpoint {out}/checkpoint-4: " in done.stderr, done.stderr[-3000:]
    assert cause in done.stderr, done.stderr[-3000:]
    assert f"the newest complete checkpoint is {out}/checkpoint-2 (untouched): resume_from_checkpoint auto continues from it" in done.stderr
    assert contents(out / "checkpoint-2") == before  # every file, trainer_state.json included, as it was
    assert not (out / "checkpoint-4").exists() and not list(out.glob(".checkpoint-*"))  # no partial folder left
    assert resolve_resume("auto", str(out))[0].path == out / "checkpoint-2"


def limit_file_size() -> None:
    # A full disk without filling one: writes past RLIMIT_FSIZE fail as on a full disk (EFBIG instead of
    # ENOSPC). Ignoring SIGXFSZ keeps it from killing the process first (CPython ignores it too).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def test_a_disk_full_during_a_save_keeps_the_previous_checkpoint(saved_at_2, tmp_path):
    out, before = a_copy(saved_at_2, tmp_path)
    done = run(out, "--max_steps", "4", "--resume_from_checkpoint", "auto", preexec_fn=limit_file_size)
    assert_save_failed_cleanly(done, out, before, "File too large")
    assert_resumes_to_the_end(out, 2, 4)  # with room again, the same command carries on from checkpoint-2


PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # <linux/prctl.h>, <linux/capability.h>


def test_a_disk_full_while_logging_stops_the_run_clearly(tmp_path):
    """metrics.jsonl and completions.jsonl grow by about 3 kB a step: a 16 kB file limit stops the run within
    a few steps with one line naming the file, never a traceback from inside the logger."""

    def limit_logs():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 2**10, 16 * 2**10))

    out = tmp_path / "out"
    done = run(out, "--max_steps", "40", "--save_steps", "0", "--log_completions_per_step", "8", preexec_fn=limit_logs)
    assert done.returncode == 2, done.stderr[-3000:]
    assert re.search(
        r"run_grpo: error: could not write .*(metrics|completions)\.jsonl: File too large; the run stops here", done.stderr
    ), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert 1 <= len(logged_steps(out)) < 40


def as_an_ordinary_user() -> None:
    """Root writes through permission bits (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH). Dropped from the
    bounding set, they are gone from the program exec'd next, for which the kernel then checks the bits
    as for anyone. (Switching to an unprivileged uid does not work here: the interpreter lives under
    /root, mode 700.)"""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {capability})")


def test_an_unwritable_output_dir_fails_the_save_clearly(saved_at_2, tmp_path):
    out, before = a_copy(saved_at_2, tmp_path)
    out.chmod(0o555)  # no new entries: the logs, already there, still take their lines
    try:
        try:
            probe = subprocess.run(
                [sys.executable, "-c", f"open({str(out / 'probe')!r}, 'w')"], preexec_fn=as_an_ordinary_user, capture_output=True
            )
        except subprocess.SubprocessError as exc:  # prctl refused: a container without CAP_SETPCAP
            pytest.skip(f"cannot take root's permission override away from the trainer here: {exc}")
        if probe.returncode == 0:
            pytest.skip("a mode 555 folder is writable here even without CAP_DAC_OVERRIDE (a filesystem that ignores modes)")
        done = run(out, "--max_steps", "4", "--resume_from_checkpoint", "auto", preexec_fn=as_an_ordinary_user)
    finally:
        out.chmod(0o755)
    assert_save_failed_cleanly(done, out, before, "PermissionError: [Errno 13] Permission denied")


def test_a_slow_reward_server_times_out_and_stops_the_run(tmp_path):
    with reward_server(tmp_path, "--workers", "1", "--plugins", PLUGINS, "--item_timeout", "60") as server:
        started = time.monotonic()
        done = run(
            tmp_path / "out", "--max_steps", "2", "--use_rm_server", "true", "--reward_server", server.url,
            "--reward_server_timeout", "2", "--reward_server_retries", "1", "--external_plugins", PLUGINS,
            "--reward_functions", "slow_one", "--reward_function_weights", "1.0",
        )
        elapsed = time.monotonic() - started
        server.process.kill()  # not SIGTERM: the server would first finish the abandoned requests' items (16 s)
    assert done.returncode == 2, done.stderr[-3000:]
    # Two attempts of 2 s and a 0.5 s pause after ~10 s of start-up, against 8 s a request would take.
    assert elapsed < 45, f"the run took {elapsed:.0f} s to give up"
    assert (
        f"run_grpo: error: reward server {server.url}/v1/score failed 2 attempt(s); "
        "last: no complete answer within reward_server_timeout = 2 s"
    ) in done.stderr, done.stderr[-3000:]
    assert "no step had finished, nothing to resume" in done.stderr


@pytest.fixture
def trickling_server():
    """A server that answers 200 at once and then its body one byte every 0.5 s: no single read waits
    long, so only a limit on the whole exchange stops the wait."""

    def trickle(wfile, body: bytes) -> None:
        try:
            for byte in body:
                wfile.write(bytes([byte]))
                wfile.flush()
                time.sleep(0.5)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
            pass

    with foreign_server({"scores": [1.0], "components": {"format": [1.0]}, "errors": [None]}, trickle) as url:
        yield url


def test_a_trickling_answer_is_held_to_the_timeout_as_a_whole(trickling_server):
    started = time.monotonic()
    with pytest.raises(RewardServerError, match=r"failed 2 attempt\(s\); last: no complete answer within reward_server_timeout = 1 s"):
        score_remote(
            ["x"], [{}], ["format"], [1.0], RewardServer(url=trickling_server, protocol="v1", timeout=1.0, retries=1, backoff_s=0.01)
        )
    assert time.monotonic() - started < 15  # 2 x 1 s, where the ~60-byte answer alone takes 30 s


@pytest.mark.slow  # a run, a server killed and restarted, a resume (about 32 s)
def test_a_reward_server_killed_mid_run_stops_with_a_checkpoint_and_resume_continues(tmp_path):
    port = free_port()
    flags = ["--max_steps", "5", "--use_rm_server", "true", "--reward_server", f"http://127.0.0.1:{port}", "--reward_server_retries", "2"]
    out = tmp_path / "out"
    with reward_server(tmp_path, "--workers", "1", port=port) as server:
        process = start(out, *flags)  # save_steps 0: the only save would be at the end
        wait_for_step(out, 2, process)
        server.process.kill()  # SIGKILL: no goodbye to the client
        process.wait(timeout=RUN_TIMEOUT_S)
    output = output_of(out)
    assert process.returncode == 2, output[-3000:]
    finished = logged_steps(out)[-1]  # 2, or 3 when step 3 had been scored before the kill
    assert f"run_grpo: error: reward server {server.url}/v1/score failed 3 attempt(s); last: ConnectError" in output, output[-3000:]
    assert f"{out}/checkpoint-{finished} holds the state after step {finished}" in output
    assert "rerun with --resume_from_checkpoint auto" in output
    assert_complete(out / f"checkpoint-{finished}", finished)

    with reward_server(tmp_path, "--workers", "1", port=port):  # the same address, as a restarted server would have
        assert_resumes_to_the_end(out, finished, 5, *flags[2:])


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])  # SIGINT: a first Ctrl-C does the same
def test_sigterm_saves_and_exits_cleanly_and_resume_continues(tmp_path, stop):
    out = tmp_path / "out"
    process = start(out, "--max_steps", "8")
    wait_for_step(out, 2, process)
    process.send_signal(stop)
    process.wait(timeout=RUN_TIMEOUT_S)
    output = output_of(out)
    assert process.returncode == 0, output[-3000:]
    finished = logged_steps(out)[-1]  # the step under way when the signal came is finished first
    assert finished < 8
    assert f"stopped by {stop.name} after step {finished} (saved in {out}/checkpoint-{finished}); resume with: " in output
    assert f"--output_dir {out} --max_steps 8 --resume_from_checkpoint auto\n" in output  # this run's own command line
    assert f"checkpoint: {out}/checkpoint-{finished}" in output
    assert_complete(out / f"checkpoint-{finished}", finished)
    assert_resumes_to_the_end(out, finished, 8)


def test_max_train_minutes_ends_the_run_after_the_step_that_passes_it_evaluated_and_saved(tmp_path):
    out = tmp_path / "out"
    evaluation = ["--eval_datasets", "data/arith/test.jsonl", "--per_device_eval_batch_size", "8", "--max_evaluate_steps", "1",
                  "--eval_rollout_n", "0", "--eval_on_start", "false", "--eval_steps", "0"]
    done = run(out, "--max_steps", "8", "--max_train_minutes", "0.0001", *evaluation)  # 6 ms: step 1 ends past it
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert rows_of(out) == [(1, False), (1, True)]  # the step, then its evaluation
    assert f"stopped by max_train_minutes (0.0001) after step 1 (saved in {out}/checkpoint-1); resume with: " in output
    assert "--max_train_minutes 0.0001" in output and "--resume_from_checkpoint auto\n" in output
    assert_complete(out / "checkpoint-1", 1)

    resumed = run(out, "--max_steps", "3", "--max_train_minutes", "0", *evaluation, "--resume_from_checkpoint", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]  # the limit is no key of what a step trains on: no refusal
    assert rows_of(out) == [(1, False), (1, True), (2, False), (3, False), (3, True)]
    assert_complete(out / "checkpoint-3", 3)


def rows_of(out: Path) -> list:
    """metrics.jsonl -> [(step, whether the row is an evaluation)]"""
    return [(row["step"], "eval_accuracy" in row) for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


def test_the_resume_command_is_the_launch_command_with_resume_auto_in_place_of_any_resume(monkeypatch):
    launched = ".venv/bin/python -m alignment.launch --log_dir 'my logs' run_grpo.py c.json --resume_from_checkpoint out/ckpt-2 --lr 1"
    monkeypatch.setenv("GRPO_LAUNCH_COMMAND", launched)
    assert resume_command() == (
        ".venv/bin/python -m alignment.launch --log_dir 'my logs' run_grpo.py c.json --lr 1 --resume_from_checkpoint auto"
    )
    monkeypatch.delenv("GRPO_LAUNCH_COMMAND")
    monkeypatch.setattr(sys, "argv", ["run_grpo.py", "c.json", "--resume_from_checkpoint=auto", "--output_dir", "o"])
    monkeypatch.delenv("PADDLE_TRAINER_ID", raising=False)
    assert resume_command().endswith(" run_grpo.py c.json --output_dir o --resume_from_checkpoint auto")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")  # paddle's launcher itself, whose command line the trainer cannot see
    assert resume_command() == "the same command with --resume_from_checkpoint auto"


@pytest.mark.slow  # two launched runs (about 40 s)
def test_ctrl_c_on_a_launched_run_says_on_the_console_what_was_saved_and_how_to_resume(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the launcher's whole process group (the workers lead their own groups)."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "alignment.launch", "--nproc_per_node", "1", "--log_dir", str(tmp_path / "log"),
               *RUN, "--output_dir", str(out), "--max_steps", "4"]
    with open(tmp_path / "out-output.txt", "w") as output:
        launcher = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_step(out, 1, launcher)
    os.killpg(launcher.pid, signal.SIGINT)
    launcher.wait(timeout=RUN_TIMEOUT_S)
    console = output_of(out)
    finished = logged_steps(out)[-1]
    assert launcher.returncode == 0, console[-3000:]
    assert finished < 4 and "LAUNCH INFO" not in console  # --log_level WARNING: no configuration dump
    stopped = re.search(rf"stopped by SIGINT after step {finished} \(saved in {out}/checkpoint-{finished}\); resume with: (.*)\n", console)
    assert stopped, console[-3000:]
    assert f"checkpoint: {out}/checkpoint-{finished}" in console
    assert_complete(out / f"checkpoint-{finished}", finished)
    resume = shlex.split(stopped.group(1))  # the command as printed, run as it is
    assert resume[-2:] == ["--resume_from_checkpoint", "auto"] and resume[1:3] == ["-m", "alignment.launch"], resume
    done = subprocess.run(resume, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"resuming from {out}/checkpoint-{finished} after step {finished}" in done.stdout + done.stderr
    assert logged_steps(out) == [1, 2, 3, 4]
    assert_complete(out / "checkpoint-4", 4)


def launch_two(tmp_path: Path, *flags: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
        *RUN, "--output_dir", str(tmp_path / "out"), *flags,
    ]
    with open(tmp_path / "out-output.txt", "w") as output:  # output_of(tmp_path / "out") reads it
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True)


def test_sigterm_to_the_launcher_saves_and_stops_both_ranks(tmp_path):
    out = tmp_path / "out"
    launcher = launch_two(tmp_path, "--max_steps", "8")
    wait_for_step(out, 2, launcher)
    launcher.send_signal(signal.SIGTERM)  # it passes SIGTERM on to its workers and gives them 30 s
    launcher.wait(timeout=120)
    output = output_of(out)
    rank_0 = (tmp_path / "log" / "workerlog.0").read_text()
    finished = logged_steps(out)[-1]
    assert launcher.returncode == signal.SIGTERM  # the launcher's own convention: exit code = the signal's number
    assert "Terminating with signal 15" in output
    assert f"stopped by SIGTERM after step {finished}" in rank_0 and finished < 8
    assert_complete(out / f"checkpoint-{finished}", finished)


@pytest.mark.parametrize("death", ["rank_1_killed", "rank_1_exits"])
def test_a_rank_that_dies_ends_the_launch_without_a_hang(tmp_path, death):
    started = time.monotonic()
    launcher = launch_two(
        tmp_path, "--max_steps", "4", "--external_plugins", PLUGINS, "--reward_functions", death, "--reward_function_weights", "1.0"
    )
    launcher.wait(timeout=RUN_TIMEOUT_S)
    elapsed = time.monotonic() - started
    output = output_of(tmp_path / "out")
    logs = {rank: (tmp_path / "log" / f"workerlog.{rank}").read_text() for rank in (0, 1)}
    assert launcher.returncode != 0, output[-3000:]
    assert elapsed < 90, f"the launch took {elapsed:.0f} s to end after rank 1 died"
    assert logged_steps(tmp_path / "out") == [1]  # step 1 finished on both ranks; rank 1 died in step 2
    # Rank 0 fails at once in its next collective and says so in one line quoting gloo's cause ("Connection
    # reset by peer", or "TIMEOUT ... pair_rank = 1": the lost peer). The launcher reports whichever failed
    # container it saw first (rank 1 with code -9, or rank 0 with code 1), so the workerlogs are where to look.
    assert "run_grpo: error: process 0 of 2: an all-reduce with the other processes failed" in logs[0]
    assert re.search(r"Container rank [01] status failed .* code -?\d+ log ", output), output[-3000:]
    if death == "rank_1_exits":  # rank 1's own log says why it died, where it had anything to say
        assert "rank 1: simulated fatal error in step 2" in logs[1]


@pytest.mark.slow
def test_a_rank_that_hangs_ends_the_launch_after_the_collective_timeout(tmp_path):
    """Alive but silent: rank 0 waits in its next collective for gloo's timeout, which paddle fixes at 30 s
    on CPU (ProcessGroupGloo takes no timeout; PADDLE_PG_TIMEOUT does not reach it), then fails, and the
    launcher stops rank 1. The same limit ends a run whose ranks drift more than 30 s apart."""
    started = time.monotonic()
    launcher = launch_two(
        tmp_path,
        "--max_steps", "4",
        "--external_plugins", PLUGINS,
        "--reward_functions", "rank_1_hangs",
        "--reward_function_weights", "1.0",
    )
    launcher.wait(timeout=RUN_TIMEOUT_S)
    elapsed = time.monotonic() - started
    assert launcher.returncode != 0 and 30 < elapsed < RUN_TIMEOUT_S, (launcher.returncode, elapsed)  # for ever without it
    assert "TIMEOUT" in (tmp_path / "log" / "workerlog.0").read_text()
    assert logged_steps(tmp_path / "out") == [1]
