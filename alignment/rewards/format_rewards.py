import re
from collections.abc import Mapping
from typing import Any

from .answers import reference_answer, sample_answer
from .registry import register_reward

_R1_FORMAT = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_R1_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def opened_response(completion: str, sample: Mapping[str, Any], opening_tag: str) -> str:
    """The whole response: the completion, after opening_tag and the whitespace that follows it where the prompt the
    model saw ends with them. A chat template may open the assistant's turn with the tag (DeepSeek-R1-distill's ends
    with "<think>\n", config/kk's with "<think>", config/smollm2/gsm8k_chat_template.jinja with "<reasoning>\n"), so
    the model writes only the rest; a format reward scores the response the reader sees. The prompt is the sample's
    prompt_text (the templated prompt the trainer adds), else its prompt (what a reward server client sends as src)."""
    prompt = sample.get("prompt_text", sample.get("prompt"))
    if not isinstance(prompt, str):
        return completion
    opened = prompt.rstrip()
    return prompt[len(opened) - len(opening_tag) :] + completion if opened.endswith(opening_tag) else completion


@register_reward(
    "format",
    "1.0 if the completion is exactly <think>...</think><answer>...</answer>, both non-empty, else 0.0 "
    "(<think> may end the prompt instead)",
)
def r1_format(completion: str, sample: Mapping[str, Any]) -> float:
    completion = opened_response(completion, sample, "<think>")
    # Counted first: with one of each tag the pattern has one way to match, while with thousands of
    # "</think>" and "</answer>" it would try each pair (quadratic).
    if any(completion.count(tag) != 1 for tag in _R1_TAGS):
        return 0.0
    match = _R1_FORMAT.fullmatch(completion)
    return 1.0 if match is not None and match[1].strip() and match[2].strip() else 0.0


# The five rewards of the GSM8K GRPO recipe (willccbb's grpo_demo.py, reused by the TRL and unsloth
# examples), with its exact values. Its system prompt asks for
# "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n". The three format rewards score the
# opened response: a chat template may write the "<reasoning>\n" itself (opened_response).


def _xml_answer(text: str) -> str:
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


@register_reward(
    "xmlcount",
    "GSM8K recipe: +0.125 per well-placed <reasoning>/<answer> tag, "
    "minus 0.001 per character after </answer>",
)
def xmlcount(completion: str, sample: Mapping[str, Any]) -> float:
    completion = opened_response(completion, sample, "<reasoning>")
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
# both rewards are 0 for almost every completion; we follow the commonly fixed version with DOTALL,
#     soft:   re.match(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", text, re.DOTALL)
#     strict: re.match(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", text, re.DOTALL)
# decided here with str.find, in linear time: the regexes rescan the rest of the text for every
# "</reasoning>" (quadratic: 1.4 s for 5,000 of them).
_SPACE_THEN_ANSWER = re.compile(r"\s*<answer>")
_STRICT_MIDDLE = "\n</reasoning>\n<answer>\n"


def _soft_format_matches(text: str) -> bool:
    if not text.startswith("<reasoning>"):
        return False
    # The first "</reasoning>" followed by <answer> ends earliest, so it leaves the most room for "</answer>".
    close = text.find("</reasoning>", len("<reasoning>"))
    while close >= 0:
        if answer := _SPACE_THEN_ANSWER.match(text, close + len("</reasoning>")):
            return text.find("</answer>", answer.end()) >= 0
        close = text.find("</reasoning>", close + 1)
    return False


def _strict_format_matches(text: str) -> bool:
    # "$" also matches before a final newline, so the text ends "\n</answer>\n" or "\n</answer>\n\n".
    ending = next((e for e in ("\n</answer>\n", "\n</answer>\n\n") if text.endswith(e)), None)
    if not text.startswith("<reasoning>\n") or ending is None:
        return False
    middle = text.find(_STRICT_MIDDLE, len("<reasoning>\n"))
    return middle >= 0 and middle + len(_STRICT_MIDDLE) <= len(text) - len(ending)


@register_reward(
    "soft_format",
    "GSM8K recipe: 0.5 if the text starts <reasoning>...</reasoning> <answer>...</answer> "
    "(with re.DOTALL, the common fix; the original omits it)",
)
def soft_format(completion: str, sample: Mapping[str, Any]) -> float:
    return 0.5 if _soft_format_matches(opened_response(completion, sample, "<reasoning>")) else 0.0


@register_reward(
    "strict_format",
    "GSM8K recipe: 0.5 if the text is exactly "
    "<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>\\n (with re.DOTALL)",
)
def strict_format(completion: str, sample: Mapping[str, Any]) -> float:
    return 0.5 if _strict_format_matches(opened_response(completion, sample, "<reasoning>")) else 0.0


@register_reward("int_answer", "GSM8K recipe: 0.5 if the <answer> content is all digits")
def int_answer(completion: str, sample: Mapping[str, Any]) -> float:
    return 0.5 if _xml_answer(completion).isdigit() else 0.0


@register_reward(
    "correctness",
    "GSM8K recipe: 2.0 if the <answer> content equals the reference's final answer as a string",
    needs_reference=True,
)
def correctness(completion: str, sample: Mapping[str, Any]) -> float:
    return 2.0 if _xml_answer(completion) == reference_answer(sample_answer(sample)) else 0.0
