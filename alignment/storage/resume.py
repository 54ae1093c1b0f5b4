"""Which checkpoint a run continues from: the complete checkpoints of an output_dir, each read and verified, the
lineages they belong to, and the settings a resume may not change. Checkpoints are written by
alignment/storage/checkpoint.py.

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
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from alignment.basics.errors import CheckpointError

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"
PICKLED_FILES = ("optimizer.pdopt", "pending_rollout.pkl")  # what checkpoints of earlier versions held: pickle


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
        if sha256(file) != expected["sha256"]:
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


def pickled_files(path: Path) -> list:
    """The files of a checkpoint of an earlier version that hold pickle (loading them runs their writer's code)."""
    return [name for name in PICKLED_FILES if (path / name).is_file()]


def sha256(path: Path) -> str:
    """A file's SHA-256, as trainer_state.json's `files` records it."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
