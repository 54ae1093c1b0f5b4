"""The algorithm registries (alignment/algo/*.py): the config's choices for each algorithm key are its registry's
names, in registration order; an unknown name is an error naming the choices; and a function registered with the
decorator is what policy_loss and the advantage phase run."""

import numpy as np
import paddle
import pytest

from alignment.algo.advantages import ADVANTAGE_ESTIMATORS, REWARD_AGGREGATIONS, REWARD_SCALES, AdvantageInputs
from alignment.algo.aggregation import LOSS_AGGREGATIONS
from alignment.algo.corrections import ROLLOUT_CORRECTIONS
from alignment.algo.kl import KL_ESTIMATOR_SYNONYMS, KL_ESTIMATORS
from alignment.algo.loss import LossInputs, policy_loss
from alignment.algo.loss_settings import LossSettings
from alignment.algo.objectives import IMPORTANCE_RATIOS, OBJECTIVES, SHARED_FLAGS
from alignment.algo.registry import Registry
from alignment.algo.schedule import SCHEDULES
from alignment.config.schema import GRPOConfig
from alignment.config.aliases import IMPORTANCE_SAMPLING_SYNONYMS, SURROGATE_SYNONYMS

# config key -> (its registry, the choices the config adds: spellings that validate() maps or refuses)
KEYS = {
    "advantage_estimator": (ADVANTAGE_ESTIMATORS, []),
    "scale_rewards": (REWARD_SCALES, []),
    "multi_objective_aggregation": (REWARD_AGGREGATIONS, []),
    "surrogate": (OBJECTIVES, list(SURROGATE_SYNONYMS)),  # verl's vanilla and geo_mean
    "importance_sampling_level": (IMPORTANCE_RATIOS, []),
    "loss_type": (LOSS_AGGREGATIONS, ["cispo", "sapo"]),  # TRL's spellings: cispo refused with a pointer to surrogate, sapo read
    "kl_estimator": (KL_ESTIMATORS, ["full", *KL_ESTIMATOR_SYNONYMS]),  # the exact KL (not an estimator); verl's kl and mse
    "kl_in_reward_estimator": (KL_ESTIMATORS, list(KL_ESTIMATOR_SYNONYMS)),
    "importance_sampling_mode": (ROLLOUT_CORRECTIONS, list(IMPORTANCE_SAMPLING_SYNONYMS)),
    "lr_scheduler_type": (SCHEDULES, []),
}


@pytest.mark.parametrize("key", list(KEYS))
def test_each_config_key_offers_its_registry_names(key):
    registry, extra = KEYS[key]
    assert GRPOConfig.__dataclass_fields__[key].metadata["choices"] == registry.names() + extra
    assert GRPOConfig.__dataclass_fields__[key].default in registry.names()


def test_registration_order_is_the_choice_order():
    assert ADVANTAGE_ESTIMATORS.names() == ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk", "opo"]
    assert OBJECTIVES.names() == ["clip", "cispo", "sapo", "gmpo"]
    assert LOSS_AGGREGATIONS.names() == ["dapo", "grpo", "dr_grpo", "bnpo"]
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3", "low_var_kl", "abs", "k1+", "k3+", "low_var_kl+"]
    assert ROLLOUT_CORRECTIONS.names() == ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def test_an_unknown_name_is_an_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"^surrogate must be clip, cispo, sapo or gmpo, not 'ppo'$"):
        OBJECTIVES.get("ppo")
    with pytest.raises(ValueError, match=r"^loss_type must be dapo, grpo, dr_grpo or bnpo, not 'cispo'$"):
        LOSS_AGGREGATIONS.get("cispo")
    with pytest.raises(ValueError, match="must be one of token_truncate, token_mask, sequence_truncate, sequence_mask, not 'token'"):
        ROLLOUT_CORRECTIONS.get("token")


def test_a_name_registers_once():
    table = Registry("thing must be {choices}, not {name!r}")
    table.register("a")(len)
    with pytest.raises(ValueError, match="'a' is registered twice"):
        table.register("a")(abs)
    table.register("b")(abs)
    assert table.names() == ["a", "b"] and table.get("b") is abs
    with pytest.raises(ValueError, match=r"^thing must be a or b, not 'c'$"):
        table.get("c")


def test_a_registered_objective_is_what_policy_loss_runs(monkeypatch):
    def plain(ratio, logprobs, advantages, mask, settings):  # -A r, never clipped
        never = paddle.zeros(ratio.shape, "bool")
        return -advantages.unsqueeze(-1) * ratio, {flag: never for flag in SHARED_FLAGS}

    monkeypatch.setitem(OBJECTIVES._entries, "plain", plain)
    logp = paddle.to_tensor([[-1.0, -2.0]])
    inputs = LossInputs(logp - 0.5, paddle.to_tensor([2.0]), paddle.to_tensor([[0.5, 0.5]]), paddle.ones([1, 2]))
    loss, sums = policy_loss(logp, inputs, LossSettings(surrogate="plain"))
    assert float(loss) == pytest.approx(-2.0 * np.exp(0.5))
    assert sums == {"clipped": 0.0, "clipped_low": 0.0, "clipped_high": 0.0}


def test_a_registered_estimator_is_what_the_advantage_phase_runs(monkeypatch):
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS._entries, "sign", lambda batch: np.sign(batch.rewards).astype(np.float32))
    inputs = AdvantageInputs(np.array([2.0, -1.0]), 2, "group", np.ones(2), {}, [], [], lambda sums: sums)
    np.testing.assert_array_equal(REWARD_AGGREGATIONS.get("sum_then_normalize")(inputs, "sign"), [1.0, -1.0])
