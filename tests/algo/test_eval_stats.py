"""The statistics of python -m alignment.evaluate against values computed by hand (the working is in the comments) and
against the formulas written out without scipy."""

import math

import numpy as np
import pytest

from alignment.algo.eval_stats import mcnemar_exact, mean_interval, paired_difference, pass_at_k, pass_at_k_values, wilson_interval

Z = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_by_hand(successes: int, n: int) -> tuple:
    centre = (successes + Z**2 / 2) / (n + Z**2)
    half = Z * math.sqrt(successes * (n - successes) / n + Z**2 / 4) / (n + Z**2)
    return centre - half, centre + half


@pytest.mark.parametrize("successes, n, low, high", [
    # 7/20: centre (7 + 1.920729) / 23.841459 = 0.374169, half 1.959964 * sqrt(4.55 + 0.960365) / 23.841459 = 0.192977
    (7, 20, 0.181192, 0.567146),
    # 0/16: centre 1.920729 / 19.841459 = 0.096803 = half: the interval starts at 0 exactly
    (0, 16, 0.0, 0.193606),
    (16, 16, 0.806394, 1.0),
    # 2/21: centre 3.920729 / 24.841459 = 0.157830, half 1.959964 * sqrt(38 / 21 + 0.960365) / 24.841459 = 0.131311
    (2, 21, 0.026519, 0.289141),
])
def test_wilson_interval_hand_computed(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=2e-6)
    assert wilson_interval(successes, n) == pytest.approx(wilson_by_hand(successes, n), abs=1e-9)


def mcnemar_by_hand(b: int, c: int) -> float:
    """Both tails of Binomial(b + c, 1/2) beyond the observed split, summed with math.comb."""
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


@pytest.mark.parametrize("b, c, p", [
    (2, 9, 134 / 2048),  # 2 * (C(11,0) + C(11,1) + C(11,2)) / 2^11 = 2 * (1 + 11 + 55) / 2048 = 0.0654296875
    (9, 2, 134 / 2048),  # either model first
    (1, 7, 18 / 256),  # 2 * (1 + 8) / 2^8 = 0.0703125
    (0, 6, 2 / 64),  # 2 * 1 / 2^6 = 0.03125
    (3, 4, 1.0),  # 2 * (1 + 7 + 21 + 35) / 2^7 = 1
    (5, 5, 1.0),  # the two tails overlap: capped at 1
    (0, 0, 1.0),  # no discordant problem: no evidence either way
])
def test_mcnemar_exact_hand_computed(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(b, c) == pytest.approx(mcnemar_by_hand(b, c), rel=1e-12)


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 0.7),  # 1 - C(3,2) / C(5,2) = 1 - 3/10
    (10, 3, 1, 0.3),  # pass@1 is the fraction correct
    (4, 0, 2, 0.0),
    (4, 3, 2, 1.0),  # C(1,2) = 0: any 2 of the 4 hold a correct one
    (8, 1, 8, 1.0),  # k = n: whether any sample is correct
    (8, 1, 4, 0.5),  # 1 - C(7,4) / C(8,4) = 1 - 35/70
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_refuses_k_above_n():
    with pytest.raises(ValueError, match="0 < k <= n"):
        pass_at_k(2, 1, 4)


@pytest.mark.parametrize("n, ks", [(1, [1]), (2, [2]), (6, [2, 4, 6]), (8, [2, 4, 8]), (16, [2, 4, 8, 16])])
def test_pass_at_k_values(n, ks):
    assert pass_at_k_values(n) == ks


def test_mean_interval_hand_computed():
    # mean 0.5; squared deviations 4 x 0.25 = 1 -> sample sd 1/3, se 1 / (3 sqrt(10)) = 0.105409; t(0.975, 9) = 2.262157
    values = np.array([0, 0.5, 1, 0.5, 0.5, 0, 1, 0.5, 0.5, 0.5])
    assert mean_interval(values) == pytest.approx((0.5, 0.5 - 0.238452, 0.5 + 0.238452), abs=2e-6)
    assert mean_interval(np.array([1.0, 1, 1, 0.5]))[2] == 1.0  # cut at 1
    assert mean_interval(np.array([0.25])) == (0.25, 0.25, 0.25)  # one problem: no spread to measure


def table(both: int, only_first: int, only_second: int, neither: int) -> tuple:
    first = [True] * both + [True] * only_first + [False] * only_second + [False] * neither
    second = [True] * both + [False] * only_first + [True] * only_second + [False] * neither
    return np.array(first), np.array(second)


def test_paired_difference_hand_computed():
    # n = 21, accuracies 2/21 and 8/21; Wilson: (0.026519, 0.289141) and (0.207515, 0.591219) (above)
    # ad - bc = 12 - 7 = 5 <= n/2, so phi = 0: low = 6/21 - sqrt((8/21 - 0.207515)^2 + (0.289141 - 2/21)^2)
    #   = 0.285714 - sqrt(0.030080 + 0.037598) = 0.025564; high = 0.285714 + sqrt(0.210267^2 + 0.068719^2) = 0.506925
    paired = paired_difference(*table(1, 1, 7, 12))
    assert paired["difference"] == pytest.approx(6 / 21)
    assert (paired["low"], paired["high"]) == pytest.approx((0.025564, 0.506925), abs=2e-5)
    assert (paired["both_correct"], paired["only_first"], paired["only_second"], paired["neither"]) == (1, 1, 7, 12)
    assert paired["mcnemar_p"] == pytest.approx(18 / 256)
    swapped = paired_difference(*reversed(table(1, 1, 7, 12)))
    assert (swapped["difference"], swapped["low"], swapped["high"]) == pytest.approx((-6 / 21, -0.506925, -0.025564), abs=2e-5)


def test_paired_difference_with_correlated_answers_equals_newcombes_formula_written_out():
    # a = 10 both right, b = 2 only the first, c = 5 only the second, d = 13 neither: ad - bc = 120 > n/2 = 15
    a, b, c, d = 10, 2, 5, 13
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = wilson_by_hand(a + b, n), wilson_by_hand(a + c, n)
    phi = (a * d - b * c - n / 2) / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))  # 105 / 220.454 = 0.476290
    low = p2 - p1 - math.sqrt((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2)
    high = p2 - p1 + math.sqrt((u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2)
    paired = paired_difference(*table(a, b, c, d))
    assert (paired["difference"], paired["low"], paired["high"]) == pytest.approx((0.1, low, high), abs=1e-9)
    # the positive correlation narrows the interval against the same margins taken as independent (phi = 0)
    unpaired = math.hypot(p2 - l2, u1 - p1) + math.hypot(u2 - p2, p1 - l1)
    assert paired["high"] - paired["low"] < unpaired - 0.05


def test_identical_answers_differ_by_nothing():
    same = np.array([True, False, True, True])
    paired = paired_difference(same, same)
    assert (paired["difference"], paired["mcnemar_p"], paired["only_first"], paired["only_second"]) == (0.0, 1.0, 0, 0)
    assert paired["low"] < 0 < paired["high"]
