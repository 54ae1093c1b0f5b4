"""The learning-rate schedules (alignment/algo/schedule.py's registry) against hand values."""

import math

import pytest

from alignment.algo.schedule import learning_rate_factor


@pytest.mark.parametrize(
    "step, schedule, expected",
    [
        (0, "linear", 0.0),  # warmup starts at 0, as in Hugging Face
        (2, "linear", 0.5),
        (4, "linear", 1.0),
        (9, "linear", 0.1 + 0.9 * 0.5),  # halfway through decay: floor + (1 - floor) / 2
        (14, "linear", 0.1),
        (9, "cosine", 0.1 + 0.9 * 0.5),
        (6, "cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2))),
        (12, "constant", 1.0),
    ],
)
def test_learning_rate_schedule(step, schedule, expected):
    assert learning_rate_factor(step, total_steps=14, warmup_steps=4, schedule=schedule, floor=0.1) == pytest.approx(expected)
