"""Secrets read from a file only their user can read, named by an environment variable or a flag, so that the secret
itself is in no process's command line (ps) and in no environment that paddle.distributed.launch writes to its log
folder (log/envlog.N and backup_env.N.json hold every variable)."""

import os
from pathlib import Path
from typing import Optional

from alignment.basics.errors import ConfigError


def read_key_file(path: str, what: str) -> str:
    """The secret in the file at path (its text, surrounding whitespace removed); ConfigError, naming `what` (the variable
    or flag that named it), where this user does not own the file, another user may read or write it, or it is empty."""
    try:
        status = os.stat(path)
        text = Path(path).read_text(encoding="utf-8") if status.st_uid == os.getuid() and not status.st_mode & 0o077 else None
    except (OSError, UnicodeDecodeError, ValueError) as error:  # ValueError: a NUL byte in the name
        raise ConfigError(f"{what} = {path}: the key file cannot be read ({getattr(error, 'strerror', None) or error})") from None
    if text is None:
        raise ConfigError(
            f"{what} = {path}: the key file must be this user's and readable by nobody else (owner {status.st_uid}, mode "
            f"{status.st_mode & 0o777:o}): chmod 600 {path}"
        )
    if not text.strip():
        raise ConfigError(f"{what} = {path}: the key file is empty")
    return text.strip()


def key_from_environment(variable: str) -> Optional[str]:
    """The key in the file $<variable>_FILE names, else $<variable> (empty: none), else None."""
    if path := os.environ.get(f"{variable}_FILE"):
        return read_key_file(path, f"{variable}_FILE")
    return os.environ.get(variable) or None
