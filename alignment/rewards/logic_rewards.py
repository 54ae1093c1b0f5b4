"""Knights-and-knaves reward with the scoring of PaddleNLP's RL example (Logic-RL's rule).

PaddleNLP trains on the K&K puzzles (llm/alignment/rl/README.md, the ppo-kk data) against the reward
server its GRPO test starts, llm/alignment/rl/reward/reward_server.py, whose compute_score is Logic-RL's
kk.py with format_reward=1: the total is a format part plus an answer part,

    format  +1  the response has exactly one each of <think>, </think>, <answer>, </answer>, in that order
            -1  otherwise
    answer  +2  every person's role in <answer> equals the reference's
            -1.5  the answer parses but some role differs
            -2  the format is wrong, the answer is empty, or it does not parse

so a completion scores 3 (right), -0.5 (well formed, wrong), -1 (well formed, unparseable) or -3. Their
answer parser: the words "knight" and "knave" (case-insensitive, so also inside "knights") together occur
exactly as often as the reference has people, and for each reference name "<name> is a knight|knave"
occurs (case-insensitive, first occurrence counts). A reference line gives the first word of letters on
it as the name and the first "knight"/"knave" after it as the role.

Two deliberate differences. PaddleNLP's prompts end with "<think>" (its src is pre-templated), so it
prepends "<think>" to every response; here "<think>" is prepended only when the prompt the model saw
ends with it: sample["prompt_text"], the templated prompt the trainer adds to each sample (a chat
template ending in "<think>", as config/kk's and DeepSeek-R1-distill's do), else sample["prompt"] (what a
PaddleNLP client sends as src, templated too). Otherwise the model writes its own "<think>". PaddleNLP
also cuts the response after a literal "Assistant:" if the model writes one; we score the whole completion.
A reference that does not parse raises instead of being scored against an empty answer key.
"""

import re
from collections.abc import Mapping
from typing import Any

from .answers import sample_answer
from .format_rewards import opened_response
from .registry import register_reward

FORMAT_RIGHT, FORMAT_WRONG = 1.0, -1.0
ANSWER_RIGHT, ANSWER_WRONG, ANSWER_UNPARSED = 2.0, -1.5, -2.0

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# PaddleNLP reads a reference line with r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b": the first word of
# letters, then the first role after it. Searched in two steps here, linear in the line (the single
# pattern rescans the rest of the line from every word when no role follows: 11 s for 20,000 words).
_NAME = re.compile(r"\b[A-Za-z]+\b", re.IGNORECASE)
_ROLE = re.compile(r"\b(knight|knave)\b", re.IGNORECASE)


def kk_reference_roles(reference: str) -> dict:
    """'(1) Zoey is a knave\\n(2) Oliver is a knight' -> {'Zoey': 'knave', 'Oliver': 'knight'} (in order)."""
    roles = {}
    for number, line in enumerate(reference.split("\n"), start=1):
        if not line.strip():
            continue
        name = _NAME.search(line)
        role = _ROLE.search(line, name.end()) if name else None
        if role is None:
            raise ValueError(f"reference answer line {number} names no knight or knave: {line.strip()[:200]!r}")
        name, role = name[0], role[1]
        if name in roles:
            raise ValueError(f"reference answer names {name!r} twice (line {number}): {reference[:200]!r}")
        roles[name] = role.lower()
    if not roles:
        raise ValueError(f"reference answer lists nobody: {reference!r}")
    return roles


def kk_format_ok(response: str) -> bool:
    positions = [response.find(tag) for tag in _TAGS]
    return all(response.count(tag) == 1 for tag in _TAGS) and positions == sorted(positions)


def kk_predicted_roles(answer: str, names: list) -> dict | None:
    """The roles the answer text gives each name, or None where it does not parse by PaddleNLP's rule."""
    lowered = answer.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    roles = {}
    for name in names:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match[1].lower()
    return roles


@register_reward(
    "knights_knaves",
    "PaddleNLP/Logic-RL K&K score: format +1/-1 (<think></think><answer></answer> once each, in order) plus "
    "answer +2 all roles right, -1.5 parsed but wrong, -2 unparsed or bad format",
    needs_reference=True,
)
def knights_knaves(completion: str, sample: Mapping[str, Any]) -> float:
    expected = kk_reference_roles(sample_answer(sample))
    response = opened_response(completion, sample, "<think>")
    if not kk_format_ok(response):
        return FORMAT_WRONG + ANSWER_UNPARSED
    answer = response[response.find("<answer>") + len("<answer>") : response.find("</answer>")].strip()
    predicted = kk_predicted_roles(answer, list(expected)) if answer else None
    if predicted is None:
        return FORMAT_RIGHT + ANSWER_UNPARSED
    return FORMAT_RIGHT + (ANSWER_RIGHT if predicted == expected else ANSWER_WRONG)
