"""A config's checks: every section's value checks, with those that read keys of several sections (here), all of a
config's problems reported in one ConfigError; then the checks that look outside it (preflight.py), the first failure
reported; and the values derived from the keys. validate() checks a config to train; validate_generation() the same
sequence less what training alone reads, for a config that generates and scores only (python -m alignment.evaluate)."""

import dataclasses
import functools
import math
import re
from typing import Optional

from alignment.algo.kl import KL_ESTIMATOR_SYNONYMS
from alignment.config import preflight
from alignment.config.aliases import IMPORTANCE_SAMPLING_SYNONYMS
from alignment.config.checks import check, collected, show
from alignment.config.files import FileReading, problems_message
from alignment.config.schema import GRPOConfig
from alignment.config.sections.algorithm import (
    check_advantages_and_penalties, check_objective_variants, check_policy_update, check_reward_functions_named,
    check_reward_model_paired, check_reward_server, clip_range, stored_objective,
)
from alignment.config.sections.evaluation import check_evaluation, check_logging_and_checkpoints
from alignment.config.sections.model_and_data import check_calculation_steps, check_lengths, check_names_a_dataset
from alignment.config.sections.optimisation import check_lora, check_memory_and_parallelism, check_optimizer_and_schedule
from alignment.config.sections.rollout import check_sampling
from alignment.basics.errors import ConfigError

INT64 = 2**63  # integers reach numpy and paddle as int64
DATASET_KEYS = ("train_datasets", "eval_datasets")


def validate(c: GRPOConfig, reading: Optional[FileReading] = None, source: str = "this config") -> GRPOConfig:
    """Checks values against each other and fills the derived ones; raises ConfigError naming the keys. Every value
    check runs, and the file's problems (reading) and theirs are reported together in one ConfigError before anything
    outside the config is looked at; then preflight's checks, in order, the first failure reported."""
    return _validated(c, True, reading, source)


def validate_generation(c: GRPOConfig) -> GRPOConfig:
    """validate()'s checks and derived values for what generating and scoring read, for a config that trains nothing
    (python -m alignment.evaluate: a saved run's settings with flags applied): lengths, sampling, the reward functions
    and their weights, the tools and environment, the reward server, the system prompt and chat template as text."""
    return _validated(c, False, None, "this config")


def _validated(c: GRPOConfig, training: bool, reading: Optional[FileReading], source: str) -> GRPOConfig:
    earlier = reading.problems if reading else []
    found = []
    derived = _checked_values(c, found, training)
    unread = reading.unread if reading else set()  # a check of a key whose value was refused would judge its default
    problems = earlier + [p for p in found if not any(re.search(rf"\b{re.escape(key)}\b", p) for key in unread)]
    if problems:
        raise ConfigError(problems_message(source, problems))
    _look_outside(c, training)
    system_prompt, chat_template = preflight.read_prompts(c)
    return dataclasses.replace(c, **derived, system_prompt=system_prompt, chat_template=chat_template)


def _checked_values(c: GRPOConfig, problems: list, training: bool) -> dict:
    """Each section's value checks, every failure added to problems -> the derived values (meaningful only without any).
    Without training, the checks of what training alone reads are left out. A section whose input another one refused
    is not run: it would report the same mistake again."""
    run = functools.partial(collected, problems)
    run(_check_numbers_fit, c)
    for key in DATASET_KEYS if training else ():
        run(check_names_a_dataset, c, key)
    run(check_calculation_steps, c)
    batches = run(_batch_sizes, c) if training else None
    run(check_lengths, c)
    run(check_sampling, c)
    if training:
        objective, clip = run(stored_objective, c), run(clip_range, c)
        run(check_policy_update, c)
        if objective:
            run(check_objective_variants, c, objective[0])
        run(check_advantages_and_penalties, c)
        if batches:
            run(_check_rollout_processes, c, batches[0])
    run(check_reward_functions_named, c)
    run(check_reward_model_paired, c)
    shaping = run(_reward_shaping, c)
    run(_check_multi_turn, c)
    run(check_reward_server, c)
    for check_values in (check_optimizer_and_schedule, check_memory_and_parallelism, check_lora, _check_precision,
                         preflight.check_precision_hardware, check_evaluation, check_logging_and_checkpoints) if training else ():
        run(check_values, c)
    if problems:
        return {}
    reward_settings, weights = shaping
    derived = dict(
        cosine_max_len=reward_settings.cosine_max_len,
        soft_max_length=reward_settings.soft_max_length,
        reward_function_weights=[float(w) for w in weights],
    )
    return derived | (_training_values(c, batches, objective, clip) if training else {})


def _training_values(c: GRPOConfig, batches: tuple, objective: tuple, clip: tuple) -> dict:
    """The values only training reads, derived: batch sizes, clips, and other trainers' names stored as what they are."""
    (prompt_batch, accumulation, mini_batch), (surrogate, loss_type), (clip_low, clip_high) = batches, objective, clip
    return dict(
        per_device_prompt_batch_size=prompt_batch,
        gradient_accumulation_steps=accumulation,
        mini_batch_size=mini_batch,
        clip_range_ratio_low=clip_low,
        clip_range_ratio_high=clip_high,
        importance_sampling_mode=IMPORTANCE_SAMPLING_SYNONYMS.get(c.importance_sampling_mode, c.importance_sampling_mode),
        surrogate=surrogate,
        loss_type=loss_type,
        kl_estimator=KL_ESTIMATOR_SYNONYMS.get(c.kl_estimator, c.kl_estimator),
        kl_in_reward_estimator=KL_ESTIMATOR_SYNONYMS.get(c.kl_in_reward_estimator, c.kl_in_reward_estimator),
    )


def _look_outside(c: GRPOConfig, training: bool) -> None:
    """preflight's checks in order, the first failure raised; without training, those of the model's files, the
    datasets, the checkpoint to resume, the dashboards and the output folder are left out."""
    if training:
        preflight.check_model_files(c)
        for key in DATASET_KEYS:
            preflight.check_dataset_files(c, key)
        preflight.check_lengths_fit_model(c)
    preflight.load_reward_functions(c)
    preflight.check_reward_model_folder(c)
    preflight.check_tools_registered(c)
    preflight.check_tool_isolation(c)
    if training:
        preflight.check_resume(c)
        preflight.check_dashboards_installed(c)
        preflight.check_output_folders(c)


def _check_numbers_fit(c: GRPOConfig) -> None:
    """From the file or the command line: no key gives inf or NaN a meaning."""
    for f in dataclasses.fields(c):
        value = getattr(c, f.name)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float):
                check(math.isfinite(v), f"{f.name} = {v}: must be a finite number")
            elif isinstance(v, int) and not -INT64 <= v < INT64:
                raise ConfigError(f"{f.name} = {show(v)}: must fit in a 64-bit integer (magnitude below 2^63)")



def _batch_sizes(c: GRPOConfig) -> tuple:
    """-> (per_device_prompt_batch_size, gradient_accumulation_steps, mini_batch_size), each derived where not given."""
    check(c.rollout_n >= 2, f"rollout_n = {c.rollout_n}: a group needs at least 2 completions to compare")
    check(c.per_device_train_batch_size >= 1, "per_device_train_batch_size must be at least 1")
    for key in ("per_device_prompt_batch_size", "gradient_accumulation_steps", "mini_batch_size", "max_seq_len"):
        check(getattr(c, key) is None or getattr(c, key) >= 1, f"{key} = {getattr(c, key)}: must be at least 1 (or null: derived)")
    micro_batch, prompt_batch, accumulation = c.per_device_train_batch_size, c.per_device_prompt_batch_size, c.gradient_accumulation_steps
    if prompt_batch is None and accumulation is not None and c.mini_batch_size is None:
        sequences = accumulation * micro_batch
        check(
            sequences % c.rollout_n == 0,
            f"per_device_train_batch_size ({micro_batch}) x gradient_accumulation_steps "
            f"({accumulation}) = {sequences} sequences is not a whole number of groups of rollout_n ({c.rollout_n})",
        )
        prompt_batch = sequences // c.rollout_n
        derived = f", derived from gradient_accumulation_steps ({accumulation}) x per_device_train_batch_size ({micro_batch})"
    else:
        derived = ""
    prompt_batch = 8 if prompt_batch is None else prompt_batch
    check(prompt_batch >= 1, "per_device_prompt_batch_size must be at least 1")
    sequences = prompt_batch * c.rollout_n
    check(
        sequences < INT64,
        f"per_device_prompt_batch_size ({prompt_batch}{derived}) x rollout_n ({c.rollout_n}) = {sequences} sequences per step: too many",
    )
    check(
        sequences % micro_batch == 0,
        f"per_device_prompt_batch_size ({prompt_batch}) x rollout_n ({c.rollout_n}) = {sequences} sequences per step "
        f"does not divide into micro-batches of per_device_train_batch_size ({micro_batch})",
    )
    mini_batch = sequences if c.mini_batch_size is None else c.mini_batch_size
    check(
        sequences % mini_batch == 0 and mini_batch % micro_batch == 0,
        f"mini_batch_size ({mini_batch}) must divide the {sequences} sequences per step (per_device_prompt_batch_size "
        f"{prompt_batch} x rollout_n {c.rollout_n}) and be a multiple of per_device_train_batch_size ({micro_batch})",
    )
    per_step = f"per_device_prompt_batch_size ({prompt_batch}) x rollout_n ({c.rollout_n}) = {sequences}"
    check(
        accumulation is None or accumulation * micro_batch == mini_batch,
        f"gradient_accumulation_steps ({accumulation}) x per_device_train_batch_size ({micro_batch}) "
        f"must equal the sequences per optimizer step: " + (f"mini_batch_size ({mini_batch})" if c.mini_batch_size else per_step),
    )
    return prompt_batch, mini_batch // micro_batch, mini_batch



def _check_rollout_processes(c: GRPOConfig, prompt_batch: int) -> None:
    check(c.rollout_workers >= 0, f"rollout_workers = {c.rollout_workers}: must be >= 0")
    check(
        c.rollout_workers > 0 or not c.async_generate,
        "async_generate generates beside training: it needs rollout_workers >= 1 (processes that only generate)",
    )
    if c.rollout_workers:
        check(
            prompt_batch >= c.rollout_workers,
            f"rollout_workers = {c.rollout_workers} but a step has {prompt_batch} prompts (per_device_prompt_batch_size): "
            f"every rollout process needs at least one",
        )
        check(
            not c.dynamic_sampling,
            "dynamic_sampling with rollout_workers: refill rounds would have to ask the rollout processes for more groups "
            "mid-step, which they do not do yet; use one or the other",
        )
        check(
            not c.sharding,
            f"sharding = '{c.sharding}' with rollout_workers: the one training process holds the whole optimizer state; drop one of them",
        )
    check(c.max_resample_times >= 0, f"max_resample_times = {c.max_resample_times}: must be >= 0")



def _reward_shaping(c: GRPOConfig) -> tuple:
    """-> (RewardSettings with its lengths filled in, reward_function_weights filled in)."""
    from alignment.rewards import REWARD_MODEL

    check(not (c.use_rm_server and REWARD_MODEL in c.reward_functions and c.reward_server_protocol == "paddlenlp"),
           f"{REWARD_MODEL} cannot be combined with a paddlenlp-protocol reward server, which answers totals only")
    try:  # RewardSettings checks its own ranges; the two lengths default to max_dec_len
        reward_settings = dataclasses.replace(
            c,
            cosine_max_len=c.max_dec_len if c.cosine_max_len is None else c.cosine_max_len,
            soft_max_length=c.max_dec_len if c.soft_max_length is None else c.soft_max_length,
        ).reward_settings()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check(
        "soft_overlong" not in c.reward_functions or reward_settings.soft_cache_length is not None,
        "reward_functions names soft_overlong but soft_cache_length is not set (DAPO used 4096 of a 20480 soft_max_length)",
    )
    weights = [1.0] * len(c.reward_functions) if c.reward_function_weights is None else c.reward_function_weights
    check(
        len(weights) == len(c.reward_functions),
        f"reward_function_weights has {len(weights)} values but reward_functions names {len(c.reward_functions)} functions",
    )
    return reward_settings, weights


def _check_multi_turn(c: GRPOConfig) -> None:
    check(c.environment != "tools" or bool(c.tools), "environment is tools but tools is empty: name the tools the model may call")
    check(c.max_turns >= 1, f"max_turns = {c.max_turns}: must be at least 1")
    check(
        c.max_turn_tokens is None or 1 <= c.max_turn_tokens <= c.max_dec_len,
        f"max_turn_tokens = {c.max_turn_tokens}: must lie in [1, max_dec_len ({c.max_dec_len})], which bounds the whole trajectory",
    )
    check(c.tool_timeout > 0, f"tool_timeout = {c.tool_timeout}: must be > 0")
    check(c.tool_memory_mb >= 64 and c.tool_output_bytes >= 1 and c.tool_workers >= 1,
           "tool_memory_mb must be at least 64, tool_output_bytes and tool_workers at least 1")
    check(c.max_tool_calls_per_turn >= 1 and c.tool_disk_mb >= 1 and c.tool_processes >= 1,
           "max_tool_calls_per_turn, tool_disk_mb and tool_processes must be at least 1")



def _check_precision(c: GRPOConfig) -> None:
    check(not (c.bf16 and c.fp16), "bf16 and fp16 are both true; choose one")
    check(
        c.kv_cache_dtype != "bfloat16" or c.use_fusemt,
        "kv_cache_dtype is bfloat16 but use_fusemt is false: the bf16 cache is the fused engine's (the eager engine keeps paddle's)",
    )
    if c.cpu_bf16_matmul == "on":
        check(
            c.use_fused_train_ops,
            "cpu_bf16_matmul is on but use_fused_train_ops is false: the bf16 matmuls run in the training operators",
        )
        check(
            not c.bf16,
            "cpu_bf16_matmul is on and bf16 is true: bf16 is the GPU's AMP, cpu_bf16_matmul the CPU's bf16 matmuls; set one",
        )
