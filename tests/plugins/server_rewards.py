"""A reward plugin for tests/test_reward_server.py, loaded by the server's workers and by the tests themselves.

The marker rewards misbehave only on completions that ask for it, so one batch can mix good and bad items.
"""

import os
import time

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


@register_reward("traced_sleep", "writes the completion to the item's trace file, sleeps its sleep_s seconds; 1.0")
def traced_sleep(completion, sample):
    with open(sample["trace"], "a") as trace:  # which items started, and in what order
        trace.write(completion + "\n")
    time.sleep(sample.get("sleep_s", 0))
    return 1.0
