"""Plugins: Python files whose @register_reward, @register_tool and @register_environment functions join the
shared registries (external_plugins).

The trainer (in process), its scoring workers, its sandboxed tool calls and the reward server (in each worker
process) load the same files, so a function written once behaves the same in every place. A file is read once per
process: the workers execute the text their parent read (plugin_sources), so a plugin edited or deleted while a run
or a server is up changes nothing, not even in a worker started later to replace one.
"""

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PluginSource:
    path: str  # resolved; names the module and appears in tracebacks
    text: str


_loaded: dict[str, PluginSource] = {}  # resolved path -> the text this process executed


def load_plugins(paths: list[str]) -> None:
    for path in paths:
        resolved = str(Path(path).resolve())
        if resolved in _loaded:
            continue
        if not Path(resolved).is_file():  # also for a path the OS refuses (too long, a NUL byte)
            raise FileNotFoundError(f"plugin {path}: no such file")
        try:
            text = Path(resolved).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ImportError(f"plugin {path} cannot be read: {exc}") from None
        load_plugin_sources([PluginSource(resolved, text)])


def plugin_sources(paths: list[str]) -> list[PluginSource]:
    """The texts of `paths` as this process loaded them (loading them first if it has not)."""
    load_plugins(paths)
    return [_loaded[str(Path(path).resolve())] for path in paths]


def load_plugin_sources(sources: list[PluginSource]) -> None:
    for source in sources:
        if source.path in _loaded:
            continue
        # One module name per file: loading the same file twice (trainer and server code paths in one
        # process) must not register its functions twice, which the registry rightly refuses.
        stem = Path(source.path).stem
        module_name = f"_plugin_{stem}_{hashlib.sha1(source.path.encode()).hexdigest()[:10]}"
        spec = importlib.util.spec_from_loader(module_name, loader=None, origin=source.path)
        module = importlib.util.module_from_spec(spec)
        module.__file__ = source.path
        sys.modules[module_name] = module  # before executing it, as a normal import would (dataclasses need it)
        try:
            exec(compile(source.text, source.path, "exec"), module.__dict__)
        except Exception as exc:
            del sys.modules[module_name]
            raise ImportError(f"plugin {source.path} failed to import: {type(exc).__name__}: {exc}") from exc
        _loaded[source.path] = source
