import multiprocessing
import os
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Decimal, Inexact, localcontext
from numbers import Integral, Real
from typing import Any

from math_verify import parse, verify

# math-verify's own limits, whole seconds because it uses signal.alarm. A real final answer parses and
# compares in milliseconds; the limit is for pathological text such as 10^{10^{10}}.
MATH_VERIFY_TIMEOUT_S = 2
# Off the main thread the comparison runs in a worker process; this bounds the wait for it
# (worker start-up, queueing behind other threads, and math-verify's three timed steps).
WORKER_WAIT_S = 30
# No final answer is this long, and sympy's cost grows fast with length: longer ones compare as strings.
MAX_SYMBOLIC_CHARS = 500

_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"  # 1,234.5 or 1234.5
# Not preceded by a letter, digit or point, so "16-3" yields 16 and 3, never -3.
_NUMBER_RE = re.compile(rf"(?<![\w.])-?{_DIGITS}")
# A whole answer that is one number, maybe with a currency sign, a fraction bar, a percent sign or
# unit words: "$1,200", "-$5", "18.00", "3/4", "50%", "18 apples". No two quantifiers may take the
# same characters (as "\s*\$?\s*" did): a fullmatch that fails would try every split, quadratic in the
# length of a run of spaces ("-" and 20,000 tabs took 5 s).
_PLAIN_NUMBER = re.compile(
    rf"(?P<neg>-)?\s*(?:\$\s*)?(?P<num>-?{_DIGITS})(?:\s*/\s*(?P<den>\d+))?\s*(?:%\s*)?(?:[A-Za-z][A-Za-z ]*)?"
)
# "A: 18" (GSM8K solutions) or "The answer is 18", the value possibly on the next line.
_FINAL_LINE = re.compile(r"(?:^[ \t]*A:|\bthe (?:final )?answer is:?)[ \t]*\n?[ \t]*(.*)", re.I | re.M)
_REFERENCE_A_LINE = re.compile(r"^[ \t]*A:(.*)", re.M)


def sample_answer(sample: Mapping[str, Any]) -> str:
    answer = sample.get("answer")
    if answer is None:
        raise ValueError("sample has no 'answer'")
    # Datasets sometimes store the answer as a number; a bool is never a reference answer. An integer
    # is written through Decimal: str() refuses one of more than 4,300 digits.
    if isinstance(answer, Integral) and not isinstance(answer, bool):
        return str(Decimal(int(answer)))
    if isinstance(answer, Real) and not isinstance(answer, bool):
        return str(answer)
    if not isinstance(answer, str):
        raise TypeError(f"sample 'answer' must be text, got {type(answer).__name__}")
    return answer


def _tidy(text: str) -> str:
    return text.strip().rstrip(".").strip()


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None  # never closed: the completion was cut off inside the box


def completion_answer(text: str) -> str | None:
    """The completion's final answer, or None where it gives none (a wrong answer, not an error)."""
    candidate = _final_answer_candidate(text)
    return None if candidate is None else _tidy(candidate) or None


def last_answer_tag(text: str) -> str | None:
    """What the last <answer>...</answer> pair holds (pairs taken left to right, each closed by the first
    close after its open, as re.findall(r"<answer>(.*?)</answer>") takes them), None where there is none.
    Linear in the text, where the regex rescans to the end from every unclosed <answer> (20,000: 10 s)."""
    opening, closing = "<answer>", "</answer>"
    last, start = None, text.find(opening)
    while start >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        last = (start + len(opening), end)
        start = text.find(opening, end + len(closing))
    return None if last is None else text[last[0] : last[1]]


def _final_answer_candidate(text: str) -> str | None:
    if (tagged := last_answer_tag(text)) is not None:
        return tagged
    if (boxed := _last_boxed(text)) is not None:
        return boxed
    if "####" in text:
        # Models keep writing after "#### 72" (the next few-shot question): keep its line only.
        return text.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    if final := _FINAL_LINE.findall(text):
        return final[-1]
    if numbers := _NUMBER_RE.findall(text):
        return numbers[-1]
    return None


def reference_answer(text: str) -> str:
    if "####" in text:
        answer = text.rsplit("####", 1)[1]
    elif lines := _REFERENCE_A_LINE.findall(text):
        answer = lines[-1]
    else:
        answer = text
    answer = _tidy(answer)
    if not answer:
        raise ValueError(f"reference answer is empty in {text[-80:]!r}")
    return answer


def parse_number(text: str) -> tuple[Decimal, Decimal] | None:
    """A plain-number answer -> (numerator, denominator > 0), exact; None where the text is not one number.
    Decimal, not int or Fraction: int() refuses more than 4,300 digits and Fraction converts through it,
    and float would call two different 400-digit numbers equal (both inf)."""
    match = _PLAIN_NUMBER.fullmatch(_tidy(text).replace("\\$", "$").replace("\\%", "%"))
    if match is None:
        return None
    numerator = Decimal(match["num"].replace(",", ""))
    denominator = Decimal(match["den"] or 1)
    if denominator == 0:
        return None
    return (-numerator if match["neg"] else numerator), denominator


def numbers_close(a: tuple[Decimal, Decimal], b: tuple[Decimal, Decimal]) -> bool:
    """|a - b| <= 1e-6 * max(|a|, |b|), exactly: both sides times the (positive) denominators."""
    with localcontext() as exact:
        # Products and differences of finite decimals are exact at the largest precision and exponent range
        # (Inexact would say otherwise); their cost follows the operands' digits, not the precision.
        exact.prec, exact.Emax, exact.Emin, exact.traps[Inexact] = MAX_PREC, MAX_EMAX, MIN_EMIN, True
        x, y = a[0] * b[1], b[0] * a[1]
        return abs(x - y).scaleb(6) <= max(abs(x), abs(y))


def answers_match(predicted: str, reference: str) -> bool:
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return numbers_close(a, b)  # relative tolerance 1e-6
    if max(len(predicted), len(reference)) > MAX_SYMBOLIC_CHARS:
        return predicted == reference
    if threading.current_thread() is threading.main_thread():
        return _math_verify_equal(predicted, reference)
    return _math_verify_in_worker(predicted, reference)


def _as_latex(text: str) -> str:
    # Outside math delimiters math-verify reads "\frac{1}{2}" as nothing, "10^{3}" as 10 and
    # "(1, 2)" as 2; an extracted final answer is one math expression, so delimit it.
    return text if "$" in text else f"${text}$"


def _math_verify_equal(predicted: str, reference: str) -> bool:
    gold = parse(_as_latex(reference), parsing_timeout=MATH_VERIFY_TIMEOUT_S)
    target = parse(_as_latex(predicted), parsing_timeout=MATH_VERIFY_TIMEOUT_S)
    return verify(gold, target, timeout_seconds=MATH_VERIFY_TIMEOUT_S)


_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _math_verify_in_worker(predicted: str, reference: str) -> bool:
    # math-verify's timeouts set signal.alarm, which only a main thread may do (a thread pool in the
    # reward server, say): run it in a worker process, where it is the main thread, and bound the
    # wait here as well. A wait that runs out raises TimeoutError: the reward is then an error, not 0.
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=min(4, os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn")
            )
        pool = _pool
    try:
        return pool.submit(_math_verify_equal, predicted, reference).result(timeout=WORKER_WAIT_S)
    except BrokenProcessPool:
        with _pool_lock:  # a worker died (killed for memory, say): the next call starts a fresh pool
            if _pool is pool:
                _pool = None
        raise
