"""Where a run reports: a progress bar and a console line every logging_steps, the scalars on the dashboards of
report_to (alignment/storage/dashboards.py: VisualDL by default), and under output_dir metrics.jsonl (one JSON object
per step, one per evaluation) and completions.jsonl (a sample of each step's completions with their rewards and
advantages). Only the main process writes.

A fresh run starts both files anew. A resumed run cuts them back to the sizes its checkpoint recorded
(`offsets()` at save time) and appends, so records of steps after that checkpoint, written before a
crash, are replaced rather than repeated; its dashboards are given the cut metrics.jsonl's records."""

import contextlib
import json
import math
import os
import sys

from tqdm import tqdm

from alignment.basics.errors import LogWriteError
from alignment.storage.dashboards import DashboardSettings, open_boards, record_scalars

METRICS, COMPLETIONS = "metrics.jsonl", "completions.jsonl"
CONSOLE_KEYS = (
    "reward_mean", "accuracy", "loss", "kl", "entropy", "response_length_mean", "lr", "rollout/staleness", "time/step", "memory/peak_gb",
)


@contextlib.contextmanager
def _writing(what: str):
    try:
        yield
    except OSError as e:
        raise LogWriteError(
            f"could not write {what}: {e.strerror or e}; the run stops here, and checkpoints already saved are "
            f"intact: free the space, then rerun with --resume_from_checkpoint auto"
        ) from None


def _jsonable(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunLogger:
    def __init__(
        self, output_dir: str, dashboards: DashboardSettings, logging_steps: int, total_steps: int, first_step: int, enabled: bool,
        resume_offsets: dict | None = None,
    ):
        self.enabled, self.logging_steps = enabled, logging_steps
        if not enabled:
            return
        os.makedirs(output_dir, exist_ok=True)
        self.metrics = _open_log(os.path.join(output_dir, METRICS), resume_offsets)
        self.completions = _open_log(os.path.join(output_dir, COMPLETIONS), resume_offsets)
        replay = None if resume_offsets is None else _written_scalars(self.metrics)
        with _writing(f"the dashboards' logs in {dashboards.logging_dir}"):
            self.boards = open_boards(dashboards, replay)
        # The console lines are bar.write's: they stay without the bar. The bar redraws itself in place on a terminal;
        # in a file or a pipe each redraw is a line of its own (4 a step), so there the console has the lines alone.
        shown = console_is_terminal() and not dashboards.run_config.get("disable_tqdm")
        self.bar = tqdm(total=total_steps, initial=first_step, desc="grpo", unit="step", dynamic_ncols=True, disable=not shown)

    def _write(self, record: dict) -> None:
        with _writing(self.metrics.name):
            self.metrics.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
            self.metrics.flush()
        step, scalars = record_scalars(record)
        for board in self.boards:
            with _writing(board.where):
                board.add(step, scalars)
                board.flush()

    def log_step(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self._write({"step": step, **metrics})
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", acc=f"{metrics['accuracy']:.3f}")
        if step % self.logging_steps == 0:
            self.bar.write(f"step {step}: {console_fields(metrics)}")

    def log_eval(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self._write({"step": step, **metrics})
        shown = " ".join(f"{k}={_short(v)}" for k, v in metrics.items())
        self.bar.write(f"eval at step {step}: {shown}")

    def log_completions(self, step: int, rows: list) -> None:
        if not self.enabled:
            return
        with _writing(self.completions.name):
            for row in rows:
                self.completions.write(json.dumps({"step": step, **{k: _jsonable(v) for k, v in row.items()}}) + "\n")
            self.completions.flush()

    def offsets(self) -> dict:
        """Bytes written so far to each jsonl file, recorded in a checkpoint for resume_offsets."""
        return {METRICS: self.metrics.tell(), COMPLETIONS: self.completions.tell()} if self.enabled else {}

    def print(self, message: str) -> None:
        if self.enabled:
            self.bar.write(message)

    def __enter__(self):
        return self

    def __exit__(self, error_type, *exc) -> None:  # on an error too: the bar ends its line before the error is printed
        try:
            self.close()
        except LogWriteError:
            if error_type is None:  # else the error under way (a full disk, say) is the one to report
                raise

    def close(self) -> None:
        if self.enabled:
            self.bar.close()
            for board in self.boards:
                with _writing(board.where):
                    board.close()
            for log in (self.metrics, self.completions):  # a file's last buffered bytes are written here
                with _writing(log.name):
                    log.close()


def _open_log(path: str, resume_offsets: dict | None):
    if resume_offsets is None or not os.path.exists(path):
        return open(path, "w")
    log = open(path, "r+")
    offset = resume_offsets.get(os.path.basename(path))
    if offset is not None:
        log.truncate(min(offset, os.path.getsize(path)))
    log.seek(0, os.SEEK_END)
    return log


def _written_scalars(log) -> list:
    """A resumed run's metrics.jsonl, already cut back to its checkpoint -> [(step, {tag: value})] for the dashboards."""
    with open(log.name) as records:
        # a line not ended by a newline is one a crash cut short (a checkpoint older than log_offsets keeps all the file)
        return [record_scalars(json.loads(line)) for line in records if line.endswith("\n")]


def console_is_terminal() -> bool:
    """Whether the console is a terminal. Under alignment.launch the trainer writes to its log file, which the launcher
    copies to its own stdout: the launcher says whether that is a terminal (GRPO_CONSOLE_IS_TERMINAL)."""
    launched = os.environ.get("GRPO_CONSOLE_IS_TERMINAL")
    return launched == "1" if launched is not None else sys.stderr.isatty()  # tqdm's bar goes to stderr


def console_fields(metrics: dict) -> str:
    """A step's console line after `step N: `: CONSOLE_KEYS as key=value; kl=off without a reference model
    (kl_loss_coeff 0), the step's peak memory as mem=7.2GB."""
    fields = []
    for key in (k for k in CONSOLE_KEYS if k in metrics):
        if key == "kl" and metrics[key] is None:
            fields.append("kl=off")
        elif key == "memory/peak_gb":
            fields.append(f"mem={metrics[key]:.1f}GB")
        else:
            fields.append(f"{key}={_short(metrics[key])}")
    return " ".join(fields)


def _short(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
