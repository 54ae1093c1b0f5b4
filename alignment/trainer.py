"""The GRPO loop, readable top to bottom: `train` is the whole run, and each step is

    prompts -> rollout (G completions each) -> rewards -> group advantages -> clipped policy update

as ../shared/DESIGN.md lists it. The math lives in alignment/algo.py; this file moves data between the
phases and times them.
"""

import dataclasses
import functools
import math
import os
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle

from alignment.algo import chunked_token_logprobs, grpo_loss, group_advantages, mean_and_pass_at_k
from alignment.checkpoint import load_training_state, resolve_resume, save_checkpoint
from alignment.config import GRPOConfig
from alignment.curves import plot_curves
from alignment.data import PromptSchedule, encode_prompts, read_prompt_records
from alignment.distributed import World, init_world
from alignment.fused_train import use_training_ops
from alignment.logger import RunLogger
from alignment.modeling import (
    completion_hidden,
    enable_recompute,
    load_causal_lm,
    load_tokenizer,
    make_token_batch,
    output_head,
    stop_token_ids,
)
from alignment.optim import build_optimizer, global_grad_norm
from alignment.rewards import ScoreTable, score_completions
from alignment.rollout import Rollout, SamplingParams, build_engine
from alignment.runtime import contiguous_kernels


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
    advantages: np.ndarray  # (B,) float32


def train(config: GRPOConfig) -> Path:
    world = init_world()
    resume = resolve_resume(config.resume_from_checkpoint, config.output_dir)
    tokenizer = load_tokenizer(config.tokenizer_name_or_path or config.actor_model_name_or_path, config.chat_template)
    train_prompts, truncated, dropped = load_prompts(config.train_datasets, tokenizer, config)
    eval_prompts = load_prompts(config.eval_datasets, tokenizer, config)[0] if config.eval_datasets else []
    schedule = PromptSchedule(len(train_prompts), config.per_device_prompt_batch_size, world.size, config.seed)
    total_steps = config.max_steps if config.max_steps > 0 else math.ceil(config.num_train_epochs * schedule.steps_per_epoch)

    model = load_causal_lm(str(resume or config.actor_model_name_or_path), _dtype(config))
    if config.recompute:
        enable_recompute(model, config.recompute_granularity)
    if config.use_fused_train_ops:
        why_not = use_training_ops(model)
        if why_not:
            warnings.warn(f"use_fused_train_ops: training with paddle's own kernels ({why_not})")
    ref_model = None
    if config.kl_loss_coeff > 0:  # kl_loss_coeff = 0 loads no reference model at all
        ref_model = load_causal_lm(config.actor_model_name_or_path, _dtype(config))
        ref_model.eval()
        for parameter in ref_model.parameters():
            parameter.stop_gradient = True
    engine = build_engine(config, model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
    scorer = build_scorer(config)
    optimizer, scheduler = build_optimizer(model, config, total_steps)
    state = load_training_state(resume, optimizer) if resume else {"step": 0}  # optimizer moments and the schedule
    first_step = state["step"]
    sampling = SamplingParams(
        max_new_tokens=config.max_dec_len,
        min_new_tokens=config.min_dec_len,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        repetition_penalty=config.repetition_penalty,
        min_p=config.min_p,
    )

    logger = RunLogger(
        config.output_dir, config.resolved_logging_dir, config.logging_steps, total_steps, first_step, world.is_main,
        resume_offsets=state.get("log_offsets", {}) if resume else None,  # {}: a checkpoint older than the offsets: append
    )
    if world.is_main:
        Path(config.output_dir, "grpo_config.json").write_text(config.to_json())
    logger.print(
        f"{len(train_prompts)} training prompts ({truncated} truncated, {dropped} dropped over max_prompt_len), "
        f"{len(eval_prompts)} evaluation prompts; {total_steps} steps of {schedule.global_batch} prompts x {config.rollout_n}; "
        f"rollout with the {type(engine).__name__}" + (f"; resuming from {resume} after step {first_step}" if resume else "")
    )
    if eval_prompts and config.eval_on_start and first_step == 0:
        logger.log_eval(0, evaluate(engine, scorer, eval_prompts, tokenizer, config, world, sampling, 0))

    checkpoint = resume
    for step in range(first_step + 1, total_steps + 1):
        started = time.perf_counter()
        prompts = [train_prompts[i] for i in schedule.indices(step - 1, world.rank)]
        first_row = world.rank * len(prompts) * config.rollout_n  # this rank's rows in the global batch
        step_sampling = dataclasses.replace(sampling, seed=seed_phase(config, step, world.rank, "train"), first_row=first_row)
        rollout = engine.generate([p.ids for p in prompts], config.rollout_n, step_sampling)
        rolled_out = time.perf_counter()
        scored = score_rollout(prompts, rollout, scorer, tokenizer, config)
        rewarded = time.perf_counter()
        learning_rate = scheduler.get_lr()
        with contiguous_kernels():
            update = update_policy(model, ref_model, optimizer, scored, config, world, tokenizer.pad_token_id)
        scheduler.step()
        updated = time.perf_counter()
        engine.sync()  # the fused engine refreshes its weight layout and checks itself against the actor
        finished = time.perf_counter()

        timings = {
            "rollout": rolled_out - started,
            "reward": rewarded - rolled_out,
            "train": updated - rewarded,
            "sync": finished - updated,
        }
        logger.log_step(step, step_metrics(scored, update, learning_rate, timings, world))
        logger.log_completions(step, completion_rows(scored, config.log_completions_per_step))
        last = step == total_steps
        if eval_prompts and (last or (config.eval_steps and step % config.eval_steps == 0)):
            logger.log_eval(step, evaluate(engine, scorer, eval_prompts, tokenizer, config, world, sampling, step))
        if world.is_main and (last or (config.save_steps and step % config.save_steps == 0)):
            state = {"total_steps": total_steps, "log_offsets": logger.offsets()}
            checkpoint = save_checkpoint(
                config.output_dir, step, model, tokenizer, optimizer, config.to_json(), state, config.save_total_limit
            )
            logger.print(f"saved {checkpoint}")
    logger.close()
    if world.is_main:
        plot_curves(config.output_dir)
    return checkpoint


PHASES = ("train", "eval")


def seed_phase(config: GRPOConfig, step: int, rank: int, phase: str) -> int:
    """Each phase of each step draws from its own random streams, so a resumed run draws exactly what an
    uninterrupted one would with no random state to save, and sampling in an evaluation never shifts
    training's samples. Seeds paddle's generator (the eager engine's draws, dropout) from
    (seed, step, phase, rank) and returns the seed of (seed, step, phase) that the fused engine keys on
    together with each row's index in the global batch: with it, a run over N processes samples exactly
    the completions a one-process run with the same global batch does."""
    shared = [config.seed, step, PHASES.index(phase)]
    paddle.seed(int(np.random.SeedSequence([*shared, rank]).generate_state(1)[0]))
    return int(np.random.SeedSequence(shared).generate_state(1)[0])


def load_prompts(paths: str, tokenizer, config: GRPOConfig):
    records = read_prompt_records(paths, config.prompt_key, config.response_key)
    return encode_prompts(records, tokenizer, config.max_prompt_len, config.prompt_truncation, config.system_prompt)


def build_scorer(config: GRPOConfig):
    """(completions, samples) -> ScoreTable, in process or through the reward server (use_rm_server)."""
    names, weights = config.reward_functions, config.reward_function_weights
    if not config.use_rm_server:
        return functools.partial(score_completions, names=names, weights=weights)
    from alignment.rewards.remote import score_remote

    return functools.partial(
        score_remote,
        names=names,
        weights=weights,
        url=config.reward_server,
        protocol=config.reward_server_protocol,
        timeout=config.reward_server_timeout,
        retries=config.reward_server_retries,
        api_key=config.reward_server_api_key or os.environ.get("GRPO_REWARD_SERVER_API_KEY"),
    )


def decode_completions(rollout: Rollout, tokenizer) -> list:
    lengths = rollout.lengths
    return tokenizer.batch_decode(
        [row[:length].tolist() for row, length in zip(rollout.completion_ids, lengths)], skip_special_tokens=True
    )


def score_rollout(prompts: list, rollout: Rollout, scorer, tokenizer, config: GRPOConfig) -> ScoredBatch:
    completions = decode_completions(rollout, tokenizer)
    samples = [prompts[row // rollout.group_size].record.reward_sample() for row in range(len(completions))]
    table: ScoreTable = scorer(completions, samples)
    columns = {name: _as_array(values) for name, values in table.columns.items()}  # none from a PaddleNLP server
    if config.accuracy_function not in columns:  # the accuracy metric is computed here whatever scores the reward
        accuracy = score_completions(completions, samples, [config.accuracy_function], [1.0])
        columns[config.accuracy_function] = _as_array(accuracy.columns[config.accuracy_function])
    rewards = _as_array(table.totals)
    advantages, _ = group_advantages(rewards, rollout.group_size)
    return ScoredBatch(
        prompts=prompts,
        rollout=rollout,
        completions=completions,
        rewards=rewards,
        reward_columns={name: columns[name] for name in reported_reward_functions(config)},
        errors=table.errors,
        correct=np.nan_to_num(columns[config.accuracy_function]) > 0,
        advantages=advantages,
    )


def _finite_or_none(value: float):
    return float(value) if np.isfinite(value) else None  # a failed reward is null in the logs, never NaN


def _as_array(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def update_policy(model, ref_model, optimizer, scored: ScoredBatch, config: GRPOConfig, world: World, pad_token_id: int) -> dict:
    """One optimizer step over the scored batch, in micro-batches of per_device_train_batch_size.

    With one policy update per rollout the old policy is the current one (ratio 1 in value, the usual
    GRPO gradient A * grad log pi); the clip matters once a batch is reused."""
    rollout = scored.rollout
    valid = np.isfinite(scored.rewards)  # completions whose reward failed stay out of the loss
    loss_mask = rollout.completion_mask * valid[:, None]  # (B, T)
    token_count = float(world.sum(np.array([loss_mask.sum()]))[0])
    totals = defaultdict(float)
    model.train()
    micro = config.per_device_train_batch_size
    for start in range(0, len(rollout.prompt_ids), micro):
        rows = slice(start, start + micro)
        batch = make_token_batch(rollout.prompt_ids[rows], rollout.completion_ids[rows], rollout.completion_mask[rows], pad_token_id)
        mask = paddle.to_tensor(loss_mask[rows].astype(np.float32))
        # (b, T) each, from the final hidden states a chunk of tokens at a time: the (b, T, V) logits never exist
        logprobs, entropy = policy_logprobs(model, batch, config)
        ref_logprobs = None
        if ref_model is not None:
            with paddle.no_grad():
                ref_logprobs, _ = policy_logprobs(ref_model, batch, config)
        loss, sums = grpo_loss(
            logprobs,
            logprobs.detach(),
            paddle.to_tensor(scored.advantages[rows]),
            mask,
            max(token_count, 1.0),
            config.clip_range_ratio,
            config.kl_loss_coeff,
            ref_logprobs,
        )
        if token_count > 0:
            loss.backward()
        totals["entropy"] += float((entropy * mask).sum())
        totals["loss"] += float(loss)
        for key, value in sums.items():
            totals[key] += value
    world.sum_gradients(model.parameters())
    grad_norm = global_grad_norm(model.parameters())
    if token_count > 0:
        optimizer.step()
    optimizer.clear_grad()
    keys = sorted(totals)
    summed = dict(zip(keys, world.sum(np.array([totals[k] for k in keys]))))
    per_token = max(token_count, 1.0)
    return {
        "loss": summed["loss"],
        "entropy": summed["entropy"] / per_token,
        "clip_fraction": summed["clipped"] / per_token,
        "kl": summed["kl"] / per_token if "kl" in summed else None,
        "grad_norm": grad_norm,
        "loss_tokens": token_count,
    }


def policy_logprobs(model, batch, config: GRPOConfig) -> tuple:
    """-> (log-probs (b, T) with grad where the model has it, entropy (b, T) detached) of the completion
    tokens under softmax(logits / temperature), logprob_chunk_tokens tokens' logits at a time."""
    weight, bias = output_head(model)
    hidden = completion_hidden(model, batch)
    return chunked_token_logprobs(hidden, weight, bias, batch.completion_ids, config.temperature, config.logprob_chunk_tokens)


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
    return {
        "reward_mean": reward_mean,
        "reward_std": math.sqrt(max(reward_squares / max(n_valid, 1) - reward_mean**2, 0.0)),
        **{f"reward/{c}": rest[i] / max(rest[len(columns) + i], 1) for i, c in enumerate(columns)},
        "reward_errors": int(count - n_valid),
        "accuracy": correct / count,
        "advantage_abs_mean": advantage_sum / max(n_valid, 1),
        "kl": update["kl"],
        "clip_fraction": update["clip_fraction"],
        "entropy": update["entropy"],
        "response_length_mean": length_sum / count,
        "response_length_max": int(world.max(np.array([lengths.max()]))[0]),
        "truncated_fraction": truncated / count,
        "loss": update["loss"],
        "lr": learning_rate,
        "grad_norm": update["grad_norm"],
        "tokens_per_second": length_sum / seconds,  # generated tokens over the whole step's wall time
        **{f"time/{phase}": t for phase, t in timings.items()},
        "time/step": seconds,
    }


def completion_rows(scored: ScoredBatch, limit: int) -> list:
    rows = []
    for row in range(min(limit, len(scored.completions))):
        prompt = scored.prompts[row // scored.rollout.group_size].record
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
    return rows


def evaluate(engine, scorer, prompts: list, tokenizer, config: GRPOConfig, world: World, sampling: SamplingParams, step: int) -> dict:
    """Greedy decoding of the evaluation prompts (a contiguous slice per rank, at most max_evaluate_steps
    batches each), scored like training. With eval_rollout_n = k, also k samples per prompt at the training
    sampling settings: mean@k is the samples' mean accuracy, pass@k the fraction of prompts with at least
    one correct sample."""
    sampling = dataclasses.replace(sampling, seed=seed_phase(config, step, world.rank, "eval"))
    share = -(-len(prompts) // world.size)
    first, end = world.rank * share, min((world.rank + 1) * share, len(prompts))  # this rank's prompts
    size, k = config.per_device_eval_batch_size, config.eval_rollout_n
    starts = range(first, end, size)
    starts = starts[: config.max_evaluate_steps] if config.max_evaluate_steps > 0 else starts
    greedy = SamplingParams(max_new_tokens=config.max_dec_len, greedy=True)
    columns = reported_reward_functions(config)
    sums = np.zeros(8 + len(columns))  # count, correct, length, truncated, reward sum, valid rewards, mean@k, pass@k, per function
    for start in starts:
        chunk = prompts[start : min(start + size, end)]
        ids = [p.ids for p in chunk]
        scored = score_rollout(chunk, engine.generate(ids, 1, greedy), scorer, tokenizer, config)
        mean_at_k = pass_at_k = np.zeros(len(chunk))
        if k:
            samples = engine.generate(ids, k, dataclasses.replace(sampling, first_row=start * k))
            sampled = score_rollout(chunk, samples, scorer, tokenizer, config)
            mean_at_k, pass_at_k = mean_and_pass_at_k(sampled.correct.reshape(len(chunk), k))
        sums += [
            len(chunk), scored.correct.sum(), scored.rollout.lengths.sum(),
            sum(r == "length" for r in scored.rollout.finish_reasons),
            np.nansum(scored.rewards), np.isfinite(scored.rewards).sum(),
            mean_at_k.sum(), pass_at_k.sum(),
            *[np.nansum(scored.reward_columns[c]) for c in columns],
        ]
    count, correct, length, truncated, reward_sum, valid, mean_at_k, pass_at_k, *per_function = world.sum(sums)
    count = max(count, 1)
    return {
        "eval_accuracy": correct / count,
        **({f"eval_mean@{k}": mean_at_k / count, f"eval_pass@{k}": pass_at_k / count} if k else {}),
        "eval_reward_mean": reward_sum / max(valid, 1),
        **{f"eval_reward/{c}": per_function[i] / count for i, c in enumerate(columns)},
        "eval_response_length_mean": length / count,
        "eval_truncated_fraction": truncated / count,
        "eval_samples": int(count),
    }


def reported_reward_functions(config: GRPOConfig) -> list:
    """Functions whose values come back one by one: all of them, except from a PaddleNLP-protocol server,
    which answers totals only."""
    paddlenlp_server = config.use_rm_server and config.reward_server_protocol == "paddlenlp"
    return [] if paddlenlp_server else list(config.reward_functions)


def _dtype(config: GRPOConfig) -> str:
    return "bfloat16" if config.bf16 else "float16" if config.fp16 else "float32"
