"""The advantage estimators, reward scales and multi-objective aggregations (alignment/algo/advantages.py's registries)
against hand-computed values and float64 loops: GRPO's group normalisation, RLOO, REINFORCE++ with and without
baseline, GDPO's per-function normalisation, pass@k and OPO; and the groups that carry a learning signal."""

import math

import numpy as np
import pytest

from alignment.algo.advantages import (
    baseline_subtracted,
    group_advantages,
    normalized_per_function,
    opo_advantages,
    passk_advantages,
    rloo_advantages,
    whiten,
)
from alignment.algo.stats import groups_with_signal, whitening_sums


def test_group_advantages_hand_computed():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, sample std sqrt((4 * 0.25) / 3) = 0.57735 -> +-0.866025
    # group 2: 2, 0, 0, 0 -> mean 0.5, sample std sqrt((2.25 + 3 * 0.25) / 3) = 1 -> 1.5, -0.5, -0.5, -0.5
    advantages = group_advantages(np.array([1.0, 0, 0, 1, 2, 0, 0, 0]), group_size=4, eps=0.0)
    np.testing.assert_allclose(advantages, [0.866025, -0.866025, -0.866025, 0.866025, 1.5, -0.5, -0.5, -0.5], atol=1e-6)
    assert (advantages.reshape(2, 4) != 0).any(axis=1).all()  # both groups carry signal
    assert np.abs(advantages).mean() == pytest.approx((4 * 0.866025 + 3.0) / 8, abs=1e-6)


def test_identical_rewards_give_zero_advantage():
    advantages = group_advantages(np.array([0.7, 0.7, 0.7, 1.0, 0.0, 1.0]), group_size=3)
    np.testing.assert_array_equal(advantages[:3], 0.0)
    assert (advantages[3:] != 0).any()  # one group of the two has no signal


def test_failed_rewards_are_left_out_of_their_group():
    # the NaN member gets 0; the others are normalised among themselves: 1, 0 -> mean .5, std .7071
    advantages = group_advantages(np.array([1.0, np.nan, 0.0, 5.0, np.nan, np.nan]), group_size=3, eps=0.0)
    np.testing.assert_allclose(advantages, [0.707107, 0.0, -0.707107, 0.0, 0.0, 0.0], atol=1e-6)


def test_vectorised_advantages_equal_a_slow_float64_loop():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=48)
    rewards[[3, 17, 30]] = np.nan
    advantages = group_advantages(rewards, group_size=6)
    for start in range(0, 48, 6):
        group = [r for r in rewards[start : start + 6] if not math.isnan(r)]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        for i in range(start, start + 6):
            expected = 0.0 if math.isnan(rewards[i]) else (rewards[i] - mean) / (std + 1e-6)
            assert advantages[i] == pytest.approx(expected, abs=1e-5)


def test_batch_and_no_scaling_hand_computed():
    rewards = np.array([1.0, 0, 0, 1, 2, 0, 0, 0])  # group means 0.5 and 0.5
    centred = [0.5, -0.5, -0.5, 0.5, 1.5, -0.5, -0.5, -0.5]
    none = group_advantages(rewards, group_size=4, scale="none")
    np.testing.assert_allclose(none, centred, atol=1e-7)
    # batch std, ddof 1: mean .5, squares 4 x .25 + 2.25 + 3 x .25 = 4 -> sqrt(4 / 7)
    batch = group_advantages(rewards, group_size=4, scale="batch", eps=0.0)
    np.testing.assert_allclose(batch, np.array(centred) / math.sqrt(4 / 7), atol=1e-6)
    given = group_advantages(rewards, group_size=4, scale="batch", batch_std=2.0, eps=0.0)  # the global std, from the trainer
    np.testing.assert_allclose(given, np.array(centred) / 2.0, atol=1e-7)
    flat = group_advantages(np.array([3.0, 3.0, 1.0, 1.0]), group_size=2, scale="none")
    np.testing.assert_array_equal(flat, 0.0)


@pytest.mark.parametrize(
    "rewards, min_std, expected",
    [
        ([1.0, 0.0, 1.0, 1.0], 1e-4, [True, False]),  # std .707 / 0
        ([0.5, 0.50001, 0.2, 0.9], 1e-4, [False, True]),  # std 7e-6: nearly equal counts as no signal
        ([0.5, 0.50001, 0.2, 0.9], 0.0, [True, True]),  # any spread at all
        ([1.0, np.nan, 0.0, 1.0], 1e-4, [False, True]),  # one valid member is not a comparison
    ],
)
def test_groups_with_signal_use_a_std_threshold(rewards, min_std, expected):
    assert groups_with_signal(np.array(rewards), 2, min_std).tolist() == expected


@pytest.mark.parametrize("rewards, expected", [
    ([1, 0, 0, 1], [2 / 3, -2 / 3, -2 / 3, 2 / 3]),  # 1 - (0 + 0 + 1) / 3 and 0 - (1 + 0 + 1) / 3
    ([1, np.nan, 0, 0], [1.0, 0.0, -0.5, -0.5]),  # a failed member is left out of the others' mean
    ([3, 3, 3, 3], [0, 0, 0, 0]),
    ([np.nan, np.nan, np.nan, 2], [0, 0, 0, 0]),  # one valid member: nothing to compare with
])
def test_rloo_hand_values(rewards, expected):
    advantages = rloo_advantages(np.array(rewards, dtype=np.float64), 4)
    np.testing.assert_allclose(advantages, expected, rtol=1e-6, atol=1e-7)


def test_rloo_equals_a_float64_loop_and_is_grpo_unscaled_times_n_over_n_minus_1():
    rewards = np.random.default_rng(3).normal(size=24)
    rewards[[2, 9]] = np.nan
    loop = np.zeros(24)
    for group in range(4):
        rows = range(group * 6, group * 6 + 6)
        valid = [r for r in rows if np.isfinite(rewards[r])]
        for r in valid:
            loop[r] = rewards[r] - np.mean([rewards[o] for o in valid if o != r])
    np.testing.assert_allclose(rloo_advantages(rewards, 6), loop, rtol=1e-5, atol=1e-6)
    full = np.random.default_rng(4).normal(size=12)
    np.testing.assert_allclose(rloo_advantages(full, 4), group_advantages(full, 4, "none") * 4 / 3, rtol=1e-5)


def test_reinforce_plus_plus_whitens_over_the_loss_tokens():
    # rewards 1, 0, 1, 1 on 2, 1, 1 and 0 tokens: token mean 0.75, unbiased token variance 0.75 / 3, std 0.5
    rewards, tokens = np.array([1.0, 0.0, 1.0, 1.0]), np.array([2, 1, 1, 0])
    advantages = whiten(rewards, whitening_sums(rewards, tokens))
    np.testing.assert_allclose(advantages, [0.5, -1.5, 0.5, 0.5], rtol=1e-5)
    with_nan = np.array([1.0, 0.0, 1.0, 1.0, np.nan])
    advantages = whiten(with_nan, whitening_sums(with_nan, np.array([2, 1, 1, 0, 5])))
    np.testing.assert_allclose(advantages, [0.5, -1.5, 0.5, 0.5, 0.0], rtol=1e-5)  # a failed reward: 0, out of the statistics


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_then_whitens():
    rewards, tokens = np.array([1.0, 0.0, 1.0, 1.0]), np.array([2, 1, 1, 0])
    centred = baseline_subtracted(rewards, 2)
    np.testing.assert_allclose(centred, [0.5, -0.5, 0.0, 0.0])
    values = np.repeat(centred, tokens)  # every loss token carries its sequence's value (verl's masked_whiten)
    expected = (centred - values.mean()) / values.std(ddof=1)
    np.testing.assert_allclose(whiten(centred, whitening_sums(centred, tokens)), expected, rtol=1e-5)


def test_whitening_over_processes_equals_whitening_the_whole_batch():
    rng = np.random.default_rng(5)
    values, tokens = rng.normal(size=12), rng.integers(0, 9, size=12)
    whole = whiten(values, whitening_sums(values, tokens))
    slices = [slice(0, 4), slice(4, 8), slice(8, 12)]
    summed = sum(whitening_sums(values[s], tokens[s]) for s in slices)
    for s in slices:
        np.testing.assert_allclose(whiten(values[s], summed), whole[s], rtol=1e-6)


def test_gdpo_normalises_each_function_in_its_group_before_the_sum():
    # two groups of 2; the format reward's 0.2 scale does not shrink its say: normalised, it is +-0.707 like the answer's
    answer, format_ = [1.0, 0.0, 1.0, 1.0], [0.2, 0.0, 0.0, 0.2]
    combined = normalized_per_function([np.array(answer), np.array(format_)], [1.0, 0.5], 2)
    half = 1 / math.sqrt(2)
    np.testing.assert_allclose(combined, [half + 0.5 * half, -half - 0.5 * half, -0.5 * half, 0.5 * half], rtol=1e-5)
    advantages = whiten(combined, whitening_sums(combined, np.ones(4)))
    np.testing.assert_allclose(advantages, combined / math.sqrt((combined**2).sum() / 3), rtol=1e-5)  # mean 0 already


def test_gdpo_leaves_a_row_with_a_failed_function_out():
    answer, format_ = np.array([1.0, 0.0, 0.0, 1.0]), np.array([0.0, np.nan, 1.0, 1.0])
    combined = normalized_per_function([answer, format_], [1.0, 1.0], 4)
    assert np.isnan(combined[1])
    # the other three rows are normalised among themselves: answer (1, 0, 1), format (0, 1, 1)
    rows = [0, 2, 3]
    expected = sum((c[rows] - c[rows].mean()) / (c[rows].std(ddof=1) + 1e-6) for c in (answer, format_))
    np.testing.assert_allclose(combined[rows], expected, rtol=1e-5)


@pytest.mark.parametrize("rewards, scale, expected", [
    ([0.2, 1.0, 0.5, 0.0], "none", [0.0, 0.5, 0.0, 0.0]),  # the best gets best - second best
    ([0.2, 1.0, 0.5, 0.0], "group", [0.0, 0.5 / (math.sqrt(0.5675 / 3) + 1e-6), 0.0, 0.0]),  # over the group's sample std
    ([0.0, 1.0, 1.0, 0.0], "group", [0.0] * 4),  # two right answers: the best's marginal value is 0
    ([np.nan, 1.0, np.nan, 0.0], "none", [0.0, 1.0, 0.0, 0.0]),  # failed members are not candidates
    ([np.nan, np.nan, np.nan, 1.0], "none", [0.0] * 4),  # one valid member: nothing to compare
])
def test_passk_advantages_hand_values(rewards, scale, expected):
    np.testing.assert_allclose(passk_advantages(np.array(rewards), 4, scale), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("rewards, lengths, expected", [
    ([1.0, 0.0, 1.0, 0.0], [1, 3, 2, 2], [5 / 8, -3 / 8, 5 / 8, -3 / 8]),  # baseline (1 + 2) / 8: long answers weigh more
    ([1.0, 0.0, 1.0, 0.0], [2, 2, 2, 2], [0.5, -0.5, 0.5, -0.5]),  # equal lengths: the group mean
    ([1.0, np.nan, 0.0, 0.0], [1, 5, 1, 2], [0.75, 0.0, -0.25, -0.25]),  # a failed member is out of the baseline
    ([np.nan, np.nan, 0.5, np.nan], [1, 1, 1, 1], [0.0, 0.0, 0.5, 0.0]),  # one valid member: baseline 0, as verl
])
def test_opo_advantages_hand_values(rewards, lengths, expected):
    np.testing.assert_allclose(opo_advantages(np.array(rewards), 4, np.array(lengths)), expected, rtol=1e-6)
