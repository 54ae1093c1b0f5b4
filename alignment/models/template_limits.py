"""Limits on every rendering of a chat template. A template is code (jinja, run in transformers' sandbox, which keeps
it from the host but not from looping): a GGUF's comes from whoever made the file, and two nested range(100000)
loops render for minutes. Each rendering gets TEMPLATE_SECONDS of its thread's CPU time, in any thread (a GGUF is
imported in a launch's worker thread too), and may produce TEMPLATE_CHARACTERS characters (or tokens).

The time limit: one watchdog thread reads the CPU clock of each thread that is rendering and, past the limit, raises
an exception in it (PyThreadState_SetAsyncExc, which any thread can be sent; a signal reaches the main thread only).
Python delivers it between two bytecodes, so a template's loops stop; what this does not bound is a single operation
on a huge string inside the template (it is bounded by memory, not interrupted)."""

import ctypes
import functools
import os
import threading
import time

from alignment.basics.errors import ChatTemplateError

TEMPLATE_SECONDS = 10
TEMPLATE_CHARACTERS = 1 << 20
WATCH_S = 0.05  # how often the watchdog reads the clocks of the threads rendering


class _OverTime(BaseException):
    """Raised in a rendering thread past its time (a BaseException: neither jinja nor transformers catch it)."""


class _Rendering:
    def __init__(self, seconds: float):
        self.thread = threading.get_ident()
        self.clock = time.pthread_getcpuclockid(self.thread)
        self.until = time.clock_gettime(self.clock) + seconds
        self.fired = False


class _Watchdog:
    """The renderings under way, and the thread that watches them (started with the first; asleep while none runs)."""

    def __init__(self):
        self.lock = threading.Lock()  # a C lock: an exception raised in a thread cannot leave it held
        self.renderings: dict = {}  # id(_Rendering) -> _Rendering
        self.wake = threading.Event()
        self.thread = None

    def start(self, seconds: float) -> _Rendering:
        rendering = _Rendering(seconds)
        with self.lock:
            self.renderings[id(rendering)] = rendering
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._watch, daemon=True, name="template-watchdog")
                self.thread.start()
        self.wake.set()
        return rendering

    def stop(self, rendering: _Rendering) -> None:
        with self.lock:
            self.renderings.pop(id(rendering), None)
            fired = rendering.fired
        if fired:  # sent but maybe not delivered yet: withdrawn, so that it cannot surface after the rendering
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(rendering.thread), None)

    def _watch(self) -> None:
        while True:
            self.wake.clear()
            with self.lock:
                watched = list(self.renderings.values())
            if not watched:
                self.wake.wait()
                continue
            time.sleep(WATCH_S)
            for rendering in watched:
                try:
                    over = time.clock_gettime(rendering.clock) > rendering.until
                except OSError:  # its thread ended after its rendering did
                    continue
                if over:
                    self._stop_thread(rendering)

    def _stop_thread(self, rendering: _Rendering) -> None:
        with self.lock:  # still rendering: once stop() has run, the thread is left alone
            if self.renderings.pop(id(rendering), None) is not None:
                rendering.fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(rendering.thread), ctypes.py_object(_OverTime))


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG.__init__)  # a forked child has no watchdog thread, and maybe a held lock


def bounded_chat_template(render):
    """A tokenizer's apply_chat_template under the limits."""

    @functools.wraps(render)
    def bounded(*args, **kwargs):
        try:
            rendering = _WATCHDOG.start(TEMPLATE_SECONDS)
            try:
                rendered = render(*args, **kwargs)
            finally:
                _WATCHDOG.stop(rendering)
        except _OverTime:
            raise ChatTemplateError(f"took more than {TEMPLATE_SECONDS} s of CPU time to render one conversation") from None
        if isinstance(rendered, (str, list)) and len(rendered) > TEMPLATE_CHARACTERS:
            raise ChatTemplateError(f"rendered one conversation as {len(rendered)} characters or tokens, more than {TEMPLATE_CHARACTERS}")
        return rendered

    return bounded
