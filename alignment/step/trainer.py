"""The GRPO loop, readable top to bottom: `train` is the whole run, and each step is

    prompts -> rollout (G completions each) -> rewards -> group advantages -> clipped policy update

as docs/architecture.md ("One step") lists it. The run is set up from its config in alignment/run/setup.py (its parts built
in alignment/run/build.py, with each phase's settings), each phase lives in its own module of alignment/step/, the math in
alignment/algo/; this file moves data between the phases and times them.
"""

import time
from pathlib import Path

import numpy as np

from alignment.basics.errors import NonFiniteError, RewardServerError, RewardsFailedError
from alignment.rollout.link import trained_parameters
from alignment.basics.runtime import contiguous_kernels
from alignment.run.setup import RunSetup
from alignment.step.advantages import step_advantages
from alignment.storage.curves import plot_curves
from alignment.step.evaluation import evaluate
from alignment.step.logger import RunLogger
from alignment.step.memory import MemoryGuard, step_peak_bytes
from alignment.step.metrics import completion_rows, step_metrics
from alignment.step.rollout import Sampler, dynamic_sampling_metrics, keep_groups_with_signal, received_batch, sample_and_score
from alignment.step.scoring import nothing_scored
from alignment.step.state import Progress, Run, save, saved_before_stopping, saved_if_rollout_stops
from alignment.step.termination import TerminationRequest, resume_command
from alignment.step.update import Learner, reference_logprobs, update_policy


def train(setup: RunSetup) -> Path:
    """The run that alignment/run/setup.py's set_up_run prepared, step by step -> its last checkpoint."""
    if setup.parts is None:  # a resume at the run's last step: nothing to train
        return setup.resume.path
    world, link, data, parts, settings = setup.world, setup.link, setup.data, setup.parts, setup.settings
    resume, state, loop = setup.resume, setup.state, settings.loop
    first_step = state["step"]
    logger = RunLogger(
        loop.output_dir, loop.dashboards, loop.logging_steps, data.total_steps, first_step, world.is_main,
        resume_offsets=state.get("log_offsets", {}) if resume else None,  # {}: a checkpoint older than the offsets: append
    )
    sampler = Sampler(parts.engine, parts.scorer, data.tokenizer, settings.rollout, world, parts.sampling)
    run = Run(settings, world, link, data, parts, sampler, logger, setup.lineage)
    announce(run, resume, first_step)
    progress = Progress(checkpoint=resume and resume.path, skipped_steps=state.get("skipped_steps", 0))
    step = first_step
    guard = MemoryGuard(parts.memory.limit, lambda: out_of_memory_advice(run, progress, step))
    step_peak_bytes()  # each step's peak from here on
    with TerminationRequest(loop.max_train_minutes) as terminate, logger, guard:
        if data.eval_prompts and settings.evaluation.eval_on_start and first_step == 0:
            results, failure = evaluate(sampler, settings.evaluation, data.eval_prompts, 0)
            if failure:
                raise failure
            logger.log_eval(0, results)
        for step in range(first_step + 1, data.total_steps + 1):
            scored, timings, extra_metrics = collect_batch(run, progress, step)
            skipped = train_on(run, progress, step, scored, timings, extra_metrics)
            check_progress(run, progress, step, scored, skipped)
            if not finish_step(run, progress, step, terminate):
                break
        if link:
            with saved_if_rollout_stops(run, progress, step):  # a rollout process that died at the end: say where the state is
                link.wait_finished()
    if world.is_main:
        plot_curves(loop.output_dir)
    return progress.checkpoint


def announce(run: Run, resume, first_step: int) -> None:
    """grpo_config.json into the run folder; what the run will do, on the console and in the log."""
    loop, data, world, logger = run.settings.loop, run.data, run.world, run.logger
    if world.is_main:
        Path(loop.output_dir, "grpo_config.json").write_text(loop.config_json)
    logger.print(run.parts.memory.line)
    logger.print(f"compute: {run.parts.compute.reason}")
    rollout = f"rollout with the {type(run.parts.engine).__name__}"
    if run.link:
        rollout = f"rollout in {run.link.workers} rollout process(es)" + (
            ", one step off (async_generate)" if run.link.async_generate else ""
        )
    logger.print(
        f"{len(data.train_prompts)} training prompts ({data.truncated} truncated, {data.dropped} dropped over max_prompt_len), "
        f"{len(data.eval_prompts)} evaluation prompts; "
        f"{data.total_steps} steps of {data.schedule.global_batch} prompts x {run.settings.rollout.rollout_n}; "
        + rollout
        + (f"; AdamW state sharded over {world.sharding_degree} processes (stage1)" if world.sharding_degree > 1 else "")
        + (f"; resuming from {resume.path} after step {first_step}" if resume else "")
    )


def out_of_memory_advice(run: Run, progress: Progress, step: int) -> str:
    """What the memory guard's message adds: where the run was, what a resume takes, what to change."""
    budget = run.parts.memory.budget
    checkpoint = f"the last checkpoint is {progress.checkpoint}" if progress.checkpoint else "no checkpoint was saved yet"
    return (
        f"during step {step}; {checkpoint} (resume with --resume_from_checkpoint auto); a smaller micro_batch_token_budget "
        f"(now {budget.update or 'none'}), recompute true or lora true lowers the peak"
    )


def collect_batch(run: Run, progress: Progress, step: int) -> tuple:
    """Rollout and scoring (from the rollout processes, or here), dynamic sampling's refills -> (ScoredBatch without
    advantages, timings, metrics of the rollout processes and of dynamic sampling). A scoring failure in any process
    stops every process after the same step, the main one saving it."""
    world, link, data = run.world, run.link, run.data
    prompts = [data.train_prompts[i] for i in data.schedule.indices(step - 1, world.rank)]
    failure = counts = None
    link_metrics = {}
    try:
        if link:
            with saved_if_rollout_stops(run, progress, step - 1):
                scored, timings, link_metrics = received_batch(link, run.sampler, prompts, step)
        else:
            scored, timings = sample_and_score(run.sampler, prompts, step, "train")
        if run.settings.rollout.dynamic_sampling:
            scored, counts = keep_groups_with_signal(run.sampler, scored, data.train_prompts, step, timings)
    except RewardServerError as error:
        failure = error
    elsewhere = RewardServerError(
        "another process's reward scoring failed: its log (<log_dir>/workerlog.<rank>) names the server and the cause"
    )
    if failure := world.first_failure(failure, elsewhere):
        raise saved_before_stopping(run, progress, failure, step - 1, "once the reward server answers again") from None
    sampling_metrics = dynamic_sampling_metrics(counts, world) if counts else {}
    return scored, timings, {**sampling_metrics, **link_metrics}


def train_on(run: Run, progress: Progress, step: int, scored, timings: dict, extra_metrics: dict):
    """Advantages, the policy update, the engine's weight refresh, then the step's log lines -> what was not finite
    when the step was skipped, or None."""
    settings, world, parts = run.settings, run.world, run.parts
    learner = Learner(parts.model, parts.ref_model, parts.optimizer)
    if settings.advantages.use_kl_in_reward:  # the KL in the reward needs the reference model's log-probs before the advantages
        with contiguous_kernels():
            scored.ref_logprobs = reference_logprobs(learner, scored, run.data.tokenizer.pad_token_id, settings.update, parts.memory.budget)
    scored.advantages, advantage_metrics = step_advantages(scored, settings.advantages, world)
    rewarded = time.perf_counter()
    learning_rate = parts.scheduler.get_lr()
    with contiguous_kernels():
        update = update_policy(learner, scored, settings.update, world, run.data.tokenizer.pad_token_id, step, parts.memory.budget)
    parts.scheduler.step()
    updated = time.perf_counter()
    sync_gap = None if run.link else parts.engine.sync()  # the fused engine refreshes its weights and checks them against the actor
    finished = time.perf_counter()

    skipped = update.skipped_phase
    progress.count_skip(skipped)
    timings.update(train=updated - rewarded, sync=finished - updated)
    metrics = step_metrics(scored, update.metrics, learning_rate, timings, world)
    extra_metrics["memory/peak_gb"] = float(world.max(np.array([step_peak_bytes()]))[0]) / 2**30
    if sync_gap is not None:  # each process checks its own engine
        extra_metrics["rollout/weight_sync_gap"] = float(world.max(np.array([sync_gap]))[0])
    step_flags = {"step_skipped": int(bool(skipped)), "skipped_steps": progress.skipped_steps}
    run.logger.log_step(step, {**metrics, **advantage_metrics, **extra_metrics, **step_flags})
    run.logger.log_completions(step, completion_rows(scored, settings.loop.log_completions_per_step))
    return skipped


def check_progress(run: Run, progress: Progress, step: int, scored, skipped) -> None:
    """Stops the run when nothing could be scored, or nothing was finite, for max_consecutive_skips steps in a row."""
    limit = run.settings.loop.max_consecutive_skips
    progress.unscored_in_a_row = progress.unscored_in_a_row + 1 if nothing_scored(scored, run.world) else 0
    if progress.unscored_in_a_row >= limit:  # the loss is empty: the run would learn nothing
        first_error = next((e for e in scored.errors if e), "another process's log names it")
        failure = RewardsFailedError(
            f"step {step}: no completion could be scored in {progress.unscored_in_a_row} consecutive steps "
            f"(max_consecutive_skips), so nothing was learned from them; the first error: {first_error}"
        )
        raise saved_before_stopping(run, progress, failure, step, "mend the data or the reward functions") from None
    if skipped:
        in_a_row, checkpoint = progress.skipped_in_a_row, progress.checkpoint
        run.logger.print(f"step {step} skipped: {skipped} not finite ({in_a_row} in a row; the weights are those before the step)")
        if in_a_row >= limit:
            raise NonFiniteError(
                f"step {step}: {skipped} not finite for {in_a_row} consecutive steps (max_consecutive_skips); "
                f"the run stops with the weights of step {step - in_a_row}" + (f"; last checkpoint {checkpoint}" if checkpoint else "")
            )


def finish_step(run: Run, progress: Progress, step: int, terminate: TerminationRequest) -> bool:
    """The next rollout (one step off), evaluation and saving when due, then the word to the rollout processes
    -> whether the run goes on."""
    settings, link = run.settings, run.link
    if link:
        with saved_if_rollout_stops(run, progress, step):
            link.collect_ahead(step)  # one step off: the next step's rollout, generated while this one trained
    out_of_time = step < run.data.total_steps and terminate.out_of_time(run.world)
    last = step == run.data.total_steps or out_of_time  # evaluated and saved
    eval_steps, save_steps = settings.evaluation.eval_steps, settings.loop.save_steps
    if run.data.eval_prompts and (last or (eval_steps and step % eval_steps == 0)):
        if link:
            run.parts.engine.sync()  # the training process's own engine, used for evaluation only
        results, failure = evaluate(run.sampler, settings.evaluation, run.data.eval_prompts, step)
        if failure:
            raise saved_before_stopping(run, progress, failure, step, "once the reward server answers again") from None
        run.logger.log_eval(step, results)
    if last or (save_steps and step % save_steps == 0):
        progress.checkpoint = save(run, progress, step)
    stopping = out_of_time or terminate.agreed(run.world)
    if stopping and (progress.checkpoint is None or progress.checkpoint.name != f"checkpoint-{step}"):
        progress.checkpoint = save(run, progress, step)
    if link:
        with saved_if_rollout_stops(run, progress, step):
            link.send_word(step, trained_parameters(run.parts.model), stopping)  # go with the new weights, or stop
    if stopping:
        stopped_by = f"max_train_minutes ({settings.loop.max_train_minutes:g})" if out_of_time else terminate.requested or "another process"
        run.logger.print(
            f"stopped by {stopped_by} after step {step} (saved in {progress.checkpoint}); "
            f"resume with: {resume_command()}"
        )
    return not stopping
