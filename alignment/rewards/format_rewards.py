import re
from collections.abc import Mapping
from typing import Any

from .answers import reference_answer, sample_answer
from .registry import register_reward

_R1_FORMAT = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_R1_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@register_reward(
    "format",
    "1.0 if the completion is exactly <think>...</think><answer>...</answer>, both non-empty, else 0.0",
)
def r1_format(completion: str, sample: Mapping[str, Any]) -> float:
    match = _R1_FORMAT.fullmatch(completion)
    if match is None or any(completion.count(tag) != 1 for tag in _R1_TAGS):
        return 0.0
    return 1.0 if match[1].strip() and match[2].strip() else 0.0


# The five rewards of the GSM8K GRPO recipe (willccbb's grpo_demo.py, reused by the TRL and unsloth
# examples), with its exact values. Its system prompt asks for
# "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n".


def _xml_answer(text: str) -> str:
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


@register_reward(
    "xmlcount",
    "GSM8K recipe: +0.125 per well-placed <reasoning>/<answer> tag, "
    "minus 0.001 per character after </answer>",
)
def xmlcount(completion: str, sample: Mapping[str, Any]) -> float:
    count = 0.0
    if completion.count("<reasoning>\n") == 1:
        count += 0.125
    if completion.count("\n</reasoning>\n") == 1:
        count += 0.125
    if completion.count("\n<answer>\n") == 1:
        count += 0.125
        count -= len(completion.split("\n</answer>\n")[-1]) * 0.001
    if completion.count("\n</answer>") == 1:
        count += 0.125
        count -= (len(completion.split("\n</answer>")[-1]) - 1) * 0.001
    return count


# The recipe's patterns have no re.DOTALL, so "." stops at the newlines its own prompt asks for and
# both rewards are 0 for almost every completion; we follow the commonly fixed version with DOTALL.
_SOFT_FORMAT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
_STRICT_FORMAT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", re.DOTALL)


@register_reward(
    "soft_format",
    "GSM8K recipe: 0.5 if the text starts <reasoning>...</reasoning> <answer>...</answer> "
    "(with re.DOTALL, the common fix; the original omits it)",
)
def soft_format(completion: str, sample: Mapping[str, Any]) -> float:
    return 0.5 if _SOFT_FORMAT.match(completion) else 0.0


@register_reward(
    "strict_format",
    "GSM8K recipe: 0.5 if the text is exactly "
    "<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>\\n (with re.DOTALL)",
)
def strict_format(completion: str, sample: Mapping[str, Any]) -> float:
    return 0.5 if _STRICT_FORMAT.match(completion) else 0.0


@register_reward("int_answer", "GSM8K recipe: 0.5 if the <answer> content is all digits")
def int_answer(completion: str, sample: Mapping[str, Any]) -> float:
    return 0.5 if _xml_answer(completion).isdigit() else 0.0


@register_reward(
    "correctness", "GSM8K recipe: 2.0 if the <answer> content equals the reference's final answer as a string"
)
def correctness(completion: str, sample: Mapping[str, Any]) -> float:
    return 2.0 if _xml_answer(completion) == reference_answer(sample_answer(sample)) else 0.0
