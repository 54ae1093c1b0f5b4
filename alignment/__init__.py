"""A command run with a Python that lacks the project's packages (the system `python` after `make train`, which set up
.venv) ends in one line saying which Python to use, where ./.venv/bin/python is there, instead of a traceback."""

import sys
from pathlib import Path

PROJECT_PYTHON = Path(".venv", "bin", "python")  # make's environment, beside the commands' working folder


def project_python_hint() -> str:
    """' (this Python); ./.venv/bin/python ... is here: ...' where that Python exists and is not the one running, else ''."""
    if not PROJECT_PYTHON.is_file() or Path(sys.prefix).resolve() == PROJECT_PYTHON.parent.parent.resolve():
        return ""
    return f" ({sys.executable}); ./{PROJECT_PYTHON}, the environment make sets up, is here: run the command with {PROJECT_PYTHON} instead"


def _missing_module_in_one_line(kind, error, trace, previous=sys.excepthook) -> None:
    hint = project_python_hint() if issubclass(kind, ModuleNotFoundError) else ""
    if not hint:
        return previous(kind, error, trace)
    print(f"{error.name} is not installed in this environment{hint}", file=sys.stderr)


sys.excepthook = _missing_module_in_one_line
