"""The names other trainers use: for keys (ALIASES: TRL, ms-swift, verl, Hugging Face generate, PaddleNLP's same-meaning
keys) and for values (verl's loss_mode and importance-sampling modes, TRL's loss_type values that name an objective).
A key's alias works in place of the key, in the file and on the command line (schema.canonical_key); a value's
synonym is among its key's choices and stored as what it is (validation.py)."""

from alignment.config.paddlenlp_keys import PADDLENLP_ALIASES

# verl's loss_mode values, stored as the surrogates they are
SURROGATE_SYNONYMS = {"vanilla": "clip", "geo_mean": "gmpo"}
# TRL's loss_type values that name an objective: cispo is refused (its clip keys mean another thing there), sapo is read as
# surrogate sapo with the per-sequence mean TRL gives it
TRL_LOSS_TYPES = {"cispo": None, "sapo": ("sapo", "grpo")}
# verl's importance_sampling_mode values, stored as the modes they are
IMPORTANCE_SAMPLING_SYNONYMS = {"token": "token_truncate", "sequence": "sequence_truncate"}

# alias -> canonical key: the names TRL (GRPOConfig), ms-swift (swift rlhf --rlhf_type grpo) and
# Hugging Face generate use for the same thing.
ALIASES = {
    "model_name_or_path": "actor_model_name_or_path",  # TRL ModelConfig
    "model": "actor_model_name_or_path",  # ms-swift
    "dataset": "train_datasets",  # ms-swift
    "val_dataset": "eval_datasets",  # ms-swift
    "system": "system_prompt",  # ms-swift
    "max_prompt_length": "max_prompt_len",  # TRL
    "max_completion_length": "max_dec_len",  # TRL, ms-swift
    "max_new_tokens": "max_dec_len",  # HF generate
    "min_new_tokens": "min_dec_len",  # HF generate
    "num_generations": "rollout_n",  # TRL, ms-swift
    "epsilon": "clip_range_ratio",  # TRL, ms-swift: both clips, the upper one unless epsilon_high is given
    "epsilon_high": "clip_range_ratio_high",  # TRL, ms-swift
    "clip_ratio_low": "clip_range_ratio_low",  # verl
    "clip_ratio_high": "clip_range_ratio_high",  # verl
    "clip_ratio_c": "dual_clip_ratio",  # verl
    "update_iters": "num_iterations",  # PaddleNLP
    "ppo_epochs": "num_iterations",  # verl
    "beta": "kl_loss_coeff",  # TRL, ms-swift
    "kl_loss_type": "kl_estimator",  # verl
    "vllm_importance_sampling_correction": "importance_sampling_correction",  # TRL
    "vllm_importance_sampling_clip_max": "importance_sampling_cap",  # TRL
    "vllm_importance_sampling_clip_min": "importance_sampling_min",  # TRL
    "vllm_importance_sampling_mode": "importance_sampling_mode",  # TRL
    "rollout_importance_sampling_mode": "importance_sampling_mode",  # ms-swift
    "rollout_is": "importance_sampling_mode",  # verl (token, sequence)
    "rollout_is_threshold": "importance_sampling_cap",  # verl (a number: truncation)
    "adv_estimator": "advantage_estimator",  # verl
    "loss_mode": "surrogate",  # verl's actor.policy_loss.loss_mode
    "tau_pos": "sapo_temperature_pos",  # verl, ms-swift
    "tau_neg": "sapo_temperature_neg",  # verl, ms-swift
    "kl_penalty": "kl_in_reward_estimator",  # verl's algorithm.kl_penalty
    "kl_coef": "kl_in_reward_coeff",  # verl's algorithm.kl_ctrl.kl_coef
    "rollout_rs": "rejection_sampling",  # verl
    "rollout_rs_threshold": "rejection_sampling_threshold",  # verl
    "bypass_mode": "use_rollout_logprobs",  # verl's algorithm.rollout_correction.bypass_mode
    "entropy_coef": "entropy_coeff",  # TRL
    "vllm_importance_sampling_cap": "importance_sampling_cap",  # TRL, deprecated there
    "delta": "dual_clip_ratio",  # TRL's two-sided GRPO clipping (INTELLECT-2): the same bound for A < 0
    "rollout_importance_sampling_threshold": "importance_sampling_cap",  # ms-swift
    "dynamic_sample": "dynamic_sampling",  # ms-swift
    "mask_truncated_completions": "overlong_filter",  # TRL
    "reward_model": "reward_model_name_or_path",  # ms-swift
    "use_peft": "lora",  # TRL
    "lora_r": "lora_rank",  # TRL
    "lora_target_modules": "target_modules",  # TRL
    "reward_funcs": "reward_functions",  # TRL, ms-swift
    "multi_turn_scheduler": "environment",  # ms-swift
    "max_assistant_turns": "max_turns",  # verl's multi_turn
    "max_tool_response_length": "tool_output_bytes",  # verl (there in characters)
    "max_parallel_calls": "max_tool_calls_per_turn",  # verl's multi_turn
    "reward_weights": "reward_function_weights",  # TRL, ms-swift
    "min_lr": "min_learning_rate",  # Megatron, ms-swift
    "lr": "learning_rate",  # verl (actor.optim.lr), Megatron, most training scripts' --lr
    "ppo_max_token_len_per_gpu": "micro_batch_token_budget",  # verl (with use_dynamic_bsz)
    "log_prob_max_token_len_per_gpu": "logprob_token_budget",  # verl (rollout and ref)
    **PADDLENLP_ALIASES,  # PaddleNLP's other names: num_return_sequences, max_length, max_src_len
}
