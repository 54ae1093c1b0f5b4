"""Reward plugins: Python files whose @register_reward functions join the shared registry.

The trainer (in process) and the reward server (in each worker process) load the same files, so a
function written once is scored the same way in both places.
"""

import hashlib
import importlib.util
import sys
from pathlib import Path


def load_plugins(paths: list[str]) -> None:
    for path in paths:
        resolved = Path(path).resolve()
        # One module name per file: loading the same file twice (trainer and server code paths in one
        # process) must not register its functions twice, which the registry rightly refuses.
        module_name = f"_reward_plugin_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
        if module_name in sys.modules:
            continue
        if not resolved.is_file():
            raise FileNotFoundError(f"reward plugin {path}: no such file")
        spec = importlib.util.spec_from_file_location(module_name, resolved)
        if spec is None or spec.loader is None:
            raise ImportError(f"reward plugin {path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # before executing it, as a normal import would (dataclasses need it)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise ImportError(f"reward plugin {path} failed to import: {type(exc).__name__}: {exc}") from exc
