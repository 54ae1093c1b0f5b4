"""Checkpoints under output_dir/checkpoint-<step>, written whole or not at all.

A checkpoint is written into a hidden temporary folder and renamed into place once every file is on
disk; trainer_state.json is its last file, so a folder named checkpoint-<step> with a trainer_state.json
is complete, and an interrupted save leaves only a .tmp folder that nothing mistakes for a checkpoint.

Contents: the model in the Hugging Face layout (config.json, model.safetensors; paddleformers'
from_pretrained and transformers load it), the tokenizer, grpo_config.json (the resolved config), optimizer.pdopt (AdamW
moments and the learning-rate schedule), rng.pdstate (random-number states), trainer_state.json.
"""

import json
import os
import re
import shutil
from pathlib import Path

import paddle

from alignment.modeling import save_model

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"


def complete_checkpoints(output_dir: str) -> list:
    """Complete checkpoint folders in output_dir, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def save_checkpoint(output_dir: str, step: int, model, tokenizer, optimizer, config_json: str, state: dict, keep: int | None) -> Path:
    final = Path(output_dir) / f"checkpoint-{step}"
    staging = Path(output_dir) / f".checkpoint-{step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_model(model, str(staging))
    tokenizer.save_pretrained(str(staging))
    (staging / "grpo_config.json").write_text(config_json)
    paddle.save(optimizer.state_dict(), str(staging / "optimizer.pdopt"))
    paddle.save(paddle.get_rng_state(), str(staging / "rng.pdstate"))
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
