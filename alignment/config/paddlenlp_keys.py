"""PaddleNLP's keys that this trainer spells otherwise or does not have: every key of PaddleNLP's RL argument files
(llm/config/*/grpo_argument, reinforce_plus_plus_argument and ppo_argument) and of the dataclasses behind them
(llm/alignment/ppo/rl_config.py: its TrainingArguments' additions, ModelArgument, DataArgument), one record each,
saying what the key does here:

- same: a key of the same meaning here under another name (aliases.py takes it as an alias);
- sets: its value becomes this trainer's keys (rl_algorithm reinforce_plus_plus: advantage_estimator reinforce_plus_plus);
  a value it cannot honour is refused with the reason;
- no effect: accepted, and a line at start says why it changes nothing here (a GPU kernel, a critic's setting);
- refused: what it asks for this run cannot do; PaddleNLP's off value (false, 0, "", null, a degree of 1) is accepted.

Keys PaddleNLP and this trainer both have under one name (bf16, rollout_n, kl_loss_coeff, clip_range_score, ...) are
the config's own (alignment/config/sections/) and not listed here.
"""

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from alignment.config.checks import show

SAME, SETS, NO_EFFECT, REFUSED = "same", "sets", "no effect", "refused"


class Refusal(ValueError):
    """A value this run cannot honour, or one of the wrong type; str(): why."""


def _is_off(value) -> bool:
    return value in (None, False, "", []) or value == 0  # 0 == False, 0.0 too


def _at_most_one(value) -> bool:
    return value is None or value <= 1  # PaddleNLP's default degree is -1 (unset)


@dataclass(frozen=True)
class PaddleKey:
    kind: str  # SAME, SETS, NO_EFFECT or REFUSED
    type: type  # PaddleNLP's type: bool (its files write 0 and 1), int, float (an integer too), str, list (a list, or a str of words)
    why: str  # SAME: the key here; otherwise what it does here, shown in the note or refusal and in docs/configuration.md
    off: Callable[[Any], bool] = _is_off  # NO_EFFECT, REFUSED: the values that ask for nothing (no note, never refused)
    sets: Optional[Callable] = None  # SETS: (value, the file's keys as written) -> ({key here: value}, note or None); raises Refusal
    wins: bool = False  # SETS: its settings replace the file's values for those keys (evaluation off drops eval_datasets)


def same(key: str) -> PaddleKey:
    return PaddleKey(SAME, object, key)


def no_effect(kind: type, why: str, off: Callable = _is_off) -> PaddleKey:
    return PaddleKey(NO_EFFECT, kind, why, off)


def refused(kind: type, why: str, off: Callable = _is_off) -> PaddleKey:
    return PaddleKey(REFUSED, kind, why, off)


def sets(kind: type, why: str, how: Callable, wins: bool = False) -> PaddleKey:
    return PaddleKey(SETS, kind, why, sets=how, wins=wins)


def _algorithm(given: dict) -> str:
    return given.get("rl_algorithm", "grpo")


def _rl_algorithm(value: str, given: dict) -> tuple:
    if value in ("grpo", "reinforce_plus_plus"):
        return {"advantage_estimator": value}, None
    if value == "ppo":
        raise Refusal("PPO trains a critic (a value model) beside the actor and this trainer has none; use grpo or reinforce_plus_plus")
    raise Refusal(f"PaddleNLP's choices are ppo, grpo and reinforce_plus_plus, got {show(value)}")


def _kl_coeff(value: float, given: dict) -> tuple:
    if _algorithm(given) != "reinforce_plus_plus":
        return {}, None if value == 0 else "the KL in the reward of PaddleNLP's PPO and REINFORCE++; GRPO's KL is kl_loss_coeff's"
    return ({"use_kl_in_reward": True, "kl_in_reward_coeff": value} if value > 0 else {}), None


def _normalize_reward(value: bool, given: dict) -> tuple:
    if not value or _algorithm(given) == "grpo":
        return {}, "PaddleNLP turns normalize_reward off for rl_algorithm grpo" if value else None
    raise Refusal("rewards normalised by their running mean and std (PaddleNLP's PPO and REINFORCE++) are not done here")


def _normalize_advantage(value: bool, given: dict) -> tuple:
    if _algorithm(given) == "grpo":
        return {}, "PaddleNLP turns it off for rl_algorithm grpo; the group's std scales the advantages (scale_rewards)" if value else None
    return {}, "REINFORCE++ whitens the advantages over the step whatever this says, in PaddleNLP as here"


def _evaluation_strategy(value: str, given: dict) -> tuple:
    if value == "no":
        return {"eval_datasets": None}, None
    if value == "steps":
        return {}, None
    raise Refusal(f"{show(value)}: this trainer evaluates every eval_steps steps (steps) or not at all (no)")


def _do_eval(value: bool, given: dict) -> tuple:
    return ({} if value else {"eval_datasets": None}), None


def _do_train(value: bool, given: dict) -> tuple:
    if value:
        return {}, None
    raise Refusal("run_grpo.py trains; python -m alignment.evaluate evaluates a model without training")


def _save_strategy(value: str, given: dict) -> tuple:
    if value == "steps":
        return {}, None
    raise Refusal(f"{show(value)}: this trainer saves every save_steps steps and at the end (save_steps 0: only at the end)")


def _global_batch_size(value: int, given: dict) -> tuple:
    """PaddleNLP's prompts per step over all processes -> per_device_prompt_batch_size, the launch's training processes'
    share (PADDLE_TRAINERS_NUM, set by the launcher, less the rollout_workers)."""
    processes = int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) - int(given.get("rollout_workers", 0))
    if value < 1 or value % max(processes, 1):
        raise Refusal(f"{value} prompts per step do not divide among this launch's {processes} training process(es)")
    return {"per_device_prompt_batch_size": value // max(processes, 1)}, None


def _global_mini_batch_size(value: int, given: dict) -> tuple:
    if value == -1:
        return {}, None
    raise Refusal("PaddleNLP's mini-batch over all processes; give mini_batch_size, the sequences of one process's optimizer step")


def _global_gen_batch_size(value: int, given: dict) -> tuple:
    if value == -1:
        return {}, None
    raise Refusal("dynamic sampling here refills a step with groups of freshly drawn prompts, up to max_resample_times rounds")


def _max_gen_batches(value: int, given: dict) -> tuple:
    if value < 1:
        raise Refusal(f"{value}: at least 1 generation batch per step")
    return {"max_resample_times": value - 1}, None


GPU_KERNEL = "a GPU kernel of PaddleNLP's models; this trainer runs paddle's own kernels, or csrc/'s with use_fused_train_ops"
GPU_MEMORY = "GPU memory management; a CPU run's weights, gradients and optimizer state live in host memory already"
NO_CRITIC = "a setting of PPO's critic (value model); this trainer trains none (rl_algorithm ppo is refused)"
BATCHED_BY_TOKENS = "batch sizes of the passes without gradients; here logprob_token_budget bounds them"
ONE_PROCESS_PARALLEL = "model parallelism across GPUs (paddle's GPU builds); here data parallel, with sharding stage1"

PADDLENLP_KEYS = {
    # rl_algorithm and the algorithm's coefficients
    "rl_algorithm": sets(str, "grpo: advantage_estimator grpo; reinforce_plus_plus: advantage_estimator reinforce_plus_plus; ppo "
                              "is refused (it needs a critic)", _rl_algorithm),
    "kl_coeff": sets(float, "with rl_algorithm reinforce_plus_plus: the KL in the reward (use_kl_in_reward, kl_in_reward_coeff; "
                            "here summed over the sequence, PaddleNLP subtracts it token by token); with grpo: no effect", _kl_coeff),
    "normalize_reward": sets(bool, "no effect with rl_algorithm grpo (PaddleNLP turns it off); true with reinforce_plus_plus is "
                                   "refused (no running reward normalisation here)", _normalize_reward),
    "normalize_advantage": sets(bool, "no effect: PaddleNLP turns it off for grpo, and REINFORCE++ whitens the advantages "
                                      "whatever it says", _normalize_advantage),
    "pg_loss_coeff": refused(float, "the policy loss has weight 1 here (the KL and entropy terms carry their own coefficients)",
                             lambda v: v == 1),
    "ptx_coeff": no_effect(float, "PaddleNLP adds the pretraining (ptx) loss only with ptx_datasets, which this trainer refuses"),
    "ptx_datasets": refused(str, "a pretraining (ptx) loss on a second dataset beside the RL loss; this trainer computes none"),
    "clip_range_value": no_effect(float, "clips PPO's value model; GRPO and REINFORCE++ have none"),
    "use_tgt_len_value": refused(bool, NO_CRITIC),
    "enable_overlong_reward_buffer": refused(bool, "use reward_functions soft_overlong with soft_cache_length (DAPO's overlong "
                                                   "penalty; overlong_reward_buffer is soft_cache_length)"),
    "overlong_reward_buffer": no_effect(int, "read only with enable_overlong_reward_buffer", lambda v: True),
    "overlong_penalty_factor": no_effect(float, "read only with enable_overlong_reward_buffer", lambda v: True),
    "max_gen_batches": sets(int, "generation batches per step with dynamic_sampling: max_resample_times is one less", _max_gen_batches),
    "global_gen_batch_size": sets(int, "-1 (off) only: dynamic sampling here refills with freshly drawn prompts",
                                  _global_gen_batch_size),
    "use_rule_reward": no_effect(bool, "the rule rewards are reward_functions' (accuracy and format by default)"),
    # the critic of PPO
    **{key: refused(kind, NO_CRITIC, lambda v: v is None) for key, kind in [
        ("critic_model_name_or_path", str), ("critic_learning_rate", float), ("critic_min_learning_rate", float),
        ("critic_weight_decay", float), ("critic_lr_scheduler_type", str), ("critic_warmup_ratio", float), ("critic_recompute", bool),
        ("critic_recompute_granularity", str), ("critic_decay_steps", int), ("reward_critic_tokenizer_alpha", float)]},
    "per_device_value_batch_size": no_effect(int, NO_CRITIC, lambda v: True),
    # batches and lengths
    "num_return_sequences": same("rollout_n"),
    "max_length": same("max_seq_len"),
    "max_src_len": same("max_prompt_len"),
    "global_batch_size": sets(int, "prompts per step over all training processes: per_device_prompt_batch_size is its share",
                              _global_batch_size),
    "global_mini_batch_size": sets(int, "-1 only: give mini_batch_size (one process's sequences per optimizer step)",
                                   _global_mini_batch_size),
    "per_device_logprob_batch_size": no_effect(int, BATCHED_BY_TOKENS),
    "per_device_reward_batch_size": no_effect(int, "scoring takes the whole step's completions at once here"),
    "per_device_rollout_batch_size": no_effect(int, "the rollout engine batches the step's completions itself"),
    "rollout_logprob_batch_size": no_effect(str, BATCHED_BY_TOKENS),
    "rollout_max_num_seqs": no_effect(int, "the rollout engine batches the step's completions itself"),
    "rollout_quant_type": refused(str, "quantised rollout weights are not implemented"),
    "quant_type": refused(str, "quantised rollout weights are not implemented"),
    "dataloader_drop_last": no_effect(bool, "every step takes a full batch of prompts: an epoch's remainder is left out, as with "
                                            "true", lambda v: bool(v)),
    "dataloader_shuffle": refused(bool, "each epoch visits the prompts in an order seeded by (seed, epoch), always",
                                  lambda v: bool(v)),
    "balance_batch": no_effect(bool, "every process takes the same number of prompts per step"),
    "use_remove_padding": no_effect(bool, "the update packs no sequences; micro_batch_token_budget bounds its padded tokens"),
    "label_key": no_effect(str, "the reference answer's column is response_key", lambda v: True),
    "eos_token": refused(str, "a completion ends at the tokenizer's eos tokens here"),
    **{key: refused(float, "tokenizing with sampled segmentations is not done here", lambda v: v is None)
       for key in ("actor_tokenizer_alpha", "reward_tokenizer_alpha")},
    # training, evaluation, checkpoints, logging
    "do_train": sets(bool, "true only: run_grpo.py trains", _do_train),
    "do_eval": sets(bool, "false: no evaluation (eval_datasets is not read)", _do_eval, wins=True),
    "evaluation_strategy": sets(str, "steps: every eval_steps steps; no: no evaluation (eval_datasets is not read); epoch is refused",
                                _evaluation_strategy, wins=True),
    "eval_mode": no_effect(str, "evaluation runs the training processes' own engines"),
    "save_strategy": sets(str, "steps only: a checkpoint every save_steps steps and at the end", _save_strategy),
    "ignore_save_lr_and_optim": no_effect(bool, "checkpoints keep the optimizer state and the schedule, which an exact resume needs"),
    "unified_checkpoint": no_effect(bool, "checkpoints are Hugging Face-layout safetensors folders already"),
    "unified_checkpoint_config": no_effect(str, "options of PaddleNLP's unified checkpoint (async saving, master weights); checkpoints "
                                                "here are written whole or not at all"),
    "early_stopping": refused(bool, "this trainer runs max_steps steps (or num_train_epochs)"),
    "early_stopping_patience": no_effect(int, "read only with early_stopping", lambda v: True),
    "early_stopping_threshold": no_effect(float, "read only with early_stopping", lambda v: True),
    "decay_steps": refused(int, "the schedule decays over max_steps here", lambda v: v is None),
    "autotuner_benchmark": refused(bool, "PaddleNLP's benchmark mode (5 steps, no checkpoints nor evaluation)"),
    "skip_profile_timer": no_effect(bool, "PaddleNLP's timers; this trainer's step timings are in metrics.jsonl always",
                                    lambda v: True),
    "run_name": no_effect(str, "a W&B run is named after output_dir"),
    "wandb_http_proxy": no_effect(str, "W&B reads its proxy from the environment (HTTPS_PROXY)"),
    "stage": no_effect(str, "run_grpo.py trains GRPO (or REINFORCE++) only", lambda v: v in (None, "", "PPO")),
    "dropout_warmup_steps": refused(int, "dropout in the actor is not applied here (LoRA has lora_dropout)"),
    **{key: refused(float, "dropout in the actor makes pi_old and the importance ratios noisy; not applied here (LoRA has "
                           "lora_dropout)") for key in ("hidden_dropout_prob", "attention_probs_dropout_prob")},
    # kernels, precision and memory
    **{key: no_effect(bool, GPU_KERNEL) for key in (
        "use_flash_attention", "fused_linear", "use_fused_linear", "use_fused_rms_norm", "use_fused_rope", "use_fused_head_and_loss_fn",
        "use_attn_mask_start_row_indices")},
    "recompute_use_reentrant": no_effect(bool, "with recompute, paddleformers recomputes each decoder layer its own way"),
    "fp16_opt_level": no_effect(str, "AMP's level for bf16 and fp16 (GPU only); a CPU run computes in float32, or bf16 matmuls "
                                     "with float32 master weights (cpu_bf16_matmul)"),
    "amp_master_grad": no_effect(bool, "AMP's setting (GPU only)"),
    "amp_custom_black_list": no_effect(list, "AMP's setting (GPU only)"),
    "amp_custom_white_list": no_effect(list, "AMP's setting (GPU only)"),
    "use_fp32_compute": no_effect(bool, "log-probs, rewards, advantages and the loss are float32 here always (bf16 matmuls, where "
                                        "cpu_bf16_matmul turns them on, accumulate in float32)"),
    "offload_level": no_effect(str, GPU_MEMORY),
    "offload_optim": no_effect(bool, GPU_MEMORY),
    "release_grads": no_effect(bool, GPU_MEMORY),
    # parallelism
    "pipeline_parallel_degree": refused(int, ONE_PROCESS_PARALLEL, _at_most_one),
    "virtual_pp_degree": refused(int, ONE_PROCESS_PARALLEL, _at_most_one),
    "pipeline_parallel_config": no_effect(str, "read only with pipeline_parallel_degree > 1, refused here"),
    "sequence_parallel": no_effect(bool, "PaddleNLP turns it off when tensor_parallel_degree is 1, the only degree here"),
    "tensor_parallel_output": no_effect(bool, "PaddleNLP turns it off when tensor_parallel_degree is 1, the only degree here"),
    "sharding_parallel_config": no_effect(str, "paddle's GPU sharding options; sharding stage1 here keeps each process's share "
                                               "of the optimizer state"),
}

PADDLENLP_ALIASES = {key: record.why for key, record in PADDLENLP_KEYS.items() if record.kind == SAME}
# PaddleNLP's spellings of values of keys both have: report_to "visualdl" (one name, not a list); reward_model_name_or_path
# "" (no reward model)
PADDLENLP_VALUES = {
    "report_to": lambda value: [value] if isinstance(value, str) else value,
    "reward_model_name_or_path": lambda value: None if value == "" else value,
}


def typed(kind: type, value):
    """value as PaddleNLP's dataclass types it: a bool is true, false, 0 or 1; a float may be written as an integer;
    a list may be one string of space-separated words (PaddleNLP's amp lists). Raises Refusal otherwise."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok, expected = {
        bool: (isinstance(value, bool) or (number and value in (0, 1) and isinstance(value, int)), "true, false, 0 or 1"),
        int: (number and isinstance(value, int), "an integer"),
        float: (number, "a number"),
        str: (isinstance(value, str), "a string"),
        list: (isinstance(value, (list, str)), "a list or a string"),
    }[kind]
    if value is not None and not ok:
        raise Refusal(f"must be {expected}, got {show(value)}")
    return bool(value) if kind is bool and value is not None else value


def read_key(key: str, value, given: dict) -> tuple:
    """PaddleNLP's key = value, the file's other keys as written -> ({key here: value}, the note to print at start or None).
    Raises Refusal for a value this run cannot honour."""
    record = PADDLENLP_KEYS[key]
    value = typed(record.type, value)
    if record.kind == SETS:
        return record.sets(value, given)
    if record.off(value):
        return {}, None
    if record.kind == REFUSED:
        raise Refusal(record.why)
    return {}, record.why


def from_text(key: str, values: list):
    """The command line's text for PaddleNLP's key -> the value its file would hold ("1" -> 1, "true" -> True)."""
    kind = PADDLENLP_KEYS[key].type
    if kind is list:
        return values
    if kind is bool and not values:  # --use_flash_attention alone, as argparse reads a true/false key
        return True
    if len(values) != 1:
        raise Refusal(f"takes one value, got {len(values)}")
    text = values[0]
    if kind is bool and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if kind in (bool, int):
        try:
            return int(text)
        except ValueError:
            raise Refusal(f"must be {'true, false, 0 or 1' if kind is bool else 'an integer'}, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise Refusal(f"must be a number, got {text!r}") from None
    return text
