"""GGUF files the tests write with the product's writer (alignment/models/gguf_export.py) from a model folder in Hugging
Face layout, in any type the gguf package quantizes to: the random small models they hold, a SentencePiece vocabulary as
convert_hf_to_gguf.py writes one, an F32 copy of a file; the texts and prompts the GGUF tests run, and llama.cpp's token
ids for the real SmolLM2-135M-Instruct."""

import json
from pathlib import Path

import gguf
import numpy as np
import paddle
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from helpers.model_files import TINY
from helpers.tiny_models import LLAMA3_ROPE
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from safetensors.numpy import load_file

from alignment.basics.data import encode_messages
from alignment.models.gguf_export import add_hyperparameters, add_tensors, add_tokenizer, encoded, finish
from alignment.models.modeling import load_causal_lm

REPO = Path(__file__).resolve().parents[2]


def write_tokenizer(writer, tokenizer_dir: Path, pre: str) -> None:
    """tiny-qwen2's byte-level BPE vocabulary (bos <|endoftext|> from its config.json, eos <|im_end|>, its chat template)
    under the pre-tokenizer named `pre`."""
    add_tokenizer(writer, tokenizer_dir, json.loads((tokenizer_dir / "config.json").read_text()), pre)


def write_gguf(model_dir: Path, path: Path, qtype: Q, pre: str = "qwen2", vocabulary=None) -> dict:
    """model_dir (Hugging Face layout) -> path (.gguf): linear weights in qtype, norms and biases F32, q/k rows permuted
    for llama; tiny-qwen2's vocabulary with pre-tokenizer `pre`, or what vocabulary(writer) writes.
    -> {Hugging Face name: the fp32 weight the file holds}, what an import must give back."""
    config = json.loads((model_dir / "config.json").read_text())
    weights = {name: w.astype(np.float32) for name, w in load_file(str(model_dir / "model.safetensors")).items()}
    writer = gguf.GGUFWriter(str(path), config["model_type"])
    add_hyperparameters(writer, config)
    (vocabulary or (lambda w: write_tokenizer(w, TINY, pre)))(writer)
    add_tensors(writer, config, weights, qtype)
    finish(writer)
    # the same before or after permuting, which moves whole rows (blocks lie along rows); a tied model has no output tensor
    kept = {name: w for name, w in weights.items() if not (name == "lm_head.weight" and config["tie_word_embeddings"])}
    return {name: dequantize(*encoded(w, qtype)).reshape(w.shape) for name, w in kept.items()}


SHAPE = dict(vocab_size=451, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, rms_norm_eps=1e-6)


def random_model(arch: str):
    """A random small model of each architecture: Llama untied (its q/k rows are the ones llama.cpp permutes), Llama 3
    ("llama3") tied with llama3 rope scaling, Qwen2 tied with non-zero q/k/v biases, Qwen3 tied with per-head q/k norms
    that are not all ones."""
    paddle.seed({"llama": 21, "qwen2": 22, "qwen3": 23, "llama3": 24}[arch])
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, rope_theta=10000.0, **SHAPE))
    if arch == "llama3":
        return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, rope_theta=10000.0, rope_scaling=dict(LLAMA3_ROPE), **SHAPE))
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, rope_theta=10000.0, **SHAPE))
        biases = [
            p
            for layer in model.model.layers
            for p in (layer.self_attn.q_proj.bias, layer.self_attn.k_proj.bias, layer.self_attn.v_proj.bias)
        ]
    else:
        model = Qwen3ForCausalLM(Qwen3Config(tie_word_embeddings=True, head_dim=32, rope_theta=10000.0, **SHAPE))
        biases = [p for layer in model.model.layers for p in (layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight)]
    for p in biases:
        p.set_value(p + paddle.randn(p.shape) * 0.1)
    return model


TEXTS = [[1, 77, 301, 12, 5, 9, 450, 33, 2, 64], [1, 200, 201, 202, 203, 204, 205, 206, 207, 208]]


def logits(folder: Path) -> np.ndarray:  # (2, 10, V)
    model = load_causal_lm(str(folder))
    model.eval()
    with paddle.no_grad():
        return model(paddle.to_tensor(TEXTS), return_dict=True).logits.astype("float32").numpy()


def dequantized_copy(source: Path, path: Path, drop: tuple = (), replace: dict | None = None) -> Path:
    """source with every tensor in F32 (those named in replace: its arrays), its metadata as is (less the keys in drop):
    what llama.cpp computes in fp32 throughout (on a quantized file its CPU kernels quantize the activations too, to Q8_1
    against Q4_1 weights)."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name not in ("general.architecture", "general.file_type", *drop):
            writer.add_key_value(name, field.contents(), field.types[0], field.types[1] if len(field.types) > 1 else None)
    for tensor in reader.tensors:
        weight = dequantize(tensor.data, tensor.tensor_type).reshape([int(n) for n in reversed(tensor.shape)])
        writer.add_tensor(tensor.name, (replace or {}).get(tensor.name, weight), raw_dtype=Q.F32)
    finish(writer)
    return path


def write_sentencepiece(writer, sp) -> None:
    """A SentencePiece vocabulary as convert_hf_to_gguf.py writes one (tokenizer.ggml.model llama)."""
    kinds = [
        gguf.TokenType.UNKNOWN if sp.is_unknown(i) else gguf.TokenType.CONTROL if sp.is_control(i)
        else gguf.TokenType.UNUSED if sp.is_unused(i) else gguf.TokenType.BYTE if sp.is_byte(i) else gguf.TokenType.NORMAL
        for i in range(sp.get_piece_size())
    ]
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    writer.add_token_scores([sp.get_score(i) for i in range(sp.get_piece_size())])
    writer.add_token_types(kinds)
    writer.add_add_space_prefix(True)
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


SPM_STRINGS = [
    "Hello world, the reward server and the trainer",
    "  two leading spaces, three   inside and a trailing one ",
    "digits 1234567 and 3.14",
    "line one\nline two\n\n\tindented",
    "unseen: Привет, 日本語, 🙂 and ü",
]


# Token ids from llama.cpp's own tokenizer on the same GGUF (llama-cpp-python 0.3.36: Llama.tokenize(text.encode(),
# add_bos=False, special=True)): digits one by one, unicode, whitespace runs, chat markup. test_tokenizer_equals_llama_cpp
# recomputes them where llama-cpp-python is installed.
SMOLLM2_TOKENS = {
    "Hello world! 123 4567 89012":
        [19556, 905, 17, 216, 33, 34, 35, 216, 36, 37, 38, 39, 216, 40, 41, 32, 33, 34],
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face":
        [2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182],
    "  multiple   spaces\n\n\ttabs \n":
        [216, 2701, 256, 5600, 1116, 197, 100, 7366, 3717],
    "Café déjà vu — naïve façade, 日本語 and 🙂 emoji":
        [51, 1939, 2756, 32564, 90, 16739, 386, 101, 1841, 15486, 46494, 40852, 28, 17097, 241, 115, 40993, 179, 120, 248, 284,
         47526, 649, 33777],
    "I'm sure we'LL see: don't, can't, he's":
        [57, 5248, 2090, 392, 23, 16421, 963, 42, 1326, 982, 28, 416, 982, 28, 384, 506],
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 12+34?<|im_end|>\n<|im_start|>assistant\n":
        [1, 9690, 198, 2683, 359, 5356, 30, 2, 198, 1, 4093, 198, 1780, 314, 216, 33, 34, 27, 35, 36, 47, 2, 198, 1, 520, 9531, 198],
    "x\r\ny  \n  z\n\n\n":
        [104, 201, 198, 105, 256, 3805, 1892, 16506],
    "3.14159 x 2^10 = 1024; -42, +7, 1,000,000 and 0.5%":
        [35, 30, 33, 36, 33, 37, 41, 1792, 216, 34, 78, 33, 32, 446, 216, 33, 32, 34, 36, 43, 731, 36, 34, 28, 1232, 39, 28, 216, 33, 28,
         32, 32, 32, 28, 32, 32, 32, 284, 216, 32, 30, 37, 21],
    "def f(x):\n    return x ** 2  # square\n":
        [1604, 275, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34, 216, 907, 5222, 198],
    "Ünïcödé ÀÉÎÕÜ ß ﬁ Ωμέγα Привет мир مرحبا नमस्ते":
        [142, 246, 94, 25972, 83, 7466, 84, 2756, 5549, 218, 39614, 142, 232, 142, 239, 142, 246, 5549, 249, 40367, 5664, 119, 16674,
         34075, 23098, 8998, 5470, 249, 46879, 16464, 32547, 41337, 7872, 9175, 36395, 20602, 44626, 31462, 10805, 12335, 118, 35090,
         38770, 16525, 26293, 30581],
    "a\u00a0b\u2003c\u200bd":
        [81, 15442, 82, 321, 221, 83, 321, 229, 84],
    "<reasoning>\nFirst, 17 * 23 = 391.\n</reasoning>\n<answer>\n391\n</answer>":
        [44, 23759, 274, 46, 198, 5345, 28, 216, 33, 39, 1672, 216, 34, 35, 446, 216, 35, 41, 33, 30, 198, 9617, 23759, 274, 46, 198,
         44, 11247, 46, 198, 35, 41, 33, 198, 9617, 11247, 46],
    "   leading and trailing   ":
        [256, 2899, 284, 35079, 333],
    "<|endoftext|>text<|im_end|><|im_start|>":
        [0, 2692, 2, 1],
    "١٢٣ ４５６ ⅻ ½ ²":
        [164, 111, 164, 112, 164, 113, 216, 8083, 238, 8083, 239, 8083, 240, 216, 173, 223, 136, 216, 16738, 216, 19133],
}


def prompts(tokenizer, count: int = 8) -> list:
    """The first held-out arithmetic questions, as the trainer prompts them (chat template, no system prompt)."""
    rows = [json.loads(line) for line in (REPO / "data" / "arith" / "test.jsonl").read_text().splitlines()[:count]]
    return [encode_messages(({"role": "user", "content": row["src"]},), tokenizer, "") for row in rows]
