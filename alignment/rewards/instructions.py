"""Instruction following with verifiable constraints: IFEval's and IFBench's verifiers as rewards.

A row carries `instruction_id_list` (ids such as "punctuation:no_comma", IFEval's 25 or IFBench's 58) and `kwargs`,
one object of arguments per id, as both benchmarks' files do. The verifiers are the reference implementations' code as
the if-verifiable package (Apache-2.0) carries it; this module only looks them up, checks a row before a run starts,
and applies IFEval's two ways of judging a response (Zhou et al. 2023, evaluation_lib.py):

- strict: the response as it is (blank: not followed);
- loose: followed if any of eight variants follows: the response, without its first line, its last line or both,
  each also with every "*" removed (markdown emphasis a model adds around what the check reads).

Rewards: the share of a row's instructions followed (instruction level) or 1.0 only if all are (prompt level), strict
or loose. The sentence tokenizer and stop words come from NLTK data installed with the project (nltk_resources.py).
"""

import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignment.basics.errors import ConfigError

from .registry import register_reward

# nltk_resources is imported where it is used: alignment.rewards imports this module, and a package that has already
# imported nltk_resources when `python -m alignment.rewards.nltk_resources` runs it makes runpy warn.
NEEDS_TAGGER = "words:start_verb"  # the one instruction that also reads NLTK's part-of-speech tagger


@dataclass(frozen=True)
class Followed:
    """One instruction's verdicts for one response."""

    instruction_id: str
    strict: bool
    loose: bool


class _QuietVerifiers(logging.Filter):
    """IFEval's verifiers log an error through the root logger for every answer langdetect cannot read ("****"), then
    count the instruction followed, as the reference does; a run's console would fill with them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "if_verifiable" not in Path(record.pathname).parts


@functools.cache
def verifiers() -> dict:
    """instruction id -> the verifier class, IFEval's and IFBench's together (their ids do not overlap)."""
    from . import nltk_resources

    absent = nltk_resources.missing(nltk_resources.ENGLISH_FILES)
    if absent:
        raise ConfigError(f"the instruction verifiers need NLTK's {', '.join(absent)}, not installed: run {nltk_resources.INSTALL_COMMAND}")
    import langdetect
    import nltk

    # if-verifiable's IFBench module calls nltk.download at import for what it does not find; nothing is fetched at
    # run time here (a missing tagger refuses its rows at load time instead), so the downloader is held off meanwhile.
    download, nltk.download = nltk.download, lambda *args, **kwargs: False
    try:
        from if_verifiable.ifbench.instructions_registry import INSTRUCTION_DICT as ifbench
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT as ifeval
    finally:
        nltk.download = download
    langdetect.DetectorFactory.seed = 0  # language:response_language: langdetect draws at random unless seeded
    logging.getLogger().addFilter(_QuietVerifiers())
    return {**ifeval, **ifbench}


def _build(verifier, arguments: Mapping, prompt: str) -> None:
    """Gives a verifier its arguments (those set to null left out, as the benchmarks' files hold every id's argument
    names), and the prompt where it reads it (IFEval's repeat_prompt)."""
    verifier.build_description(**{name: value for name, value in arguments.items() if value is not None})
    expected = verifier.get_instruction_args()
    if expected and "prompt" in expected:
        verifier.build_description(prompt=prompt)


def check_row(sample: Mapping[str, Any]) -> None:
    """Raises ValueError naming what is wrong with a row's instructions: missing or malformed columns, an unknown id,
    arguments that are not the verifier's (a verifier draws a missing argument at random) or that it refuses (IFEval's
    relation "at most"), or NLTK data not installed."""
    row_verifiers(sample)


def row_verifiers(sample: Mapping[str, Any]) -> list:
    """The row's verifiers built with their arguments, in its order; ValueError as check_row says."""
    ids, arguments = sample.get("instruction_id_list"), sample.get("kwargs")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"'instruction_id_list' must be a non-empty list of instruction ids, got {str(ids)[:80]}")
    if not isinstance(arguments, list) or len(arguments) != len(ids) or not all(isinstance(a, dict) for a in arguments):
        raise ValueError(f"'kwargs' must be a list of {len(ids)} objects, one per instruction id, got {str(arguments)[:80]}")
    from . import nltk_resources

    known, built = verifiers(), []
    for position, (instruction_id, given) in enumerate(zip(ids, arguments)):
        if instruction_id not in known:
            raise ValueError(f"unknown instruction id {instruction_id!r} (instruction_id_list[{position}]); known: IFEval's and "
                             "IFBench's ids, e.g. 'punctuation:no_comma'")
        absent = nltk_resources.missing([nltk_resources.TAGGER] if instruction_id == NEEDS_TAGGER else [])
        if absent:
            command = f"python -m nltk.downloader -d {nltk_resources.default_target()} {absent[0].split('/')[-1]}"
            raise ValueError(f"instruction {instruction_id!r} needs NLTK's {', '.join(absent)}, which no registry package carries: "
                             f"install it where the internet can be reached ({command})")
        verifier = known[instruction_id](instruction_id)
        expected = set(verifier.get_instruction_args_keys() or ()) - {"prompt"}
        named = {name for name, value in given.items() if value is not None}
        if named != expected:
            raise ValueError(
                f"kwargs[{position}] of {instruction_id!r} must set {sorted(expected) or 'nothing'}, got {sorted(named) or 'nothing'}"
            )
        try:
            _build(verifier, given, str(sample.get("prompt", "")))
        except ValueError as e:
            raise ValueError(f"kwargs[{position}] of {instruction_id!r}: {e}") from None
        built.append(verifier)
    return built


def loose_variants(response: str) -> list:
    """IFEval's loose variants: the response, and without its first line, last line or both, each also without '*'."""
    lines = response.split("\n")
    cut = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return cut + [text.replace("*", "") for text in cut]


def followed(completion: str, sample: Mapping[str, Any]) -> list:
    """-> [Followed] for each of the row's instructions, in its order."""
    variants = loose_variants(completion)
    verdicts = []
    for instruction_id, verifier in zip(sample["instruction_id_list"], row_verifiers(sample)):
        strict = bool(completion.strip()) and bool(verifier.check_following(completion))
        loose = strict or any(text.strip() and verifier.check_following(text) for text in variants)
        verdicts.append(Followed(instruction_id, strict, loose))
    return verdicts


def _share(verdicts: list, loose: bool) -> float:
    return sum(v.loose if loose else v.strict for v in verdicts) / len(verdicts)


@register_reward("ifeval", "IFEval/IFBench rows (instruction_id_list, kwargs): the share of the row's instructions the completion follows, "
                 "strict (the completion as it is)", check_sample=check_row, prepare=verifiers)
def ifeval(completion: str, sample: Mapping[str, Any]) -> float:
    return _share(followed(completion, sample), loose=False)


@register_reward("ifeval_loose", "IFEval/IFBench rows: the share of the row's instructions followed, loose (also with the first or last "
                 "line, or both, left out, and with '*' removed)", check_sample=check_row, prepare=verifiers)
def ifeval_loose(completion: str, sample: Mapping[str, Any]) -> float:
    return _share(followed(completion, sample), loose=True)


@register_reward("ifeval_all", "IFEval/IFBench rows: 1.0 if the completion follows every one of the row's instructions, strict, else 0.0 "
                 "(IFEval's prompt-level accuracy)", check_sample=check_row, prepare=verifiers)
def ifeval_all(completion: str, sample: Mapping[str, Any]) -> float:
    return float(_share(followed(completion, sample), loose=False) == 1.0)


@register_reward("ifeval_all_loose", "IFEval/IFBench rows: 1.0 if the completion follows every one of the row's instructions, loose, "
                 "else 0.0", check_sample=check_row, prepare=verifiers)
def ifeval_all_loose(completion: str, sample: Mapping[str, Any]) -> float:
    return float(_share(followed(completion, sample), loose=True) == 1.0)


# --- Shaping and a guard, for training: a 135M model never writes a whole answer in one case by chance, so the
# binary verdict gives GRPO nothing to compare; and a format one instruction asks for (the whole answer in quotes)
# spreads to every answer unless something says it was not asked for (issue 53's seventh run quoted 424 of 541).

# instruction id -> the letters of a response that break it (none would follow it)
WRONG_LETTERS = {
    "change_case:english_lowercase": str.isupper,
    "change_case:english_capital": str.islower,
}

# instruction id -> whether a response carries the format it asks for: quotes and title as IFEval's verifiers read them; a
# postscript only at a line's start (IFEval's finds the marker anywhere), and JSON by its opening alone, parsed or not
FORMAT_MARKS = {
    "startend:quotation": lambda text: len(text) > 1 and text[0] == text[-1] == '"',
    "detectable_format:title": lambda text: re.search(r"<<[^\n]+>>", text) is not None,
    "detectable_content:postscript": lambda text: re.search(r"^\s*p\.\s?(p\.\s?)?s\.", text, re.IGNORECASE | re.MULTILINE) is not None,
    "detectable_format:json_format": lambda text: re.match(r"(```(json)?\s*)?\{", text, re.IGNORECASE) is not None,
}


def partial_credit(instruction_id: str, completion: str) -> float:
    """An unfollowed instruction's credit: 0.5 / (1 + its wrong letters / 10) for the case instructions, else 0 (also for an
    answer without a letter: a blank one would otherwise earn the most)."""
    wrong_letter = WRONG_LETTERS.get(instruction_id)
    if wrong_letter is None or not any(map(str.isalpha, completion)):
        return 0.0
    return 0.5 / (1 + sum(map(wrong_letter, completion)) / 10)


@register_reward("ifeval_graded", "IFEval/IFBench rows: as ifeval (strict), with an unfollowed all-lowercase or all-capitals instruction "
                 "counting 0.5 / (1 + letters in the wrong case / 10) instead of 0", check_sample=check_row, prepare=verifiers)
def ifeval_graded(completion: str, sample: Mapping[str, Any]) -> float:
    credits = [1.0 if v.strict else partial_credit(v.instruction_id, completion) for v in followed(completion, sample)]
    return sum(credits) / len(credits)


@register_reward("unasked_format", "-1.0 if the completion carries a format an IFEval instruction asks for (the whole answer in double "
                 "quotes, a <<title>>, a P.S., a JSON object) that its row does not ask for, else 0.0")
def unasked_format(completion: str, sample: Mapping[str, Any]) -> float:
    asked, text = set(sample.get("instruction_id_list") or ()), completion.strip()
    return -1.0 if any(carries(text) for instruction_id, carries in FORMAT_MARKS.items() if instruction_id not in asked) else 0.0
