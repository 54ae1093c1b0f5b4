"""The PyTorch side of tests/references/test_hf_interop.py, run with the interpreter named by GRPO_TORCH_PYTHON.

    hf_side.py save qwen2|llama OUT_DIR TOKENIZER_DIR   a random transformers model + that tokenizer, safetensors
    hf_side.py forward MODEL_DIR INPUTS.npz OUT.npz TEXT
        loads MODEL_DIR with AutoModelForCausalLM and AutoTokenizer, writes the fp32 logits for INPUTS'
        input_ids / attention_mask / position_ids (B, L) as OUT's "logits" (B, L, V), and prints as JSON
        the tokenizer's ids for TEXT and for TEXT as a user turn through the chat template.
    hf_side.py gguf MODEL.gguf INPUTS.npz OUT.npz
        loads MODEL.gguf with transformers' own GGUF loader (from_pretrained(folder, gguf_file=name)), writes the fp32
        logits as forward does, and prints as JSON the eos its tokenizer, config and generation config name and the
        sha256 of every weight it loaded (fp32 bytes).
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

# Vocabulary above the bundled tokenizer's 451 (rows no token uses, as real checkpoints pad theirs).
# Every shape has a square q_proj / o_proj (a missing transpose there loads silently wrong, so only the
# logits catch it) and non-square k/v and MLP projections (a missing transpose there fails on shape).
TOKENS = dict(vocab_size=480, bos_token_id=0, eos_token_id=2, pad_token_id=0, max_position_embeddings=256)
BUILDERS = {
    # Qwen2.5's layout: tied embeddings, q/k/v biases, 6 query heads sharing 2 KV heads (head_dim 16).
    "qwen2": lambda: Qwen2ForCausalLM(
        Qwen2Config(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                    num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6, **TOKENS)
    ),
    # Llama 3's layout: untied lm_head, no biases, 8 query heads sharing 2 KV heads (head_dim 16).
    "llama": lambda: LlamaForCausalLM(
        LlamaConfig(hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=2, tie_word_embeddings=False, rope_theta=5e5, rms_norm_eps=1e-5, **TOKENS)
    ),
}


def save(arch: str, out_dir: str, tokenizer_dir: str) -> None:
    torch.manual_seed(0)
    model = BUILDERS[arch]()
    # transformers initialises biases to 0 and norms to 1, which would hide a bias or norm that fails to
    # load; random values everywhere make every tensor count in the logits (std about 1).
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.1 + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)


def write_logits(model, inputs_path: str, out_path: str) -> None:
    inputs = {k: torch.from_numpy(v) for k, v in np.load(inputs_path).items()}
    with torch.no_grad():
        logits = model(**inputs).logits  # (B, L, V)
    np.savez(out_path, logits=logits.float().numpy())


def forward(model_dir: str, inputs_path: str, out_path: str, text: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    write_logits(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), inputs_path, out_path)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    print(json.dumps({"text_ids": tokenizer(text).input_ids, "chat_ids": list(chat)}))


def gguf(gguf_path: str, inputs_path: str, out_path: str) -> None:
    folder, name = str(Path(gguf_path).parent), Path(gguf_path).name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    write_logits(model, inputs_path, out_path)
    eos = {"tokenizer": [tokenizer.eos_token, tokenizer.eos_token_id], "config": model.config.eos_token_id,
           "generation_config": model.generation_config.eos_token_id}
    weights = {name: hashlib.sha256(t.float().contiguous().numpy().tobytes()).hexdigest() for name, t in model.state_dict().items()}
    print(json.dumps({"eos": eos, "weights": weights}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"save": save, "forward": forward, "gguf": gguf}[command](*args)
