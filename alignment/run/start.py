"""Where a run starts, before any model loads: the run folder (another run's is refused unless resuming or
overwrite_output_dir), the verified checkpoint to resume from and the settings it may not change, the
model folders (a .gguf imported once), and a resume with nothing left to train. Every process calls these
together; the main one writes, and a refusal in any process stops all of them."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path

import numpy as np

from alignment.basics.errors import CheckpointError, ConfigError, GGUFImportError
from alignment.models.gguf_import import import_if_changed
from alignment.parallel.distributed import World
from alignment.config.checks import names_gguf
from alignment.config.schema import GRPOConfig
from alignment.storage.checkpoint import previous_run_files, remove_previous_run
from alignment.storage.resume import Lineage, pickled_files, resolve_resume, settings_changes


def start_point(config: GRPOConfig, world: World) -> tuple:
    """Where the run starts -> (the verified ResumePoint or None, the Lineage its checkpoints get). Refuses an
    output_dir holding another run unless resuming or overwrite_output_dir, and a resume that changes what a
    step trains on unless allow_config_change; every process decides together, before any writes."""
    current = json.loads(config.to_json())

    def matches(settings: dict, state: dict) -> bool:
        return not settings_changes(settings, state.get("processes"), current, world.size)[0]

    refusal = resume = previous = None
    notes = []
    try:
        resume, skipped = resolve_resume(config.resume_from_checkpoint, config.output_dir, matches)
        notes += [f"skipped damaged checkpoint {path}: {why}" for path, why in skipped]
        if skipped and resume is None:
            notes.append("no intact checkpoint left: the run starts anew")
        previous = previous_run_files(config.output_dir, config.resolved_logging_dir) if config.resume_from_checkpoint is None else []
        shown = ", ".join(path.name for path in previous[:6]) + (f" and {len(previous) - 6} more" if len(previous) > 6 else "")
        if previous and not config.overwrite_output_dir:
            raise ConfigError(
                f"output_dir {config.output_dir} holds another run ({shown}): continue it with --resume_from_checkpoint auto, "
                f"replace it with --overwrite_output_dir, or choose another --output_dir"
            )
        if previous:
            notes.append(f"overwrite_output_dir: removed the previous run's {shown} from {config.output_dir}")
        if resume and (pickled := pickled_files(resume.path)) and not config.trust_pickled_checkpoint:
            raise ConfigError(
                f"resume_from_checkpoint: {resume.path} holds {' and '.join(pickled)}, pickle written by an earlier version, "
                f"which runs any code its writer put in it when loaded: resume it only if you trust whoever wrote it, with "
                f"--trust_pickled_checkpoint true (its next save writes safetensors and JSON)"
            )
        if resume:
            refused, allowed = settings_changes(resume.settings, resume.state.get("processes"), current, world.size)
            if refused and not config.allow_config_change:
                raise ConfigError(
                    f"resume_from_checkpoint: {resume.path} was trained with other values of keys that change what a step "
                    f"trains on: {'; '.join(refused)}; resume with the old values, or give --allow_config_change"
                )
            if refused or allowed:
                notes.append(f"resuming with changed settings: {'; '.join(refused + allowed)}")
    except (ConfigError, CheckpointError) as error:
        refusal = error
    if refusal := world.first_failure(
        refusal, ConfigError("another process refused to start: its log (<log_dir>/workerlog.<rank>) says why")
    ):
        raise refusal
    if world.is_main:
        remove_previous_run(previous)
        for note in notes:
            print(note, flush=True)
    return resume, (Lineage.of(resume.state).continued(resume.step, resume.path) if resume else Lineage.new())


def model_folders(config: GRPOConfig, world: World) -> tuple:
    """-> (the actor's folder, the tokenizer's): actor_model_name_or_path and tokenizer_name_or_path, where a .gguf
    stands for <output_dir>/imported/<file stem>, imported there by the main process unless an import of the file
    as it is now is there already (alignment/models/gguf_import.py). grpo_config.json keeps the path the user gave."""
    paths = {
        "actor_model_name_or_path": config.actor_model_name_or_path,
        "tokenizer_name_or_path": config.tokenizer_name_or_path or config.actor_model_name_or_path,
    }
    folders = {key: Path(config.output_dir, "imported", Path(path).stem) if names_gguf(path) else path for key, path in paths.items()}
    ggufs = {paths[key]: key for key in reversed(paths) if names_gguf(paths[key])}  # one import where both name one file

    def import_all() -> None:
        for path, key in ggufs.items():
            started = time.perf_counter()
            try:
                fresh = import_if_changed(path, folders[key])
            except (GGUFImportError, OSError) as e:  # OSError: a full disk while writing the folder
                raise ConfigError(f"{key}: {e}") from None
            print(f"{key}: imported {path} into {folders[key]} in {time.perf_counter() - started:.1f} s" if fresh else
                  f"{key}: {path} is unchanged since its import: loading {folders[key]}", flush=True)

    if ggufs:
        failure = None
        try:
            main_does(import_all, world)
        except ConfigError as error:
            failure = error
        if failure := world.first_failure(
            failure, ConfigError("the main process could not import a .gguf model: its log (<log_dir>/workerlog.0) says why")
        ):
            raise failure
    return str(folders["actor_model_name_or_path"]), str(folders["tokenizer_name_or_path"])


def main_does(work, world: World):
    """work() on the main process, the others waiting -> its result there (None elsewhere); its error is raised there.
    The waiting meets the main process in a collective every second: gloo ends one that waits more than 30 s."""
    if world.size == 1:
        return work()
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(work) if world.is_main else None
        while world.max(np.array([float(job is not None and not job.done())]))[0]:
            if job:
                wait_for([job], timeout=1)
            else:
                time.sleep(1)
        return job.result() if job else None


def nothing_to_train(resume, total_steps: int, world: World) -> Path:
    """A resume at or past the run's last step: say so (an error when max_steps is below the checkpoint's step)."""
    if resume.step > total_steps:
        raise ConfigError(
            f"max_steps: the run ends at step {total_steps}, before {resume.path} (step {resume.step}); "
            f"give --max_steps above {resume.step} to train further"
        )
    if world.is_main:
        print(
            f"nothing to train: {resume.path} is the run's last step ({total_steps}); "
            f"give --max_steps above {total_steps} to train further",
            flush=True,
        )
    return resume.path
