from collections.abc import Mapping
from typing import Any

from .answers import answers_match, completion_answer, reference_answer, sample_answer
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
