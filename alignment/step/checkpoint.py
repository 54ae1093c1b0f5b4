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
moments, and the learning-rate schedule as JSON in its metadata), trainer_state.json (the step, and how far
metrics.jsonl and completions.jsonl had been written). A LoRA run stores its adapter instead of the model, in Hugging
Face peft's layout (adapter_config.json, adapter_model.safetensors; alignment/models/lora.py), with everything
else as above; it resumes on the base model (actor_model_name_or_path) with the adapter loaded back, and
`python -m alignment.merge_lora` turns it into a model folder. No random-number state is saved: every
phase of every step reseeds from (seed, step, phase) (and the rank, for paddle's generator), so a resumed
run draws what an uninterrupted one would.

Nothing in a checkpoint is pickle: tensors are safetensors, the rest JSON, so loading a checkpoint someone else
wrote runs no code of theirs. Checkpoints of earlier versions held two pickles (optimizer.pdopt, paddle.save's, and
pending_rollout.pkl), which run whatever code their writer put in them: a resume refuses them unless
trust_pickled_checkpoint is set, and its next save writes the safe files.

Integrity: trainer_state.json lists every other file of the checkpoint with its size and SHA-256
(`files`). A resume verifies them: `auto` skips a damaged checkpoint (naming it and why) for the newest
intact one of the run's lineage, and an explicit folder that fails verification is an error naming the
file, so a scheduler's restart loop never meets the same traceback on every restart.

Lineage: every launch of the trainer has a run id; trainer_state.json records it, and the runs (and the
steps) the run continued from (`ancestry`). A checkpoint belongs to a run's lineage when that run wrote it,
or when an ancestor run wrote it at or before the step the lineage continued from. Retention
(save_total_limit) counts only the lineage's checkpoints and never removes the one just saved nor the one
the run resumed from; `auto` resumes the lineage of the newest checkpoint written whose recorded settings
match the run's, never another run's checkpoint that happens to have a higher step.
"""

import hashlib
import json
import math
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import paddle
from safetensors import SafetensorError, safe_open
from safetensors.paddle import load_file, save_file

from alignment.errors import CheckpointError
from alignment.models.lora import has_lora, save_adapter
from alignment.models.modeling import save_model
from alignment.step.dashboards import WANDB_RUN_ID

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
LEFTOVER_RE = re.compile(r"^\.checkpoint-\d+\.(tmp|old)$")  # staging and set-aside folders of a save cut short
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
PICKLED_FILES = ("optimizer.pdopt", "pending_rollout.pkl")  # what checkpoints of earlier versions held: pickle
# safetensors reports a failed write (disk full, file too large) as its own error, not as OSError
WRITE_ERRORS = (OSError, SafetensorError)


@dataclass(frozen=True)
class Lineage:
    """The run writing checkpoints, and the runs it continues: ancestry holds (run id, last step taken from
    that run), oldest first. Checkpoints written before run ids existed all have run id ''."""

    run_id: str
    ancestry: tuple = ()
    resumed_from: Path | None = None  # retention never removes it

    @staticmethod
    def new() -> "Lineage":
        return Lineage(uuid.uuid4().hex)

    def continued(self, step: int, path: Path) -> "Lineage":
        """A new run resuming from this lineage's checkpoint at `step` (in `path`)."""
        return Lineage(uuid.uuid4().hex, self.ancestry + ((self.run_id, step),), path)

    def holds(self, state: dict) -> bool:
        run_id, step = state.get("run_id", ""), state["step"]
        return run_id == self.run_id or any(run_id == ancestor and step <= last for ancestor, last in self.ancestry)

    def recorded(self) -> dict:
        return {"run_id": self.run_id, "ancestry": [list(pair) for pair in self.ancestry]}

    @staticmethod
    def of(state: dict) -> "Lineage":
        """The lineage that wrote a checkpoint, from its trainer_state.json."""
        return Lineage(state.get("run_id", ""), tuple((run_id, step) for run_id, step in state.get("ancestry", [])))


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run continues from, read and verified."""

    path: Path
    state: dict  # its trainer_state.json
    settings: dict  # its grpo_config.json: the settings of the run that wrote it

    @property
    def step(self) -> int:
        return self.state["step"]


def is_complete_checkpoint(path: Path) -> bool:
    return (path / STATE_FILE).is_file()


def complete_checkpoints(output_dir: str) -> list:
    """Complete checkpoint folders in output_dir, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and is_complete_checkpoint(p)]
    return [p for _, p in sorted(found)]


def read_checkpoint(path: Path) -> tuple:
    """-> (trainer_state.json, grpo_config.json) as dicts; raises CheckpointError naming the file that cannot be read."""
    records = []
    for name in (STATE_FILE, "grpo_config.json"):
        try:
            record = json.loads((path / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path / name} cannot be read ({type(exc).__name__}: {exc}): the checkpoint is damaged") from None
        if not isinstance(record, dict) or (name == STATE_FILE and not isinstance(record.get("step"), int)):
            raise CheckpointError(f"{path / name} is not a checkpoint's record: the checkpoint is damaged")
        if name == STATE_FILE and (why := _state_problem(record)):
            raise CheckpointError(f"{path / name} holds {why}: the checkpoint is damaged")
        records.append(record)
    return tuple(records)


def _state_problem(state: dict) -> str | None:
    """Which of trainer_state.json's fields is not of its kind (damaged, or forged with its checksums), else None:
    each would otherwise be a traceback later in the resume."""
    for key in ("step", "total_steps", "skipped_steps", "processes"):
        if key in state and (type(state[key]) is not int or state[key] < 0):
            return f"{key} = {state[key]!r:.60}, not a count"
    offsets = state.get("log_offsets", {})
    if not isinstance(offsets, dict) or not all(type(offset) is int and offset >= 0 for offset in offsets.values()):
        return f"log_offsets = {offsets!r:.60}, not byte offsets"
    ancestry = state.get("ancestry", [])
    if not isinstance(state.get("run_id", ""), str) or not isinstance(ancestry, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and type(pair[1]) is int for pair in ancestry
    ):
        return f"run_id = {state.get('run_id')!r:.40} and ancestry = {ancestry!r:.60}, not a run id and [run id, step] pairs"
    if type(state.get("saved_at", 0.0)) not in (int, float):
        return f"saved_at = {state['saved_at']!r:.60}, not a time"
    return None


def damage(path: Path, state: dict) -> str | None:
    """None when no link in the checkpoint leads out of it and every file trainer_state.json lists is inside it with its
    recorded size and SHA-256, else what is wrong. A checkpoint written before the list existed is taken as it is."""
    for folder, subfolders, names in os.walk(path):  # links are not followed: one leading out is refused, listed or not
        for entry in (Path(folder, name) for name in subfolders + names):
            if entry.is_symlink() and not entry.resolve().is_relative_to(path.resolve()):
                return f"{entry} is a link to {entry.resolve()} outside the checkpoint"
    files = state.get("files", {})
    if not isinstance(files, dict):
        return f"{path / STATE_FILE} lists its files as {type(files).__name__}, not an object"
    for name, expected in files.items():
        if why := _outside(path, name):
            return why
        if not isinstance(expected, dict) or type(expected.get("size")) is not int or not isinstance(expected.get("sha256"), str):
            return f"{path / STATE_FILE} records the file {name!r} without an integer size and a sha256"
        file = path / name
        if not file.is_file():
            return f"{file} is missing"
        size = file.stat().st_size
        if size != expected["size"]:
            return f"{file} has {size} bytes, {expected['size']} were written (truncated?)"
        if _sha256(file) != expected["sha256"]:
            return f"{file} does not match the checksum recorded when it was written"
    return None


def _outside(path: Path, name: str) -> str | None:
    """Why a file that trainer_state.json lists is not a path inside the checkpoint (absolute, or with a '..', as a
    forged checkpoint names ../../../../etc/hostname), else None. Links leading out are damage()'s own check."""
    if not name or "\0" in name or Path(name).is_absolute() or ".." in Path(name).parts:
        return f"{path / STATE_FILE} lists the file {name!r}, which is not a path inside the checkpoint"
    return None


def resolve_resume(
    resume_from_checkpoint: str | None, output_dir: str, matches: Callable[[dict, dict], bool] = lambda settings, state: True
) -> tuple:
    """resume_from_checkpoint -> (the verified checkpoint to continue from or None for a fresh start,
    [(folder, why)] of the damaged checkpoints skipped on the way).

    A folder is taken as given and must be intact (CheckpointError naming the damage otherwise). auto takes
    the lineage of the newest checkpoint written in output_dir whose settings `matches(settings, state)` the
    run's (of the newest written, when none matches: the trainer then reports what changed), and continues
    from that lineage's newest intact checkpoint. None when output_dir holds no intact checkpoint: the same
    command starts a run and restarts it after a crash."""
    if resume_from_checkpoint != "auto":
        if not resume_from_checkpoint:
            return None, []
        path = Path(resume_from_checkpoint)
        state, settings = read_checkpoint(path)
        if why := damage(path, state):
            raise CheckpointError(
                f"resume_from_checkpoint: {path} is damaged: {why}; "
                "resume from an earlier checkpoint (or auto, which skips damaged ones)"
            )
        return ResumePoint(path, state, settings), []
    readable, skipped = [], []
    for path in complete_checkpoints(output_dir):
        try:
            readable.append((path, *read_checkpoint(path)))
        except CheckpointError as exc:
            skipped.append((path, str(exc)))
    if not readable:
        return None, skipped

    def written(entry) -> tuple:  # checkpoints from before saved_at existed: the time of their last file
        path, state, _ = entry
        return state.get("saved_at", (path / STATE_FILE).stat().st_mtime), state["step"]

    newest_first = sorted(readable, key=written, reverse=True)
    _, anchor, _ = next((entry for entry in newest_first if matches(entry[2], entry[1])), newest_first[0])
    lineage = Lineage.of(anchor)
    ours = [entry for entry in readable if lineage.holds(entry[1]) and entry[1]["step"] <= anchor["step"]]
    for path, state, settings in sorted(ours, key=lambda entry: entry[1]["step"], reverse=True):
        if why := damage(path, state):
            skipped.append((path, why))
            continue
        return ResumePoint(path, state, settings), skipped
    return None, skipped


# Keys that change what a step trains on: the prompts, their order and encoding, the samples drawn, the
# batch. A resume that changes one no longer continues the run, so it needs allow_config_change. The
# batch keys are per process: they are compared times the number of processes, so a run may resume on
# another layout with the same global batch.
TRAINING_KEYS = (
    "actor_model_name_or_path", "tokenizer_name_or_path", "chat_template", "train_datasets", "calculation_steps", "prompt_key",
    "response_key", "system_prompt", "max_prompt_len", "prompt_truncation", "max_dec_len", "rollout_n", "seed", "lora_rank",
    "target_modules", "tools", "environment", "max_turns", "max_turn_tokens", "async_generate",
)
PER_PROCESS_KEYS = ("per_device_prompt_batch_size", "mini_batch_size")
# how to start, not what to train; and the reward server's key, written as "set" or "unset" (GRPOConfig.to_json) and read
# again from the user's config or environment on resume
RESUME_KEYS = ("resume_from_checkpoint", "overwrite_output_dir", "allow_config_change", "trust_pickled_checkpoint", "reward_server_api_key")


def settings_changes(recorded: dict, recorded_processes: int | None, current: dict, processes: int) -> tuple:
    """A checkpoint's settings against the run's -> (refused, allowed): lines "key: old -> new". Keys the
    checkpoint does not record (older versions) are not compared."""
    recorded_processes = recorded_processes or processes  # a checkpoint from before the count was recorded

    def shown(key: str, config: dict, count: int) -> str:
        value = json.dumps(config[key])
        return f"{value} x {count} processes" if key in PER_PROCESS_KEYS and count != 1 else value

    refused, allowed = [], []
    for key in sorted(set(recorded) & set(current)):
        if key in RESUME_KEYS:
            continue
        if key in PER_PROCESS_KEYS:
            differs = type(recorded[key]) is not int or recorded[key] * recorded_processes != current[key] * processes  # forged: {}
        else:
            differs = recorded[key] != current[key]
        if differs:
            line = f"{key}: {shown(key, recorded, recorded_processes)} -> {shown(key, current, processes)}"
            (refused if key in TRAINING_KEYS + PER_PROCESS_KEYS else allowed).append(line)
    return refused, allowed


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


def pickled_files(path: Path) -> list:
    """The files of a checkpoint of an earlier version that hold pickle (loading them runs their writer's code)."""
    return [name for name in PICKLED_FILES if (path / name).is_file()]


def save_optimizer_state(state: dict, path: Path) -> None:
    """AdamW's state dict -> one safetensors file: its tensors (master weights as master_weights/<name>) as they are,
    the rest (the learning-rate schedule's numbers) as JSON in the file's metadata."""
    tensors = {key: value for key, value in state.items() if isinstance(value, paddle.Tensor)}
    tensors |= {f"master_weights/{key}": value for key, value in state.get("master_weights", {}).items()}
    rest = {key: value for key, value in state.items() if key != "master_weights" and not isinstance(value, paddle.Tensor)}
    save_file({key: value.contiguous() for key, value in tensors.items()}, str(path), metadata={"grpo_optimizer": json.dumps(rest)})


def load_optimizer_state(path: Path) -> dict:
    """The inverse of save_optimizer_state."""
    with safe_open(str(path), "np") as opened:
        state = json.loads((opened.metadata() or {})["grpo_optimizer"])
    for key, value in load_file(str(path)).items():
        if key.startswith("master_weights/"):
            state.setdefault("master_weights", {})[key.removeprefix("master_weights/")] = value
        else:
            state[key] = value
    return state


def load_training_state(path: Path, optimizer, named_parameters: list, trust_pickle: bool = False) -> dict:
    """Restores the optimizer (AdamW moments and the learning-rate schedule) of `named_parameters` ((name in the
    model, parameter) of the trained ones) -> trainer_state.json. The moments are checked against the parameters
    first (CheckpointError naming the file and the tensor as the file names it), then given this process's parameter
    names (the file names them as the model does: accumulators_renamed). A checkpoint of an earlier version
    (optimizer.pdopt, pickle) is read only when trust_pickle (start_point refused it otherwise)."""
    if (path / OPTIMIZER_FILE).is_file():
        state = load_optimizer_state(path / OPTIMIZER_FILE)
        if why := optimizer_state_mismatch(state, named_parameters):
            raise CheckpointError(f"resume_from_checkpoint: {path / OPTIMIZER_FILE} {why}: it is not this model's optimizer state")
        optimizer.set_state_dict(accumulators_renamed(state, {name: parameter.name for name, parameter in named_parameters}))
    elif trust_pickle:
        optimizer.set_state_dict(paddle.load(str(path / "optimizer.pdopt")))
    else:
        raise CheckpointError(f"{path} has no {OPTIMIZER_FILE}")
    return json.loads((path / STATE_FILE).read_text())


# AdamW's tensors per parameter, named <parameter>_<kind>_<n>: the moments have the parameter's shape, the powers one value
MOMENTS, POWERS = ("moment1", "moment2", "moment2_max"), ("beta1_pow_acc", "beta2_pow_acc")
ACCUMULATOR_RE = re.compile(rf"^(.+)_({'|'.join(MOMENTS + POWERS)})_\d+$")


def accumulators_renamed(state: dict, names: dict) -> dict:
    """AdamW's state dict with each parameter's tensors (<name>_<kind>_<n>, master_weights/<name>) renamed by `names`;
    names it does not hold are kept. Paddle names parameters by process-wide counters (linear_12.w_0), which shift
    when a process builds another model first: a checkpoint names them as the model does (model.layers.0...), and a
    resume gives them this process's names back. A file of an earlier version holds paddle's names, kept as they are."""
    renamed = {}
    for key, value in state.items():
        if key == "master_weights":
            renamed[key] = {names.get(name, name): tensor for name, tensor in value.items()}
        elif isinstance(value, paddle.Tensor) and (match := ACCUMULATOR_RE.match(key)):
            renamed[names.get(match[1], match[1]) + key[match.end(1):]] = value
        else:
            renamed[key] = value
    return renamed


def optimizer_state_mismatch(state: dict, named_parameters: list) -> str | None:
    """What in a loaded optimizer state does not fit the trained parameters, (name in the model, parameter), (a moment
    of another shape or dtype, one missing, a schedule that is not numbers), else None. The state names a parameter as
    the model does, or (a file of an earlier version) by paddle's name. Moments are float32 or the parameter's dtype."""
    by_name = {p.name: (name, p) for name, p in named_parameters} | {name: (name, p) for name, p in named_parameters}
    found = set()
    tensors = [(key, value) for key, value in state.items() if isinstance(value, paddle.Tensor)]
    tensors += [(f"master_weights/{key}", value) for key, value in state.get("master_weights", {}).items()]
    for key, value in tensors:
        if key.startswith("master_weights/"):
            name, kind = key.removeprefix("master_weights/"), "master"
        elif match := ACCUMULATOR_RE.match(key):
            name, kind = match.groups()
        else:
            return f"holds {key}, which is none of AdamW's tensors"
        if name not in by_name:
            return f"holds {key}, which belongs to no trained parameter of the model"
        name, parameter = by_name[name]
        shape = [1] if kind in POWERS else list(parameter.shape)
        dtypes = {paddle.float32} if kind in POWERS + ("master",) else {paddle.float32, parameter.dtype}
        if list(value.shape) != shape or value.dtype not in dtypes:
            wanted = " or ".join(sorted(str(dtype).removeprefix("paddle.") for dtype in dtypes))
            return f"holds {key} as {str(value.dtype).removeprefix('paddle.')} {list(value.shape)}, not {wanted} {shape}"
        found.add((name, kind))
    needed = ("moment1", "moment2", *POWERS)  # each parameter's, once any is there (none: saved before the first update)
    if found and (missing := [f"{name}'s {kind}" for name, _ in named_parameters for kind in needed if (name, kind) not in found]):
        return f"lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
    schedule = state.get("LR_Scheduler", {})
    if not isinstance(schedule, dict) or not all(type(v) in (int, float) and math.isfinite(v) for v in schedule.values()):
        return f"holds a learning-rate schedule that is not finite numbers ({str(schedule)[:80]})"
    return None


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
                files[str(path.relative_to(staging))] = {"size": path.stat().st_size, "sha256": _sha256(path)}
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


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
