import math
from collections.abc import Mapping
from dataclasses import dataclass

from .registry import get_reward
from .settings import RewardSettings


@dataclass
class ScoreTable:
    totals: list[float | None]  # weighted sum per item; None where any function failed for it
    columns: dict[str, list[float | None]]  # per function name, None where it failed
    errors: list[str | None]  # "name: ExceptionType: message" of the item's first failure, else None


def score_completions(
    completions: list[str],
    samples: list[Mapping],
    names: list[str],
    weights: list[float],
    *,
    settings: RewardSettings = RewardSettings(),
) -> ScoreTable:
    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions but {len(samples)} samples")
    if len(names) != len(weights):
        raise ValueError(f"{len(names)} reward functions but {len(weights)} weights")
    if not names:
        raise ValueError("no reward functions to score with")
    if len(set(names)) != len(names):
        raise ValueError(f"reward functions named twice: {names}")
    # Unknown names are a configuration error for the whole batch, so they raise here.
    specs = [get_reward(name) for name in names]

    columns: dict[str, list[float | None]] = {name: [] for name in names}
    totals: list[float | None] = []
    errors: list[str | None] = []
    for completion, sample in zip(completions, samples, strict=True):
        total: float | None = 0.0
        error: str | None = None
        for spec, weight in zip(specs, weights, strict=True):
            # One item's failure (bad sample, timeout) must not cost the rest of the batch,
            # and must not pass for a score of 0 either.
            try:
                if spec.uses_settings:
                    value = float(spec.fn(completion, sample, settings))
                else:
                    value = float(spec.fn(completion, sample))
                if not math.isfinite(value):
                    raise ValueError(f"returned {value}")
            except Exception as exc:
                value = None
                error = error or f"{spec.name}: {type(exc).__name__}: {exc}"
            columns[spec.name].append(value)
            total = None if total is None or value is None else total + weight * value
        totals.append(total)
        errors.append(error)
    return ScoreTable(totals=totals, columns=columns, errors=errors)
