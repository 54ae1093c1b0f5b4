"""What config.py's value checks and preflight's look-outside checks share."""

import json
from pathlib import Path
from typing import Optional

from alignment.errors import ConfigError


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def show(value) -> str:
    """A JSON value as the file spells it, cut to 80 characters, for error messages."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def names_gguf(path: Optional[str]) -> bool:
    """Whether a model path names a GGUF file (llama.cpp, Ollama), which the trainer imports (alignment/gguf.py):
    a name ending .gguf, or a file starting with the bytes GGUF (Ollama's blobs are named sha256-<digest>)."""
    if path is None or Path(path).suffix.lower() == ".gguf":
        return path is not None
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, ValueError):  # a folder, no such file, a name the system refuses
        return False
