"""The learning-rate schedules after warmup (config key lr_scheduler_type)."""

import math

from alignment.algo.registry import Registry

# name -> f(progress in [0, 1] through the decay, floor) -> the multiplier of the peak learning rate
SCHEDULES = Registry("lr_scheduler_type must be {choices}, not {name!r}")


@SCHEDULES.register("constant")
def constant(progress: float, floor: float) -> float:
    return 1.0


@SCHEDULES.register("linear")
def linear(progress: float, floor: float) -> float:
    return floor + (1.0 - floor) * (1.0 - progress)


@SCHEDULES.register("cosine")
def cosine(progress: float, floor: float) -> float:
    return floor + (1.0 - floor) * (0.5 * (1.0 + math.cos(math.pi * progress)))


def learning_rate_factor(step: int, total_steps: int, warmup_steps: int, schedule: str, floor: float) -> float:
    """Multiplier of the peak learning rate before optimizer step `step` (0-based): linear warmup from 0
    over warmup_steps (as in Hugging Face's schedulers), then constant, linear or cosine decay to
    `floor` = min_learning_rate / learning_rate at the last step."""
    decay = SCHEDULES.get(schedule)
    if step < warmup_steps:
        return step / warmup_steps
    return decay(min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)), floor)
