"""Stopping cleanly on SIGTERM, Ctrl-C and a time limit."""

import os
import shlex
import signal
import sys
import time

import numpy as np

from alignment.parallel.distributed import World


class TerminationRequest:
    """SIGTERM (a scheduler's preemption, `kill`, the launcher stopping its workers) and a first Ctrl-C only
    set a flag: the step under way finishes, every process agrees at its end, and the run saves and stops
    cleanly. A second Ctrl-C stops at once (KeyboardInterrupt), losing the steps since the last save.
    max_train_minutes (0: none) is counted from entering the block."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, max_train_minutes: float):
        self.max_train_minutes = max_train_minutes

    def __enter__(self):
        self.started = time.monotonic()
        self.requested = None  # the name of the first signal
        self.previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _handle(self, number, frame):
        if number == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        if self.requested is None:
            self.requested = signal.Signals(number).name
            if number == signal.SIGINT:
                print("\nCtrl-C: the run saves and stops after this step (Ctrl-C again stops at once)", flush=True)

    def agreed(self, world: World) -> bool:
        return bool(world.max(np.array([float(self.requested is not None)]))[0])  # every rank stops after the same step

    def out_of_time(self, world: World) -> bool:
        if not self.max_train_minutes:
            return False
        over = time.monotonic() - self.started >= 60 * self.max_train_minutes
        return bool(world.max(np.array([float(over)]))[0])  # one rank's clock decides for all: they stop after the same step


def resume_command() -> str:
    """The command that continues this run from its last checkpoint: the launch command alignment.launch passed on
    (GRPO_LAUNCH_COMMAND), or this process's own command line when it runs alone, with --resume_from_checkpoint auto
    in place of any resume_from_checkpoint it had. Under paddle's launcher itself the command line is not known here."""
    if "GRPO_LAUNCH_COMMAND" in os.environ:
        words = shlex.split(os.environ["GRPO_LAUNCH_COMMAND"])
    elif "PADDLE_TRAINER_ID" in os.environ:
        return "the same command with --resume_from_checkpoint auto"
    else:
        python = os.path.relpath(sys.executable)
        words = [python if not python.startswith("..") else sys.executable, *sys.argv]
    kept, skip = [], False
    for word in words:
        if not skip and not word.startswith("--resume_from_checkpoint"):
            kept.append(word)
        skip = word == "--resume_from_checkpoint"  # its value follows
    return shlex.join([*kept, "--resume_from_checkpoint", "auto"])
