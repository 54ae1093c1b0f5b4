"""completions.jsonl's sample of a step spreads over its groups (prompts), not the first group's members."""

import numpy as np

from alignment.rollout import Rollout
from alignment.basics.data import EncodedPrompt, PromptRecord
from alignment.step.metrics import completion_rows
from alignment.step.records import ScoredBatch

QUESTIONS, G = ["What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"], 4


def scored_batch() -> ScoredBatch:
    """3 prompts x 4 completions, prompt-major; completion "p<group>c<member>" ends with eos except members 3."""
    rows = len(QUESTIONS) * G
    prompts = [EncodedPrompt(PromptRecord(({"role": "user", "content": q},), str(2 * (i + 1))), (1, 2)) for i, q in enumerate(QUESTIONS)]
    rollout = Rollout(
        prompt_ids=[[1, 2]] * rows, completion_ids=np.zeros((rows, 3), np.int64), completion_mask=np.ones((rows, 3), np.float32),
        logprobs=np.zeros((rows, 3), np.float32), finish_reasons=["length" if row % G == 3 else "eos" for row in range(rows)], group_size=G,
    )
    rewards = np.arange(rows, dtype=np.float64) / 10
    rewards[5] = np.nan  # group 1, member 1: its reward could not be computed
    return ScoredBatch(
        prompts=prompts, rollout=rollout, completions=[f"p{row // G}c{row % G}" for row in range(rows)], rewards=rewards,
        reward_columns={"accuracy": rewards.copy()}, errors=["accuracy: boom" if row == 5 else None for row in range(rows)],
        correct=np.zeros(rows, bool), advantages=np.linspace(-1, 1, rows, dtype=np.float32),
    )


def test_rows_take_each_group_in_turn():
    scored = scored_batch()
    rows = completion_rows(scored, 5)
    assert [row["completion"] for row in rows] == ["p0c0", "p1c0", "p2c0", "p0c1", "p1c1"]
    assert [row["prompt"] for row in rows] == [*QUESTIONS, *QUESTIONS[:2]]
    assert [row["answer"] for row in rows] == ["2", "4", "6", "2", "4"]
    # each row's fields come from the same completion: p1c1 is row 5 of the batch
    assert rows[4] == {
        "prompt": QUESTIONS[1], "answer": "4", "completion": "p1c1", "reward": None, "rewards": {"accuracy": None},
        "advantage": float(scored.advantages[5]), "finish_reason": "eos", "error": "accuracy: boom",
    }
    assert rows[0]["reward"] == 0.0 and rows[1]["reward"] == 0.4 and rows[3]["advantage"] == float(scored.advantages[1])


def test_a_limit_past_the_batch_gives_every_completion_once():
    rows = completion_rows(scored_batch(), 100)
    assert sorted(row["completion"] for row in rows) == sorted(f"p{g}c{m}" for g in range(3) for m in range(G))
    assert [row["finish_reason"] for row in rows[-3:]] == ["length"] * 3  # the members 3 come last
    assert completion_rows(scored_batch(), 0) == []
