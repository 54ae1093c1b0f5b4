"""Optimisation: the optimizer and its schedule, the step count, memory (token budgets, recompute, LoRA), sharding
and precision."""

from dataclasses import dataclass
from typing import Optional

from alignment.algo.schedule import SCHEDULES
from alignment.config.checks import check
from alignment.config.sections import _key


@dataclass(frozen=True)
class Optimisation:
    TITLE = "Optimisation"

    learning_rate: float = _key(1e-6, "Peak learning rate.")
    min_learning_rate: float = _key(0.0, "Learning rate at the end of the linear or cosine schedule.")
    lr_scheduler_type: str = _key("linear", "Schedule after warmup.", choices=SCHEDULES.names())
    warmup_ratio: float = _key(0.0, "Warmup as a fraction of max_steps.")
    warmup_steps: int = _key(0, "Warmup steps (give warmup_ratio or warmup_steps, not both).")
    weight_decay: float = _key(0.0, "AdamW decoupled weight decay (not applied to biases and norms).")
    adam_beta1: float = _key(0.9, "AdamW beta1.")
    adam_beta2: float = _key(0.999, "AdamW beta2.")
    adam_epsilon: float = _key(1e-8, "AdamW epsilon.")
    max_grad_norm: float = _key(1.0, "Clip the global gradient norm to this (0: no clipping).")
    max_consecutive_skips: int = _key(
        3,
        "A step whose loss or gradients are not finite is skipped (no optimizer step) and counted; this many skipped in a row stop the "
        "run, naming the step and the phase.",
    )
    max_steps: int = _key(-1, "Optimizer steps to run; -1: num_train_epochs over train_datasets.")
    num_train_epochs: float = _key(1.0, "Passes over the training prompts when max_steps is -1.")
    max_train_minutes: float = _key(
        0.0,
        "Stop after the first step that ends this many minutes after the training loop began (0: no limit): that step evaluates and "
        "saves as a last one does, and the console prints the command that resumes the run, which gets as many minutes again. A time "
        "budget that holds on slower and faster CPUs alike, or inside a scheduler's time limit.",
    )
    seed: int = _key(42, "Seed for data order, sampling and initialisation.")
    use_prefix_grouper: bool = _key(
        True,
        "The policy update's forward runs each prompt once per micro-batch and its completions attend to its keys and values, instead of "
        "running it again with every completion (verl's key; the same log-probs and gradients up to float32 rounding, and a prompt shared "
        "by n completions costs 1/n). Where the training operators run (use_fused_train_ops) and recompute is off; elsewhere whole rows "
        "are run.",
    )
    micro_batch_token_budget: Optional[int] = _key(
        None,
        "Most padded tokens (rows x (prompt width + completion width)) in one micro-batch of the update: micro-batches hold at most "
        "per_device_train_batch_size rows and at most this many tokens (whole prompt groups where the prefix grouper runs, at least one "
        "row), cut into equal parts; the gradient is the same whatever the cut. Default: derived at start from the memory estimate, so "
        "that the estimated peak stays under 60% of memory_limit_gb (the run's first line says it); 0: no budget.",
    )
    logprob_token_budget: Optional[int] = _key(
        None,
        "The same for the passes without gradients (the old and the reference model's log-probs); default: micro_batch_token_budget.",
    )
    memory_limit_gb: Optional[float] = _key(
        None,
        "Resident memory this process may use, in GB (2^30 bytes). A run whose estimate (printed at start: weights, gradients, AdamW "
        "state, the rollout cache, a micro-batch's activations) exceeds it is refused before any model loads, naming settings that "
        "would fit; a run whose resident memory reaches it stops with a message naming the last checkpoint, before the kernel's "
        "out-of-memory killer would end it silently. Default: the memory available at start (MemAvailable, or the cgroup's limit), "
        "divided among the launch's processes on this machine; 0: no estimate check, no derived budget and no guard.",
    )
    logprob_chunk_tokens: int = _key(
        512,
        "Tokens whose full-vocabulary logits exist at once when computing log-probs for the update (backward recomputes each chunk); "
        "smaller uses less memory for the same result.",
    )
    lora: bool = _key(
        False,
        "Train LoRA adapters (paddleformers.peft) instead of all the actor's weights; checkpoints hold the adapter in Hugging Face peft's "
        "layout (python -m alignment.merge_lora merges it into the base).",
    )
    lora_rank: int = _key(8, "Rank r of each adapter (A is in x r, B is r x out).")
    lora_alpha: float = _key(32.0, "Adapter scale numerator: the update is A B (lora_alpha / lora_rank).")
    lora_dropout: float = _key(
        0.0,
        "Dropout on the adapters' input during the update (off in rollout and evaluation); 0 by default, as TRL disables dropout for GRPO: "
        "it makes pi_old and the importance weights noisy.",
    )
    target_modules: list[str] = _key(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Linear layers that get adapters: a module matches when its dotted name equals a listed name or ends in .name.",
    )
    recompute: bool = _key(
        False,
        "Recompute each decoder layer's activations in the backward pass instead of storing them: the update's peak memory stops growing "
        "with the sequence length, for one more forward per layer (bench/RESULTS.md, training-phase memory).",
    )
    recompute_granularity: str = _key(
        "full",
        "What is recomputed: full (each decoder layer); core_attn and full_attn exist only for paddleformers' MoE models.",
        choices=["full", "full_attn", "core_attn"],
    )
    sharding: str = _key(
        "",
        "stage1: each process keeps the AdamW state of its share of the parameters only (paddle's DygraphShardingOptimizer, ZeRO-1), with "
        "the same update as plain data parallel; empty: every process keeps all of it. stage2 and stage3 are refused (paddle runs them in "
        "GPU builds only; not run here).",
        choices=["", "stage1", "stage2", "stage3"],
    )
    sharding_parallel_degree: int = _key(
        -1,
        "With sharding: the processes that share one copy of the optimizer state; -1 (or the number of processes): all of them; 1: no "
        "sharding. Groups of fewer processes are refused (paddle's sub-groups for them fail over gloo; not run on GPUs).",
    )
    tensor_parallel_degree: int = _key(
        1,
        "Processes splitting each weight matrix: 1 only (paddle's tensor parallel layers run in GPU builds only; not run here).",
    )
    bf16: bool = _key(False, "bfloat16 weights and compute (GPU only).")
    fp16: bool = _key(False, "float16 weights and compute (GPU only).")


def check_optimizer_and_schedule(c: Optimisation) -> None:
    check(c.learning_rate >= 0, f"learning_rate = {c.learning_rate}: must be >= 0")
    check(
        0 <= c.min_learning_rate <= c.learning_rate,
        f"min_learning_rate ({c.min_learning_rate}) must lie in [0, learning_rate ({c.learning_rate})]",
    )
    check(0 <= c.warmup_ratio < 1, f"warmup_ratio = {c.warmup_ratio}: must lie in [0, 1)")
    check(c.warmup_steps >= 0, f"warmup_steps = {c.warmup_steps}: must be >= 0")
    check(not (c.warmup_ratio > 0 and c.warmup_steps > 0), "give warmup_ratio or warmup_steps, not both")
    check(0 <= c.adam_beta1 < 1 and 0 <= c.adam_beta2 < 1, "adam_beta1 and adam_beta2 must lie in [0, 1)")
    check(c.adam_epsilon > 0, f"adam_epsilon = {c.adam_epsilon}: must be > 0 (AdamW divides by sqrt(v) + epsilon)")
    check(c.weight_decay >= 0 and c.max_grad_norm >= 0, "weight_decay and max_grad_norm must be >= 0")
    check(
        c.max_steps > 0 or (c.max_steps == -1 and c.num_train_epochs > 0),
        "set max_steps > 0, or max_steps = -1 with num_train_epochs > 0",
    )
    check(c.max_train_minutes >= 0, f"max_train_minutes = {c.max_train_minutes}: must be >= 0 (0: no limit)")
    check(c.seed >= 0, f"seed = {c.seed}: must be >= 0")
    check(c.max_consecutive_skips >= 1, f"max_consecutive_skips = {c.max_consecutive_skips}: must be at least 1")
    check(c.logprob_chunk_tokens >= 1, f"logprob_chunk_tokens = {c.logprob_chunk_tokens}: must be at least 1")
    for key in ("micro_batch_token_budget", "logprob_token_budget"):
        value = getattr(c, key)
        check(value is None or value >= 0, f"{key} = {value}: must be at least 0 (0: no token budget) or null (derived from memory)")
    check(
        c.memory_limit_gb is None or c.memory_limit_gb >= 0,
        f"memory_limit_gb = {c.memory_limit_gb}: must be at least 0 (0: no check) or null (the memory available at start)",
    )


def check_memory_and_parallelism(c: Optimisation) -> None:
    check(
        not c.recompute or c.recompute_granularity == "full",
        f"recompute_granularity = {c.recompute_granularity}: paddleformers 1.0.0 recomputes Qwen2, Qwen3 and Llama "
        f"layer by layer only (full); core_attn and full_attn exist only for its MoE models",
    )
    check(
        c.sharding not in ("stage2", "stage3"),
        f"sharding = '{c.sharding}': not supported; paddle's group-sharded stage2 and stage3 run only in its GPU builds "
        f"and this trainer has not been run on a GPU; stage1 shards the optimizer state (the largest part)",
    )
    check(
        c.sharding_parallel_degree == -1 or c.sharding_parallel_degree >= 1,
        f"sharding_parallel_degree = {c.sharding_parallel_degree}: must be -1 (all processes) or at least 1",
    )
    check(
        c.sharding or c.sharding_parallel_degree in (-1, 1),
        f"sharding_parallel_degree = {c.sharding_parallel_degree} without sharding: set sharding to stage1",
    )
    check(
        c.tensor_parallel_degree == 1,
        f"tensor_parallel_degree = {c.tensor_parallel_degree}: not supported; paddle's tensor-parallel layers run only in "
        f"its GPU builds and this trainer has not been run on a GPU; scale out with data parallel (and sharding: stage1)",
    )


def check_lora(c: Optimisation) -> None:
    check(
        c.lora_rank >= 1 and c.lora_alpha > 0,
        f"lora_rank = {c.lora_rank}, lora_alpha = {c.lora_alpha}: the rank must be at least 1 and alpha > 0",
    )
    check(0 <= c.lora_dropout < 1, f"lora_dropout = {c.lora_dropout}: must lie in [0, 1)")
    check(not c.lora or len(c.target_modules) > 0, "lora is true but target_modules is empty")
