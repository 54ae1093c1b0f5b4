"""The run as a training step reads it (Run), what the loop carries from step to step (Progress), and saving inside
the loop: every save_steps, when the run is asked to stop, and before a failure ends it, so that no failure loses more
than the steps since the last save."""

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from alignment.basics.errors import RolloutWorkerError
from alignment.parallel.distributed import World
from alignment.rollout.link import trained_parameters
from alignment.rollout.trainer_link import PENDING_FILE, TrainerLink
from alignment.run.build import RunData, RunParts
from alignment.run.settings import StepSettings
from alignment.storage.checkpoint import CheckpointContents, checkpoint_path, save_checkpoint
from alignment.storage.optimizer_state import accumulators_renamed
from alignment.storage.resume import Lineage
from alignment.step.logger import RunLogger
from alignment.step.rollout import Sampler


@dataclass(frozen=True)
class Run:
    """Everything a training step reads, built once by train()."""

    settings: StepSettings
    world: World
    link: Optional[TrainerLink]  # the rollout processes, or None: this process generates
    data: RunData
    parts: RunParts
    sampler: Sampler
    logger: RunLogger
    lineage: Lineage


@dataclass
class Progress:
    """What the loop carries from one step to the next."""

    checkpoint: Optional[Path]  # the newest checkpoint of this run (or the one it resumed from)
    skipped_steps: int  # steps skipped for non-finite values, over the whole run (saved in checkpoints)
    skipped_in_a_row: int = 0
    unscored_in_a_row: int = 0  # steps in a row with no completion scored

    def count_skip(self, skipped: Any) -> None:
        self.skipped_steps, self.skipped_in_a_row = self.skipped_steps + bool(skipped), (self.skipped_in_a_row + 1) if skipped else 0


def save(run: Run, progress: Progress, step: int) -> Path:
    """Every process calls it (with sharding, the optimizer state is gathered from all); the main one writes."""
    loop, link = run.settings.loop, run.link
    model_names = {parameter.name: name for name, parameter in trained_parameters(run.parts.model)}
    optimizer_state = accumulators_renamed(run.parts.optimizer.state_dict(), model_names)
    if not run.world.is_main:
        return checkpoint_path(loop.output_dir, step)
    state = {"total_steps": run.data.total_steps, "log_offsets": run.logger.offsets(), "skipped_steps": progress.skipped_steps,
             "processes": run.world.size}
    in_flight = {PENDING_FILE: link.pending_bytes()} if link and link.pending else {}  # one step off: the next step's rollout
    contents = CheckpointContents(run.parts.model, run.data.tokenizer, optimizer_state, loop.config_json, state, in_flight)
    path = save_checkpoint(loop.output_dir, step, contents, loop.save_total_limit, run.lineage)
    run.logger.print(f"saved {path}")
    return path


def saved_before_stopping(run: Run, progress: Progress, error: Exception, finished_step: int, then: str) -> Exception:
    """Scoring failed (after the client's retries, or for every completion of several steps): keep what the
    finished steps learned, then stop. Only the main process writes; every rank learns of the failure at
    the same point."""
    checkpoint = progress.checkpoint
    saved = checkpoint if checkpoint and checkpoint.name == f"checkpoint-{finished_step}" else None
    if saved is None and finished_step > 0:
        saved = save(run, progress, finished_step)
    where = f"{saved} holds the state after step {finished_step}" if saved else "no step had finished, nothing to resume"
    return type(error)(f"{error}\n{where}; {then}, then rerun with --resume_from_checkpoint auto")


@contextlib.contextmanager
def saved_if_rollout_stops(run: Run, progress: Progress, finished_step: int):
    """A rollout process failed or died: save the last finished step, then let a failed one exit."""
    try:
        yield
    except RolloutWorkerError as error:
        failure = saved_before_stopping(run, progress, error, finished_step, "mend what stopped the rollout process")
        run.link.release()
        raise failure from None
