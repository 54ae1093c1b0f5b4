"""The evaluation statistics of alignment/algo/stats.py against hand values: mean@k and the unbiased pass@k."""

import math

import numpy as np
import pytest

from alignment.algo.stats import mean_and_pass_at_k


@pytest.mark.parametrize(
    "correct, mean_at_k, pass_at_k",
    [
        ([[1, 0, 0, 1]], [0.5], [1.0]),
        ([[0, 0, 0, 0]], [0.0], [0.0]),
        ([[1, 1, 1, 1]], [1.0], [1.0]),
        ([[0, 0, 1], [0, 0, 0]], [1 / 3, 0.0], [1.0, 0.0]),
    ],
)
def test_mean_and_pass_at_k_hand_computed(correct, mean_at_k, pass_at_k):
    means, passes = mean_and_pass_at_k(np.array(correct))
    np.testing.assert_allclose(means, mean_at_k)
    np.testing.assert_array_equal(passes, pass_at_k)


def test_pass_at_k_is_the_unbiased_estimator_with_k_of_k_samples():
    rng = np.random.default_rng(0)
    correct = rng.random((50, 6)) < 0.2
    _, passes = mean_and_pass_at_k(correct)
    n = k = 6
    unbiased = [1 - math.comb(n - c, k) / math.comb(n, k) for c in correct.sum(axis=1)]
    np.testing.assert_allclose(passes, unbiased)
