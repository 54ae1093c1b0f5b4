"""The console of a run shows the run: none of paddle's, paddleformers' or glog's notices that say nothing
about it (alignment/basics/runtime.py filters them where they start; alignment.launch, the Makefile's launcher, keeps
paddle's launcher to warnings), and draws a progress bar only on a terminal: in a file or a pipe, each of its redraws
would be a line."""

import contextlib
import os
import pty
import re
import subprocess
import sys
import termios
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOISE = [
    "No ccache found",  # paddle looks for ccache at every import
    "OMP_NUM_THREADS",  # paddle's "PLEASE USE OMP_NUM_THREADS WISELY" when it is above 1, as chosen on purpose
    "is_torch_available",  # paddleformers hiding PyTorch from transformers
    "FLAGS_enable_pir_in_executor",  # init_parallel_env's report of modified flags naming one paddle sets itself
    "is not in group",  # fleet.init warning once per size-1 group it makes (sharding)
    "LAUNCH INFO",  # paddle's launcher's configuration dump (37 lines) and its progress notes
]
GLOG_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ ", re.MULTILINE)  # I1124 07:54:14.199149  5283 tcp_store.cc:336] ...
# What alignment/basics/runtime.py exports in this pytest process (tests/conftest.py); a user's shell has none of it.
SET_BY_THE_RUNTIME = ("OMP_NUM_THREADS", "MKL_DEBUG_CPU_TYPE", "GLOG_minloglevel", "TRANSFORMERS_NO_ADVISORY_WARNINGS")
USERS_ENVIRONMENT = {key: value for key, value in os.environ.items() if key not in SET_BY_THE_RUNTIME}


def noise_in(text: str) -> list:
    return [line for line in text.splitlines() if any(marker in line for marker in NOISE)] + GLOG_LINE.findall(text)


def make_train(output: Path, *args: str) -> subprocess.CompletedProcess:
    """`make train` into `output` with extra keys; this environment stands in for the installed .venv (-o: the
    install and the operators are taken as they are)."""
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "-o", "csrc/build/grpo_ops/grpo_ops.so", "train",
               f"PY={sys.executable}", f"OUTPUT={output}", f"ARGS={' '.join(args)}"]
    return subprocess.run(command, cwd=ROOT, env=USERS_ENVIRONMENT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_make_train_prints_the_run_and_runs_again_in_the_same_folder(tmp_path):
    output = tmp_path / "tiny"
    for attempt in range(2):  # the second run replaces the first (--overwrite_output_dir in the Makefile)
        done = make_train(output, "--max_steps", "1", "--eval_datasets", "''")
        console = done.stdout + done.stderr
        assert done.returncode == 0, console[-3000:]
        command, console = console.split("\n", 1)  # make shows the command it runs
        assert command.startswith(f"{sys.executable} -m alignment.launch") and "run_grpo.py" in console.split("\n", 1)[0], command
        assert f"checkpoint: {output}/checkpoint-1" in done.stdout, attempt
        worker = (output / "launch_log" / "workerlog.0").read_text()
        assert noise_in(console) == [] and noise_in(worker) == [], attempt
        assert "\r" not in console and "grpo:" not in console, attempt  # no progress bar in a pipe: its redraws would be lines


def test_two_processes_print_no_distributed_notices_and_keep_flags_a_user_set(tmp_path):
    """Two processes meet through paddle's TCP store (glog INFO lines) and fleet's sharding groups, as with
    `sharding: stage1`; a flag the user exported is still reported, the one paddle sets itself is not."""
    script = tmp_path / "meet.py"
    script.write_text(
        "from alignment.basics.runtime import configure_cpu_runtime, import_paddle\n"
        "configure_cpu_runtime()\n"
        "import_paddle()\n"
        "import numpy as np\n"
        "from alignment.parallel.distributed import init_world\n"
        "world = init_world('stage1')\n"
        "print('sum', world.sum(np.ones(1))[0])\n"
    )
    command = [sys.executable, "-m", "alignment.launch", "--nproc_per_node", "2",
               "--log_dir", str(tmp_path / "log"), str(script)]
    env = {**USERS_ENVIRONMENT, "PYTHONPATH": str(ROOT), "FLAGS_call_stack_level": "3"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for rank in range(2):
        log = (tmp_path / "log" / f"workerlog.{rank}").read_text()
        assert "sum 2.0" in log, log
        assert "FLAGS(name='FLAGS_call_stack_level', current_value=3" in log, log
        assert noise_in(log) == [], rank
    assert noise_in(done.stdout + done.stderr) == []


# RunLogger as the trainer drives it: 4 steps, a line every 2, no reference model (kl None), 7.1875 GB at the peak.
FOUR_STEPS = """
import sys
from alignment.storage.dashboards import DashboardSettings
from alignment.step.logger import RunLogger
with RunLogger(sys.argv[1], DashboardSettings((), sys.argv[1], sys.argv[1], {}), 2, 4, 0, True) as logger:
    for step in range(1, 5):
        logger.log_step(step, {"reward_mean": 0.5, "accuracy": 0.25, "kl": None, "lr": 1e-6, "memory/peak_gb": 7.1875})
"""
STEP_LINE = "step {}: reward_mean=0.5 accuracy=0.25 kl=off lr=1e-06 mem=7.2GB"


def in_a_terminal(command: list, env: dict) -> str:
    """command's stdout and stderr on a pseudo-terminal, as a user at a terminal sees them (\\r\\n: the terminal's)."""
    main, child = pty.openpty()
    termios.tcsetwinsize(child, (24, 100))  # a new one has 0 columns: tqdm would draw the bar empty
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=child, stderr=child)
    os.close(child)
    seen = b""
    with contextlib.suppress(OSError):  # EIO once the process's end of the terminal is closed
        while chunk := os.read(main, 65536):
            seen += chunk
    os.close(main)
    assert process.wait(timeout=120) == 0, seen[-3000:]
    return seen.decode()


def test_a_console_in_a_file_or_a_pipe_gets_the_step_lines_alone(tmp_path):
    """No progress bar where the console is not a terminal: each of its redraws would be a line of its own there."""
    done = subprocess.run([sys.executable, "-c", FOUR_STEPS, str(tmp_path)], cwd=ROOT, env=USERS_ENVIRONMENT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert done.stdout == f"{STEP_LINE.format(2)}\n{STEP_LINE.format(4)}\n"


def test_a_console_on_a_terminal_gets_the_bar_and_the_step_lines(tmp_path):
    seen = in_a_terminal([sys.executable, "-c", FOUR_STEPS, str(tmp_path)], USERS_ENVIRONMENT)
    assert "grpo: 100%" in seen and "4/4" in seen and "\r" in seen.replace("\r\n", "")  # the bar, redrawn in place
    assert f"{STEP_LINE.format(2)}\r\n" in seen and f"{STEP_LINE.format(4)}\r\n" in seen


def test_the_launcher_tells_its_worker_whether_the_console_is_a_terminal(tmp_path):
    """Worker 0 writes to its log file under alignment.launch; the launcher copies it to its own stdout, the console."""
    script = tmp_path / "says.py"
    script.write_text("import os\nprint('console is a terminal:', os.environ['GRPO_CONSOLE_IS_TERMINAL'])\n")
    command = [sys.executable, "-m", "alignment.launch", "--nproc_per_node", "1", "--log_dir", str(tmp_path / "log"), str(script)]
    env = {**USERS_ENVIRONMENT, "PYTHONPATH": str(ROOT)}
    piped = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "console is a terminal: 0\n" in piped.stdout, (piped.stdout + piped.stderr)[-3000:]
    assert "console is a terminal: 1\r\n" in in_a_terminal(command, env)
