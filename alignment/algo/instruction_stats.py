"""IFEval's figures (Zhou et al. 2023) from an evaluation's records (python -m alignment.evaluate): prompt-level accuracy
(every instruction of a prompt followed) and instruction-level accuracy (over all instructions), strict and loose, with
95% intervals; the paired comparison of two models on the same prompts; and the rates per instruction id.

A record of a prompt with instructions holds "instructions": [{"id", "strict", "loose"}], one per instruction of its row.
The prompts are the independent units: a prompt's instructions share one response, so the instruction-level interval
is clustered by prompt (the ratio estimator's linearized standard error), not a binomial one over instructions."""

import math

import numpy as np
from scipy import stats

from .eval_stats import CONFIDENCE, paired_difference, wilson_interval

JUDGEMENTS = ("strict", "loose")
SIGNIFICANCE = 0.05
METHODS = {
    "prompt_strict, prompt_loose": "Wilson score interval over prompts (all of a prompt's instructions followed)",
    "instruction_strict, instruction_loose": "ratio estimator (instructions followed / instructions), Student t interval with the "
    "standard error clustered by prompt (linearization: sqrt(P/(P-1) * sum_i (y_i - r m_i)^2) / sum_i m_i, y_i followed of m_i "
    "instructions of prompt i), cut to [0, 1]",
    "instruction comparisons": "Newcombe's paired interval and the exact McNemar test on prompt-level strict and loose accuracy",
    "by_instruction": "per instruction id: count and the share followed, strict and loose; sorted by the largest change against "
    "the first model, then by the first model's loose rate, lowest first",
}


def clustered_ratio_interval(followed: np.ndarray, counts: np.ndarray, confidence: float = CONFIDENCE) -> tuple:
    """followed, counts (P,): instructions followed and instructions per prompt -> (ratio, low, high): the share of all
    instructions followed, with a Student t interval (P - 1 degrees of freedom) whose standard error is the ratio
    estimator's, clustered by prompt. One prompt, or residuals all 0, give the ratio for both ends."""
    followed, counts = np.asarray(followed, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    prompts, ratio = len(counts), float(followed.sum() / counts.sum())
    if prompts < 2:
        return ratio, ratio, ratio
    residuals = followed - ratio * counts
    error = math.sqrt(prompts / (prompts - 1) * float((residuals**2).sum())) / counts.sum()
    half = stats.t.ppf(0.5 + confidence / 2, prompts - 1) * error
    return ratio, max(0.0, ratio - half), min(1.0, ratio + half)


def instruction_records(records: list) -> list:
    """The records of prompts with instructions, in their order."""
    return [r for r in records if r.get("instructions")]


def prompt_level(records: list, judgement: str) -> np.ndarray:
    """(P,) bool: whether each prompt's response followed all its instructions, judged strict or loose."""
    return np.array([all(v[judgement] for v in r["instructions"]) for r in records], dtype=bool)


def model_figures(records: list) -> dict:
    """One model's records of prompts with instructions -> IFEval's four figures, each {value, low, high} (and the count)."""
    figures = {}
    for judgement in JUDGEMENTS:
        right = int(prompt_level(records, judgement).sum())
        low, high = wilson_interval(right, len(records))
        figures[f"prompt_{judgement}"] = {"value": right / len(records), "low": low, "high": high, "followed": right}
    counts = np.array([len(r["instructions"]) for r in records])
    for judgement in JUDGEMENTS:
        followed = np.array([sum(v[judgement] for v in r["instructions"]) for r in records])
        value, low, high = clustered_ratio_interval(followed, counts)
        figures[f"instruction_{judgement}"] = {"value": value, "low": low, "high": high, "followed": int(followed.sum())}
    return figures


def compare(first: list, second: list) -> dict:
    """second's records against first's on the same prompts: the paired difference of prompt-level accuracy, strict and loose."""
    if [r["problem"] for r in first] != [r["problem"] for r in second]:
        raise ValueError("the two models' records are not of the same prompts in the same order")
    pairs = {}
    for judgement in JUDGEMENTS:
        paired = paired_difference(prompt_level(first, judgement), prompt_level(second, judgement))
        pairs[f"prompt_{judgement}"] = {**paired, "significant": paired["mcnemar_p"] < SIGNIFICANCE}
    return {"baseline": first[0]["model"], "model": second[0]["model"], **pairs}


def rates(records: list) -> dict:
    """instruction id -> {count, strict, loose}: how often the id occurs and the share of its occurrences followed."""
    tallies = {}
    for record in records:
        for verdict in record["instructions"]:
            tally = tallies.setdefault(verdict["id"], [0, 0, 0])
            tally[0] += 1
            tally[1] += verdict["strict"]
            tally[2] += verdict["loose"]
    return {key: {"count": n, "strict": strict / n, "loose": loose / n} for key, (n, strict, loose) in tallies.items()}


def by_instruction(per_model: list) -> list:
    """per_model: each model's records of prompts with instructions, the first the baseline -> one row per instruction id,
    {id, count, rates: [{strict, loose}] per model, change: [{strict, loose}] per model after the first}, the ids that
    moved most first (the largest absolute change, strict or loose, against the first model), then the hardest for the first."""
    tables = [rates(records) for records in per_model]
    rows = []
    for key, first in tables[0].items():
        rows.append({
            "id": key, "count": first["count"],
            "rates": [{j: table[key][j] for j in JUDGEMENTS} for table in tables],
            "change": [{j: table[key][j] - first[j] for j in JUDGEMENTS} for table in tables[1:]],
        })
    moved = [max((abs(change[j]) for change in row["change"] for j in JUDGEMENTS), default=0.0) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: (-moved[i], rows[i]["rates"][0]["loose"], rows[i]["id"]))
    return [rows[i] for i in order]


def instruction_summary(per_model: list) -> dict | None:
    """per_model: each model's records, the first the baseline -> IFEval's figures of every model, each model's
    comparison with the first, and the per-instruction table; None where no record carries instructions."""
    kept = [instruction_records(records) for records in per_model]
    if not kept[0]:
        return None
    return {
        "problems": len(kept[0]), "instructions": sum(len(r["instructions"]) for r in kept[0]),
        "models": [{"model": records[0]["model"], **model_figures(records)} for records in kept],
        "comparisons": [compare(kept[0], other) for other in kept[1:]],
        "by_instruction": by_instruction(kept),
    }
