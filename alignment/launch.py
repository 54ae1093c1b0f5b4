"""paddle.distributed.launch, with Ctrl-C and SIGTERM reaching the run as what they are:

    python -m alignment.launch --nproc_per_node 1 --log_dir output/tiny/launch_log run_grpo.py CONFIG [--key value ...]

It takes paddle's launcher's arguments and runs paddle's launcher: its processes, logs, exit codes and multi-node
options are paddle's. Two things differ:
- A first SIGINT (Ctrl-C) or SIGTERM is passed on to each worker as it came, and the launcher goes on watching them.
  Paddle's own handler sends SIGTERM instead, stops copying worker 0's log to the console, kills the workers after
  30 s and exits with the signal's number (2 after Ctrl-C, the code of an error). Here the trainer finishes its step,
  saves, says on the console which signal stopped it and how to resume, and the launcher exits with the workers'
  code: 0 after a clean stop. A second signal is passed on too (a second Ctrl-C stops the trainer at once), and then
  handled as paddle does.
- --log_level defaults to WARNING: paddle's 37-line configuration dump and its INFO lines stay out of the console;
  a failed worker's report (ERROR, with the tail of its log) still shows. --log_level INFO brings them back.
The command line goes to the workers in GRPO_LAUNCH_COMMAND, so that the trainer can print the resume command whole,
and whether the console is a terminal in GRPO_CONSOLE_IS_TERMINAL (the trainer draws a progress bar only there).
"""

import os
import shlex
import sys
import warnings

warnings.filterwarnings("ignore", message="No ccache found")  # paddle looks for ccache at import (csrc/ is built already)

from paddle.distributed.launch.controllers.controller import ControllerBase  # noqa: E402
from paddle.distributed.launch.main import launch  # noqa: E402

_paddles_handler = ControllerBase.signal_handler


def _pass_on(controller: ControllerBase, number: int, frame) -> None:
    for container in controller.pod.containers:
        process = container._proc._proc if container._proc else None  # paddle's ProcessContext holds the Popen
        if process is not None and process.poll() is None:
            os.kill(process.pid, number)  # the worker only: its own children are its business
    if getattr(controller, "passed_on", False):
        _paddles_handler(controller, number, frame)
    controller.passed_on = True


def main() -> None:
    argv = sys.argv[1:]
    if not any(arg == "--log_level" or arg.startswith("--log_level=") for arg in argv):
        sys.argv[1:1] = ["--log_level", "WARNING"]
    python = os.path.relpath(sys.executable)
    python = python if not python.startswith("..") else sys.executable
    os.environ["GRPO_LAUNCH_COMMAND"] = shlex.join([python, "-m", "alignment.launch", *argv])
    # Worker 0 writes to its log file, never a terminal; the launcher copies that file to its stdout, the console the
    # user sees: the trainer draws its progress bar only where that is a terminal (alignment/step/logger.py).
    os.environ.setdefault("GRPO_CONSOLE_IS_TERMINAL", "1" if sys.stdout.isatty() else "0")
    ControllerBase.signal_handler = _pass_on
    launch()


if __name__ == "__main__":
    main()
