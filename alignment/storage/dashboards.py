"""The dashboards a run reports its scalars to (report_to, Hugging Face's key and names): VisualDL (the default),
TensorBoard and Weights & Biases, each a registry entry with one small protocol:

    Board(settings, replay)    replay: None for a fresh run; for a resumed one, metrics.jsonl's records up to the
                               checkpoint as [(step, {tag: value})], so the dashboard can show the whole run
    board.add(step, scalars)   one record's scalars, {tag: value}
    board.flush(), board.close()

Every board gets the same tags at the same steps: train/<key> for a step's metrics, validation/<key> for an
evaluation's (metrics.jsonl's key without its eval_ prefix). VisualDL groups charts by a tag's first path component,
sorts the groups by name and opens only the first: "train" sorts before "validation", so it opens on the training
reward, the first chart of its group (steps log reward_mean first).

A resumed run's file dashboards (VisualDL, TensorBoard) are rewritten from the cut metrics.jsonl: VisualDL serves
only the newest vdlrecords file of a folder, and appending would repeat the steps a crash logged after the checkpoint.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from alignment.algo.registry import Registry
from alignment.basics.errors import ConfigError

TRAIN_GROUP, EVAL_GROUP = "train", "validation"
NONE = "none"  # report_to none: no dashboard (metrics.jsonl and completions.jsonl are always written)
WANDB_RUN_ID = "wandb_run_id"  # in output_dir: the W&B run a resume continues
DASHBOARDS = Registry("report_to: unknown dashboard {name!r}; choose from {choices}")


@dataclass(frozen=True)
class DashboardSettings:
    report_to: tuple  # dashboard names, none left out
    logging_dir: str  # VisualDL's and TensorBoard's files
    output_dir: str  # the W&B run's name and folder (WANDB_DIR overrides the folder)
    run_config: dict  # the frozen config, as grpo_config.json holds it: the W&B run's config


class Board(Protocol):
    where: str  # for error messages: "the VisualDL log in <folder>"

    def add(self, step: int, scalars: dict) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def record_scalars(record: dict) -> tuple:
    """A metrics.jsonl record -> (step, {tag: value}): its finite numbers, tagged by their group (an evaluation's
    keys start with eval_, as alignment/storage/curves.py reads them too)."""
    group = EVAL_GROUP if any(key.startswith("eval_") for key in record) else TRAIN_GROUP
    scalars = {
        f"{group}/{key.removeprefix('eval_')}": float(value) for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and math.isfinite(value)
    }
    return record["step"], scalars


def missing_package(name: str):
    """-> the pip command that installs what dashboard `name` needs, or None where it is installed."""
    import importlib.util

    board = DASHBOARDS.get(name)
    if importlib.util.find_spec(board.module) is not None:
        return None
    return f"pip install {board.module} (or, in this repository, pip install -e '.[{board.extra}]')"


def open_boards(settings: DashboardSettings, replay) -> list:
    return [DASHBOARDS.get(name)(settings, replay) for name in settings.report_to]


def _fresh_files(folder: str, pattern: str) -> None:
    """A resumed run's file dashboard starts a new log holding the whole run: the older ones go first (they are
    rewritten from metrics.jsonl, so a crash before the rewrite ends loses nothing)."""
    os.makedirs(folder, exist_ok=True)
    for old in Path(folder).glob(pattern):
        old.unlink()


def _replay(board, replay) -> None:
    for step, scalars in replay or []:
        board.add(step, scalars)
    board.flush()


@DASHBOARDS.register("visualdl")
class VisualDLBoard:
    module, extra = "visualdl", "visualdl"  # a requirement of the package: always installed

    def __init__(self, settings: DashboardSettings, replay):
        from visualdl import LogWriter

        if replay is not None:  # VisualDL 2.5.3 would serve only the newest file: the resumed part
            _fresh_files(settings.logging_dir, "vdlrecords.*.log")
        self.where = f"the VisualDL log in {settings.logging_dir}"
        self.writer = LogWriter(logdir=settings.logging_dir)
        _replay(self, replay)

    def add(self, step: int, scalars: dict) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag=tag, value=value, step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@DASHBOARDS.register("tensorboard")
class TensorBoardBoard:
    # tensorboardX writes TensorBoard's event files without torch or TensorFlow. Its events.out.tfevents.* files and
    # VisualDL's vdlrecords.*.log share logging_dir: each reader takes only its own file names.
    # Its SummaryWriter.add_scalar renames a tag with characters outside [-/\w.] (validation/mean@4 -> validation/mean_4,
    # a rule of TensorFlow 1's graph node names); TensorBoard reads and shows any tag, so the board writes the Summary
    # protos itself through tensorboardX's FileWriter and keeps every dashboard's names the same.
    module, extra = "tensorboardX", "tensorboard"

    def __init__(self, settings: DashboardSettings, replay):
        from tensorboardX import FileWriter
        from tensorboardX.proto.summary_pb2 import Summary

        if replay is not None:  # TensorBoard would merge the files, the steps after the checkpoint twice
            _fresh_files(settings.logging_dir, "events.out.tfevents.*")
        self.where = f"the TensorBoard log in {settings.logging_dir}"
        self.summary = Summary
        self.writer = FileWriter(logdir=settings.logging_dir)
        _replay(self, replay)

    def add(self, step: int, scalars: dict) -> None:
        values = [self.summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        self.writer.add_summary(self.summary(value=values), global_step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@DASHBOARDS.register("wandb")
class WandbBoard:
    """One W&B run per training run, named after output_dir, its config the run's; wandb reads WANDB_MODE (offline:
    no network, `wandb sync` uploads later) and the API key itself. A resume continues the run whose id output_dir
    keeps; W&B holds its earlier steps. A run that starts reporting to W&B only at a resume gets the earlier steps
    replayed."""

    module, extra = "wandb", "wandb"

    def __init__(self, settings: DashboardSettings, replay):
        import wandb

        id_file = Path(settings.output_dir, WANDB_RUN_ID)
        run_id = id_file.read_text().strip() if replay is not None and id_file.is_file() else None
        folder = os.environ.get("WANDB_DIR") or settings.output_dir
        os.makedirs(folder, exist_ok=True)
        self.where = f"the W&B run in {folder}/wandb"
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "paddle-grpo", name=Path(settings.output_dir).resolve().name,
                dir=folder, id=run_id, resume="allow" if run_id else None, config=settings.run_config,
            )
        except wandb.errors.Error as e:
            raise ConfigError(
                f"report_to wandb: the W&B run could not start: {str(e).rstrip('.')}; without a network or an API key, set "
                f"WANDB_MODE=offline and upload later with wandb sync"
            ) from None
        id_file.write_text(self.run.id)
        if run_id is None:
            _replay(self, replay)

    def add(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)  # an evaluation at a step joins that step's row

    def flush(self) -> None:  # wandb writes in its own process
        pass

    def close(self) -> None:
        self.run.finish()
