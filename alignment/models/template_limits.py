"""Limits on every rendering of a chat template. A template is code (jinja, run in transformers' sandbox, which keeps
it from the host but not from looping): a GGUF's comes from whoever made the file, and two nested range(100000)
loops render for minutes. Each rendering gets TEMPLATE_SECONDS of CPU time (a SIGPROF timer, in the main thread,
where every rendering of the trainer and the chat runs; elsewhere the size limit only) and may produce
TEMPLATE_CHARACTERS characters (or tokens). What this does not bound: a single operation on a huge string inside the
template (it is bounded by memory, not interrupted)."""

import contextlib
import functools
import signal
import threading

from alignment.errors import ChatTemplateError

TEMPLATE_SECONDS = 10
TEMPLATE_CHARACTERS = 1 << 20


@contextlib.contextmanager
def _cpu_seconds(seconds: float):
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def over(number, frame):
        raise ChatTemplateError(f"took more than {seconds} s of CPU time to render one conversation")

    previous = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def bounded_chat_template(render):
    """A tokenizer's apply_chat_template under the limits."""

    @functools.wraps(render)
    def bounded(*args, **kwargs):
        with _cpu_seconds(TEMPLATE_SECONDS):
            rendered = render(*args, **kwargs)
        if isinstance(rendered, (str, list)) and len(rendered) > TEMPLATE_CHARACTERS:
            raise ChatTemplateError(f"rendered one conversation as {len(rendered)} characters or tokens, more than {TEMPLATE_CHARACTERS}")
        return rendered

    return bounded
