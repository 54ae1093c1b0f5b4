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
without the training state), the tokenizer, grpo_config.json (the resolved config), optimizer.safetensors (AdamW
moments, and the learning-rate schedule as JSON in its metadata: alignment/storage/optimizer_state.py),
trainer_state.json (the step, how far metrics.jsonl and completions.jsonl had been written, the run's lineage, and
every other file with its size and SHA-256, which a resume verifies: alignment/storage/resume.py). A LoRA run stores its
adapter instead of the model, in Hugging Face peft's layout (adapter_config.json, adapter_model.safetensors;
alignment/models/lora.py), with everything else as above; it resumes on the base model (actor_model_name_or_path)
with the adapter loaded back, and `python -m alignment.merge_lora` turns it into a model folder. No random-number
state is saved: every phase of every step reseeds from (seed, step, phase) (and the rank, for paddle's generator),
so a resumed run draws what an uninterrupted one would.

Nothing in a checkpoint is pickle: tensors are safetensors, the rest JSON, so loading a checkpoint someone else
wrote runs no code of theirs. Checkpoints of earlier versions held two pickles (optimizer.pdopt, paddle.save's, and
pending_rollout.pkl), which run whatever code their writer put in them: a resume refuses them unless
trust_pickled_checkpoint is set, and its next save writes the safe files.

Retention (save_total_limit) counts only the lineage's checkpoints and never removes the one just saved nor the
one the run resumed from.
"""

import json
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from safetensors import SafetensorError

from alignment.basics.errors import CheckpointError
from alignment.models.lora import has_lora, save_adapter
from alignment.models.modeling import save_model
from alignment.storage.dashboards import WANDB_RUN_ID
from alignment.storage.optimizer_state import OPTIMIZER_FILE, save_optimizer_state
from alignment.storage.resume import CHECKPOINT_RE, STATE_FILE, Lineage, complete_checkpoints, read_checkpoint, sha256

LEFTOVER_RE = re.compile(r"^\.checkpoint-\d+\.(tmp|old)$")  # staging and set-aside folders of a save cut short
# safetensors reports a failed write (disk full, file too large) as its own error, not as OSError
WRITE_ERRORS = (OSError, SafetensorError)


def checkpoint_path(output_dir: str, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


@dataclass(frozen=True)
class CheckpointContents:
    model: Any  # the actor: its weights, or a LoRA run's adapters alone
    tokenizer: Any
    optimizer_state: dict
    config_json: str  # the run's grpo_config.json
    state: dict  # trainer_state.json's fields beside the step, the lineage and the files
    extra_files: Optional[dict] = None  # name -> bytes written beside the rest (a one-step-off run's rollout in flight)


def save_checkpoint(output_dir: str, step: int, contents: CheckpointContents, keep: int | None, lineage: Lineage = Lineage("")) -> Path:
    """Written into a hidden folder, synced, checksummed, then renamed into place: a checkpoint that looks complete is."""
    model, tokenizer, config_json = contents.model, contents.tokenizer, contents.config_json
    optimizer_state, state, extra_files = contents.optimizer_state, contents.state, contents.extra_files
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
        save_optimizer_state(optimizer_state, staging / OPTIMIZER_FILE)
        for name, data in (extra_files or {}).items():
            (staging / name).write_bytes(data)
        files = {}
        for path in sorted(staging.rglob("*")):
            _fsync(path)
            if path.is_file():
                files[str(path.relative_to(staging))] = {"size": path.stat().st_size, "sha256": sha256(path)}
        record = {"step": step, **state, **lineage.recorded(), "saved_at": time.time(), "files": files}
        _write_synced(staging / STATE_FILE, json.dumps(record, indent=2))
        _fsync(staging)
        _put_in_place(staging, final)
        _fsync(root)
    except WRITE_ERRORS as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(_failure_message(final, staging, exc)) from exc
    if keep is not None:
        for old in _beyond_limit(output_dir, keep, lineage, final):
            try:
                _remove(old)
            except OSError as exc:  # the new checkpoint is saved: an old one left behind loses nothing
                warnings.warn(f"save_total_limit: could not remove {old}: {exc}")
    return final


def _beyond_limit(output_dir: str, keep: int, lineage: Lineage, saved: Path) -> list:
    """The lineage's checkpoints past the newest `keep` (by step), less the one just saved and the one resumed
    from. Other runs' checkpoints, and any whose record cannot be read, are not the lineage's to remove."""
    ours = []
    for path in complete_checkpoints(output_dir):
        try:
            state, _ = read_checkpoint(path)
        except CheckpointError:
            continue
        if lineage.holds(state):
            ours.append(path)
    protected = {saved.resolve()} | ({lineage.resumed_from.resolve()} if lineage.resumed_from else set())
    return [path for path in ours[:-keep] if path.resolve() not in protected]


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


# wandb: W&B's folder (report_to wandb) unless WANDB_DIR puts it elsewhere
RUN_FILES = ("grpo_config.json", "metrics.jsonl", "completions.jsonl", "curves.png", "wandb", WANDB_RUN_ID)


def previous_run_files(output_dir: str, logging_dir: str) -> list:
    """What a run left in output_dir: its records, checkpoints (and leftovers of a save cut short), and a
    non-empty VisualDL folder. Other files (the launcher's --log_dir, the user's own) are not a run's."""
    root, found = Path(output_dir), []
    if root.is_dir():
        found = [p for p in sorted(root.iterdir()) if p.name in RUN_FILES or CHECKPOINT_RE.match(p.name) or LEFTOVER_RE.match(p.name)]
    logs = Path(logging_dir)
    if logs.is_dir() and any(logs.iterdir()) and logs not in found:
        found.append(logs)
    return found


def remove_previous_run(paths: list) -> None:
    for path in paths:
        if path.is_dir():
            _remove(path)
        else:
            path.unlink()
