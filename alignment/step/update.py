"""The update phase: the clipped policy update over the scored batch."""

import contextlib
import math
from collections import defaultdict

import numpy as np
import paddle

from alignment.algo.core import (
    LossSettings,
    aggregation_counts,
    chunked_token_logprobs,
    entropy_bonus,
    entropy_threshold,
    loss_token_weights,
    policy_loss,
    rollout_correction,
)
from alignment.models.fused_train import groups_prompts, head_kernels, weights_changed
from alignment.models.lora import adapters_disabled
from alignment.models.modeling import (
    completion_hidden,
    make_token_batch,
    output_head,
)
from alignment.parallel.distributed import World
from alignment.parallel.optim import sum_gradients
from alignment.run.config import GRPOConfig
from alignment.run.seeding import seed_phase
from alignment.step.metrics import _finite_or_none
from alignment.step.records import ScoredBatch, loss_mask


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
