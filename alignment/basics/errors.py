"""Every error a run or a command stops with: one line for the user, naming what was wrong and where. run_grpo
prints RUN_ERRORS as `run_grpo: error: ...` and exits 2; anything else is a bug and keeps its traceback."""


class ConfigError(ValueError):
    """A configuration mistake; the message names the key(s) and, where known, the file."""


class DataError(ValueError):
    """A problem with a data file; the message starts with file:line."""


class ModelLoadError(ValueError):
    """A model or tokenizer folder that does not load; the message names the file and what is wrong with it."""


class ChatTemplateError(ValueError):
    """A chat template that took longer, or wrote more, than one rendering may."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message names it, the cause, and the checkpoint a resume takes."""


class LogWriteError(RuntimeError):
    """metrics.jsonl, completions.jsonl or the VisualDL log could not be written (disk full, no permission)."""


class DistributedError(RuntimeError):
    """A collective operation failed because another process stopped; the message names this process."""


class NonFiniteError(RuntimeError):
    """The loss or the gradients stayed NaN or infinite for max_consecutive_skips steps in a row."""


class RewardServerError(RuntimeError):
    """The reward server could not score a batch; the message names the server and the cause."""


class RewardsFailedError(RuntimeError):
    """Every completion of max_consecutive_skips steps in a row failed to score."""


class WeightSyncError(RuntimeError):
    """A rollout engine no longer computes the actor's policy (stale weights or wrong operators)."""


class RolloutWorkerError(RuntimeError):
    """A rollout process failed or died; the message names it."""


class TrainerGone(RuntimeError):
    """The training process stopped (its connection closed): a rollout process has nobody to serve."""


class WireError(ValueError):
    """A record or message that is not what it should be; the message names the field."""


class MemoryPlanError(ValueError):
    """A run whose estimated memory exceeds what the machine has; the message names settings that would fit."""


class OutOfMemoryError(RuntimeError):
    """The run's resident memory reached memory_limit_gb; the message says where and names the last checkpoint."""


class IsolationError(RuntimeError):
    """The machine cannot isolate a tool call as the sandbox promises."""


class GGUFImportError(ValueError):
    """A GGUF this importer cannot turn into a model folder; the message names the file and the key or tensor."""


class GGUFExportError(ValueError):
    """A folder this writer cannot turn into a GGUF; the message names the folder and the file or key."""


class ExportError(Exception):
    """A checkpoint that cannot be exported, or an output folder in the way; the message names it."""


RUN_ERRORS = (
    ConfigError, ModelLoadError, DataError, RewardServerError, RewardsFailedError, WeightSyncError, NonFiniteError, DistributedError,
    CheckpointError, LogWriteError, RolloutWorkerError, MemoryPlanError, OutOfMemoryError,
)
