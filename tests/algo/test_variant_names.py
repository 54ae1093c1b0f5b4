"""Issue 34's variants from the names their users bring: each row is a config file written with TRL's, verl's or
ms-swift's keys and values, and the settings the trainer reads from it. A short training run with each variant is
in tests/step/test_variants.py; the math against TRL's and verl's own functions in tests/references/test_trl_verl.py."""

import json

import pytest

from alignment.basics.errors import ConfigError
from alignment.config.cli import load_config

# name -> (the keys as its users write them, what the validated config holds)
USERS_NAMES = {
    "TRL sapo": ({"loss_type": "sapo", "sapo_temperature_neg": 1.2},
                 {"surrogate": "sapo", "loss_type": "grpo", "sapo_temperature_neg": 1.2}),
    "verl sapo": ({"loss_mode": "sapo", "tau_pos": 0.9, "tau_neg": 1.1}, {"surrogate": "sapo", "sapo_temperature_pos": 0.9,
                                                                          "sapo_temperature_neg": 1.1}),
    "verl geo_mean": ({"loss_mode": "geo_mean", "clip_ratio_low": 0.4, "clip_ratio_high": 0.4},
                      {"surrogate": "gmpo", "clip_range_ratio_low": 0.4, "clip_range_ratio_high": 0.4}),
    "verl vanilla": ({"loss_mode": "vanilla"}, {"surrogate": "clip"}),
    "TRL bnpo": ({"loss_type": "bnpo"}, {"loss_type": "bnpo"}),
    "TRL off_policy_mask_threshold": ({"off_policy_mask_threshold": 0.5}, {"off_policy_mask_threshold": 0.5}),
    "verl kl_loss_type low_var_kl": ({"kl_loss_type": "low_var_kl", "beta": 0.01}, {"kl_estimator": "low_var_kl", "kl_loss_coeff": 0.01}),
    "verl kl_loss_type mse": ({"kl_loss_type": "mse"}, {"kl_estimator": "k2"}),
    "verl kl_loss_type k3+": ({"kl_loss_type": "k3+"}, {"kl_estimator": "k3+"}),
    "verl kl_loss_type full": ({"kl_loss_type": "full", "beta": 0.01}, {"kl_estimator": "full"}),
    "verl use_kl_in_reward": ({"use_kl_in_reward": True, "kl_penalty": "kl", "kl_coef": 0.002},
                              {"use_kl_in_reward": True, "kl_in_reward_estimator": "k1", "kl_in_reward_coeff": 0.002}),
    "verl rollout_rs geometric": ({"rollout_rs": "geometric", "rollout_rs_threshold": "0.999_1.001"},
                                  {"rejection_sampling": "geometric", "rejection_sampling_threshold": "0.999_1.001"}),
    "verl rollout_rs two options": ({"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "2.0,0.5"},
                                    {"rejection_sampling": "token_k1,seq_max_k2"}),
    "verl adv_estimator grpo_passk": ({"adv_estimator": "grpo_passk", "scale_rewards": "none"},
                                      {"advantage_estimator": "grpo_passk", "scale_rewards": "none"}),
    "verl adv_estimator opo": ({"adv_estimator": "opo"}, {"advantage_estimator": "opo"}),
}


def load(tmp_path, keys: dict):
    path = tmp_path / "grpo_argument.json"
    path.write_text(json.dumps({"actor_model_name_or_path": "data/tiny-qwen2", "output_dir": str(tmp_path / "out"), **keys}))
    return load_config([str(path)])


@pytest.mark.parametrize("name", list(USERS_NAMES))
def test_each_variant_from_its_users_names(tmp_path, name):
    keys, expected = USERS_NAMES[name]
    config = load(tmp_path, keys)
    assert {key: getattr(config, key) for key in expected} == expected


@pytest.mark.parametrize("keys, message", [
    ({"loss_type": "sapo", "surrogate": "cispo"}, "loss_type = sapo is TRL's spelling of surrogate sapo with loss_type grpo"),
    ({"surrogate": "gmpo", "importance_sampling_level": "sequence"}, "importance_sampling_level must be token"),
    ({"rollout_rs": "token_k1"}, "rejection_sampling is token_k1 and rejection_sampling_threshold is not set: give both"),
    ({"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": "0.5_2"}, "only the k1 options take lower_upper"),
    ({"rollout_rs": "seq_sum_k4", "rollout_rs_threshold": "2"}, "must be one of token_k1"),
    ({"tau_neg": 0.0}, "sapo_temperature_neg = 0.0: must be > 0"),
    ({"off_policy_mask_threshold": -1.0}, "off_policy_mask_threshold = -1.0: must be >= 0"),
    ({"use_kl_in_reward": True, "multi_objective_aggregation": "normalize_then_sum"}, "use_kl_in_reward subtracts the KL"),
    ({"adv_estimator": "opo", "scale_rewards": "none"}, "scale_rewards = none applies to advantage_estimator grpo"),
    ({"kl_penalty": "full"}, 'invalid choice "full"'),  # the exact KL is the loss's: the reward's needs the sampled tokens' KL
])
def test_what_cannot_be_read_is_refused_naming_the_keys(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message.replace("+", r"\+").replace("(", r"\(")):
        load(tmp_path, keys)
