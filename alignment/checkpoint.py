"""Checkpoints under output_dir/checkpoint-<step>, written whole or not at all.

A checkpoint is written into a hidden temporary folder and renamed into place once every file is on
disk; trainer_state.json is its last file, so a folder named checkpoint-<step> with a trainer_state.json
is complete, and an interrupted save leaves only a .tmp folder that nothing mistakes for a checkpoint.

Contents: the model in the Hugging Face layout (config.json, model.safetensors, generation_config.json
when the source model had one; transformers loads it as is, and `python -m alignment.export` copies it
without the training state), the tokenizer, grpo_config.json (the resolved config), optimizer.pdopt (AdamW
moments and the learning-rate schedule), trainer_state.json (the step, and how far metrics.jsonl and
completions.jsonl had been written). A LoRA run stores its adapter instead of the model, in Hugging
Face peft's layout (adapter_config.json, adapter_model.safetensors; alignment/lora.py), with everything
else as above; it resumes on the base model (actor_model_name_or_path) with the adapter loaded back, and
`python -m alignment.merge_lora` turns it into a model folder. No random-number state is saved: every
phase of every step reseeds from (seed, step, phase) (and the rank, for paddle's generator), so a resumed
run draws what an uninterrupted one would.
"""

import json
import os
import re
import shutil
from pathlib import Path

import paddle

from alignment.lora import has_lora, save_adapter
from alignment.modeling import save_model

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"


def is_complete_checkpoint(path: Path) -> bool:
    return (path / STATE_FILE).is_file()


def complete_checkpoints(output_dir: str) -> list:
    """Complete checkpoint folders in output_dir, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and is_complete_checkpoint(p)]
    return [p for _, p in sorted(found)]


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str) -> Path | None:
    """resume_from_checkpoint -> the folder to continue from: the given one, or for auto the newest
    complete checkpoint in output_dir (None, a fresh start, when there is none yet: the same command
    then starts a run and restarts it after a crash)."""
    if resume_from_checkpoint != "auto":
        return Path(resume_from_checkpoint) if resume_from_checkpoint else None
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def load_training_state(path: Path, optimizer) -> dict:
    """Restores the optimizer (AdamW moments and the learning-rate schedule) -> trainer_state.json."""
    optimizer.set_state_dict(paddle.load(str(path / "optimizer.pdopt")))
    return json.loads((path / STATE_FILE).read_text())


def save_checkpoint(output_dir: str, step: int, model, tokenizer, optimizer, config_json: str, state: dict, keep: int | None) -> Path:
    final = Path(output_dir) / f"checkpoint-{step}"
    staging = Path(output_dir) / f".checkpoint-{step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if has_lora(model):  # the adapters alone: the base weights never change
        save_adapter(model, staging, json.loads(config_json).get("actor_model_name_or_path"))
    else:
        save_model(model, str(staging))
    tokenizer.save_pretrained(str(staging))
    (staging / "grpo_config.json").write_text(config_json)
    paddle.save(optimizer.state_dict(), str(staging / "optimizer.pdopt"))
    _write_synced(staging / STATE_FILE, json.dumps({"step": step, **state}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    if keep is not None:
        for old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old)
    return final


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
