"""Multi-turn rollouts with tools: the tools the model may call, the environment that answers its turns, and the
limits of a tool call."""

from dataclasses import dataclass
from typing import Optional

from alignment.config.sections import _key


@dataclass(frozen=True)
class MultiTurn:
    TITLE = "Multi-turn rollouts with tools"

    tools: list[str] = _key(
        [],
        "Tools the model may call, by name: calculator, python (built in), or @register_tool functions of external_plugins; shown to the "
        "model through the chat template's tools=. Given: rollouts are multi-turn (environment tools).",
    )
    environment: Optional[str] = _key(
        None,
        "What answers each model turn: a registered environment (built in: tools, which runs the turn's tool calls and ends the episode at "
        "a turn without one; more from external_plugins' @register_environment); default: tools when tools are given, else single-turn "
        "rollouts.",
    )
    max_turns: int = _key(
        4,
        "Model turns per episode at most; a turn that still calls a tool at the last one ends the episode unanswered (finish reason "
        "max_turns).",
    )
    max_turn_tokens: Optional[int] = _key(
        None,
        "Tokens the model may generate in one turn; a turn that reaches it ends the episode (finish reason length). Default: max_dec_len, "
        "which bounds the whole trajectory after the prompt, tool answers included.",
    )
    tool_timeout: float = _key(
        10.0,
        "Seconds one tool call may take (wall clock); a slower one is killed and answered with an error, and the episode goes on.",
    )
    tool_memory_mb: int = _key(
        512, "Memory limit (MB) of a python or plugin tool call: each process's address space, and as root all the call's processes "
        "together (a memory cgroup, its tmpfs files on top); as a user a call of tool_processes processes may hold that many times it."
    )
    tool_output_bytes: int = _key(
        4096,
        "Bytes of a tool's output kept; a tool that prints more is stopped and its answer says so (verl's max_tool_response_length "
        "counts characters).",
    )
    tool_workers: int = _key(8, "Tool calls running at once.")
    max_tool_calls_per_turn: int = _key(
        4,
        "Tool calls one model turn may make; the ones after are not run, and one error answer says so.",
    )
    tool_isolation: str = _key(
        "bwrap",
        "How python and plugin tools are isolated: bwrap (each call in bubblewrap's namespaces: a read-only view of /usr and the Python "
        "installation only, no network, its own processes, a private folder; the run refuses to start where bubblewrap cannot run) or none "
        "(no isolation, only the limits below: for code you trust; a warning at start). docs/security.md says what it promises.",
        choices=["bwrap", "none"],
    )
    tool_disk_mb: int = _key(
        64, "Size (MB) of each of a python or plugin tool call's two writable places, tmpfs both: its private folder (also /tmp) "
        "and /dev/shm; the rest of what it sees is read-only."
    )
    tool_processes: int = _key(16, "Processes and threads a python or plugin tool call may have at once.")

    @property
    def resolved_environment(self) -> Optional[str]:
        """The environment of multi-turn rollouts; None: single-turn."""
        return self.environment or ("tools" if self.tools else None)
