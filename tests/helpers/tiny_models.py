"""Small random Qwen2, Llama and Qwen3 models for engine tests: grouped KV heads, tied and untied embeddings; a
smaller Qwen2 for the trainer's phases and checkpoints; a small random Qwen2 reward model (a sequence classifier) saved
with the bundled tokenizer; a model folder gone bad, for the NaN tests; and two prompts' sampled groups, for the update's
tests."""

import shutil
from pathlib import Path

import numpy as np
import paddle
from helpers.model_files import TINY
from paddleformers.transformers import (
    LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen3Config, Qwen3ForCausalLM,
)
from safetensors.numpy import load_file, save_file

from alignment.basics.data import EncodedPrompt, PromptRecord
from alignment.models.modeling import load_tokenizer
from alignment.rollout import EagerEngine, SamplingParams

PAD, VOCAB = 0, 97
SHAPE = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=256,
)
PROMPTS = [[5, 17, 33, 8, 9, 41, 2], [12, 3], [60, 61, 62, 63, 64]]  # different lengths: left padding in one batch


def qwen2_tied():
    paddle.seed(11)
    model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **SHAPE))
    for layer in model.model.layers:  # Qwen2 initialises its q/k/v biases to zero; make them count
        for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            projection.bias.set_value(paddle.randn(projection.bias.shape) * 0.1)
    return model


def llama_untied():
    paddle.seed(12)
    return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **SHAPE))


# Llama 3.1 / 3.2's rotary scaling with a small original context: at head size 16 and rope_theta 10000 it leaves the
# highest of the 8 frequencies as it is, blends the next and divides the other 6 by the factor.
LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32
}


def llama3_tied():
    """Llama 3.2's layout: tied embeddings, llama3 rope scaling."""
    paddle.seed(15)
    # a copy: the config adds keys to it
    return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, rope_scaling=dict(LLAMA3_ROPE), **SHAPE))


# half the width of SHAPE, q/k/v biases left at zero: the trainer's phases, checkpoints and kernels' scoping
SMALL = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def small_qwen2(vocab_size: int, seed: int, layers: int = 2):
    paddle.seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, num_hidden_layers=layers, **SMALL))


def two_sampled_groups(model_seed: int, sample_seed: int, max_new_tokens: int) -> tuple:
    """Two word problems in the bundled tokenizer's chat template, four completions of each sampled (temperature 1) by a
    small random Qwen2 on the eager engine -> (tokenizer, model, EncodedPrompts, Rollout of 8 rows)."""
    tokenizer = load_tokenizer("data/tiny-qwen2")
    model = small_qwen2(vocab_size=len(tokenizer), seed=model_seed)
    prompts = []
    for question in ("Mia has 3 apples.", "Leo has 4 coins. He finds 3 more."):
        messages = [{"role": "user", "content": question}]
        ids = tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        prompts.append(EncodedPrompt(PromptRecord(tuple(messages), "7"), ids))
    paddle.seed(sample_seed)
    rollout = EagerEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id).generate(
        [p.ids for p in prompts], 4, SamplingParams(max_new_tokens=max_new_tokens)
    )
    return tokenizer, model, prompts, rollout


def qwen3(tied: bool, head_dim: int):
    """Qwen3: per-head q/k RMSNorms (made not all ones, so they count), no q/k/v bias."""
    paddle.seed(13 if tied else 14)
    model = Qwen3ForCausalLM(Qwen3Config(tie_word_embeddings=tied, head_dim=head_dim, **SHAPE))
    for layer in model.model.layers:
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
            norm.weight.set_value(norm.weight + paddle.randn(norm.weight.shape) * 0.3)
    return model


def qwen3_tied():
    return qwen3(tied=True, head_dim=32)  # a head size that is not hidden / heads, as the real Qwen3s have


def qwen3_untied():
    return qwen3(tied=False, head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"])


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def tiny_classifier(num_labels: int = 1) -> Qwen2ForSequenceClassification:
    paddle.seed(5)
    config = Qwen2Config(**(SHAPE | {"vocab_size": 451}), num_labels=num_labels, pad_token_id=0)
    model = Qwen2ForSequenceClassification(config)
    for layer in model.model.layers:  # Qwen2 initialises its q/k/v biases to zero; make them count
        for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            projection.bias.set_value(paddle.randn(projection.bias.shape) * 0.1)
    return model


def save_with_tokenizer(model, folder, chat_template: bool = True):
    model.save_pretrained(str(folder), save_checkpoint_format="unified_checkpoint")
    for name in TOKENIZER_FILES:
        if chat_template or name != "chat_template.jinja":
            shutil.copy(TINY / name, folder / name)
    return folder


def put_a_nan_in_the_final_norm(folder: Path) -> None:
    """A model folder gone bad: its final norm's first weight becomes NaN."""
    weights = load_file(str(folder / "model.safetensors"))
    weights[next(n for n in weights if n.endswith("model.norm.weight"))][0] = np.nan
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "np"})
