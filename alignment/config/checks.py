"""What the sections' value checks, validation.py's and preflight's look-outside checks share."""

import json
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Optional

from alignment.basics.errors import ConfigError

_FOUND: ContextVar[Optional[list]] = ContextVar("found", default=None)  # set while collecting: the failed checks' messages


def check(condition: bool, message: str) -> None:
    """A failed condition raises ConfigError, or, inside collecting(), is added to its list and the check goes on."""
    if not condition:
        found = _FOUND.get()
        if found is None:
            raise ConfigError(message)
        found.append(message)


@contextmanager
def collecting(found: list):
    token = _FOUND.set(found)
    try:
        yield found
    finally:
        _FOUND.reset(token)


def collected(problems: list, check_values, *args):
    """check_values(*args) with each of its failed checks added to problems (a ConfigError it raises too) -> its result,
    or None where one failed: whatever it derived is then not to be used. A crash after a failed check (a division by
    the zero a check refused) counts as that check's failure; one without any is the bug it is, and raised."""
    found = []
    try:
        with collecting(found):
            result = check_values(*args)
    except ConfigError as e:
        found.append(str(e))
    except Exception:
        if not found:
            raise
    problems += found
    return None if found else result


def show(value) -> str:
    """A JSON value as the file spells it, cut to 80 characters, for error messages."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def names_gguf(path: Optional[str]) -> bool:
    """Whether a model path names a GGUF file (llama.cpp, Ollama), which the trainer imports (alignment/models/gguf_import.py):
    a name ending .gguf, or a file starting with the bytes GGUF (Ollama's blobs are named sha256-<digest>)."""
    if path is None or Path(path).suffix.lower() == ".gguf":
        return path is not None
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, ValueError):  # a folder, no such file, a name the system refuses
        return False
