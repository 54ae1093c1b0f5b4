"""The GRPO loop, readable top to bottom: `train` is the whole run, and each step is

    prompts -> rollout (G completions each) -> rewards -> group advantages -> clipped policy update

as ../shared/DESIGN.md lists it. The math lives in alignment/algo/core.py; this file moves data between the
phases and times them.
"""

import contextlib
import dataclasses
import functools
import math
import os
import signal
import time
import warnings
import weakref
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle

from alignment.algo.core import (
    LossSettings,
    aggregation_counts,
    baseline_subtracted,
    chunked_token_logprobs,
    entropy_bonus,
    entropy_threshold,
    group_advantages,
    groups_with_signal,
    loss_token_weights,
    mean_and_pass_at_k,
    normalized_per_function,
    policy_loss,
    rloo_advantages,
    rollout_correction,
    sample_std,
    whiten,
    whitening_sums,
)
from alignment.step.checkpoint import checkpoint_path, load_training_state, save_checkpoint
from alignment.run.config import GRPOConfig
from alignment.models.cpu_bf16 import choose_compute
from alignment.step.curves import plot_curves
from alignment.run.data import PromptSchedule, encode_prompts, read_prompt_records
from alignment.parallel.distributed import World, init_world
from alignment.models.fused_train import bf16_unavailable, groups_prompts, head_kernels, use_training_ops, weights_changed
from alignment.step.logger import RunLogger
from alignment.models.lora import adapters_disabled, apply_lora, load_adapter
from alignment.models.modeling import (
    completion_hidden,
    enable_recompute,
    load_causal_lm,
    load_tokenizer,
    make_token_batch,
    output_head,
    stop_token_ids,
)
from alignment.parallel.optim import NonFiniteError, build_optimizer, sum_gradients
from alignment.rewards import REWARD_MODEL, ScoreTable, score_completions
from alignment.run.plugins import plugin_sources
from alignment.rewards.pool import ScoringPool
from alignment.rewards.registry import reference_readers
from alignment.rewards.remote import RewardServerError, score_remote
from alignment.rollout import Rollout, SamplingParams, build_engine, concat_rollouts
from alignment.rollout.multi_turn import MultiTurnEngine, check_template, episode_sums, tool_schemas, tool_use, with_environment
from alignment.rollout.link import PENDING_FILE, RolloutWorkerError, RunPlan, TrainerLink, placement, trained_parameters
from alignment.run.start import model_folders, nothing_to_train, start_point
from alignment.run.runtime import contiguous_kernels


@dataclass
class ScoredBatch:
    """One rank's rollout with its rewards; B = len(prompts) * G rows, prompt-major."""

    prompts: list  # P EncodedPrompts
    rollout: Rollout
    completions: list  # B decoded completions
    rewards: np.ndarray  # (B,) weighted sum of the reward functions, NaN where one failed
    reward_columns: dict  # function name -> (B,) values, NaN where it failed
    errors: list  # B entries: None or "name: error" of the first failing function
    correct: np.ndarray  # (B,) bool: config.accuracy_function gave a positive value
    advantages: np.ndarray | None = None  # (B,) float32, set once the step's batch is final

    def groups(self, indices: list) -> "ScoredBatch":
        """The groups at `indices` (prompt positions), in that order."""
        rows = [group * self.rollout.group_size + member for group in indices for member in range(self.rollout.group_size)]
        return ScoredBatch(
            prompts=[self.prompts[group] for group in indices],
            rollout=self.rollout.groups(indices),
            completions=[self.completions[row] for row in rows],
            rewards=self.rewards[rows],
            reward_columns={name: values[rows] for name, values in self.reward_columns.items()},
            errors=[self.errors[row] for row in rows],
            correct=self.correct[rows],
        )


def concat_scored(parts: list, pad_token_id: int) -> ScoredBatch:
    return ScoredBatch(
        prompts=[prompt for part in parts for prompt in part.prompts],
        rollout=concat_rollouts([part.rollout for part in parts], pad_token_id),
        completions=[c for part in parts for c in part.completions],
        rewards=np.concatenate([part.rewards for part in parts]),
        reward_columns={name: np.concatenate([part.reward_columns[name] for part in parts]) for name in parts[0].reward_columns},
        errors=[e for part in parts for e in part.errors],
        correct=np.concatenate([part.correct for part in parts]),
    )


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


class RewardsFailedError(RuntimeError):
    """Every completion of max_consecutive_skips steps in a row failed to score."""


def nothing_scored(scored: ScoredBatch, world: World) -> bool:
    return not world.max(np.array([float(np.isfinite(scored.rewards).any())]))[0]


class TerminationRequest:
    """SIGTERM (a scheduler's preemption, `kill`, the launcher stopping its workers) and a first Ctrl-C only
    set a flag: the step under way finishes, every process agrees at its end, and the run saves and stops
    cleanly. A second Ctrl-C stops at once (KeyboardInterrupt), losing the steps since the last save."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        self.requested = None  # the name of the first signal
        self.previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _handle(self, number, frame):
        if number == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        if self.requested is None:
            self.requested = signal.Signals(number).name
            if number == signal.SIGINT:
                print("\nCtrl-C: the run saves and stops after this step (Ctrl-C again stops at once)", flush=True)

    def agreed(self, world: World) -> bool:
        return bool(world.max(np.array([float(self.requested is not None)]))[0])  # every rank stops after the same step


PHASES = ("train", "eval", "resample", "shuffle")


def sampling_params(config: GRPOConfig) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=config.max_dec_len,
        min_new_tokens=config.min_dec_len,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        repetition_penalty=config.repetition_penalty,
        min_p=config.min_p,
    )


def seed_phase(config: GRPOConfig, step: int, rank: int, phase: str, attempt: int = 0) -> int:
    """Each phase of each step draws from its own random streams, so a resumed run draws exactly what an
    uninterrupted one would with no random state to save, and sampling in an evaluation never shifts
    training's samples. Seeds paddle's generator (the eager engine's draws, dropout) from
    (seed, step, phase, rank) and returns the seed of (seed, step, phase) that the fused engine keys on
    together with each row's index in the global batch: with it, a run over N processes samples exactly
    the completions a one-process run with the same global batch does. `attempt` numbers the refill
    rounds of dynamic sampling and the iterations over a batch."""
    shared = [config.seed, step, PHASES.index(phase)] + ([attempt] if attempt else [])
    paddle.seed(int(np.random.SeedSequence([*shared, rank]).generate_state(1)[0]))
    return int(np.random.SeedSequence(shared).generate_state(1)[0])


def sample_and_score(engine, scorer, prompts: list, tokenizer, config: GRPOConfig, world: World, sampling: SamplingParams, step: int, phase: str, attempt: int = 0) -> tuple:
    """rollout_n completions of each prompt, scored -> (ScoredBatch without advantages, {"rollout": s, "reward": s})."""
    started = time.perf_counter()
    first_row = world.rank * len(prompts) * config.rollout_n  # this rank's rows in the global batch
    params = dataclasses.replace(sampling, seed=seed_phase(config, step, world.rank, phase, attempt), first_row=first_row)
    rollout = generate(engine, prompts, config.rollout_n, params)
    rolled_out = time.perf_counter()
    scored = score_rollout(prompts, rollout, scorer, tokenizer, config)
    return scored, {"rollout": rolled_out - started, "reward": time.perf_counter() - rolled_out}


def received_batch(link: TrainerLink, prompts: list, scorer, tokenizer, config: GRPOConfig, step: int) -> tuple:
    """Step `step`'s completions from the rollout processes, scored -> (ScoredBatch without advantages, timings,
    metrics: how stale the batch is and how long generating it took)."""
    seed_phase(config, step, 0, "train")  # paddle's generator as a colocated run leaves it (dropout in the update)
    parts, waited, broadcast = link.take(step)
    started = time.perf_counter()
    scored = score_rollout(prompts, concat_rollouts([part.rollout for part in parts], tokenizer.pad_token_id), scorer, tokenizer, config)
    timings = {"rollout": waited, "reward": time.perf_counter() - started, "weights": broadcast}
    gaps = [part.sync_gap for part in parts if part.sync_gap is not None]  # none before the first weights arrive
    return scored, timings, {
        "rollout/staleness": step - 1 - min(part.weights_step for part in parts),  # optimizer steps behind
        "rollout/generate_seconds": max(part.seconds for part in parts),
        "rollout/engine_sync_seconds": max(part.sync_seconds for part in parts),  # the rollout process's weight refresh and check
        **({"rollout/weight_sync_gap": max(gaps)} if gaps else {}),
    }


def actor_sources(config: GRPOConfig, resume, actor_folder: str) -> tuple:
    """-> (the folder the actor's weights load from, the folder of its LoRA adapter or None): a LoRA checkpoint
    holds the adapter only, its base comes from actor_model_name_or_path."""
    if resume is None:
        return actor_folder, None
    return (actor_folder, str(resume.path)) if config.lora else (str(resume.path), None)


def load_actor(config: GRPOConfig, weights_folder: str, adapter_folder):
    """The policy as the training process and the rollout processes hold it: the model, with LoRA adapters."""
    model = load_causal_lm(weights_folder, model_dtype(config))
    if config.lora:
        apply_lora(model, config.lora_rank, config.lora_alpha, config.lora_dropout, config.target_modules)
        if adapter_folder:
            load_adapter(model, adapter_folder)
    return model


def matmul_compute(config: GRPOConfig, model):
    """cpu_bf16_matmul's choice for this model on this machine (alignment/models/cpu_bf16.py)."""
    on_gpu = not model.lm_head.weight.place.is_cpu_place()
    return choose_compute(config.cpu_bf16_matmul, on_gpu, bf16_unavailable(model, config.use_fused_train_ops))


def rollout_engine(config: GRPOConfig, model, tokenizer, bf16: bool):
    """The engine that generates (use_fusemt picks the fused one), with the environment of a multi-turn run."""
    engine = build_engine(config, model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, bf16)
    return with_environment(engine, config, tokenizer, plugin_sources(config.external_plugins))


def generate(engine, prompts: list, group_size: int, params: SamplingParams) -> Rollout:
    """group_size completions of each EncodedPrompt; a multi-turn engine's environment also sees each prompt's sample."""
    ids = [p.ids for p in prompts]
    if isinstance(engine, MultiTurnEngine):
        return engine.generate(ids, group_size, params, samples=[p.record.reward_sample() for p in prompts])
    return engine.generate(ids, group_size, params)


def keep_groups_with_signal(scored: ScoredBatch, engine, scorer, train_prompts: list, tokenizer, config: GRPOConfig, world: World, sampling: SamplingParams, step: int, timings: dict) -> tuple:
    """DAPO's dynamic sampling: groups whose rewards (nearly) agree are dropped and replaced by groups of
    other prompts, sampled and scored in up to max_resample_times further rounds; if the rounds run out,
    dropped groups fill the gap (they add no policy gradient) and are counted. Refill prompts are a seeded
    draw from the whole training set per (step, round, process), so resuming draws them again exactly and
    the epoch's data order is left alone. No collective runs here, so a process whose scoring fails cannot
    leave the others waiting. -> (the batch to train on, this process's counts)."""
    wanted = len(scored.prompts)
    kept, dropped = [], []  # (batch, group) pairs
    batches = [scored]
    rounds = 0
    while True:
        signal = groups_with_signal(batches[-1].rewards, config.rollout_n, config.dynamic_sampling_min_std)
        kept += [(batches[-1], g) for g in np.flatnonzero(signal)]
        dropped += [(batches[-1], g) for g in np.flatnonzero(~signal)]
        if len(kept) >= wanted or rounds == config.max_resample_times:
            break
        rounds += 1
        rng = np.random.default_rng(seed_phase(config, step, world.rank, "resample", rounds))
        picks = rng.choice(len(train_prompts), wanted, replace=wanted > len(train_prompts))
        refill, spent = sample_and_score(engine, scorer, [train_prompts[i] for i in picks], tokenizer, config, world, sampling, step, "resample", rounds)
        batches.append(refill)
        for phase, seconds in spent.items():
            timings[phase] += seconds
    chosen = (kept + dropped)[:wanted]
    parts = [batch.groups([g for b, g in chosen if b is batch]) for batch in batches]
    counts = {"dropped_groups": len(dropped), "unfilled_groups": max(0, wanted - len(kept)), "rounds": rounds}
    return concat_scored([part for part in parts if part.prompts], tokenizer.pad_token_id), counts


def dynamic_sampling_metrics(counts: dict, world: World) -> dict:
    """keep_groups_with_signal's counts of this process -> summed over processes (rounds: the most any took)."""
    dropped, unfilled = world.sum(np.array([counts["dropped_groups"], counts["unfilled_groups"]], dtype=np.float64))
    rounds = world.max(np.array([counts["rounds"]], dtype=np.float64))[0]
    return {"dynamic_sampling/dropped_groups": int(dropped), "dynamic_sampling/unfilled_groups": int(unfilled), "dynamic_sampling/rounds": int(rounds)}


def step_advantages(scored: ScoredBatch, config: GRPOConfig, world: World) -> np.ndarray:
    """(B,) float32 advantages by advantage_estimator (and multi_objective_aggregation), 0 where the reward failed;
    statistics over the whole step are summed over all processes."""
    rewards, size, estimator = scored.rewards, config.rollout_n, config.advantage_estimator
    if config.multi_objective_aggregation == "normalize_then_sum":
        combined = normalized_per_function([scored.reward_columns[name] for name in config.reward_functions], config.reward_function_weights, size)
        return whiten(combined, world.sum(whitening_sums(combined, np.ones(len(combined)))))[0]
    if estimator == "grpo":
        batch_std = global_reward_std(scored, world) if config.scale_rewards == "batch" else None
        return group_advantages(rewards, size, config.scale_rewards, batch_std)[0]
    if estimator == "rloo":
        return rloo_advantages(rewards, size)[0]
    # REINFORCE++: every loss token carries its sequence's (baseline-subtracted) reward, whitened over all of them
    values = baseline_subtracted(rewards, size) if estimator == "reinforce_plus_plus_baseline" else rewards
    tokens = loss_mask(scored, config).sum(axis=1)
    return whiten(values, world.sum(whitening_sums(values, tokens)))[0]


def global_reward_std(scored: ScoredBatch, world: World) -> float:
    """Sample std (ddof=1) of every valid reward of the step, over all processes: scale_rewards=batch's divisor."""
    return sample_std(world.sum(whitening_sums(scored.rewards, np.ones(len(scored.rewards)))))


def load_prompts(paths: str, tokenizer, config: GRPOConfig):
    # Rows the rewards (or the accuracy metric) could not score for want of a reference are refused here,
    # before any model loads, not found one failed reward at a time.
    readers = reference_readers(config.reward_functions)
    needed_by = f"reward function {readers[0]}" if readers else None
    if needed_by is None and reference_readers([config.accuracy_function]):
        needed_by = f"accuracy_function {config.accuracy_function}; name one there that reads none"
    records = read_prompt_records(paths, config.prompt_key, config.response_key, config.skip_bad_rows, needed_by)
    return encode_prompts(records, tokenizer, config.max_prompt_len, config.prompt_truncation, config.system_prompt, tool_schemas(config))


def build_scorer(config: GRPOConfig):
    """(completions, samples) -> ScoreTable over config.reward_functions: the rule functions in worker
    processes of this one, each item within reward_item_timeout, or through the reward server
    (use_rm_server); `reward_model` in process. The workers stop when the scorer is dropped or the process
    exits."""
    names, weights = config.reward_functions, config.reward_function_weights
    rules = [(name, weight) for name, weight in zip(names, weights) if name != REWARD_MODEL]
    settings = config.reward_settings()
    if not config.use_rm_server:
        score_rules = pooled_rules(config, [name for name, _ in rules], settings)
    else:
        score_rules = functools.partial(
            score_remote,
            url=config.reward_server,
            protocol=config.reward_server_protocol,
            timeout=config.reward_server_timeout,
            retries=config.reward_server_retries,
            api_key=config.reward_server_api_key or os.environ.get("GRPO_REWARD_SERVER_API_KEY"),
            settings=settings,
        )
    reward_model = None
    if config.reward_model_name_or_path:
        from alignment.rewards.reward_model import RewardModel

        reward_model = RewardModel.load(config.reward_model_name_or_path)

    def score(completions: list, samples: list) -> ScoreTable:
        table = score_rules(completions, samples, [n for n, _ in rules], [w for _, w in rules]) if rules else None
        if reward_model is None:
            return table
        model_scores = reward_model.score(samples, completions).tolist()  # (B,)
        model_weight = weights[names.index(REWARD_MODEL)]
        if table is None:
            return ScoreTable(totals=[model_weight * v for v in model_scores], columns={REWARD_MODEL: model_scores}, errors=[None] * len(completions))
        totals = [None if t is None else t + model_weight * v for t, v in zip(table.totals, model_scores)]
        return ScoreTable(totals=totals, columns={**table.columns, REWARD_MODEL: model_scores}, errors=table.errors)

    return score


def pooled_rules(config: GRPOConfig, rule_names: list, settings):
    """The rule functions scored in worker processes of this one, each item within reward_item_timeout ->
    (completions, samples, names, weights) -> ScoreTable. The workers stop when it is dropped or the process
    exits."""
    # This machine's CPUs, shared with the launch's other processes on it; a few workers are plenty for
    # rule rewards (~30 us to a few ms an item), and one is enough to bound an item's time.
    cpus = len(os.sched_getaffinity(0)) // int(os.environ.get("PADDLE_LOCAL_SIZE", "1"))
    pool = ScoringPool(max(1, min(4, cpus)), config.reward_item_timeout, plugin_sources(config.external_plugins))
    pool.start()
    unshared = [name for name in rule_names if name not in pool.rewards]
    if unshared:  # registered by the code that called train(), which the workers do not run
        warnings.warn(
            f"reward functions {unshared} are not from a plugin file: all rules are scored in this process, "
            f"without reward_item_timeout (external_plugins gives them the limit)"
        )
        pool.close()
        return functools.partial(score_completions, settings=settings)
    # The accuracy metric's function, when it is no reward, gets the time limit too (score_rollout computes
    # it in process only when the table lacks its column).
    metric = [name for name in [config.accuracy_function] if name not in rule_names and name in pool.rewards]

    def score_rules(completions: list, samples: list, names: list, weights: list) -> ScoreTable:
        jobs = [pool.submit(completions, samples, names, weights, settings)]
        jobs += [pool.submit(completions, samples, metric, [1.0], settings)] if metric else []
        table, *extra = [job.table() for job in jobs]
        for other in extra:
            table.columns |= other.columns
        return table

    weakref.finalize(score_rules, pool.close)  # the scorer holds score_rules: dropping it stops the pool
    return score_rules


def decode_completions(rollout: Rollout, tokenizer) -> list:
    lengths = rollout.lengths
    return tokenizer.batch_decode(
        [row[:length].tolist() for row, length in zip(rollout.completion_ids, lengths)], skip_special_tokens=True
    )


def score_rollout(prompts: list, rollout: Rollout, scorer, tokenizer, config: GRPOConfig) -> ScoredBatch:
    """Rewards score what the model wrote: in a multi-turn rollout its turns, one per line, and not what tools and
    environments put between them (a tool that prints <answer>42</answer> earns nothing); the whole conversation,
    the turns and the tool calls are in each sample for a reward that reads them."""
    completions = decode_completions(rollout, tokenizer)  # multi-turn: the whole conversation after the prompt, for the logs
    generated = rollout.loss_mask.sum(axis=1).astype(np.int64)
    samples = [
        {**prompts[row // rollout.group_size].record.reward_sample(), "completion_tokens": int(generated[row])}
        for row in range(len(completions))
    ]
    written = completions
    if rollout.episodes is not None:
        written = ["\n".join(episode.turns) for episode in rollout.episodes]
        for sample, episode, conversation in zip(samples, rollout.episodes, completions):
            sample.update(conversation=conversation, turns=list(episode.turns), tool_calls=[call.as_dict() for call in episode.calls])
    table: ScoreTable = scorer(written, samples)
    columns = {name: _as_array(values) for name, values in table.columns.items()}  # none from a PaddleNLP server
    if config.accuracy_function not in columns:  # the accuracy metric is computed here whatever scores the reward
        accuracy = score_completions(written, samples, [config.accuracy_function], [1.0], settings=config.reward_settings())
        columns[config.accuracy_function] = _as_array(accuracy.columns[config.accuracy_function])
    return ScoredBatch(
        prompts=prompts,
        rollout=rollout,
        completions=completions,
        rewards=_as_array(table.totals),
        reward_columns={name: columns[name] for name in reported_reward_functions(config)},
        errors=table.errors,
        correct=np.nan_to_num(columns[config.accuracy_function]) > 0,
    )


def _finite_or_none(value: float):
    return float(value) if np.isfinite(value) else None  # a failed reward is null in the logs, never NaN


def _as_array(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def update_policy(model, ref_model, optimizer, scored: ScoredBatch, config: GRPOConfig, world: World, pad_token_id: int, step: int) -> dict:
    """num_iterations passes over the scored batch, each cut into mini-batches of mini_batch_size sequences
    (one optimizer step each), run in micro-batches of per_device_train_batch_size.

    The old policy's log-probs are the current ones (ratio 1 in value: the usual GRPO gradient A grad log pi)
    when the batch gets a single optimizer step; otherwise they are computed once, before the first step,
    as are the reference model's. Each mini-batch's loss is normalised over the mini-batch's loss tokens or
    sequences in all processes (loss_type), so the gradient does not depend on the micro-batch size."""
    rollout = scored.rollout
    rows_total = len(rollout.prompt_ids)
    trained = loss_mask(scored, config)  # (B, T)
    micro, mini = config.per_device_train_batch_size, config.mini_batch_size
    settings = loss_settings(config)

    def batch_of(rows: np.ndarray):
        return make_token_batch([rollout.prompt_ids[r] for r in rows], rollout.completion_ids[rows], rollout.completion_mask[rows], pad_token_id)

    def fixed_logprobs(source) -> tuple:  # (B, T) log-probs and entropies of a model that does not change during the update
        with paddle.no_grad():
            parts = [policy_logprobs(source, batch_of(np.arange(start, min(start + micro, rows_total))), config) for start in range(0, rows_total, micro)]
        return np.concatenate([p[0].numpy() for p in parts]), np.concatenate([p[1].numpy() for p in parts])

    model.train()
    several_updates = config.num_iterations > 1 or mini < rows_total
    selecting = config.top_entropy_quantile < 1  # the entropy selection is fixed before any update
    old_logprobs, old_entropy = fixed_logprobs(model) if several_updates or selecting else (None, None)
    old_logprobs = old_logprobs if several_updates else None
    selected = high_entropy_tokens(old_entropy, trained, config.top_entropy_quantile, world) if selecting else None  # (B, T)
    ref_logprobs = None
    if config.kl_loss_coeff > 0:
        with adapters_disabled(model) if ref_model is None else contextlib.nullcontext():  # LoRA: the base is the reference
            ref_logprobs = fixed_logprobs(ref_model or model)[0]
    effective = trained if selected is None else selected  # (B, T) the tokens the policy term trains on
    totals, updates, nonfinite, skipped_phase = defaultdict(float), 0, None, None
    global_tokens = float(world.sum(np.array([trained.sum()]))[0])
    for iteration in range(config.num_iterations):
        if skipped_phase:
            break
        order = np.arange(rows_total)
        if config.shuffle_minibatch:
            order = np.random.default_rng(seed_phase(config, step, world.rank, "shuffle", iteration + 1)).permutation(rows_total)
        for mini_start in range(0, rows_total, mini):
            rows = order[mini_start : mini_start + mini]
            counts = world.sum(aggregation_counts(trained[rows]))  # global tokens, live sequences, sequences
            weights = loss_token_weights(trained[rows], config.loss_type, config.max_dec_len, counts)  # (m, T)
            effective_tokens = float(world.sum(np.array([effective[rows].sum()]))[0]) if config.entropy_coeff else 0.0
            for start in range(0, len(rows), micro):
                chunk = rows[start : start + micro]
                mask = paddle.to_tensor(trained[chunk].astype(np.float32))
                # (b, T) each, from the final hidden states a chunk of tokens at a time: the (b, T, V) logits never exist
                logprobs, entropy = policy_logprobs(model, batch_of(chunk), config, entropy_grad=config.entropy_coeff > 0)
                old = logprobs.detach() if old_logprobs is None else paddle.to_tensor(old_logprobs[chunk])
                importance = None
                if config.importance_sampling_correction:
                    rollout_logprobs = paddle.to_tensor(rollout.logprobs[chunk])  # (b, T) the engine's
                    importance, outside = rollout_correction(
                        old, rollout_logprobs, mask, config.importance_sampling_mode, config.importance_sampling_cap, config.importance_sampling_min
                    )
                    if iteration == 0:  # the weights depend only on the batch: count them once
                        totals["is_weight"] += float((importance * mask).sum())
                        totals["is_capped"] += float((outside.astype("float32") * mask).sum())
                        totals["is_logprob_gap_max"] = max(totals["is_logprob_gap_max"], float(((old - rollout_logprobs).abs() * mask).max()))
                loss, sums = policy_loss(
                    logprobs,
                    old,
                    paddle.to_tensor(scored.advantages[chunk]),
                    paddle.to_tensor(weights[start : start + micro]),
                    mask,
                    settings,
                    importance,
                    None if ref_logprobs is None else paddle.to_tensor(ref_logprobs[chunk]),
                    None if selected is None else paddle.to_tensor(selected[chunk]),
                )
                if config.entropy_coeff:
                    loss = loss + entropy_bonus(entropy, effective[chunk], effective_tokens, config.entropy_coeff)
                if counts[0] > 0:
                    loss.backward()
                if not math.isfinite(float(loss)) and nonfinite is None:  # which input made it so, for the message
                    nonfinite = next(
                        (name for name, values in [
                            ("the policy's log-probs", logprobs.numpy()),
                            ("the reference model's log-probs", None if ref_logprobs is None else ref_logprobs[chunk]),
                            ("the importance weights (the rollout engine's log-probs)", None if importance is None else importance.numpy()),
                        ] if values is not None and not np.isfinite(values).all()),
                        "the loss",
                    )
                totals["entropy"] += float((entropy * mask).sum())
                totals["loss"] += float(loss)
                for key, value in sums.items():
                    totals[key] += value
            grad_norm = sum_gradients(optimizer, model.parameters(), world)  # every rank decides alike
            totals["grad_norm"] += grad_norm
            updates += 1
            if not math.isfinite(grad_norm):  # no optimizer step on NaN or infinite gradients: the step is skipped
                optimizer.clear_grad()
                skipped_phase = nonfinite or "the gradients"
                break
            if counts[0] > 0:
                optimizer.step()
                weights_changed(model)  # bf16 matmuls remake their weight copies
            optimizer.clear_grad()
    gap_max = world.max(np.array([totals.pop("is_logprob_gap_max", 0.0)]))[0]
    keys = sorted(totals)
    summed = dict(zip(keys, world.sum(np.array([totals[k] for k in keys]))))
    per_token = max(global_tokens, 1.0) * config.num_iterations  # token sums over every update
    metrics = {
        "skipped_phase": skipped_phase,  # None, or what was not finite when the step was skipped
        "loss": summed["loss"] / updates,
        "entropy": summed["entropy"] / per_token,
        "clip_fraction": summed["clipped"] / per_token,
        "clip_low_fraction": summed["clipped_low"] / per_token,
        "clip_high_fraction": summed["clipped_high"] / per_token,
        "kl": summed["kl"] / per_token if "kl" in summed else None,
        "grad_norm": summed["grad_norm"] / world.size / updates,  # every process computed the same all-reduced norm
        "loss_tokens": global_tokens,
        "optimizer_steps": updates,
    }
    if config.dual_clip_ratio is not None and config.surrogate == "clip":
        metrics["dual_clip_fraction"] = summed["dual_clipped"] / per_token
    if selected is not None:
        metrics["entropy_selected_fraction"] = summed["selected"] / per_token
    if config.importance_sampling_correction:
        metrics["is/weight_mean"] = summed["is_weight"] / max(global_tokens, 1.0)
        metrics["is/capped_fraction"] = summed["is_capped"] / max(global_tokens, 1.0)
        metrics["is/logprob_gap_max"] = gap_max
    return {key: _finite_or_none(value) if isinstance(value, float) else value for key, value in metrics.items()}


def high_entropy_tokens(entropy: np.ndarray, trained: np.ndarray, top_quantile: float, world: World) -> np.ndarray:
    """entropy, trained (B, T) -> (B, T) float32, 1 on the trained tokens among the top_quantile fraction of the
    step's (all processes') with the highest entropy."""
    threshold = entropy_threshold(world.gather(entropy[trained > 0].astype(np.float64)), top_quantile)
    return ((entropy >= threshold) & (trained > 0)).astype(np.float32)


def loss_mask(scored: ScoredBatch, config: GRPOConfig) -> np.ndarray:
    """(B, T) 1 on the tokens the update trains: the model's own (not the tool answers), of completions whose
    reward could be computed, and not cut off at max_dec_len under overlong_filter."""
    rollout = scored.rollout
    mask = rollout.loss_mask * np.isfinite(scored.rewards)[:, None]
    if config.overlong_filter:
        mask = mask * np.array([reason != "length" for reason in rollout.finish_reasons])[:, None]
    return mask


def loss_settings(config: GRPOConfig) -> LossSettings:
    return LossSettings(
        clip_low=config.clip_range_ratio_low,
        clip_high=config.clip_range_ratio_high,
        dual_clip=config.dual_clip_ratio,
        level=config.importance_sampling_level,
        surrogate=config.surrogate,
        kl_coeff=config.kl_loss_coeff,
        kl_estimator=config.kl_estimator,
        kl_bias_correction=config.use_bias_correction_kl,
    )


def policy_logprobs(model, batch, config: GRPOConfig, entropy_grad: bool = False) -> tuple:
    """-> (log-probs (b, T) with grad where the model has it, entropy (b, T), with grad only for entropy_grad)
    of the completion tokens under softmax(logits / temperature), logprob_chunk_tokens tokens' logits at a time."""
    weight, bias = output_head(model)
    hidden = completion_hidden(model, batch, config.use_prefix_grouper and groups_prompts(model, config.recompute))
    return chunked_token_logprobs(
        hidden, weight, bias, batch.completion_ids, config.temperature, config.logprob_chunk_tokens, head_kernels(model), entropy_grad
    )


def step_metrics(scored: ScoredBatch, update: dict, learning_rate: float, timings: dict, world: World) -> dict:
    """Batch statistics summed over ranks, so every rank logs the same global numbers."""
    rollout, valid = scored.rollout, np.isfinite(scored.rewards)
    lengths = rollout.lengths.astype(np.float64)
    rewards = scored.rewards[valid]
    columns = list(scored.reward_columns)
    local = [
        len(lengths), valid.sum(), rewards.sum(), (rewards**2).sum(), scored.correct.sum(), lengths.sum(),
        sum(r == "length" for r in rollout.finish_reasons), np.abs(scored.advantages[valid]).sum(),
        *[np.nansum(scored.reward_columns[c]) for c in columns], *[np.isfinite(scored.reward_columns[c]).sum() for c in columns],
    ]
    (count, n_valid, reward_sum, reward_squares, correct, length_sum, truncated, advantage_sum, *rest) = world.sum(np.array(local, dtype=np.float64))
    reward_mean = reward_sum / max(n_valid, 1)
    seconds = sum(timings.values())
    tools = {}
    if rollout.episodes is not None:
        sums = episode_sums(rollout, scored.correct)
        summed = dict(zip(sums, world.sum(np.array(list(sums.values()), dtype=np.float64))))
        tools = {f"tools/{name}": value if name == "tool_seconds" else value / count for name, value in summed.items()}
    return {
        "reward_mean": reward_mean,
        "reward_std": math.sqrt(max(reward_squares / max(n_valid, 1) - reward_mean**2, 0.0)),
        **{f"reward/{c}": rest[i] / max(rest[len(columns) + i], 1) for i, c in enumerate(columns)},
        "reward_errors": int(count - n_valid),
        "accuracy": correct / count,
        "advantage_abs_mean": advantage_sum / max(n_valid, 1),
        **{key: value for key, value in update.items() if key not in ("loss", "grad_norm", "loss_tokens")},
        "response_length_mean": length_sum / count,
        "response_length_max": int(world.max(np.array([lengths.max()]))[0]),
        "truncated_fraction": truncated / count,
        "loss": update["loss"],
        "lr": learning_rate,
        "grad_norm": update["grad_norm"],
        **tools,
        "tokens_per_second": length_sum / seconds,  # tokens after the prompts (tool answers included) over the step's wall time
        **{f"time/{phase}": t for phase, t in timings.items()},
        "time/step": seconds,
    }


def completion_rows(scored: ScoredBatch, limit: int) -> list:
    """At most `limit` rows of completions.jsonl, spread over the step's groups: every group's first
    completion, then every group's second, and so on, so a small sample shows many prompts."""
    size = scored.rollout.group_size
    groups = len(scored.completions) // size
    rows = []
    for row in [group * size + member for member in range(size) for group in range(groups)][:limit]:
        prompt = scored.prompts[row // size].record
        rows.append({
            "prompt": prompt.question,
            "answer": prompt.answer,
            "completion": scored.completions[row],
            "reward": _finite_or_none(scored.rewards[row]),
            "rewards": {name: _finite_or_none(values[row]) for name, values in scored.reward_columns.items()},
            "advantage": float(scored.advantages[row]),
            "finish_reason": scored.rollout.finish_reasons[row],
            "error": scored.errors[row],
        })
        if scored.rollout.episodes is not None:
            episode = scored.rollout.episodes[row]
            rows[-1].update(turns=episode.turns, tool_calls=[call.as_dict() for call in episode.calls])
    return rows


def evaluate(engine, scorer, prompts: list, tokenizer, config: GRPOConfig, world: World, sampling: SamplingParams, step: int) -> tuple:
    """Greedy decoding of the evaluation prompts (a contiguous slice per rank, at most max_evaluate_steps
    batches each), scored like training. With eval_rollout_n = k, also k samples per prompt at the training
    sampling settings: mean@k is the samples' mean accuracy, pass@k the fraction of prompts with at least
    one correct sample. -> (metrics, None), or (None, the error) when scoring failed in any process: the
    failure travels in the one all-reduce, so no process is left waiting."""
    sampling = dataclasses.replace(sampling, seed=seed_phase(config, step, world.rank, "eval"))
    share = -(-len(prompts) // world.size)
    first, end = world.rank * share, min((world.rank + 1) * share, len(prompts))  # this rank's prompts
    size, k = config.per_device_eval_batch_size, config.eval_rollout_n
    starts = range(first, end, size)
    starts = starts[: config.max_evaluate_steps] if config.max_evaluate_steps > 0 else starts
    greedy = SamplingParams(max_new_tokens=config.max_dec_len, greedy=True)
    columns = reported_reward_functions(config)
    # count, correct, length, truncated, reward sum, valid rewards, mean@k, pass@k, failed processes, per function,
    # then tool_use's two counts
    sums, failure = np.zeros(9 + len(columns) + 2), None
    for start in starts:
        chunk = prompts[start : min(start + size, end)]
        mean_at_k = pass_at_k = np.zeros(len(chunk))
        try:
            scored = score_rollout(chunk, generate(engine, chunk, 1, greedy), scorer, tokenizer, config)
            if k:
                samples = generate(engine, chunk, k, dataclasses.replace(sampling, first_row=start * k))
                sampled = score_rollout(chunk, samples, scorer, tokenizer, config)
                mean_at_k, pass_at_k = mean_and_pass_at_k(sampled.correct.reshape(len(chunk), k))
        except RewardServerError as error:
            failure = error
            sums[8] = 1
            break
        sums[:8] += [
            len(chunk), scored.correct.sum(), scored.rollout.lengths.sum(),
            sum(r == "length" for r in scored.rollout.finish_reasons),
            np.nansum(scored.rewards), np.isfinite(scored.rewards).sum(),
            mean_at_k.sum(), pass_at_k.sum(),
        ]
        sums[9 : 9 + len(columns)] += [np.nansum(scored.reward_columns[c]) for c in columns]
        if scored.rollout.episodes is not None:
            sums[-2:] += list(tool_use(scored.rollout.episodes, scored.correct).values())
    count, correct, length, truncated, reward_sum, valid, mean_at_k, pass_at_k, failed, *per_function, called, useful = world.sum(sums)
    if failed:
        return None, failure or RewardServerError("another process's reward scoring failed during evaluation: its log names the cause")
    count = max(count, 1)
    return {
        "eval_accuracy": correct / count,
        **({f"eval_mean@{k}": mean_at_k / count, f"eval_pass@{k}": pass_at_k / count} if k else {}),
        "eval_reward_mean": reward_sum / max(valid, 1),
        **{f"eval_reward/{c}": per_function[i] / count for i, c in enumerate(columns)},
        "eval_response_length_mean": length / count,
        "eval_truncated_fraction": truncated / count,
        **({"eval_tool_call_rate": called / count, "eval_useful_call_rate": useful / count} if config.resolved_environment else {}),
        "eval_samples": int(count),
    }, None


def reported_reward_functions(config: GRPOConfig) -> list:
    """Functions whose values come back one by one: all of them, except from a PaddleNLP-protocol server,
    which answers totals only."""
    paddlenlp_server = config.use_rm_server and config.reward_server_protocol == "paddlenlp"
    return [] if paddlenlp_server else list(config.reward_functions)


def model_dtype(config: GRPOConfig) -> str:
    return "bfloat16" if config.bf16 else "float16" if config.fp16 else "float32"
