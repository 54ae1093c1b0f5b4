"""Tools and environments registered by name, as reward functions are (alignment/rewards/registry.py).

A tool is a Python function with type hints and a Google-style docstring (TRL's convention): its JSON schema,
which the chat template shows the model through `tools=`, comes from transformers' get_json_schema. It takes
the call's arguments as keywords and returns the text the model reads. Tools from plugin files (external_plugins)
run in a child process under the sandbox's limits (alignment/tools/sandbox.py), so that a hang, a crash or a flood
of output costs one call, not the run; the built-in ones are bounded by construction and run where they are
called (`in_process`).

An environment decides what follows each model turn: messages to append (a tool's answer, a user's reply) or the
end of the episode. The built-in `tools` environment answers the turn's tool calls and ends the episode at a turn
without one (alignment/tools/environment.py).
"""

import difflib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class ToolSpec:
    name: str
    fn: Callable[..., str]
    in_process: bool = False  # built-ins only: run in the calling process, which their own limits keep safe
    # built-ins only: (arguments, SandboxLimits) -> answer, for a tool that applies the limits itself (python)
    runner: Optional[Callable[[dict, Any], str]] = None

    @property
    def sandboxed(self) -> bool:
        """Whether a call runs in a child process under the sandbox (plugin tools; python, through its runner)."""
        return not self.in_process or self.runner is not None

    @functools.cached_property
    def schema(self) -> dict:
        """{"type": "function", "function": {"name", "description", "parameters"}} for apply_chat_template's tools=.
        Made when first asked for (config validation), not at registration: a sandboxed tool's process loads the
        plugin file without importing transformers."""
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(self.fn)
        except Exception as exc:  # transformers says which argument lacks a type hint or a description
            raise ValueError(f"tool {self.name!r}: {exc}") from None
        schema["function"]["name"] = self.name
        schema["function"].pop("return", None)
        return schema


@dataclass(frozen=True)
class EnvironmentSpec:
    name: str
    factory: Callable[..., Any]  # (ToolSettings) -> an Environment (alignment/tools/environment.py)
    description: str


class ToolError(Exception):
    """Raised by a tool whose message is the whole answer (the Python tool's "exited with code 1: ...")."""


_TOOLS: dict[str, ToolSpec] = {}
_ENVIRONMENTS: dict[str, EnvironmentSpec] = {}


def register_tool(name: str, in_process: bool = False, runner: Optional[Callable[[dict, Any], str]] = None) -> Callable:
    def decorator(fn: Callable[..., str]) -> Callable[..., str]:
        existing = _TOOLS.get(name)
        if existing is not None and existing.fn is not fn:
            raise ValueError(f"tool {name!r} is already registered to {existing.fn.__module__}.{existing.fn.__qualname__}")
        _TOOLS.setdefault(name, ToolSpec(name=name, fn=fn, in_process=in_process or runner is not None, runner=runner))
        return fn

    return decorator


def register_environment(name: str, description: str) -> Callable:
    def decorator(factory: Callable) -> Callable:
        existing = _ENVIRONMENTS.get(name)
        if existing is not None and existing.factory is not factory:
            raise ValueError(f"environment {name!r} is already registered to {existing.factory.__module__}.{existing.factory.__qualname__}")
        _ENVIRONMENTS.setdefault(name, EnvironmentSpec(name=name, factory=factory, description=description.strip()))
        return factory

    return decorator


def _lookup(table: dict, name: str, what: str):
    if name in table:
        return table[name]
    close = difflib.get_close_matches(name, list(table), n=3)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"unknown {what} {name!r}.{hint} Registered: {', '.join(sorted(table))}")


def get_tool(name: str) -> ToolSpec:
    return _lookup(_TOOLS, name, "tool")


def get_environment(name: str) -> EnvironmentSpec:
    return _lookup(_ENVIRONMENTS, name, "environment")


def available_tools() -> list[ToolSpec]:
    return [_TOOLS[name] for name in sorted(_TOOLS)]
