"""One place builds a run's parts, once: the tokenizer and prompts (RunData), then the models, the engine, the scorer
and the optimizer (RunParts). The training process builds all of them; a rollout process builds the tokenizer,
the prompts, the actor and its engine from the same functions."""

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import paddle

from alignment.algo.loss_settings import LossSettings
from alignment.models.cpu_bf16 import choose_compute
from alignment.models.fused_train import bf16_unavailable, use_training_ops
from alignment.models.lora import apply_lora, load_adapter
from alignment.models.modeling import enable_recompute, load_causal_lm, load_tokenizer, stop_token_ids
from alignment.parallel.distributed import World
from alignment.parallel.optim import OptimizerSettings, build_optimizer
from alignment.rewards.registry import reference_readers, sample_checks
from alignment.run.scorer import build_scorer
from alignment.rollout import EngineSettings, SamplingParams, build_engine
from alignment.rollout.multi_turn import TurnLimits, TurnSettings, check_template, tool_schemas, with_environment
from alignment.config.schema import GRPOConfig
from alignment.basics.data import PromptSchedule, encode_prompts, read_prompt_records, select_by_calculation_steps
from alignment.run.memory_plan import MemoryPlan, plan_memory
from alignment.basics.plugins import plugin_sources
from alignment.run.settings import (
    AdvantageSettings,
    EvaluationSettings,
    LoopSettings,
    RolloutSettings,
    ScoringSettings,
    StepSettings,
    UpdateSettings,
)
from alignment.run.start import model_folders
from alignment.tools import ToolSettings


def actor_sources(config: GRPOConfig, resume, actor_folder: str) -> tuple:
    """-> (the folder the actor's weights load from, the folder of its LoRA adapter or None): a LoRA checkpoint
    holds the adapter only, its base comes from actor_model_name_or_path."""
    if resume is None:
        return actor_folder, None
    return (actor_folder, str(resume.path)) if config.lora else (str(resume.path), None)


def load_actor(config: GRPOConfig, weights_folder: str, adapter_folder):
    """The policy as the training process and the rollout processes hold it: the model, with LoRA adapters."""
    model = load_causal_lm(weights_folder, model_dtype(config))
    if config.lora:
        # The adapters' random A from `seed`: the same in every process of the run (data-parallel ranks, rollout
        # processes) and in every run with that seed. Unseeded, paddle drew them afresh in each process.
        paddle.seed(config.seed)
        apply_lora(model, config.lora_rank, config.lora_alpha, config.lora_dropout, config.target_modules)
        if adapter_folder:
            load_adapter(model, adapter_folder)
    return model


def matmul_compute(config: GRPOConfig, model):
    """cpu_bf16_matmul's choice for this model on this machine (alignment/models/cpu_bf16.py)."""
    on_gpu = not model.lm_head.weight.place.is_cpu_place()
    return choose_compute(config.cpu_bf16_matmul, on_gpu, bf16_unavailable(model, config.use_fused_train_ops))


def model_compute(config: GRPOConfig, model) -> tuple:
    """The matmuls' choice for this model, and the training operators put in where use_fused_train_ops asks ->
    (compute, why the operators could not be used, or None): what training and the evaluation command decode with."""
    compute = matmul_compute(config, model)
    why_not = use_training_ops(model, compute.bf16) if config.use_fused_train_ops else None
    return compute, why_not


def rollout_engine(config: GRPOConfig, model, tokenizer, bf16: bool):
    """The engine that generates (use_fusemt picks the fused one), with the environment of a multi-turn run."""
    engine = build_engine(engine_settings(config), model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, bf16)
    return with_environment(engine, tokenizer, turn_settings(config))


def optimizer_settings(config: GRPOConfig) -> OptimizerSettings:
    return from_keys(OptimizerSettings, config, multi_precision=config.bf16 or config.fp16)


def engine_settings(config: GRPOConfig) -> EngineSettings:
    return EngineSettings(
        fused=config.use_fusemt, weight_sync_tolerance=config.weight_sync_tolerance, kv_cache_dtype=config.kv_cache_dtype
    )


def turn_settings(config: GRPOConfig) -> TurnSettings:
    """The multi-turn keys as the environment and its tools read them."""
    from alignment.tools.sandbox import SandboxLimits  # only where a tool may run

    limits = SandboxLimits(
        seconds=config.tool_timeout, memory_mb=config.tool_memory_mb, output_bytes=config.tool_output_bytes, disk_mb=config.tool_disk_mb,
        processes=config.tool_processes, isolated=config.tool_isolation == "bwrap",
    )
    tools = ToolSettings(
        tools=tuple(config.tools), limits=limits, plugin_sources=tuple(plugin_sources(config.external_plugins)),
        parallel=config.tool_workers, calls_per_turn=config.max_tool_calls_per_turn,
    )
    turn_limits = TurnLimits(config.max_turns, config.max_turn_tokens or config.max_dec_len, config.max_dec_len)
    return TurnSettings(config.resolved_environment, tools, turn_limits)


def model_dtype(config: GRPOConfig) -> str:
    return "bfloat16" if config.bf16 else "float16" if config.fp16 else "float32"


def load_prompts(paths: str, tokenizer, config: GRPOConfig, row_checks: dict | None = None):
    # Rows the rewards (or the accuracy metric) could not score for want of a reference are refused here,
    # before any model loads, not found one failed reward at a time.
    readers = reference_readers(config.reward_functions)
    needed_by = f"reward function {readers[0]}" if readers else None
    if needed_by is None and reference_readers([config.accuracy_function]):
        needed_by = f"accuracy_function {config.accuracy_function}; name one there that reads none"
    # the rewards' row checks, and row_checks ({what needs it: check}) of a caller that reads the rows itself
    checks = {**sample_checks([*config.reward_functions, config.accuracy_function]), **(row_checks or {})}
    records = read_prompt_records(paths, config.prompt_key, config.response_key, config.skip_bad_rows, needed_by, checks)
    records = select_by_calculation_steps(records, config.calculation_steps, paths)
    return encode_prompts(
        records, tokenizer, config.max_prompt_len, config.prompt_truncation, config.system_prompt, tool_schemas(config.tools)
    )


def sampling_params(config: GRPOConfig) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=config.max_dec_len,
        min_new_tokens=config.min_dec_len,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        repetition_penalty=config.repetition_penalty,
        min_p=config.min_p,
    )


def from_keys(record_type, config: GRPOConfig, **derived):
    """A settings record whose fields are config keys of the same names, filled by name; `derived`: its fields that
    are no key."""
    keys = {f.name: getattr(config, f.name) for f in dataclasses.fields(record_type) if f.name not in derived}
    return record_type(**keys, **derived)


def scoring_settings(config: GRPOConfig) -> ScoringSettings:
    paddlenlp_server = config.use_rm_server and config.reward_server_protocol == "paddlenlp"  # it answers totals only
    return ScoringSettings(config.accuracy_function, config.reward_settings(), () if paddlenlp_server else tuple(config.reward_functions))


def rollout_settings(config: GRPOConfig) -> RolloutSettings:
    return from_keys(RolloutSettings, config, scoring=scoring_settings(config))


def advantage_settings(config: GRPOConfig) -> AdvantageSettings:
    return from_keys(AdvantageSettings, config)


def update_settings(config: GRPOConfig) -> UpdateSettings:
    return from_keys(UpdateSettings, config, loss=from_keys(LossSettings, config))


def step_settings(config: GRPOConfig) -> StepSettings:
    """What each phase of a training step reads of the config (alignment/run/settings.py)."""
    return StepSettings(
        loop=from_keys(LoopSettings, config, dashboards=config.dashboard_settings(), config_json=config.to_json()),
        rollout=rollout_settings(config),
        evaluation=from_keys(EvaluationSettings, config, multi_turn=bool(config.resolved_environment)),
        advantages=advantage_settings(config),
        update=update_settings(config),
    )


@dataclass(frozen=True)
class RunData:
    """What a run reads before any model loads."""

    actor_folder: str  # where the actor (and the reference model) load from: a .gguf's imported folder
    tokenizer_folder: str
    tokenizer: Any
    train_prompts: list  # EncodedPrompts
    eval_prompts: list
    schedule: PromptSchedule
    total_steps: int
    truncated: int  # training prompts cut to max_prompt_len
    dropped: int  # training prompts dropped over it


@dataclass(frozen=True)
class RunParts:
    """The training process's parts, built once by build_parts."""

    model: Any  # the actor, with LoRA adapters and the training operators where they apply
    ref_model: Optional[Any]  # None without a KL term (kl_loss_coeff 0, no use_kl_in_reward), and with LoRA (the actor without adapters)
    compute: Any  # cpu_bf16's choice (alignment/models/cpu_bf16.py)
    engine: Optional[Any]  # None in a training process beside rollout processes with nothing to evaluate
    scorer: Any
    optimizer: Any
    scheduler: Any
    sampling: SamplingParams
    memory: MemoryPlan  # the estimate, the token budgets and the guard's limit


def read_run_data(config: GRPOConfig, world: World) -> RunData:
    """The tokenizer, the prompts and their schedule; refuses prompts the rewards cannot score."""
    actor_folder, tokenizer_folder = model_folders(config, world)  # a .gguf is imported once, into <output_dir>/imported
    tokenizer = load_tokenizer(tokenizer_folder, config.chat_template)
    if config.resolved_environment:
        check_template(tokenizer, tool_schemas(config.tools))
    train_prompts, truncated, dropped = load_prompts(config.train_datasets, tokenizer, config)
    eval_prompts = load_prompts(config.eval_datasets, tokenizer, config)[0] if config.eval_datasets else []
    schedule = PromptSchedule(len(train_prompts), config.per_device_prompt_batch_size, world.size, config.seed)
    total_steps = config.max_steps if config.max_steps > 0 else math.ceil(config.num_train_epochs * schedule.steps_per_epoch)
    return RunData(actor_folder, tokenizer_folder, tokenizer, train_prompts, eval_prompts, schedule, total_steps, truncated, dropped)


def reference_model(config: GRPOConfig, actor_folder: str, bf16: bool):
    """The frozen model of the KL term, or None: without a KL term, and with LoRA (the reference is then the actor with its
    adapters off). It runs the policy's operators and matmuls (use_fused_train_ops, bf16 where the policy's are), so that
    at equal weights its log-probs are the policy's, and its pass costs what the policy's forward does."""
    if not config.loads_reference_model:
        return None
    model = load_causal_lm(actor_folder, model_dtype(config))
    model.eval()
    for parameter in model.parameters():
        parameter.stop_gradient = True
    if config.use_fused_train_ops:
        use_training_ops(model, bf16)  # where it cannot, the policy could not either (the same architecture): paddle's kernels
    return model


def build_parts(config: GRPOConfig, data: RunData, world: World, sources: tuple, generates: bool) -> RunParts:
    """sources: actor_sources(); generates: whether this process needs a rollout engine. The memory plan comes first: a
    run that cannot fit is refused before any model loads."""
    prompt_width = max((len(prompt.ids) for prompt in data.train_prompts + data.eval_prompts), default=config.max_prompt_len)
    memory = plan_memory(config, data.actor_folder, prompt_width, world.size)
    model = load_actor(config, *sources)  # adapters before the training operators, the engine and the optimizer
    if config.recompute:
        enable_recompute(model, config.recompute_granularity)
    compute, why_not = model_compute(config, model)
    if why_not:
        warnings.warn(f"use_fused_train_ops: training with paddle's own kernels ({why_not})")
    ref_model = reference_model(config, data.actor_folder, compute.bf16)
    engine = rollout_engine(config, model, data.tokenizer, compute.bf16) if generates else None
    scorer = build_scorer(config)
    optimizer, scheduler = build_optimizer(model, optimizer_settings(config), data.total_steps, world)
    return RunParts(model, ref_model, compute, engine, scorer, optimizer, scheduler, sampling_params(config), memory)
