"""The memory plan of a training process, made before any model loads: the estimate (alignment/models/memory.py) against
what the machine has, the token budget of the micro-batches, and the refusal of a run that cannot fit."""

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import paddle

from alignment.basics.errors import MemoryPlanError
from alignment.models.cpu_bf16 import cpu_bf16_flags
from alignment.models.memory import (
    FAST_ACTIVATIONS, FLOAT, MemoryEstimate, MemorySettings, ModelShape, TokenBudget, estimate_memory, gigabytes, lora_parameters,
    rows_within,
)
from alignment.rollout import cache_dtype_for
from alignment.kernels.ops import bf16_primitive_missing, load_ops
from alignment.config.schema import GRPOConfig

TARGET_SHARE = 0.6  # the default budget keeps the estimated peak under this share of the limit: room for the estimate's error


@dataclass(frozen=True)
class MemoryPlan:
    budget: TokenBudget
    estimate: Optional[MemoryEstimate]  # None: no limit (memory_limit_gb 0) or no shape to estimate from
    limit: Optional[int]  # bytes this process may use; None: no guard
    line: str  # what the run's first lines say about it


def resident_bytes(field_name: str = "VmRSS") -> int:
    """This process's resident memory now (VmRSS) or at its peak since the last reset (VmHWM), in bytes."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field_name}:\s+(\d+) kB", status).group(1)) * 1024


def available_bytes() -> tuple:
    """-> (bytes a new allocation may still take on this machine, where that figure comes from): the smaller of
    /proc/meminfo's MemAvailable and what the cgroup's limit leaves."""
    meminfo = Path("/proc/meminfo").read_text()
    available = int(re.search(r"MemAvailable:\s+(\d+) kB", meminfo).group(1)) * 1024
    source = "MemAvailable"
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) - usage < available:
            available, source = int(limit) - usage, "the cgroup's memory limit"
    return available, source


def prefix_grouped(config: GRPOConfig) -> bool:  # where the update runs each prompt once per micro-batch
    return config.use_prefix_grouper and config.use_fused_train_ops and not config.recompute


def memory_settings(config: GRPOConfig, shape: ModelShape, prompt_width: int, world_size: int) -> MemorySettings:
    generations = [(config.per_device_prompt_batch_size, config.rollout_n)]
    if config.eval_datasets:
        generations += [(config.per_device_eval_batch_size, 1), (config.per_device_eval_batch_size, config.eval_rollout_n)]
    sharding = world_size if config.sharding and config.sharding_parallel_degree == -1 else max(config.sharding_parallel_degree, 1)
    return MemorySettings(
        prompt_width=prompt_width,
        completion_width=config.max_dec_len,
        group_size=config.rollout_n,
        generations=tuple(generations),
        training_ops=config.use_fused_train_ops,
        prefix_grouper=prefix_grouped(config),
        recompute=config.recompute,
        reference_model=config.loads_reference_model,
        lora_parameters=lora_parameters(shape, config.lora_rank, config.target_modules) if config.lora else None,
        optimizer_share=1.0 / sharding if config.sharding else 1.0,
        logprob_chunk_tokens=config.logprob_chunk_tokens,
        attention_weights_kept=not (config.use_fused_train_ops and hasattr(load_ops()[0], "grpo_attention")),
        cache_value_bytes=2 if expected_cache_dtype(config) == "bfloat16" else FLOAT,
    )


def expected_cache_dtype(config: GRPOConfig) -> str:
    """The fused engine's KV cache dtype as alignment/rollout's build_engine will pick it, before the model loads: `auto`
    is bfloat16 where the matmuls will be bf16 (cpu_bf16_matmul not off, a CPU with bf16, the training operators and
    oneDNN's bf16 primitive). A model the training operators cannot run falls back to float32 after this guess: the
    cache is then twice the estimate's, as the update's activations are over-counted then."""
    if not config.use_fusemt:
        return "float32"  # the eager engine's cache is paddle's
    bf16 = config.cpu_bf16_matmul != "off" and config.use_fused_train_ops and bool(cpu_bf16_flags()) and not bf16_primitive_missing()
    return cache_dtype_for(config.kv_cache_dtype, bf16)


def plan_memory(config: GRPOConfig, actor_folder: str, prompt_width: int, world_size: int) -> MemoryPlan:
    """The estimate for this process, the token budgets (memory_limit_gb's derived default where not given), or
    MemoryPlanError when not even the smallest micro-batch fits."""
    most_rows = config.per_device_train_batch_size
    group = config.rollout_n if prefix_grouped(config) else 1
    shape, (limit, machine) = model_shape(actor_folder), memory_limit(config)
    why_not = "memory_limit_gb 0" if limit is None else "no config.json" if shape is None else None
    if "gpu" in paddle.device.get_device():  # the estimate counts the CPU's float32 path against the host's memory
        why_not = "the run is on a GPU; memory/peak_gb reports the device's peak"
    if why_not:
        update_budget = config.micro_batch_token_budget or 0
        budget = TokenBudget(update_budget, _logprob_budget(config, update_budget), most_rows, group)
        return MemoryPlan(budget, None, None, f"memory: not estimated ({why_not}); micro_batch_token_budget {update_budget or 'none'}")
    settings = memory_settings(config, shape, prompt_width, world_size)
    runtime = resident_bytes()
    update_budget = config.micro_batch_token_budget
    if update_budget is None:
        fitting = rows_within(shape, settings, runtime, TARGET_SHARE * limit, most_rows, FAST_ACTIVATIONS)
        update_budget = (fitting or rows_within(shape, settings, runtime, limit, most_rows)) * settings.row_tokens
    budget = TokenBudget(update_budget, _logprob_budget(config, update_budget), most_rows, group)
    rows_total = min(config.mini_batch_size, config.per_device_prompt_batch_size * config.rollout_n)
    rows = budget.rows(rows_total, settings.row_tokens)
    estimate = estimate_memory(shape, settings, runtime, rows)
    if update_budget == 0 and config.micro_batch_token_budget is None or estimate.total > limit:
        raise MemoryPlanError(refusal(config, shape, settings, runtime, limit, estimate))
    how = "derived from memory" if config.micro_batch_token_budget is None else "set"
    line = (
        f"memory: estimated peak {gigabytes(estimate.total)} of memory_limit_gb {limit / 2**30:.3g} ({machine}): {estimate.summary()}; "
        f"micro_batch_token_budget {update_budget or 'none'} ({how}): micro-batches of {rows} rows of {settings.row_tokens} tokens"
    )
    return MemoryPlan(budget, estimate, limit, line)


def _logprob_budget(config: GRPOConfig, update_budget: int) -> int:
    return update_budget if config.logprob_token_budget is None else config.logprob_token_budget


def memory_limit(config: GRPOConfig) -> tuple:
    """-> (memory_limit_gb in bytes, or by default this process's share of what the machine has now, None: no limit;
    where the figure comes from)."""
    available, source = available_bytes()
    machine = f"the machine has {gigabytes(available)} available, by {source}"
    if config.memory_limit_gb is not None:
        return int(config.memory_limit_gb * 2**30) or None, f"set; {machine}"
    processes = int(os.environ.get("PADDLE_LOCAL_SIZE", "1") or 1)
    share = f", shared by {processes} processes" if processes > 1 else ""
    return int((available + processes * resident_bytes()) / processes), f"{machine}{share}, plus this process's own"


def model_shape(actor_folder: str) -> Optional[ModelShape]:
    try:
        return ModelShape.from_config(json.loads(Path(actor_folder, "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # a model the estimate cannot read: the loader will say what is wrong
        return None


def refusal(config: GRPOConfig, shape: ModelShape, settings: MemorySettings, runtime: int, limit: int, estimate: MemoryEstimate) -> str:
    """One line: the estimate against the limit, and the changes (each alone) whose estimate would fit."""
    rows = max(estimate.micro_batch_rows, 1)
    fitting_rows = rows_within(shape, settings, runtime, limit, config.per_device_train_batch_size)
    lora = lora_parameters(shape, config.lora_rank, config.target_modules)
    changes = [  # (the change, the settings with it, micro-batch rows with it)
        (f"micro_batch_token_budget {fitting_rows * settings.row_tokens}", settings, fitting_rows),
        ("recompute true", dataclasses.replace(settings, recompute=True, prefix_grouper=False), rows),
        ("lora true", dataclasses.replace(settings, lora_parameters=lora, reference_model=False), rows),
        ("smaller per_device_prompt_batch_size and per_device_eval_batch_size", dataclasses.replace(settings, generations=((1, 1),)), rows),
    ]
    fitting = [name for name, changed, trial_rows in changes if (changed, trial_rows) != (settings, rows) and trial_rows > 0
               and estimate_memory(shape, changed, runtime, trial_rows).total <= limit]
    hint = f"; it would fit with {' or '.join(fitting)}" if fitting else "; no one change of the token budget, recompute or lora fits"
    return (
        f"memory: the estimated peak {gigabytes(estimate.total)} ({estimate.summary()}) exceeds memory_limit_gb "
        f"{limit / 2**30:.3g}{hint} (memory_limit_gb 0 runs without this check)"
    )
