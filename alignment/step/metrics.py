"""What a step logs: metrics.jsonl's numbers and completions.jsonl's rows."""

import math

import numpy as np

from alignment.parallel.distributed import World
from alignment.rollout.multi_turn import episode_sums
from alignment.step.records import ScoredBatch


def step_metrics(scored: ScoredBatch, update: dict, learning_rate: float, timings: dict, world: World) -> dict:
    """Batch statistics summed over ranks, so every rank logs the same global numbers."""
    rollout, valid = scored.rollout, np.isfinite(scored.rewards)
    lengths = rollout.lengths.astype(np.float64)
    rewards = scored.rewards[valid]
    columns = list(scored.reward_columns)
    total = world.sum_named({
        "count": len(lengths), "valid": valid.sum(), "reward_sum": rewards.sum(), "reward_squares": (rewards**2).sum(),
        "correct": scored.correct.sum(), "length": lengths.sum(), "truncated": sum(r == "length" for r in rollout.finish_reasons),
        "advantage_abs": np.abs(scored.advantages[valid]).sum(),
        **{f"reward/{c}": np.nansum(scored.reward_columns[c]) for c in columns},
        **{f"scored/{c}": np.isfinite(scored.reward_columns[c]).sum() for c in columns},
    })
    count, n_valid, length_sum = total["count"], total["valid"], total["length"]
    reward_mean = total["reward_sum"] / max(n_valid, 1)
    seconds = sum(timings.values())
    tools = {}
    if rollout.episodes is not None:
        summed = world.sum_named(episode_sums(rollout, scored.correct))
        tools = {f"tools/{name}": value if name == "tool_seconds" else value / count for name, value in summed.items()}
    return {
        "reward_mean": reward_mean,
        "reward_std": math.sqrt(max(total["reward_squares"] / max(n_valid, 1) - reward_mean**2, 0.0)),
        **{f"reward/{c}": total[f"reward/{c}"] / max(total[f"scored/{c}"], 1) for c in columns},
        "reward_errors": int(count - n_valid),
        "accuracy": total["correct"] / count,
        "advantage_abs_mean": total["advantage_abs"] / max(n_valid, 1),
        **{key: value for key, value in update.items() if key not in ("loss", "grad_norm", "loss_tokens")},
        "response_length_mean": length_sum / count,
        "response_length_max": int(world.max(np.array([lengths.max()]))[0]),
        "truncated_fraction": total["truncated"] / count,
        "loss": update["loss"],
        "lr": learning_rate,
        "grad_norm": update["grad_norm"],
        **tools,
        "tokens_per_second": length_sum / seconds,  # tokens after the prompts (tool answers included) over the step's wall time
        **{f"time/{phase}": t for phase, t in timings.items()},
        "time/step": seconds,
    }


def completion_rows(scored: ScoredBatch, limit: int) -> list:
    """At most `limit` rows of completions.jsonl, spread over the step's groups: every group's first
    completion, then every group's second, and so on, so a small sample shows many prompts."""
    size = scored.rollout.group_size
    groups = len(scored.completions) // size
    rows = []
    for row in [group * size + member for member in range(size) for group in range(groups)][:limit]:
        prompt = scored.prompts[row // size].record
        rows.append({
            "prompt": prompt.question,
            "answer": prompt.answer,
            "completion": scored.completions[row],
            "reward": finite_or_none(scored.rewards[row]),
            "rewards": {name: finite_or_none(values[row]) for name, values in scored.reward_columns.items()},
            "advantage": float(scored.advantages[row]),
            "finish_reason": scored.rollout.finish_reasons[row],
            "error": scored.errors[row],
        })
        if scored.rollout.episodes is not None:
            episode = scored.rollout.episodes[row]
            rows[-1].update(turns=episode.turns, tool_calls=[call.as_dict() for call in episode.calls])
    return rows


def finite_or_none(value: float):
    return float(value) if np.isfinite(value) else None  # a failed reward is null in the logs, never NaN
