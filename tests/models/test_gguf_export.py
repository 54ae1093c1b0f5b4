"""GGUF out (alignment/models/gguf_export.py, python -m alignment.export CHECKPOINT OUT.gguf --format gguf): a checkpoint of
the bundled tiny model exported in f32, f16, bf16 and q8_0 and imported back (alignment/models/gguf_import.py) gives the weights, config,
special tokens, chat template and tokenization back (f32 exactly, f16 / bf16 / q8_0 as their rounding); a random Llama and
Qwen3 round-trip through the q/k permutation and the per-head norms; a LoRA checkpoint is merged first. llama.cpp's greedy
continuations of the exported files are tests/references/test_llama_cpp.py's."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file
from helpers.model_files import TINY
from helpers.gguf_files import prompts, random_model
from helpers.tiny_models import LLAMA3_ROPE

from alignment.basics.errors import ExportError, GGUFExportError
from alignment.export import export_gguf
from alignment.models.gguf_import import import_gguf
from alignment.merge_lora import merge_lora
from alignment.models.gguf_export import PROBES
from alignment.models.lora import apply_lora, lora_layers
from alignment.models.modeling import load_causal_lm, load_tokenizer, save_model
from alignment.config.schema import GRPOConfig
from alignment.storage.checkpoint import CheckpointContents, save_checkpoint

REPO = Path(__file__).resolve().parents[2]
CONFIG_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings")


def test_f32_export_imports_back_exactly(tiny_checkpoint, tmp_path):
    """Through the command: every weight bit for bit, the config, bos / eos / pad, the chat template, and the same ids
    for the probe texts and the task's prompts (tokenizer.ggml.pre chosen by probing: gpt-2 for tiny's digit split)."""
    command = [sys.executable, "-m", "alignment.export", str(tiny_checkpoint), str(tmp_path / "tiny.gguf"), "--format", "gguf"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{tmp_path / 'tiny.gguf'}: qwen2, f32, tokenizer.ggml.pre gpt-2\n" and done.stderr == ""
    back = import_gguf(tmp_path / "tiny.gguf", tmp_path / "back")
    original, imported = load_file(str(tiny_checkpoint / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert set(imported) == set(original) - {"lm_head.weight"}  # tied: no output tensor
    for name, weight in imported.items():
        np.testing.assert_array_equal(weight, original[name], err_msg=name)
    config, config_back = (json.loads((folder / "config.json").read_text()) for folder in (tiny_checkpoint, back))
    assert {k: config_back[k] for k in CONFIG_KEYS} == {k: config[k] for k in CONFIG_KEYS}
    assert config_back["rope_theta"] == config["rope_theta"]
    assert np.float32(config_back["rms_norm_eps"]) == np.float32(config["rms_norm_eps"])  # GGUF holds it as a float32
    tokenizer, tokenizer_back = load_tokenizer(str(tiny_checkpoint)), load_tokenizer(str(back))
    special = ("bos_token", "eos_token", "pad_token", "chat_template")
    assert {k: getattr(tokenizer_back, k) for k in special} == {
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": tokenizer.chat_template,
    }
    for text in PROBES + [tokenizer.decode(ids) for ids in prompts(tokenizer)]:
        assert tokenizer_back(text, add_special_tokens=False)["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"], text


def bf16_rounded(w: np.ndarray) -> np.ndarray:
    """w rounded to bfloat16 (8 significant bits) to the nearest, ties to even, in float64: frexp's mantissa in [0.5, 1)
    times 2^8, rounded by np.rint (ties to even); exact for the normal numbers that weights are."""
    mantissa, exponent = np.frexp(w.astype(np.float64))
    return np.ldexp(np.rint(mantissa * 2.0**8), exponent - 8).astype(np.float32)


@pytest.mark.parametrize("outtype,qtype", [("f16", Q.F16), ("bf16", Q.BF16), ("q8_0", Q.Q8_0)])
def test_f16_bf16_and_q8_0_exports_hold_the_rounded_weights(tiny_checkpoint, outtype, qtype, tmp_path):
    """Matrices rounded once: to fp16 (within 2^-11 of each value), to bf16 (the float64 rounding to 8 significant bits,
    ties to even, as ggml's fp32 -> bf16 rounds; within 2^-8 of each value), or to Q8_0 blocks of 32 (within half a step,
    the block's largest magnitude / 127, plus the fp16 rounding of that step); norms and biases stay fp32."""
    assert export_gguf(tiny_checkpoint, tmp_path / "tiny.gguf", outtype)["outtype"] == outtype
    imported = load_file(str(import_gguf(tmp_path / "tiny.gguf", tmp_path / "back") / "model.safetensors"))
    original = load_file(str(tiny_checkpoint / "model.safetensors"))
    for name, weight in imported.items():
        w = original[name]
        if w.ndim == 1:
            np.testing.assert_array_equal(weight, w, err_msg=name)
            continue
        np.testing.assert_array_equal(weight, dequantize(quantize(w, qtype), qtype).reshape(w.shape), err_msg=name)
        if qtype == Q.BF16:
            np.testing.assert_array_equal(weight, bf16_rounded(w), err_msg=name)
            assert np.all(np.abs(weight - w) <= np.abs(w) * 2.0**-8), name
            continue
        blocks = np.abs(w).reshape(w.shape[0], -1, 32)
        bound = blocks.max(axis=-1, keepdims=True) / 127 / 2 + blocks * 2.0**-10 if qtype == Q.Q8_0 else blocks * 2.0**-11 + 2.0**-25
        assert np.all(np.abs(weight - w).reshape(bound.shape) <= bound), name


@pytest.mark.parametrize("arch", ["llama", "qwen3", "llama3"])
def test_random_llama_and_qwen3_round_trip(arch, tmp_path):
    """llama: q/k rows permuted on the way out and back on the way in; qwen3: per-head q/k norms, head size 32 with
    hidden / heads 16 (attention.key_length and value_length written); llama3: its rope scaling as rope_freqs.weight and
    the original context, read back into config.json."""
    folder = tmp_path / arch
    save_model(random_model(arch), str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).write_bytes((TINY / name).read_bytes())
    export_gguf(folder, tmp_path / "model.gguf")
    back = import_gguf(tmp_path / "model.gguf", tmp_path / "back")
    original, imported = load_file(str(folder / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert set(original) - set(imported) <= {"lm_head.weight"}
    for name, weight in imported.items():
        np.testing.assert_array_equal(weight, original[name], err_msg=name)
    assert (
        json.loads((back / "config.json").read_text())["head_dim"]
        == json.loads((folder / "config.json").read_text()).get("head_dim", 16)
    )
    assert json.loads((back / "config.json").read_text())["rope_scaling"] == (LLAMA3_ROPE if arch == "llama3" else None)


def test_lora_checkpoint_is_merged_first(tmp_path):
    """The exported file holds base + adapter, as python -m alignment.merge_lora writes them."""
    paddle.seed(5)
    model = apply_lora(load_causal_lm(str(TINY)), 4, 8.0, 0.0, ["q_proj", "v_proj", "down_proj"])
    for layer in lora_layers(model).values():
        layer.lora_B.set_value(paddle.randn(layer.lora_B.shape) * 0.5)
    run_config = GRPOConfig(actor_model_name_or_path=str(TINY)).to_json()
    path = save_checkpoint(str(tmp_path / "run"), 1, CheckpointContents(model, load_tokenizer(str(TINY)), {}, run_config, {}), None)
    export_gguf(path, tmp_path / "out" / "merged.gguf")
    merge_lora(path, tmp_path / "merged", dtype="float32")
    imported = load_file(str(import_gguf(tmp_path / "out" / "merged.gguf", tmp_path / "back") / "model.safetensors"))
    merged, base = load_file(str(tmp_path / "merged" / "model.safetensors")), load_file(str(TINY / "model.safetensors"))
    for name, weight in imported.items():
        np.testing.assert_array_equal(weight, merged[name], err_msg=name)
    assert not np.array_equal(imported["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["merged.gguf"]  # the merged folder is gone


def test_refusals_name_the_file(tiny_checkpoint, tmp_path):
    (tmp_path / "taken.gguf").write_text("")
    with pytest.raises(ExportError, match=r"taken.gguf: exists \(pass --overwrite to replace it\)"):
        export_gguf(tiny_checkpoint, tmp_path / "taken.gguf")
    with pytest.raises(ExportError, match=r": is a folder; --format gguf writes one file"):
        export_gguf(tiny_checkpoint, tmp_path)
    gemma = tmp_path / "gemma"
    gemma.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (gemma / name).write_bytes((tiny_checkpoint / name).read_bytes())
    (gemma / "config.json").write_text(json.dumps({**json.loads((tiny_checkpoint / "config.json").read_text()), "model_type": "gemma"}))
    with pytest.raises(GGUFExportError, match=r"gemma/config.json: model_type is 'gemma'; the GGUF export writes llama, qwen2, qwen3"):
        export_gguf(gemma, tmp_path / "gemma.gguf")
    assert not list(tmp_path.glob("*gemma.gguf*"))  # nothing half-written
    (gemma / "config.json").write_text(json.dumps({**json.loads((tiny_checkpoint / "config.json").read_text()), "rope_scaling": LLAMA3_ROPE}))
    with pytest.raises(
        GGUFExportError,
        match=r"gemma/config.json: rope_scaling .* \(scaled rotary positions\): not supported; "
        r"the export writes llama3 scaling of llama models",
    ):
        export_gguf(gemma, tmp_path / "gemma.gguf")  # llama3 scaling on a qwen2 model
    done = subprocess.run([sys.executable, "-m", "alignment.export", str(tmp_path / "none"), str(tmp_path / "x.gguf"), "--format", "gguf"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stderr == f"export: error: {tmp_path / 'none'}: no such folder\n"
