"""Checkpoints under output_dir/checkpoint-<step>, written whole or not at all.

A checkpoint is written into a hidden temporary folder and renamed into place once every file is on
disk; trainer_state.json is its last file, so a folder named checkpoint-<step> with a trainer_state.json
is complete, and an interrupted save leaves only a .tmp folder that nothing mistakes for a checkpoint.
Every file is fsynced before trainer_state.json is written (a full disk may only show at fsync on some
filesystems, and a power cut must not leave a complete-looking folder of unwritten data). A save that
fails (disk full, file too large, permission denied) removes its .tmp folder and raises CheckpointError
naming the checkpoint, the cause, and the newest complete checkpoint, which it leaves untouched.
Folders are only ever removed after an atomic rename to a hidden name, so a deletion cut short never
leaves a checkpoint-<step> that looks complete but is not.

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
import warnings
from pathlib import Path

import paddle
from safetensors import SafetensorError

from alignment.lora import has_lora, save_adapter
from alignment.modeling import save_model

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
LEFTOVER_RE = re.compile(r"^\.checkpoint-\d+\.(tmp|old)$")  # staging and set-aside folders of a save cut short
STATE_FILE = "trainer_state.json"
# safetensors reports a failed write (disk full, file too large) as its own error, not as OSError
WRITE_ERRORS = (OSError, SafetensorError)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message names it, the cause, and the checkpoint a resume takes."""


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


def checkpoint_path(output_dir: str, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


def save_checkpoint(output_dir: str, step: int, model, tokenizer, optimizer_state: dict, config_json: str, state: dict, keep: int | None) -> Path:
    root = Path(output_dir)
    final = checkpoint_path(output_dir, step)
    staging = root / f".checkpoint-{step}.tmp"
    try:
        _remove_leftovers(root)
        staging.mkdir(parents=True)
        if has_lora(model):  # the adapters alone: the base weights never change
            save_adapter(model, staging, json.loads(config_json).get("actor_model_name_or_path"))
        else:
            save_model(model, str(staging))
        tokenizer.save_pretrained(str(staging))
        (staging / "grpo_config.json").write_text(config_json)
        paddle.save(optimizer_state, str(staging / "optimizer.pdopt"))
        for path in staging.iterdir():
            _fsync(path)
        _write_synced(staging / STATE_FILE, json.dumps({"step": step, **state}, indent=2))
        _fsync(staging)
        _put_in_place(staging, final)
        _fsync(root)
    except WRITE_ERRORS as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(_failure_message(final, staging, exc)) from exc
    if keep is not None:
        for old in complete_checkpoints(output_dir)[:-keep]:
            try:
                _remove(old)
            except OSError as exc:  # the new checkpoint is saved: an old one left behind loses nothing
                warnings.warn(f"save_total_limit: could not remove {old}: {exc}")
    return final


def _failure_message(final: Path, staging: Path, exc: BaseException) -> str:
    found = complete_checkpoints(str(final.parent))
    message = f"could not save checkpoint {final}: {type(exc).__name__}: {exc}; "
    if found:
        message += f"the newest complete checkpoint is {found[-1]} (untouched): resume_from_checkpoint auto continues from it"
    else:
        message += "there is no complete checkpoint in this output_dir yet: resume_from_checkpoint auto would start anew"
    if staging.exists():
        message += f"; the partial folder {staging} could not be removed (nothing resumes from it)"
    return message


def _put_in_place(staging: Path, final: Path) -> None:
    if not final.exists():
        os.replace(staging, final)
        return
    # A checkpoint of this step is there already (a run resumed from an earlier one): rename cannot replace a
    # non-empty folder, so set the old one aside, and put it back if the new one cannot take its place.
    aside = _aside(final)
    os.replace(final, aside)
    try:
        os.replace(staging, final)
    except OSError:
        os.replace(aside, final)
        raise
    shutil.rmtree(aside, ignore_errors=True)  # a leftover is hidden and removed by the next save


def _remove(folder: Path) -> None:
    aside = _aside(folder)
    os.replace(folder, aside)  # atomic: from here on nothing takes it for a checkpoint
    shutil.rmtree(aside)


def _aside(folder: Path) -> Path:
    aside = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    return aside


def _remove_leftovers(root: Path) -> None:
    """Staging and set-aside folders of a save cut short (SIGKILL, power loss): only the main rank of one run
    writes into output_dir, so any there now is garbage, and as large as a checkpoint."""
    if root.is_dir():
        for path in root.iterdir():
            if LEFTOVER_RE.match(path.name):
                shutil.rmtree(path, ignore_errors=True)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)  # a folder too: its entries (the files, the rename) reach the disk
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
