"""Rollout: how completions are sampled, in what batches, by which engine and in which processes."""

from dataclasses import dataclass
from typing import Optional

from alignment.config.checks import check
from alignment.config.sections import _key


@dataclass(frozen=True)
class Rollout:
    TITLE = "Rollout"

    rollout_n: int = _key(8, "Completions sampled per prompt (the group size G).")
    per_device_prompt_batch_size: Optional[int] = _key(
        None,
        "Prompts per process per step; default 8, or derived from gradient_accumulation_steps.",
    )
    per_device_train_batch_size: int = _key(8, "Sequences per forward/backward micro-batch.")
    gradient_accumulation_steps: Optional[int] = _key(None, "Micro-batches per optimizer step; derived when not given, checked when given.")
    temperature: float = _key(1.0, "Sampling temperature; log-probs are those of softmax(logits / temperature).")
    top_p: float = _key(1.0, "Nucleus sampling mass (1.0: off).")
    top_k: int = _key(0, "Sample among the k most likely tokens (0: off).")
    repetition_penalty: float = _key(1.0, "CTRL-style penalty on tokens already present (1.0: off).")
    min_p: float = _key(0.0, "Drop tokens less likely than min_p x the most likely one (0: off).")
    use_fusemt: bool = _key(False, "Generate with the fused engine built from csrc/ (make ops); eager when the operators are not built.")
    use_fused_train_ops: bool = _key(
        False,
        "Run the actor's forward and backward through the compiled csrc/ training operators (RMSNorm, rotary q|k|v, attention softmax, "
        "SwiGLU with backward kernels; CPU, float32 Qwen2 / Llama / Qwen3); paddle's own kernels, with a warning, where they cannot run.",
    )
    cpu_bf16_matmul: str = _key(
        "auto",
        "CPU runs: the matmuls of the actor's projections, attention and log-prob head in bfloat16 with float32 accumulation, master "
        "weights, gradients and AdamW in float32 (csrc/grpo_bf16.cc, paddle's oneDNN; needs use_fused_train_ops). auto: on where the CPU "
        "has AMX or AVX512-BF16 (the run's first line says which); off: float32 as before; on: bf16, an error where it cannot run. GPU "
        "runs use the bf16 key instead.",
        choices=["auto", "on", "off"],
    )
    kv_cache_dtype: str = _key(
        "auto",
        "The fused engine's KV cache on the CPU (vLLM's name): auto (bfloat16 where the CPU matmuls run in bf16, cpu_bf16_matmul; else "
        "float32), float32, or bfloat16 (keys and values computed in float32 and rounded when written: half the cache's memory and of "
        "what decode's attention reads; with bf16 matmuls the actor's attention rounds keys and values alike, and the rollout's "
        "log-probs differ from the actor's by 0.011 a token on average on SmolLM2-135M, bench/RESULTS.md). bfloat16 needs use_fusemt.",
        choices=["auto", "float32", "bfloat16"],
    )
    rollout_workers: int = _key(
        0,
        "Processes that only generate, beside one training process under the same launch (python -m paddle.distributed.launch "
        "--nproc_per_node 1+N): each holds its own copy of the weights in its rollout engine and generates its share of every step's "
        "completions; after every optimizer step the trainer sends the new weights (a broadcast over the launcher's collective: gloo on "
        "CPU, NCCL on GPU) and the engine's weight-sync check runs on the receiving side. 0: the training processes generate (colocated).",
    )
    async_generate: bool = _key(
        False,
        "With rollout_workers: one step off (ms-swift's name): step s+1's completions are generated while step s trains, from weights one "
        "optimizer step old (metric rollout/staleness), which the importance-sampling correction accounts for; a checkpoint holds the "
        "rollout in flight, so a resume is exact. false: the trainer waits for completions of its current weights, and the run equals a "
        "colocated one.",
    )
    weight_sync_tolerance: Optional[float] = _key(
        None,
        "Largest |log-prob difference| allowed between the fused engine and the actor on its probe after each weight refresh; default 1e-4 "
        "with float32 matmuls, 0.25 with bf16 ones or a bfloat16 kv_cache_dtype (the gap is rounding there, and stale bf16 weight copies "
        "are caught exactly instead).",
    )


def check_sampling(c: Rollout) -> None:
    check(c.temperature > 0, f"temperature = {c.temperature}: must be > 0")
    check(0 < c.top_p <= 1, f"top_p = {c.top_p}: must lie in (0, 1]")
    check(c.top_k >= 0, f"top_k = {c.top_k}: must be >= 0 (0 turns it off)")
    check(c.repetition_penalty > 0, f"repetition_penalty = {c.repetition_penalty}: must be > 0")
    check(0 <= c.min_p < 1, f"min_p = {c.min_p}: must lie in [0, 1) (0 turns it off)")
    check(
        c.weight_sync_tolerance is None or c.weight_sync_tolerance > 0,
        f"weight_sync_tolerance = {c.weight_sync_tolerance}: must be > 0",
    )
