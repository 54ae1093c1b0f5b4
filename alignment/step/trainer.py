"""The GRPO loop, readable top to bottom: `train` is the whole run, and each step is

    prompts -> rollout (G completions each) -> rewards -> group advantages -> clipped policy update

as ../shared/DESIGN.md lists it. The math lives in alignment/algo/core.py; this file moves data between the
phases and times them.
"""

import contextlib
import math
import time
import warnings
from pathlib import Path

import numpy as np

from alignment.models.fused_train import use_training_ops
from alignment.models.modeling import (
    enable_recompute,
    load_causal_lm,
    load_tokenizer,
)
from alignment.parallel.distributed import init_world
from alignment.parallel.optim import NonFiniteError, build_optimizer
from alignment.rewards.remote import RewardServerError
from alignment.rollout.link import PENDING_FILE, RolloutWorkerError, RunPlan, TrainerLink, placement, trained_parameters
from alignment.rollout.multi_turn import check_template, tool_schemas
from alignment.run.build import actor_sources, load_actor, load_prompts, matmul_compute, model_dtype, rollout_engine, sampling_params
from alignment.run.config import GRPOConfig
from alignment.run.data import PromptSchedule
from alignment.run.runtime import contiguous_kernels
from alignment.run.start import model_folders, nothing_to_train, start_point
from alignment.step.advantages import step_advantages
from alignment.step.checkpoint import checkpoint_path, load_training_state, save_checkpoint
from alignment.step.curves import plot_curves
from alignment.step.evaluation import evaluate
from alignment.step.logger import RunLogger
from alignment.step.metrics import completion_rows, step_metrics
from alignment.step.rollout import dynamic_sampling_metrics, keep_groups_with_signal, received_batch, sample_and_score
from alignment.step.scoring import RewardsFailedError, build_scorer, nothing_scored
from alignment.step.termination import TerminationRequest
from alignment.step.update import update_policy


def train(config: GRPOConfig) -> Path:
    placement(config.rollout_workers)  # one training process beside the rollout processes, or none of them
    world = init_world(config.sharding, config.sharding_parallel_degree, config.rollout_workers)
    link = TrainerLink(config.rollout_workers, config.async_generate, config.output_dir) if config.rollout_workers else None
    resume, lineage = start_point(config, world)  # refuses another run's output_dir; verifies the checkpoint
    actor_folder, tokenizer_folder = model_folders(config, world)  # a .gguf is imported once, into <output_dir>/imported
    tokenizer = load_tokenizer(tokenizer_folder, config.chat_template)
    if config.resolved_environment:
        check_template(tokenizer, tool_schemas(config))
    train_prompts, truncated, dropped = load_prompts(config.train_datasets, tokenizer, config)
    eval_prompts = load_prompts(config.eval_datasets, tokenizer, config)[0] if config.eval_datasets else []
    schedule = PromptSchedule(len(train_prompts), config.per_device_prompt_batch_size, world.size, config.seed)
    total_steps = config.max_steps if config.max_steps > 0 else math.ceil(config.num_train_epochs * schedule.steps_per_epoch)
    weights_folder, adapter_folder = actor_sources(config, resume, actor_folder)
    if resume and resume.step >= total_steps:
        if link:  # nothing to generate either
            link.publish(RunPlan(tokenizer_folder, weights_folder, adapter_folder, total_steps, total_steps, False, []))
            link.wait_finished()
        return nothing_to_train(resume, total_steps, world)

    model = load_actor(config, weights_folder, adapter_folder)  # adapters before the training operators, the engine and the optimizer
    if config.recompute:
        enable_recompute(model, config.recompute_granularity)
    compute = matmul_compute(config, model)
    if config.use_fused_train_ops:
        why_not = use_training_ops(model, compute.bf16)
        if why_not:
            warnings.warn(f"use_fused_train_ops: training with paddle's own kernels ({why_not})")
    ref_model = None
    if config.kl_loss_coeff > 0 and not config.lora:  # no reference model at kl_loss_coeff 0; with LoRA it is the actor without adapters
        ref_model = load_causal_lm(actor_folder, model_dtype(config))
        ref_model.eval()
        for parameter in ref_model.parameters():
            parameter.stop_gradient = True
    engine = None  # with rollout processes, the training process generates for evaluation only
    if link is None or eval_prompts:
        engine = rollout_engine(config, model, tokenizer, compute.bf16)
    scorer = build_scorer(config)
    optimizer, scheduler = build_optimizer(model, config, total_steps, world)
    state = load_training_state(resume.path, optimizer, config.trust_pickled_checkpoint) if resume else {"step": 0}  # optimizer moments and the schedule
    first_step = state["step"]
    sampling = sampling_params(config)
    if link:
        if resume and config.async_generate:
            link.restore_pending(resume.path, first_step + 1, config.trust_pickled_checkpoint)
        names = [name for name, _ in trained_parameters(model)]
        link.publish(RunPlan(tokenizer_folder, weights_folder, adapter_folder, first_step, total_steps, link.pending is not None, names))

    logger = RunLogger(
        config.output_dir, config.resolved_logging_dir, config.logging_steps, total_steps, first_step, world.is_main,
        resume_offsets=state.get("log_offsets", {}) if resume else None,  # {}: a checkpoint older than the offsets: append
    )
    if world.is_main:
        Path(config.output_dir, "grpo_config.json").write_text(config.to_json())
    logger.print(f"compute: {compute.reason}")
    logger.print(
        f"{len(train_prompts)} training prompts ({truncated} truncated, {dropped} dropped over max_prompt_len), "
        f"{len(eval_prompts)} evaluation prompts; {total_steps} steps of {schedule.global_batch} prompts x {config.rollout_n}; "
        + (f"rollout in {config.rollout_workers} rollout process(es)" + (", one step off (async_generate)" if config.async_generate else "") if link else f"rollout with the {type(engine).__name__}")
        + (f"; AdamW state sharded over {world.sharding_degree} processes (stage1)" if world.sharding_degree > 1 else "")
        + (f"; resuming from {resume.path} after step {first_step}" if resume else "")
    )
    if eval_prompts and config.eval_on_start and first_step == 0:
        results, failure = evaluate(engine, scorer, eval_prompts, tokenizer, config, world, sampling, 0)
        if failure:
            raise failure
        logger.log_eval(0, results)

    checkpoint, skipped_steps, skipped_in_a_row, unscored_in_a_row = resume and resume.path, state.get("skipped_steps", 0), 0, 0

    def save(step: int) -> Path:
        """Every process calls it (with sharding, the optimizer state is gathered from all); the main one writes."""
        optimizer_state = optimizer.state_dict()
        if not world.is_main:
            return checkpoint_path(config.output_dir, step)
        state = {"total_steps": total_steps, "log_offsets": logger.offsets(), "skipped_steps": skipped_steps, "processes": world.size}
        in_flight = {PENDING_FILE: link.pending_bytes()} if link and link.pending else {}  # one step off: the next step's rollout
        path = save_checkpoint(
            config.output_dir, step, model, tokenizer, optimizer_state, config.to_json(), state, config.save_total_limit, lineage, in_flight
        )
        logger.print(f"saved {path}")
        return path

    def stop_saving(error: Exception, finished_step: int, then: str) -> Exception:
        """Scoring failed (after the client's retries, or for every completion of several steps): keep what the
        finished steps learned, then stop. Only the main process writes; every rank learns of the failure at
        the same point."""
        saved = checkpoint if checkpoint and checkpoint.name == f"checkpoint-{finished_step}" else None
        if saved is None and finished_step > 0:
            saved = save(finished_step)
        where = f"{saved} holds the state after step {finished_step}" if saved else "no step had finished, nothing to resume"
        return type(error)(f"{error}\n{where}; {then}, then rerun with --resume_from_checkpoint auto")

    @contextlib.contextmanager
    def saved_if_rollout_stops(finished_step: int):
        """A rollout process failed or died: save the last finished step, then let a failed one exit."""
        try:
            yield
        except RolloutWorkerError as error:
            failure = stop_saving(error, finished_step, "mend what stopped the rollout process")
            link.release()
            raise failure from None

    with TerminationRequest() as terminate, logger:
        for step in range(first_step + 1, total_steps + 1):
            prompts = [train_prompts[i] for i in schedule.indices(step - 1, world.rank)]
            failure = counts = None
            link_metrics = {}
            try:
                if link:
                    with saved_if_rollout_stops(step - 1):
                        scored, timings, link_metrics = received_batch(link, prompts, scorer, tokenizer, config, step)
                else:
                    scored, timings = sample_and_score(engine, scorer, prompts, tokenizer, config, world, sampling, step, "train")
                if config.dynamic_sampling:
                    scored, counts = keep_groups_with_signal(scored, engine, scorer, train_prompts, tokenizer, config, world, sampling, step, timings)
            except RewardServerError as error:
                failure = error
            elsewhere = RewardServerError("another process's reward scoring failed: its log (<log_dir>/workerlog.<rank>) names the server and the cause")
            if failure := world.first_failure(failure, elsewhere):  # every process stops after the same step, the main one saving it
                raise stop_saving(failure, step - 1, "once the reward server answers again") from None
            sampling_metrics = dynamic_sampling_metrics(counts, world) if counts else {}
            scored.advantages = step_advantages(scored, config, world)
            rewarded = time.perf_counter()
            learning_rate = scheduler.get_lr()
            with contiguous_kernels():
                update = update_policy(model, ref_model, optimizer, scored, config, world, tokenizer.pad_token_id, step)
            scheduler.step()
            updated = time.perf_counter()
            sync_gap = None if link else engine.sync()  # the fused engine refreshes its weights and checks them against the actor
            finished = time.perf_counter()

            skipped = update.pop("skipped_phase")
            skipped_steps, skipped_in_a_row = skipped_steps + bool(skipped), (skipped_in_a_row + 1) if skipped else 0
            timings.update(train=updated - rewarded, sync=finished - updated)
            metrics = step_metrics(scored, update, learning_rate, timings, world)
            if sync_gap is not None:  # each process checks its own engine
                link_metrics["rollout/weight_sync_gap"] = float(world.max(np.array([sync_gap]))[0])
            logger.log_step(step, {**metrics, **sampling_metrics, **link_metrics, "step_skipped": int(bool(skipped)), "skipped_steps": skipped_steps})
            logger.log_completions(step, completion_rows(scored, config.log_completions_per_step))
            unscored_in_a_row = unscored_in_a_row + 1 if nothing_scored(scored, world) else 0
            if unscored_in_a_row >= config.max_consecutive_skips:  # the loss is empty: the run would learn nothing
                first_error = next((e for e in scored.errors if e), "another process's log names it")
                failure = RewardsFailedError(
                    f"step {step}: no completion could be scored in {unscored_in_a_row} consecutive steps "
                    f"(max_consecutive_skips), so nothing was learned from them; the first error: {first_error}"
                )
                raise stop_saving(failure, step, "mend the data or the reward functions") from None
            if skipped:
                logger.print(f"step {step} skipped: {skipped} not finite ({skipped_in_a_row} in a row; the weights are those before the step)")
                if skipped_in_a_row >= config.max_consecutive_skips:
                    raise NonFiniteError(
                        f"step {step}: {skipped} not finite for {skipped_in_a_row} consecutive steps (max_consecutive_skips); "
                        f"the run stops with the weights of step {step - skipped_in_a_row}" + (f"; last checkpoint {checkpoint}" if checkpoint else "")
                    )
            if link:
                with saved_if_rollout_stops(step):
                    link.collect_ahead(step)  # one step off: the next step's rollout, generated while this one trained
            last = step == total_steps
            if eval_prompts and (last or (config.eval_steps and step % config.eval_steps == 0)):
                if link:
                    engine.sync()  # the training process's own engine, used for evaluation only
                results, failure = evaluate(engine, scorer, eval_prompts, tokenizer, config, world, sampling, step)
                if failure:
                    raise stop_saving(failure, step, "once the reward server answers again") from None
                logger.log_eval(step, results)
            if last or (config.save_steps and step % config.save_steps == 0):
                checkpoint = save(step)
            stopping = terminate.agreed(world)
            if stopping and (checkpoint is None or checkpoint.name != f"checkpoint-{step}"):
                checkpoint = save(step)
            if link:
                with saved_if_rollout_stops(step):
                    link.send_word(step, trained_parameters(model), stopping)  # go with the new weights, or stop
            if stopping:
                logger.print(f"stopped by {terminate.requested or 'another process'} after step {step}; resume with --resume_from_checkpoint auto")
                break
        if link:
            with saved_if_rollout_stops(step):  # a rollout process that died at the end: say where the state is
                link.wait_finished()
    if world.is_main:
        plot_curves(config.output_dir)
    return checkpoint


