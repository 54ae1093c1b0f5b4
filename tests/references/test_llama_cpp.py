"""The GGUF import and export against llama.cpp itself (make test-gguf): the real SmolLM2-135M-Instruct's tokenizer and
fp32 logits, random Llama, Qwen2, Qwen3 and Llama 3 files' logits, a SentencePiece vocabulary, and greedy continuations
of exported files (the tiny model and SmolLM2) equal llama.cpp's. llama-cpp-python lives in its own environment, named
by GRPO_LLAMA_CPP_PYTHON; without it these skip."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import paddle
import pytest
from gguf import GGMLQuantizationType as Q
from helpers.gguf_files import (
    SMOLLM2_TOKENS, SPM_STRINGS, TEXTS, dequantized_copy, logits, prompts, random_model, write_gguf, write_sentencepiece,
)
from helpers.model_files import smollm2_file

from alignment.export import export_gguf
from alignment.models.gguf_import import import_gguf
from alignment.models.modeling import load_causal_lm, load_tokenizer, save_model, stop_token_ids
from alignment.rollout import EagerEngine, SamplingParams

# llama.cpp itself: llama-cpp-python, which compiles llama.cpp from source (about 8 minutes on 2
# cores), lives in its own environment, named by GRPO_LLAMA_CPP_PYTHON; this code runs there.

LLAMA_CPP_SIDE = r"""
import json, sys
import numpy as np
import llama_cpp

task = json.load(sys.stdin)
if task["do"] == "tokenize":
    vocab = llama_cpp.Llama(model_path=task["gguf"], vocab_only=True, verbose=False)
    print(json.dumps([vocab.tokenize(text.encode(), add_bos=False, special=True) for text in task["texts"]]))
else:  # fp32 logits at every position: an F32 file, and an F32 KV cache (llama.cpp's default is F16)
    model = llama_cpp.Llama(model_path=task["gguf"], n_ctx=256, n_batch=256, n_threads=2, logits_all=True, verbose=False,
                            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    rows = []
    for ids in task["ids"]:
        model.reset()
        model.eval(ids)
        rows.append(np.array(model.scores[: len(ids)], dtype=np.float32))  # a copy: the next eval overwrites scores
    np.save(task["out"], np.stack(rows))
"""


def llama_cpp_python() -> str:
    python = os.environ.get("GRPO_LLAMA_CPP_PYTHON")
    if not python:
        pytest.skip("GRPO_LLAMA_CPP_PYTHON is not set: it names a Python with llama-cpp-python (docs/real-models.md)")
    return python


def llama_cpp(task: dict) -> str:
    run = subprocess.run([llama_cpp_python(), "-c", LLAMA_CPP_SIDE], input=json.dumps(task), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def llama_cpp_logits(path: Path, ids: list) -> np.ndarray:  # (rows, positions, V)
    llama_cpp({"do": "logits", "gguf": str(path), "ids": ids, "out": str(path.with_suffix(".npy"))})
    return np.load(path.with_suffix(".npy"))


@pytest.mark.llamacpp
def test_tokenizer_equals_llama_cpp(smollm2):
    texts = list(SMOLLM2_TOKENS)
    assert json.loads(llama_cpp({"do": "tokenize", "gguf": str(smollm2_file()), "texts": texts})) == list(SMOLLM2_TOKENS.values())


@pytest.mark.llamacpp
def test_smollm2_logits_equal_llama_cpp(smollm2, tmp_path):
    """fp32 logits of the imported model = llama.cpp's on the same (dequantized) weights. Measured: largest difference
    1.5e-4 over 2 x 37 positions x 49,152 logits of standard deviation 7.4."""
    llama_cpp_python()  # skips before writing the 540 MB copy where llama.cpp is not available
    ids = [SMOLLM2_TOKENS[text] for text in list(SMOLLM2_TOKENS)[5:7]]
    ids = [ids[0], (ids[1] * 5)[: len(ids[0])]]  # two rows of one length
    expected = llama_cpp_logits(dequantized_copy(smollm2_file(), tmp_path / "f32.gguf"), ids)
    model = load_causal_lm(str(smollm2))
    model.eval()
    with paddle.no_grad():
        got = model(paddle.to_tensor(ids), return_dict=True).logits.astype("float32").numpy()
    assert np.abs(got - expected).max() <= 1e-3


@pytest.mark.llamacpp
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "llama3"])
def test_random_models_logits_equal_llama_cpp(arch, tmp_path):
    """The files this test writes are ones llama.cpp reads as the original models: q/k permutation (llama), q/k/v
    biases (qwen2), per-head q/k norms and a head size that is not hidden / heads (qwen3), rope_freqs.weight (llama3)."""
    model_dir = tmp_path / arch
    save_model(random_model(arch), str(model_dir))
    write_gguf(model_dir, tmp_path / "model.gguf", Q.F32)
    folder = import_gguf(tmp_path / "model.gguf", tmp_path / "imported")
    # measured: 1.2e-6 to 3.7e-6
    np.testing.assert_allclose(logits(folder), llama_cpp_logits(tmp_path / "model.gguf", TEXTS), rtol=0, atol=1e-5)


@pytest.mark.llamacpp
def test_sentencepiece_vocabulary_equals_llama_cpp(sentencepiece_model, tmp_path):
    """Including llama.cpp's ▁ before the text after a special token, and special tokens in the text."""
    model_dir = tmp_path / "model"
    save_model(random_model("llama"), str(model_dir))
    write_gguf(model_dir, tmp_path / "model.gguf", Q.F32, vocabulary=lambda w: write_sentencepiece(w, sentencepiece_model))
    tokenizer = load_tokenizer(str(import_gguf(tmp_path / "model.gguf", tmp_path / "imported")))
    texts = SPM_STRINGS + ["<s>Hello</s> world", "</s>  x", " leading"]
    expected = json.loads(llama_cpp({"do": "tokenize", "gguf": str(tmp_path / "model.gguf"), "texts": texts}))
    assert [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts] == expected


# llama.cpp (llama-cpp-python in the Python GRPO_LLAMA_CPP_PYTHON names): greedy continuations of the exported file.

LLAMA_CPP_GREEDY = (r"""
import json, sys
import numpy as np
import llama_cpp

task = json.load(sys.stdin)
model = llama_cpp.Llama(model_path=task["gguf"], n_ctx=512, n_batch=512, n_threads=2, logits_all=True, verbose=False,"""
                    r"""  # scores filled only with logits_all
                        type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
answers = []
for ids in task["prompts"]:
    model.reset()
    model.eval(ids)
    answer = []
    while len(answer) < task["max_new_tokens"] and (not answer or answer[-1] not in task["stop"]):
        answer.append(int(np.argmax(model.scores[model.n_tokens - 1])))  # greedy: the largest logit
        model.eval(answer[-1:])
    answers.append(answer)
print(json.dumps(answers))
""")


# skipped before any fixture is set up (SmolLM2's import alone takes seconds)
needs_llama_cpp = pytest.mark.skipif(
    not os.environ.get("GRPO_LLAMA_CPP_PYTHON"),
    reason="GRPO_LLAMA_CPP_PYTHON is not set: it names a Python with llama-cpp-python (docs/real-models.md)",
)


def llama_cpp_greedy(path: Path, prompt_ids: list, stop: list, max_new_tokens: int) -> list:
    python = os.environ["GRPO_LLAMA_CPP_PYTHON"]
    task = {"gguf": str(path), "prompts": prompt_ids, "stop": stop, "max_new_tokens": max_new_tokens}
    done = subprocess.run([python, "-c", LLAMA_CPP_GREEDY], input=json.dumps(task), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def trainer_greedy(folder: Path, prompt_ids: list, max_new_tokens: int) -> tuple:
    """-> (the eager engine's greedy completions, each through its stop token, the stop ids)."""
    model, tokenizer = load_causal_lm(str(folder)), load_tokenizer(str(folder))
    stop = stop_token_ids(model, tokenizer)
    rollout = EagerEngine(model, stop, tokenizer.pad_token_id).generate(
        prompt_ids, 1, SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    )
    return [rollout.completion_ids[i, : rollout.lengths[i]].tolist() for i in range(len(prompt_ids))], stop


def agreement(expected: list, got: list) -> tuple:
    """-> (fraction of the expected tokens that llama.cpp gave at the same place, the first divergence in each answer)."""
    same = sum(sum(a == b for a, b in zip(e, g)) for e, g in zip(expected, got))
    first = [
        next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), None if len(e) == len(g) else min(len(e), len(g)))
        for e, g in zip(expected, got)
    ]
    return same / sum(map(len, expected)), first


def greedy_agreement(folder: Path, prompt_ids: list, max_new_tokens: int, tmp_path: Path, pre: str) -> dict:
    """-> {outtype: (llama.cpp's answers identical, fraction of identical tokens, first divergence per answer)}."""
    expected, stop = trainer_greedy(folder, prompt_ids, max_new_tokens)
    measured = {}
    for outtype in ("f32", "f16", "bf16", "q8_0"):
        assert export_gguf(folder, tmp_path / f"{outtype}.gguf", outtype)["pre"] == pre
        got = llama_cpp_greedy(tmp_path / f"{outtype}.gguf", prompt_ids, stop, max_new_tokens)
        measured[outtype] = (got == expected, *agreement(expected, got))
    print(json.dumps({"tokens": sum(map(len, expected)), **measured}))
    return measured


@pytest.mark.llamacpp
@needs_llama_cpp
def test_tiny_greedy_equals_llama_cpp(tiny_checkpoint, tmp_path):
    measured = greedy_agreement(tiny_checkpoint, prompts(load_tokenizer(str(tiny_checkpoint)), 16), 48, tmp_path, "gpt-2")
    assert measured["f32"][0], measured["f32"]
    assert measured["f16"][1] >= 0.9 and measured["bf16"][1] >= 0.9 and measured["q8_0"][1] >= 0.8, measured  # bf16: 0.95 here


@pytest.mark.llamacpp
@pytest.mark.real
@needs_llama_cpp
def test_smollm2_greedy_equals_llama_cpp(smollm2, tmp_path):
    tokenizer = load_tokenizer(str(smollm2))
    questions = ["What is the capital of France?", "Write a haiku about the sea.", "What is 17 + 25?", "Name three primary colors."]
    prompt_ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]
    measured = greedy_agreement(smollm2, prompt_ids, 32, tmp_path, "smollm")
    assert measured["f32"][0], measured["f32"]
