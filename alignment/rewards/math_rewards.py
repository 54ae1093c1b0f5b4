import re
from collections.abc import Mapping
from typing import Any

from .answers import _DIGITS, answers_match, completion_answer, numbers_close, parse_number, reference_answer, sample_answer
from .registry import register_reward


@register_reward(
    "accuracy",
    "1.0 if the final answer (last <answer>, \\boxed{}, '####', 'A:' line or last number) equals the "
    "reference's, numerically or by math-verify, else 0.0",
    needs_reference=True,
)
def accuracy(completion: str, sample: Mapping[str, Any]) -> float:
    reference = reference_answer(sample_answer(sample))
    predicted = completion_answer(completion)
    if predicted is None:
        return 0.0
    return 1.0 if answers_match(predicted, reference) else 0.0


# GSM8K's worked answers mark each calculation as <<16-3-4=9>>: the text after the mark's last "=" is the step's result.
_MARKED_RESULT = re.compile(r"<<[^<>]*=([^<>=]*)>>")
# What a completion states after an equals sign: "= 9", "= $18", "=1,200.5", "= .5" (the sign and unit words aside).
_STATED_RESULT = re.compile(rf"=\s*\$?\s*(-?(?:{_DIGITS}|\.\d+))")


def _step_value(text: str):
    """A step's result -> parse_number's exact (numerator, denominator); GSM8K writes 0.4 as .4."""
    text = text.strip()
    return parse_number(re.sub(r"^(-?)\.", r"\g<1>0.", text))


@register_reward(
    "step_results",
    "GSM8K: the share of the reference's <<a+b=c>> step results that the completion states after an '=' sign (partial "
    "credit for each step of a worked answer); raises for a reference that marks none",
    needs_reference=True,
)
def step_results(completion: str, sample: Mapping[str, Any]) -> float:
    marked = [_step_value(value) for value in _MARKED_RESULT.findall(sample_answer(sample))]
    if not marked:
        raise ValueError("the reference marks no <<...>> calculation: step_results reads GSM8K's worked answers")
    stated = [_step_value(value) for value in _STATED_RESULT.findall(completion)]
    found = sum(any(numbers_close(result, value) for value in stated) for result in marked if result is not None)
    return found / len(marked)
