"""IFEval's figures of python -m alignment.evaluate (alignment/algo/instruction_stats.py) against values counted and
computed by hand from a few records (the working is in the comments)."""

import math

import numpy as np
import pytest
from test_eval_stats import wilson_by_hand

from alignment.algo.eval_stats import mean_interval
from alignment.algo.instruction_stats import clustered_ratio_interval, instruction_summary

T_975 = {3: 3.182446305284263}  # Student t's 97.5% quantile by degrees of freedom


def record(model: str, problem: int, *verdicts: tuple) -> dict:
    """verdicts: (id, strict, loose); none: a problem without instructions."""
    instructions = [{"id": key, "strict": strict, "loose": loose} for key, strict, loose in verdicts]
    return {"model": model, "problem": problem, **({"instructions": instructions} if instructions else {})}


# Three prompts with instructions and one without (mixed data: left out of IFEval's figures).
FIRST = [
    record("A", 0, ("a", True, True)),
    record("A", 1, ("b", False, True), ("a", True, True)),
    record("A", 2, ("c", False, False), ("b", False, False)),
    record("A", 3),
]
SECOND = [
    record("B", 0, ("a", False, True)),
    record("B", 1, ("b", True, True), ("a", True, True)),
    record("B", 2, ("c", True, True), ("b", False, True)),
    record("B", 3),
]


def test_clustered_ratio_interval_hand_computed():
    # followed 1, 1, 0, 2 of 1, 2, 1, 3: ratio 4/7; residuals y - r m: 3/7, -1/7, -4/7, 2/7, squares summing to 30/49;
    # standard error sqrt(4/3 * 30/49) / 7 = sqrt(40) / 49 = 0.129073; half width 3.182446 * 0.129073 = 0.410767
    ratio, low, high = clustered_ratio_interval(np.array([1, 1, 0, 2]), np.array([1, 2, 1, 3]))
    half = T_975[3] * math.sqrt(40) / 49
    assert (ratio, low, high) == pytest.approx((4 / 7, 4 / 7 - half, 4 / 7 + half), abs=1e-12)
    assert (low, high) == pytest.approx((0.160662, 0.982195), abs=1e-6)


def test_one_instruction_per_prompt_is_the_mean_over_prompts():
    """With one instruction a prompt, the ratio is a mean of 0s and 1s and its clustered error s / sqrt(P)."""
    followed = np.array([1, 0, 1, 1, 0, 1, 1])
    assert clustered_ratio_interval(followed, np.ones(7)) == pytest.approx(mean_interval(followed), abs=1e-12)


def test_no_spread_gives_the_ratio_for_both_ends():
    assert clustered_ratio_interval(np.array([2]), np.array([3])) == pytest.approx((2 / 3,) * 3)
    assert clustered_ratio_interval(np.array([1, 2]), np.array([2, 4])) == pytest.approx((0.5,) * 3)  # residuals 0


def test_figures_of_each_model_from_its_records():
    summary = instruction_summary([FIRST, SECOND])
    assert (summary["problems"], summary["instructions"]) == (3, 5)
    first, second = summary["models"]
    assert (first["model"], second["model"]) == ("A", "B")
    # A: all followed strict in prompts 0 only, loose in 0 and 1; instructions followed strict 2 of 5, loose 3 of 5.
    # B: all strict in prompt 1 only, loose in all three; instructions strict 3 of 5, loose 5 of 5.
    for model, prompts, instructions in ((first, (1, 2), (2, 3)), (second, (1, 3), (3, 5))):
        for judgement, right in zip(("strict", "loose"), prompts):
            assert model[f"prompt_{judgement}"] == pytest.approx(
                {"value": right / 3, "low": wilson_by_hand(right, 3)[0], "high": wilson_by_hand(right, 3)[1], "followed": right}, abs=1e-6)
        for judgement, followed in zip(("strict", "loose"), instructions):
            assert model[f"instruction_{judgement}"]["value"] == pytest.approx(followed / 5)
            assert model[f"instruction_{judgement}"]["followed"] == followed
    # A loose: followed 1, 2, 0 of 1, 2, 2; ratio 3/5; residuals 0.4, 0.8, -1.2; squares 2.24; standard error
    # sqrt(3/2 * 2.24) / 5 = 0.366606, half width t(0.975, 2) = 4.302653 times that = 1.577377: cut to [0, 1].
    assert (first["instruction_loose"]["low"], first["instruction_loose"]["high"]) == (0.0, 1.0)
    # B loose: every instruction followed, no spread.
    assert (second["instruction_loose"]["low"], second["instruction_loose"]["high"]) == (1.0, 1.0)


def test_prompt_level_comparison_strict_and_loose():
    (pair,) = instruction_summary([FIRST, SECOND])["comparisons"]
    assert (pair["baseline"], pair["model"]) == ("A", "B")
    # loose: A right on 0, 1; B on 0, 1, 2 -> only B on prompt 2; McNemar on 0 vs 1 discordant: p = 1
    loose = pair["prompt_loose"]
    assert (loose["both_correct"], loose["only_first"], loose["only_second"], loose["neither"]) == (2, 0, 1, 0)
    assert loose["difference"] == pytest.approx(1 / 3) and loose["mcnemar_p"] == 1.0 and not loose["significant"]
    # strict: A right on 0 only, B on 1 only
    strict = pair["prompt_strict"]
    assert (strict["both_correct"], strict["only_first"], strict["only_second"], strict["neither"]) == (0, 1, 1, 1)
    assert strict["difference"] == 0.0 and strict["mcnemar_p"] == 1.0


def test_per_instruction_table_the_ids_that_moved_most_first():
    rows = instruction_summary([FIRST, SECOND])["by_instruction"]
    # c: once, A 0/0 -> B 1/1 (moved 1); b: twice, A strict 0/2 loose 1/2 -> B 1/2, 2/2 (moved 0.5);
    # a: twice, A 2/2, 2/2 -> B 1/2, 2/2 (moved 0.5); b and a tie: A's lower loose rate (b's 0.5) first.
    assert [(row["id"], row["count"]) for row in rows] == [("c", 1), ("b", 2), ("a", 2)]
    by_id = {row["id"]: row for row in rows}
    assert by_id["b"]["rates"] == [{"strict": 0.0, "loose": 0.5}, {"strict": 0.5, "loose": 1.0}]
    assert by_id["b"]["change"] == [{"strict": 0.5, "loose": 0.5}]
    assert by_id["a"]["change"] == [{"strict": -0.5, "loose": 0.0}]
    assert by_id["c"]["change"] == [{"strict": 1.0, "loose": 1.0}]


def test_one_model_hardest_first_and_none_without_instructions():
    rows = instruction_summary([FIRST])["by_instruction"]
    assert [row["id"] for row in rows] == ["c", "b", "a"] and all(row["change"] == [] for row in rows)  # loose 0, 0.5, 1
    assert instruction_summary([[record("A", 0), record("A", 1)]]) is None


def test_records_of_other_prompts_are_refused():
    with pytest.raises(ValueError, match="not of the same prompts"):
        instruction_summary([FIRST, SECOND[1:]])
