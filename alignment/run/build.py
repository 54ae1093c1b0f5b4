"""Building a run's parts: the actor, its rollout engine, the prompts."""



from alignment.models.cpu_bf16 import choose_compute
from alignment.models.fused_train import bf16_unavailable
from alignment.models.lora import apply_lora, load_adapter
from alignment.models.modeling import (
    load_causal_lm,
    stop_token_ids,
)
from alignment.rewards.registry import reference_readers
from alignment.rollout import SamplingParams, build_engine
from alignment.rollout.multi_turn import tool_schemas, with_environment
from alignment.run.config import GRPOConfig
from alignment.run.data import encode_prompts, read_prompt_records
from alignment.run.plugins import plugin_sources


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
        apply_lora(model, config.lora_rank, config.lora_alpha, config.lora_dropout, config.target_modules)
        if adapter_folder:
            load_adapter(model, adapter_folder)
    return model


def matmul_compute(config: GRPOConfig, model):
    """cpu_bf16_matmul's choice for this model on this machine (alignment/models/cpu_bf16.py)."""
    on_gpu = not model.lm_head.weight.place.is_cpu_place()
    return choose_compute(config.cpu_bf16_matmul, on_gpu, bf16_unavailable(model, config.use_fused_train_ops))


def rollout_engine(config: GRPOConfig, model, tokenizer, bf16: bool):
    """The engine that generates (use_fusemt picks the fused one), with the environment of a multi-turn run."""
    engine = build_engine(config, model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, bf16)
    return with_environment(engine, config, tokenizer, plugin_sources(config.external_plugins))


def model_dtype(config: GRPOConfig) -> str:
    return "bfloat16" if config.bf16 else "float16" if config.fp16 else "float32"


def load_prompts(paths: str, tokenizer, config: GRPOConfig):
    # Rows the rewards (or the accuracy metric) could not score for want of a reference are refused here,
    # before any model loads, not found one failed reward at a time.
    readers = reference_readers(config.reward_functions)
    needed_by = f"reward function {readers[0]}" if readers else None
    if needed_by is None and reference_readers([config.accuracy_function]):
        needed_by = f"accuracy_function {config.accuracy_function}; name one there that reads none"
    records = read_prompt_records(paths, config.prompt_key, config.response_key, config.skip_bad_rows, needed_by)
    return encode_prompts(records, tokenizer, config.max_prompt_len, config.prompt_truncation, config.system_prompt, tool_schemas(config))


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
