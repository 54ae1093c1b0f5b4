"""Rewards on a completion's length, repetition and substance, parametrised by RewardSettings.

Lengths are in tokens of the policy's tokenizer, which only the trainer knows: it puts each
completion's token count into the sample as "completion_tokens" (and so into each reward server item).
"""

import math
import re
from collections import Counter
from collections.abc import Mapping
from numbers import Integral
from typing import Any

from .math_rewards import accuracy
from .registry import register_reward
from .settings import RewardSettings


def completion_tokens(sample: Mapping[str, Any]) -> int:
    if "completion_tokens" not in sample:
        raise ValueError(
            "item has no 'completion_tokens' (the completion's length in tokens): the trainer adds it; "
            "a reward server client must send it in each request item"
        )
    value = sample["completion_tokens"]
    if not isinstance(value, Integral) or isinstance(value, bool) or value < 0:
        raise ValueError(f"item 'completion_tokens' must be a whole number >= 0, got {value!r}")
    return int(value)


def _required(settings: RewardSettings, name: str) -> int:
    value = getattr(settings, name)
    if value is None:
        raise ValueError(f"{name} is not set (the trainer sets it; a reward server client sends it in reward_settings)")
    return value


@register_reward(
    "cosine",
    "Length-scaled correctness (Demystifying Long CoT): a cosine from the *_min_len_value at 0 tokens to the "
    "*_max_len_value at cosine_max_len, the correct or wrong pair by 'accuracy'",
    uses_settings=True,
    needs_reference=True,
)
def cosine(completion: str, sample: Mapping[str, Any], settings: RewardSettings) -> float:
    max_len = _required(settings, "cosine_max_len")
    # Past cosine_max_len the value stays at the *_max_len_value: the cosine would rise again (ms-swift
    # lets it; the paper gives such completions a separate exceed-length penalty instead).
    length = min(completion_tokens(sample), max_len)
    if accuracy(completion, sample) > 0:
        at_zero, at_max = settings.cosine_min_len_value_correct, settings.cosine_max_len_value_correct
    else:
        at_zero, at_max = settings.cosine_min_len_value_wrong, settings.cosine_max_len_value_wrong
    return at_max + 0.5 * (at_zero - at_max) * (1.0 + math.cos(math.pi * length / max_len))


@register_reward(
    "repetition",
    "n-gram repetition penalty (open-r1, ms-swift): (1 - unique/total lower-cased word n-grams) * "
    "repetition_max_penalty; 0.0 for fewer words than repetition_n_grams",
    uses_settings=True,
)
def repetition(completion: str, sample: Mapping[str, Any], settings: RewardSettings) -> float:
    words = completion.lower().split()  # lower-cased, as open-r1 and ms-swift do
    n = settings.repetition_n_grams
    if len(words) < n:  # no n-gram at all, so nothing repeats: a real 0.0, as in both references
        return 0.0
    ids = ngram_ids(_numbered(words), n)  # len(words) - n + 1 of them
    return (1.0 - len(set(ids)) / len(ids)) * settings.repetition_max_penalty


def ngram_ids(tokens: list[int], n: int) -> list[int]:
    """One int per n-gram of tokens (len(tokens) - n + 1 of them), equal exactly where the n-grams are equal.

    By doubling: the ids of the 2m-grams number the pairs (id of the m-gram at i, id of the m-gram at i + m),
    so time and memory are O(len(tokens) log n) and O(len(tokens)) whatever n. Tuples of n words would take
    n times the memory (6 GB for 60,000 words and n = 30,000)."""
    if n == 1:
        return tokens
    half = ngram_ids(tokens, n // 2)
    ids = _numbered(zip(half, half[n // 2 :]))  # the 2 * (n // 2)-grams
    return _numbered(zip(ids, tokens[n - 1 :])) if n % 2 else ids  # one more token for an odd n


def _numbered(keys) -> list[int]:
    """Each key -> the order of its first occurrence: ['a', 'b', 'a'] -> [0, 1, 0]."""
    numbers: dict = {}
    return [numbers.setdefault(key, len(numbers)) for key in keys]


@register_reward(
    "soft_overlong",
    "DAPO's soft overlong punishment: 0 up to soft_max_length - soft_cache_length tokens, then linear to -1 "
    "at soft_max_length, -1 beyond",
    uses_settings=True,
)
def soft_overlong(completion: str, sample: Mapping[str, Any], settings: RewardSettings) -> float:
    max_length = _required(settings, "soft_max_length")
    cache = _required(settings, "soft_cache_length")
    length = completion_tokens(sample)
    expected = max_length - cache
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / cache
    return -1.0  # ms-swift goes on falling below -1 here; DAPO's formula stops at -1


def degenerate(answer: str, min_words: int) -> bool:
    """An answer with no substance: fewer than min_words words, one word making up more than half of them, or more
    punctuation and symbols than word characters. Constraints such as "end with this phrase" or "a title in <<double
    angle brackets>>" are met by such answers alone (the IFBench paper's appendix; issue 53's first run)."""
    words = re.findall(r"\w+", answer)
    if len(words) < min_words or not words:
        return True
    symbols = len(re.findall(r"[^\w\s]", answer))
    return Counter(words).most_common(1)[0][1] > len(words) / 2 or symbols > sum(map(len, words))


def _word_floor(sample: Mapping[str, Any], min_words: int) -> int:
    """min_words, lowered to half the limit of a row that itself asks for fewer than N words (IFEval's
    length_constraints:number_words with relation "less than"), so that the reward never contradicts the request."""
    floor = min_words
    for instruction_id, arguments in zip(sample.get("instruction_id_list") or (), sample.get("kwargs") or ()):
        if instruction_id == "length_constraints:number_words" and (arguments or {}).get("relation") == "less than":
            floor = min(floor, int(arguments["num_words"]) // 2)
    return floor


@register_reward(
    "substance",
    "-1.0 for a degenerate completion (fewer than substance_min_words words, or half the row's own 'less than N words' "
    "limit; one word over half of them; more symbols than word characters), else 0.0: beside rewards a bare answer can game",
    uses_settings=True,
)
def substance(completion: str, sample: Mapping[str, Any], settings: RewardSettings) -> float:
    return -1.0 if degenerate(completion, _word_floor(sample, settings.substance_min_words)) else 0.0
