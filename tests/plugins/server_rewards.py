"""A reward plugin for tests/reward_server/test_reward_server.py, loaded by the server's workers and by the tests themselves.

The marker rewards misbehave only on completions that ask for it, so one batch can mix good and bad items.
"""

import os
import time
from pathlib import Path

from alignment.rewards import register_reward


@register_reward("within_max_chars", "1.0 if the completion fits the item's max_chars column, else 0.0")
def within_max_chars(completion, sample):
    return 1.0 if len(completion) <= sample["max_chars"] else 0.0  # KeyError without the column: an item error


@register_reward("hang_on_marker", "sleeps for an hour when the completion contains HANG, else 1.0")
def hang_on_marker(completion, sample):
    if "HANG" in completion:
        time.sleep(3600)
    return 1.0


@register_reward("raise_on_marker", "raises ValueError when the completion contains RAISE, else 1.0")
def raise_on_marker(completion, sample):
    if "RAISE" in completion:
        raise ValueError("asked to raise")
    return 1.0


@register_reward("exit_on_marker", "ends its own process when the completion contains EXIT, else 1.0")
def exit_on_marker(completion, sample):
    if "EXIT" in completion:
        os._exit(3)
    return 1.0


@register_reward(
    "traced_gate",
    "writes the completion and its process id to the item's trace file, waits until its gate file exists (at most 10 minutes); 1.0",
)
def traced_gate(completion, sample):
    with open(sample["trace"], "a") as trace:  # which items started, in what order, and in which worker
        trace.write(f"{completion} {os.getpid()}\n")
    gate, deadline = Path(sample["gate"]), time.monotonic() + 600
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return 1.0
