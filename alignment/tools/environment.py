"""What follows a model turn: the Environment protocol, the records an episode keeps, and the built-in `tools`
environment, which answers the turn's tool calls and ends the episode at a turn that makes none.

Tool calls of one turn, over every row of the batch, run in parallel threads; each is bounded by the sandbox's
limits (tool_timeout and the rest), so a turn waits at most about tool_timeout for its slowest tool."""

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Protocol

from alignment.tools.calls import MalformedCall, parse_tool_calls
from alignment.tools.registry import ToolError, ToolSpec, get_tool, register_environment


@dataclass(frozen=True)
class ToolSettings:
    tools: tuple  # registered tool names, shown to the model through the chat template
    limits: object  # a SandboxLimits (alignment/tools/sandbox.py, imported only where a tool runs)
    plugin_sources: tuple = ()  # PluginSources of external_plugins: where sandboxed plugin tools come from
    parallel: int = 8  # tool calls running at once
    calls_per_turn: int = 4  # calls of one turn that run; the ones after are answered with an error


@dataclass
class ToolCall:
    name: str  # as the model wrote it ("" for a call that could not be parsed)
    arguments: dict
    answer: str  # what the model reads back
    error: Optional[str]  # None: the tool answered
    seconds: float

    def as_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments, "answer": self.answer, "error": self.error}


@dataclass
class Episode:
    """One row's conversation after its prompt."""

    sample: dict  # the prompt's reward sample (question, reference answer, dataset columns)
    turns: list = field(default_factory=list)  # the model's turns, decoded
    calls: list = field(default_factory=list)  # ToolCalls, in order


class Environment(Protocol):
    def done(self, episode: Episode) -> bool:
        """True: the episode ends after its last turn (asked before any reply, so a turn at max_turns costs nothing)."""

    def reply(self, episodes: list) -> list:
        """Episodes not done -> for each, the chat messages that follow its last turn ({"role", "content"}, role
        "tool" for a tool's answer), rendered by the model's chat template."""


def error_answer(error: str) -> str:
    return f"error: {error}"


class ToolEnvironment:
    def __init__(self, settings: ToolSettings):
        self.settings = settings
        self.tools = {name: get_tool(name) for name in settings.tools}
        self.pool = ThreadPoolExecutor(settings.parallel, thread_name_prefix="tool")

    def done(self, episode: Episode) -> bool:
        return not parse_tool_calls(episode.turns[-1])

    def reply(self, episodes: list) -> list:
        calls = [(episode, call) for episode in episodes for call in self._turn_calls(episode.turns[-1])]
        results = list(self.pool.map(lambda pair: self.run(pair[1]), calls))
        messages = {id(episode): [] for episode in episodes}
        for (episode, _), result in zip(calls, results):
            episode.calls.append(result)
            messages[id(episode)].append({"role": "tool", "name": result.name, "content": result.answer})
        return [messages[id(episode)] for episode in episodes]

    def _turn_calls(self, turn: str) -> list:
        """The turn's calls, the first calls_per_turn of them; the rest are not run, and one error says so."""
        calls, most = parse_tool_calls(turn), self.settings.calls_per_turn
        if len(calls) <= most:
            return calls
        return calls[:most] + [
            MalformedCall("", f"this turn made {len(calls)} tool calls; only the first {most} ran (max_tool_calls_per_turn)")
        ]

    def run(self, call) -> ToolCall:
        started = time.perf_counter()
        if isinstance(call, MalformedCall):
            return ToolCall("", {}, error_answer(call.error), call.error, 0.0)
        error = self._argument_error(call)
        answer = None
        if error is None:
            answer, error = self._call(self.tools[call.name], call.arguments)
        return ToolCall(call.name, call.arguments, error_answer(error) if error else answer, error, time.perf_counter() - started)

    def _argument_error(self, call) -> Optional[str]:
        if call.name not in self.tools:
            return f"unknown tool {call.name!r}; the tools are {', '.join(sorted(self.tools))}"
        parameters = self.tools[call.name].schema["function"]["parameters"]
        known, required = set(parameters.get("properties", {})), set(parameters.get("required", []))
        unknown, missing = sorted(set(call.arguments) - known), sorted(required - set(call.arguments))
        if unknown or missing:
            wrong = f"unknown argument(s) {', '.join(unknown)}" if unknown else f"missing argument(s) {', '.join(missing)}"
            return f"tool {call.name!r}: {wrong}; it takes {', '.join(sorted(known)) or 'none'}"
        return None

    def _call(self, tool: ToolSpec, arguments: dict) -> tuple:
        """-> (answer, None) or (None, error)."""
        from alignment.tools.sandbox import call_in_sandbox

        limits = self.settings.limits
        if not tool.in_process:
            result = call_in_sandbox(list(self.settings.plugin_sources), tool.name, arguments, limits)
            return (None, result.error()) if result.error() else (result.stdout, None)
        try:
            answer = tool.runner(arguments, limits) if tool.runner else tool.fn(**arguments)
        except ToolError as exc:
            return None, str(exc)
        except Exception as exc:  # the model reads what went wrong, and the episode goes on
            return None, f"{type(exc).__name__}: {exc}"
        if not isinstance(answer, str):
            return None, f"tool {tool.name!r} returned {type(answer).__name__}, not str"
        return answer[: limits.output_bytes], None


@register_environment("tools", "runs the tool calls of each turn and answers them; a turn without a call ends the episode")
def tool_environment(settings: ToolSettings) -> ToolEnvironment:
    return ToolEnvironment(settings)
