"""Memory while a run trains: each step's peak resident memory (metric memory/peak_gb), and the guard that stops the
run with a message once its resident memory reaches memory_limit_gb, before the kernel's out-of-memory killer ends it
without a word (SIGKILL cannot be caught; the guard acts first)."""

import signal
import threading
from pathlib import Path
from typing import Callable, Optional

import paddle

from alignment.basics.errors import OutOfMemoryError
from alignment.models.memory import gigabytes
from alignment.run.memory_plan import available_bytes, resident_bytes

POLL_SECONDS = 0.05
RESERVE = 256 * 2**20  # the guard acts while this much is still free: one operator's allocation may come between two polls


def step_peak_bytes() -> int:
    """The peak since the last call: on a GPU the device's allocated memory (paddle's counter, then reset); on a CPU the
    resident memory (VmHWM, then reset by writing 5 to /proc/self/clear_refs)."""
    if "gpu" in paddle.device.get_device():
        peak = paddle.device.cuda.max_memory_allocated()
        paddle.device.cuda.reset_max_memory_allocated()
        return peak
    peak = resident_bytes("VmHWM")
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # a kernel that does not allow the reset: the metric is then the peak since the start
        pass
    return peak


class MemoryGuard:
    """While entered: a thread reads the resident memory every POLL_SECONDS and, once it passes limit - RESERVE (or
    the machine has less than RESERVE available), interrupts the main thread with OutOfMemoryError, whose message is
    the reading plus describe() (the step, the last checkpoint, what to change). limit None: no guard."""

    def __init__(self, limit: Optional[int], describe: Callable[[], str]):
        self.limit, self.describe = limit, describe
        self.reading: Optional[str] = None
        self.stopped: Optional[OutOfMemoryError] = None  # what the guard raised in the main thread
        self._stop = threading.Event()
        self._previous_handler = None

    def __enter__(self):
        if self.limit is None or threading.current_thread() is not threading.main_thread():
            return self
        self._previous_handler = signal.signal(signal.SIGUSR1, self._raise)
        threading.Thread(target=self._watch, name="memory-guard", daemon=True).start()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self._stop.set()
        if self._previous_handler is not None:
            signal.signal(signal.SIGUSR1, self._previous_handler)
        if self.stopped is not None and exc is not None and exc is not self.stopped:
            # raised inside a PyLayer's backward, paddle hands the guard's error on as an OSError holding its text
            raise self.stopped from None

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            resident, (available, source) = resident_bytes(), available_bytes()
            if resident >= self.limit - RESERVE or available < RESERVE:
                self.reading = (
                    f"resident memory {gigabytes(resident)} of memory_limit_gb {self.limit / 2**30:.3g}, "
                    f"{gigabytes(available)} left on the machine ({source})"
                )
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
                return

    def _raise(self, signum, frame) -> None:
        if self.reading is None or self._stop.is_set():
            return
        self._stop.set()
        self.stopped = OutOfMemoryError(
            f"out of memory: {self.reading}; the run stopped before the kernel would kill it; {self.describe()}"
        )
        raise self.stopped
