"""Rollout engines behind one interface (base.RolloutEngine): given prompts, sample G completions each
and return a Rollout with token ids, the sampling log-probs, and finish reasons."""

import warnings
from dataclasses import dataclass
from typing import Optional

from alignment.rollout.base import Rollout, RolloutEngine, SamplingParams, concat_rollouts
from alignment.rollout.eager import EagerEngine


@dataclass(frozen=True)
class EngineSettings:
    fused: bool  # use_fusemt
    weight_sync_tolerance: Optional[float] = None  # the fused engine's check against the actor after each sync (None: its default)
    kv_cache_dtype: str = "auto"  # the fused engine's cache: float32, bfloat16, or auto (bfloat16 with bf16 matmuls)


def cache_dtype_for(kv_cache_dtype: str, bf16: bool) -> str:
    """The fused engine's KV cache dtype: kv_cache_dtype, where auto is bfloat16 with bf16 matmuls, float32 else."""
    return ("bfloat16" if bf16 else "float32") if kv_cache_dtype == "auto" else kv_cache_dtype


def build_engine(settings: EngineSettings, model, eos_token_ids: list, pad_token_id: int, bf16: bool = False) -> RolloutEngine:
    """use_fusemt picks the fused engine; where its operators are not built or the model is not one it
    runs, a warning says why and the eager engine runs instead. bf16: the fused engine multiplies in bf16
    (cpu_bf16_matmul; the eager engine runs the actor's own modules, bf16 where use_training_ops made them so)."""
    if settings.fused:
        from alignment.rollout.fused import FusedEngine, unsupported_reason
        from alignment.kernels.ops import load_ops

        ops, why_not = load_ops()
        why_not = why_not or unsupported_reason(model)
        if why_not is None:
            cache_dtype = cache_dtype_for(settings.kv_cache_dtype, bf16)
            return FusedEngine(model, eos_token_ids, pad_token_id, ops, settings.weight_sync_tolerance, bf16, cache_dtype)
        warnings.warn(f"use_fusemt: the fused engine cannot run here ({why_not}); generating with the eager engine")
    return EagerEngine(model, eos_token_ids, pad_token_id)


def generate(engine: RolloutEngine, prompts: list, group_size: int, params: SamplingParams) -> Rollout:
    """group_size completions of each EncodedPrompt (alignment/basics/data.py); a multi-turn engine's environment also
    sees each prompt's sample."""
    return engine.generate([p.ids for p in prompts], group_size, params, samples=[p.record.reward_sample() for p in prompts])


__all__ = [
    "EagerEngine",
    "EngineSettings",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
    "cache_dtype_for",
    "concat_rollouts",
    "generate",
]
