"""Stopping cleanly on SIGTERM and Ctrl-C."""

import signal

import numpy as np

from alignment.parallel.distributed import World


class TerminationRequest:
    """SIGTERM (a scheduler's preemption, `kill`, the launcher stopping its workers) and a first Ctrl-C only
    set a flag: the step under way finishes, every process agrees at its end, and the run saves and stops
    cleanly. A second Ctrl-C stops at once (KeyboardInterrupt), losing the steps since the last save."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
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
