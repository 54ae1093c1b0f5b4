"""The console of a run shows the run: none of paddle's, paddleformers' or glog's notices that say nothing
about it (alignment/run/runtime.py filters them where they start; alignment.launch, the Makefile's launcher, keeps
paddle's launcher to warnings)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOISE = [
    "No ccache found",  # paddle looks for ccache at every import
    "OMP_NUM_THREADS",  # paddle's "PLEASE USE OMP_NUM_THREADS WISELY" when it is above 1, as chosen on purpose
    "is_torch_available",  # paddleformers hiding PyTorch from transformers
    "FLAGS_enable_pir_in_executor",  # init_parallel_env's report of modified flags naming one paddle sets itself
    "is not in group",  # fleet.init warning once per size-1 group it makes (sharding)
    "LAUNCH INFO",  # paddle's launcher's configuration dump (37 lines) and its progress notes
]
GLOG_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ ", re.MULTILINE)  # I1124 07:54:14.199149  5283 tcp_store.cc:336] ...
# What alignment/run/runtime.py exports in this pytest process (tests/conftest.py); a user's shell has none of it.
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


def test_two_processes_print_no_distributed_notices_and_keep_flags_a_user_set(tmp_path):
    """Two processes meet through paddle's TCP store (glog INFO lines) and fleet's sharding groups, as with
    `sharding: stage1`; a flag the user exported is still reported, the one paddle sets itself is not."""
    script = tmp_path / "meet.py"
    script.write_text(
        "from alignment.run.runtime import configure_cpu_runtime, import_paddle\n"
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
