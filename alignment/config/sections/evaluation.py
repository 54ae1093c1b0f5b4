"""Evaluation, logging, checkpoints: when and how much to evaluate, where the run writes, what it reports and keeps,
and how it resumes."""

import os
from dataclasses import dataclass
from typing import Optional

from alignment.config.checks import check, show
from alignment.config.sections import _key
from alignment.storage.dashboards import DASHBOARDS, NONE


@dataclass(frozen=True)
class Evaluation:
    TITLE = "Evaluation, logging, checkpoints"

    eval_steps: int = _key(0, "Evaluate every this many steps (0: only before the first and after the last step).")
    eval_on_start: bool = _key(True, "Evaluate before the first step.")
    per_device_eval_batch_size: int = _key(64, "Prompts per evaluation batch.")
    eval_rollout_n: int = _key(
        0,
        "Samples per evaluation prompt at the training sampling settings, for eval_mean@k and eval_pass@k (0: greedy only).",
    )
    max_evaluate_steps: int = _key(-1, "Evaluation batches per process at most (-1: the whole eval_datasets).")
    output_dir: str = _key("output", "Run folder: checkpoints, metrics.jsonl, completions.jsonl, the resolved config.")
    report_to: list[str] = _key(
        ["visualdl"],
        "Dashboards that get the run's scalars (train/<key> every step, validation/<key> at each evaluation, the same names on "
        "each): visualdl, tensorboard (event files in logging_dir; pip install tensorboardX), wandb (Weights & Biases: project "
        "$WANDB_PROJECT or paddle-grpo, files under $WANDB_DIR or output_dir, WANDB_MODE=offline without a network; pip install "
        "wandb), or none. metrics.jsonl is written whatever this says.",
        choices=[*DASHBOARDS.names(), NONE],
    )
    logging_dir: Optional[str] = _key(None, "VisualDL's and TensorBoard's log folder; default: <output_dir>/vdl_log.")
    logging_steps: int = _key(1, "Print a console line every this many steps (metrics.jsonl gets every step).")
    disable_tqdm: bool = _key(False, "No progress bar on the console (the lines of logging_steps stay).")
    log_completions_per_step: int = _key(4, "Completions written to completions.jsonl per step (0: none).")
    save_steps: int = _key(0, "Save a checkpoint every this many steps (0: only at the end).")
    save_total_limit: Optional[int] = _key(
        None,
        "Keep at most this many checkpoints of this run's lineage (the lowest steps removed first; never the one just saved nor the one "
        "the run resumed from; other runs' checkpoints are not counted).",
    )
    resume_from_checkpoint: Optional[str] = _key(
        None,
        "Continue a run from a checkpoint folder, or auto: the newest intact checkpoint of this run's lineage in output_dir (a fresh start "
        "when there is none).",
    )
    overwrite_output_dir: bool = _key(
        False,
        "Start a new run in an output_dir that holds another run's files (they are removed first); without it such a folder is refused "
        "unless resume_from_checkpoint is set.",
    )
    allow_config_change: bool = _key(
        False,
        "On resume, accept changes to keys that change what a step trains on (rollout_n, batch sizes, seed, datasets, max_dec_len, ...); "
        "without it they are refused, naming the old and new values.",
    )
    trust_pickled_checkpoint: bool = _key(
        False,
        "Resume from a checkpoint of an earlier version, whose optimizer.pdopt and pending_rollout.pkl are pickle (loading them runs any "
        "code their writer put in them): only for checkpoints you or someone you trust wrote. Without it such a checkpoint is refused; its "
        "next save writes safetensors and JSON.",
    )

    @property
    def resolved_logging_dir(self) -> str:
        return self.logging_dir or os.path.join(self.output_dir, "vdl_log")


def check_evaluation(c: Evaluation) -> None:
    check(c.per_device_eval_batch_size >= 1, "per_device_eval_batch_size must be at least 1")
    check(c.eval_rollout_n >= 0, f"eval_rollout_n = {c.eval_rollout_n}: must be >= 0 (0: greedy evaluation only)")
    check(
        c.max_evaluate_steps == -1 or c.max_evaluate_steps >= 1,
        f"max_evaluate_steps = {c.max_evaluate_steps}: must be -1 (all) or at least 1",
    )


def check_logging_and_checkpoints(c: Evaluation) -> None:
    check(len(set(c.report_to)) == len(c.report_to), f"report_to = {show(c.report_to)} names a dashboard twice")
    check(
        NONE not in c.report_to or c.report_to == [NONE],
        f"report_to = {show(c.report_to)}: none means no dashboard, so it goes alone",
    )
    check(c.eval_steps >= 0 and c.save_steps >= 0, "eval_steps and save_steps must be >= 0")
    check(c.logging_steps >= 1, "logging_steps must be at least 1")
    check(c.log_completions_per_step >= 0, "log_completions_per_step must be >= 0")
    check(c.save_total_limit is None or c.save_total_limit >= 1, "save_total_limit must be at least 1 (or null: keep all)")
