"""Statistics of an evaluation (python -m alignment.evaluate): confidence intervals of accuracies over problems, the
unbiased pass@k, and the paired comparison of two models on the same problems. The problems are the independent
units: the k samples of one problem are not k independent trials, so every interval is over problems."""

import math

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


def wilson_interval(successes: int, count: int, confidence: float = CONFIDENCE) -> tuple:
    """-> (low, high) of a binomial proportion: Wilson's score interval, which keeps its coverage near the nominal
    level at small counts and at 0 or count successes, where the normal (Wald) interval collapses to a point."""
    interval = stats.binomtest(successes, count).proportion_ci(confidence, method="wilson")
    return float(interval.low), float(interval.high)


def mean_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple:
    """values (P,) one number per problem (mean@k, pass@k) -> (mean, low, high): Student's t interval on the
    per-problem values, the standard error clustered by problem (Miller 2024, "Adding error bars to evals"), cut to
    [0, 1]. One problem, or problems all alike, give the mean itself for both ends: there is no spread to measure."""
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, mean, mean
    half = stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. (2021) from n samples of which c are correct, k <= n: 1 - C(n-c, k) / C(n, k),
    the chance that k samples drawn from the n without replacement hold a correct one."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_values(n: int) -> list:
    """The k reported for n samples: the powers of two from 2 below n, and n (verl's choice; pass@1 is mean@n)."""
    return [k for k in (2**i for i in range(1, n.bit_length())) if k < n] + [n]


def mcnemar_exact(b: int, c: int) -> float:
    """The exact (binomial) McNemar test: b problems only the first model answered right, c only the second. Under
    "the two are equally accurate" each of the b + c discordant problems goes either way with chance 1/2, so the
    two-sided p-value is P(X <= min(b, c)) + P(X >= max(b, c)), X ~ Binomial(b + c, 1/2); 1 without discordant pairs."""
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(min(b, c), b + c, 0.5).pvalue)


def paired_difference(first: np.ndarray, second: np.ndarray, confidence: float = CONFIDENCE) -> dict:
    """first, second (P,) bool: which problems each model answered right -> second's accuracy minus first's, with
    Newcombe's (1998, method 10) interval for paired proportions: the two Wilson intervals squared and added, less
    their covariance through the correlation phi of the paired table (phi's numerator ad - bc cut by n/2 towards 0
    when positive, as Newcombe gives it), and the 2x2 counts McNemar's test reads."""
    first, second = np.asarray(first, dtype=bool), np.asarray(second, dtype=bool)
    n = len(first)
    both, only_first = int((first & second).sum()), int((first & ~second).sum())
    only_second, neither = int((~first & second).sum()), int((~first & ~second).sum())
    p1, p2 = (both + only_first) / n, (both + only_second) / n
    l1, u1 = wilson_interval(both + only_first, n, confidence)
    l2, u2 = wilson_interval(both + only_second, n, confidence)
    margins = (both + only_first) * (only_second + neither) * (both + only_second) * (only_first + neither)
    association = both * neither - only_first * only_second
    if association > n / 2:
        association -= n / 2
    elif association > 0:
        association = 0
    phi = association / math.sqrt(margins) if margins else 0.0
    difference = p2 - p1
    low = difference - math.sqrt(max((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0.0))
    high = difference + math.sqrt(max((u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2, 0.0))
    return {
        "difference": difference, "low": max(-1.0, low), "high": min(1.0, high), "both_correct": both,
        "only_first": only_first, "only_second": only_second, "neither": neither, "mcnemar_p": mcnemar_exact(only_first, only_second),
    }
