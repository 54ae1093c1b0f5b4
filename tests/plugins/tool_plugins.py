"""Tools and an environment for the multi-turn tests, loaded through external_plugins like a user's."""

import os
import time

from alignment.tools.registry import register_environment, register_tool


@register_tool("add")
def add(a: int, b: int) -> str:
    """Adds two integers.

    Args:
        a: the first
        b: the second
    """
    return str(a + b)


@register_tool("sleepy")
def sleepy(seconds: float) -> str:
    """Sleeps, then answers.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"


@register_tool("clock")
def clock(seconds: float) -> str:
    """Sleeps, then answers when it began and ended (seconds since the epoch, a clock every process shares).

    Args:
        seconds: how long
    """
    began = time.time()
    time.sleep(seconds)
    return f"{began} {time.time()}"


@register_tool("flood")
def flood(megabytes: int) -> str:
    """Prints a lot.

    Args:
        megabytes: how much
    """
    print("x" * (megabytes * 2**20))
    return "done"


@register_tool("crash")
def crash(code: int) -> str:
    """Ends its process at once.

    Args:
        code: unused
    """
    os.abort()


class Nudge:
    """Answers every turn with the same user message: every episode runs to max_turns (or a token budget)."""

    def __init__(self, settings):
        self.settings = settings

    def done(self, episode) -> bool:
        return False

    def reply(self, episodes: list) -> list:
        return [[{"role": "user", "content": f"turn {len(episode.turns) + 1} please"}] for episode in episodes]


@register_environment("nudge", "asks for another turn after every turn")
def nudge(settings):
    return Nudge(settings)
