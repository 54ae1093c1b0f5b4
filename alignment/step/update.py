"""The update phase: the clipped policy update over the scored batch."""

import contextlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import paddle

from alignment.algo.aggregation import CUT_DEPENDENT, aggregation_counts, loss_token_weights
from alignment.algo.corrections import (
    off_policy_diagnostics,
    off_policy_sums,
    rejection_counts,
    rejection_keep,
    rejection_rules,
    rollout_correction,
)
from alignment.algo.logprobs import ReferenceHead, chunked_full_kl, chunked_token_logprobs
from alignment.algo.loss import LossInputs, entropy_bonus, entropy_threshold, policy_loss
from alignment.algo.loss_settings import LossSettings
from alignment.algo.objectives import FLAG_METRICS, SHARED_FLAGS
from alignment.models.fused_train import groups_prompts, head_kernels, weights_changed
from alignment.models.lora import adapters_disabled
from alignment.models.memory import TokenBudget
from alignment.models.modeling import completion_hidden, make_token_batch, output_head
from alignment.parallel.distributed import World
from alignment.parallel.optim import sum_gradients
from alignment.run.seeding import seed_phase
from alignment.run.settings import UpdateSettings
from alignment.step.metrics import finite_or_none
from alignment.step.micro_batches import MicroBatch, completion_widths, longest_first
from alignment.step.records import ScoredBatch, loss_mask


@dataclass(frozen=True)
class Learner:
    """What update_policy trains: the policy, its reference model (None: the policy with its LoRA adapters off, or no
    KL term) and the optimizer."""

    model: Any
    ref_model: Any
    optimizer: Any


@dataclass(frozen=True)
class UpdateResult:
    metrics: dict  # metrics.jsonl's numbers of the update (loss, grad_norm, the clip fractions, ...)
    skipped_phase: Optional[str]  # None, or what was not finite when the step was skipped


@dataclass(frozen=True)
class UpdateBatch:
    """The scored batch and what stays fixed while the policy is updated on it, numpy (B, T) arrays."""

    scored: ScoredBatch
    pad_token_id: int
    loss: LossSettings
    trained: np.ndarray  # 1 on the loss tokens
    old_logprobs: Optional[np.ndarray]  # the old policy's log-probs; None: the current ones, detached (a single optimizer step)
    ref_logprobs: Optional[np.ndarray]  # None: no KL term
    selected: Optional[np.ndarray]  # the entropy selection's tokens; None: every loss token
    global_tokens: float  # loss tokens over all processes (after rejection sampling)
    micro_batch_rows: int  # rows per micro-batch: per_device_train_batch_size, or fewer under the token budget
    widths: np.ndarray  # (B,) each completion's columns (alignment/step/micro_batches.py)
    rejection: Optional[np.ndarray] = None  # rejection sampling's global [tokens, rejected, sequences, rejected]; None: off

    @property
    def effective(self) -> np.ndarray:  # the tokens the policy term trains on
        return self.trained if self.selected is None else self.selected

    def tokens(self, micro: MicroBatch):
        return token_batch(self.scored, micro, self.pad_token_id)


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step's rows, with what was summed over all processes for them."""

    rows: np.ndarray  # (m,) rows of the batch, in the order they are cut into micro-batches
    counts: np.ndarray  # aggregation_counts over all processes: loss tokens, live sequences, sequences
    weights: np.ndarray  # (m, T) loss_token_weights
    effective_tokens: float  # the policy term's tokens over all processes, the entropy bonus's divisor (0 without it)
    iteration: int


@dataclass
class Tally:
    """What the update adds up as it goes, in this process."""

    totals: defaultdict = field(default_factory=lambda: defaultdict(float))  # token sums, loss, grad_norm
    updates: int = 0  # optimizer steps (and skipped ones)
    nonfinite: Optional[str] = None  # the first input found not finite where the loss was not
    skipped_phase: Optional[str] = None


def update_policy(
    learner: Learner, scored: ScoredBatch, settings: UpdateSettings, world: World, pad_token_id: int, step: int,
    budget: Optional[TokenBudget] = None,
) -> UpdateResult:
    """num_iterations passes over the scored batch, each cut into mini-batches of mini_batch_size sequences
    (one optimizer step each), run in micro-batches of per_device_train_batch_size rows, or fewer where the token
    budget (None: none) says so.

    The old policy's log-probs are the current ones (ratio 1 in value: the usual GRPO gradient A grad log pi)
    when the batch gets a single optimizer step; otherwise they are computed once, before the first step,
    as are the reference model's. With use_rollout_logprobs they are the rollout engine's in every case.
    Each mini-batch's loss is normalised over the mini-batch's loss tokens or sequences in all processes
    (loss_type), so the gradient does not depend on the micro-batch size."""
    learner.model.train()
    budget = budget or TokenBudget(0, 0, settings.per_device_train_batch_size)
    batch = update_batch(learner, scored, settings, world, pad_token_id, budget)
    rows_total, tally = len(batch.trained), Tally()
    for iteration in range(settings.num_iterations):
        order = np.arange(rows_total)
        if settings.shuffle_minibatch:
            order = np.random.default_rng(seed_phase(settings.seed, step, world.rank, "shuffle", iteration + 1)).permutation(rows_total)
        for mini_start in range(0, rows_total, settings.mini_batch_size):
            mini = mini_batch(batch, order[mini_start : mini_start + settings.mini_batch_size], iteration, settings, world)
            train_mini_batch(learner, batch, mini, settings, world, tally)
            if tally.skipped_phase:
                break
        if tally.skipped_phase:
            break
    return UpdateResult(update_metrics(tally, batch, settings, world), tally.skipped_phase)


def update_batch(
    learner: Learner, scored: ScoredBatch, settings: UpdateSettings, world: World, pad_token_id: int, budget: TokenBudget
) -> UpdateBatch:
    """The fixed inputs, in the model's training mode: the old log-probs and entropies where more than one optimizer step,
    the entropy selection or rejection sampling needs them (with use_rollout_logprobs, the rollout engine's log-probs
    instead, and no pass), the reference model's with a KL term; rejection sampling's rejected tokens leave the loss mask."""
    trained = loss_mask(scored, settings.overlong_filter)  # (B, T)
    several_updates = settings.num_iterations > 1 or settings.mini_batch_size < len(trained)
    selecting = settings.top_entropy_quantile < 1  # the entropy selection is fixed before any update
    rejecting = settings.rejection_sampling is not None
    old_logprobs = old_entropy = rejection = None
    if settings.use_rollout_logprobs:  # validation refused it beside selecting and rejecting
        old_logprobs = scored.rollout.logprobs
    elif several_updates or selecting or rejecting:
        old_logprobs, old_entropy = fixed_logprobs(learner.model, scored, pad_token_id, settings, budget)
    if rejecting:
        trained, rejection = rejected_tokens(trained, old_logprobs, scored.rollout.logprobs, settings, world)
    selected = high_entropy_tokens(old_entropy, trained, settings.top_entropy_quantile, world) if selecting else None  # (B, T)
    ref_logprobs = None
    if settings.loss.kl_loss_coeff > 0 and not full_kl_loss(settings):  # the KL in the reward may have needed them first
        ref_logprobs = scored.ref_logprobs
        if ref_logprobs is None:
            ref_logprobs = reference_logprobs(learner, scored, pad_token_id, settings, budget)
    global_tokens = float(world.sum(np.array([trained.sum()]))[0])
    old_logprobs = old_logprobs if several_updates or settings.use_rollout_logprobs else None
    micro_batch_rows = budget.rows(min(settings.mini_batch_size, len(trained)), row_tokens(scored))
    return UpdateBatch(
        scored, pad_token_id, settings.loss, trained, old_logprobs, ref_logprobs, selected, global_tokens, micro_batch_rows,
        completion_widths(scored.rollout.completion_mask), rejection,
    )


def reference_logprobs(
    learner: Learner, scored: ScoredBatch, pad_token_id: int, settings: UpdateSettings, budget: TokenBudget
) -> np.ndarray:
    """(B, T) the reference model's log-probs of the completions (with LoRA: the policy with its adapters off)."""
    with adapters_disabled(learner.model) if learner.ref_model is None else contextlib.nullcontext():
        return fixed_logprobs(learner.ref_model or learner.model, scored, pad_token_id, settings, budget)[0]


def rejected_tokens(trained: np.ndarray, old_logprobs: np.ndarray, rollout_logprobs: np.ndarray, settings: UpdateSettings, world: World):
    """-> (the loss mask without the tokens rejection sampling rejects, the global [tokens, rejected tokens, sequences,
    rejected sequences] over the sequences with loss tokens)."""
    rules = rejection_rules(settings.rejection_sampling, settings.rejection_sampling_threshold)
    keep = rejection_keep(old_logprobs, rollout_logprobs, trained, rules)
    return trained * keep, world.sum(rejection_counts(trained, keep))


def fixed_logprobs(model, scored: ScoredBatch, pad_token_id: int, settings: UpdateSettings, budget: TokenBudget) -> tuple:
    """(B, T) log-probs and entropies, numpy, of a model that does not change during the update, in micro-batches under
    the log-prob token budget, longest completions first; 0 after each completion."""
    widths = completion_widths(scored.rollout.completion_mask)
    order = longest_first(np.arange(len(widths)), widths)
    step = budget.rows(len(order), row_tokens(scored), logprobs=True)
    logprobs, entropy = (np.zeros(scored.rollout.completion_mask.shape, dtype=np.float32) for _ in range(2))
    with paddle.no_grad():
        for start in range(0, len(order), step):
            micro = MicroBatch.of(order[start : start + step], widths)
            values = policy_logprobs(model, token_batch(scored, micro, pad_token_id), settings)
            logprobs[micro.rows, : micro.width], entropy[micro.rows, : micro.width] = (v.numpy() for v in values)
    return logprobs, entropy


def row_tokens(scored: ScoredBatch) -> int:
    """Padded tokens of a row, as the token budget counts them: the longest prompt + the completion width."""
    return max(len(p) for p in scored.rollout.prompt_ids) + scored.rollout.completion_ids.shape[1]


def token_batch(scored: ScoredBatch, micro: MicroBatch, pad_token_id: int):
    rollout = scored.rollout
    prompts = [rollout.prompt_ids[r] for r in micro.rows]
    return make_token_batch(prompts, micro.take(rollout.completion_ids), micro.take(rollout.completion_mask), pad_token_id)


def mini_batch(batch: UpdateBatch, rows: np.ndarray, iteration: int, settings: UpdateSettings, world: World) -> MiniBatch:
    if settings.loss_type not in CUT_DEPENDENT:
        rows = longest_first(rows, batch.widths)
    counts = world.sum(aggregation_counts(batch.trained[rows]))
    weights = loss_token_weights(  # (m, T)
        batch.trained[rows], settings.loss_type, settings.max_dec_len, counts, batch.micro_batch_rows, world.size
    )
    effective_tokens = float(world.sum(np.array([batch.effective[rows].sum()]))[0]) if settings.entropy_coeff else 0.0
    return MiniBatch(rows, counts, weights, effective_tokens, iteration)


def train_mini_batch(learner: Learner, batch: UpdateBatch, mini: MiniBatch, settings: UpdateSettings, world: World, tally: Tally) -> None:
    """The mini-batch's gradient, micro-batch by micro-batch, then one optimizer step unless the gradients are not
    finite (then the step is skipped: tally.skipped_phase says what was not finite)."""
    for start in range(0, len(mini.rows), batch.micro_batch_rows):
        backward_micro_batch(learner, batch, mini, start, settings, tally)
    grad_norm = sum_gradients(learner.optimizer, learner.model.parameters(), world)  # every rank decides alike
    tally.totals["grad_norm"] += grad_norm
    tally.updates += 1
    if not math.isfinite(grad_norm):  # no optimizer step on NaN or infinite gradients: the step is skipped
        learner.optimizer.clear_grad()
        tally.skipped_phase = tally.nonfinite or "the gradients"
        return
    if mini.counts[0] > 0:
        learner.optimizer.step()
        weights_changed(learner.model)  # bf16 matmuls remake their weight copies
    learner.optimizer.clear_grad()


def backward_micro_batch(learner: Learner, batch: UpdateBatch, mini: MiniBatch, start: int, settings: UpdateSettings, tally: Tally) -> None:
    """The loss of the micro-batch of mini.rows from `start`, its gradient accumulated and its sums added to tally."""
    micro = MicroBatch.of(mini.rows[start : start + batch.micro_batch_rows], batch.widths)
    chunk, take = micro.rows, micro.take
    mask = paddle.to_tensor(take(batch.trained).astype(np.float32))
    tokens = batch.tokens(micro)
    hidden = policy_hidden(learner.model, tokens, settings)  # (b, T, H)
    # (b, T) each, from the final hidden states a chunk of tokens at a time: the (b, T, V) logits never exist
    logprobs, entropy = policy_logprobs(learner.model, tokens, settings, entropy_grad=settings.entropy_coeff > 0, hidden=hidden)
    old = logprobs.detach() if batch.old_logprobs is None else paddle.to_tensor(take(batch.old_logprobs))
    importance = rollout_weights(batch, micro, old, mask, settings, tally if mini.iteration == 0 else None)
    inputs = LossInputs(
        old_logprobs=old,
        advantages=paddle.to_tensor(batch.scored.advantages[chunk]),
        weights=paddle.to_tensor(mini.weights[start : start + len(chunk), : micro.width]),
        mask=mask,
        importance_weights=importance,
        ref_logprobs=None if batch.ref_logprobs is None else paddle.to_tensor(take(batch.ref_logprobs)),
        selected=None if batch.selected is None else paddle.to_tensor(take(batch.selected)),
        sampling_logprobs=None if batch.loss.off_policy_mask_threshold is None else paddle.to_tensor(take(batch.scored.rollout.logprobs)),
        kl=exact_kl(learner, tokens, hidden, settings) if full_kl_loss(settings) else None,
    )
    loss, sums = policy_loss(logprobs, inputs, batch.loss)
    if settings.entropy_coeff:
        loss = loss + entropy_bonus(entropy, take(batch.effective), mini.effective_tokens, settings.entropy_coeff)
    if mini.counts[0] > 0:
        loss.backward()
    if not math.isfinite(float(loss)) and tally.nonfinite is None:  # which input made it so, for the message
        tally.nonfinite = nonfinite_input(logprobs, None if batch.ref_logprobs is None else take(batch.ref_logprobs), importance)
    tally.totals["entropy"] += float((entropy * mask).sum())
    tally.totals["loss"] += float(loss)
    for key, value in sums.items():
        tally.totals[key] += value


def rollout_weights(batch: UpdateBatch, micro: MicroBatch, old, mask, settings: UpdateSettings, tally: Optional[Tally]):
    """-> (b, T) the rollout correction's weights pi_old / pi_rollout, or None without it; counted into tally where
    given (the first iteration only: the weights depend only on the batch)."""
    if not settings.importance_sampling_correction:
        return None
    rollout_logprobs = paddle.to_tensor(micro.take(batch.scored.rollout.logprobs))  # (b, T) the engine's
    importance, outside = rollout_correction(
        old, rollout_logprobs, mask, settings.importance_sampling_mode, settings.importance_sampling_cap, settings.importance_sampling_min
    )
    if tally is not None:
        totals = tally.totals
        totals["is_weight"] += float((importance * mask).sum())
        totals["is_capped"] += float((outside.astype("float32") * mask).sum())
        totals["is_logprob_gap_max"] = max(totals["is_logprob_gap_max"], float(((old - rollout_logprobs).abs() * mask).max()))
        for key, value in off_policy_sums(old.numpy(), rollout_logprobs.numpy(), importance.numpy(), mask.numpy()).items():
            totals[f"gap_{key}"] += value
    return importance


def full_kl_loss(settings: UpdateSettings) -> bool:  # the KL loss is exact, over the vocabulary, rather than estimated
    return settings.loss.kl_loss_coeff > 0 and settings.loss.kl_estimator == "full"


def exact_kl(learner: Learner, tokens, hidden: paddle.Tensor, settings: UpdateSettings) -> paddle.Tensor:
    """kl_estimator full: (b, T) KL(pi || pi_ref) over the whole vocabulary at each completion position, with its gradient
    through the policy's hidden states (b, T, H) and head; the reference's hidden states are computed here, without
    gradient, for this micro-batch (with LoRA: the policy with its adapters off)."""
    reference_model = learner.ref_model or learner.model
    with paddle.no_grad(), adapters_disabled(learner.model) if learner.ref_model is None else contextlib.nullcontext():
        reference_hidden = policy_hidden(reference_model, tokens, settings)
    ref_weight, ref_bias = output_head(reference_model)
    reference = ReferenceHead(reference_hidden, ref_weight, ref_bias, head_kernels(reference_model).matmul)
    weight, bias = output_head(learner.model)
    return chunked_full_kl(
        hidden, weight, bias, reference, settings.temperature, settings.logprob_chunk_tokens, head_kernels(learner.model).matmul
    )


def nonfinite_input(logprobs, ref_logprobs: Optional[np.ndarray], importance) -> str:
    """The first of the loss's inputs with a NaN or an infinity, else "the loss"."""
    inputs = [
        ("the policy's log-probs", logprobs.numpy()),
        ("the reference model's log-probs", ref_logprobs),
        ("the importance weights (the rollout engine's log-probs)", None if importance is None else importance.numpy()),
    ]
    return next((name for name, values in inputs if values is not None and not np.isfinite(values).all()), "the loss")


def update_metrics(tally: Tally, batch: UpdateBatch, settings: UpdateSettings, world: World) -> dict:
    """The tally summed over processes -> the update's metrics (null where not finite)."""
    gap_max = world.max(np.array([tally.totals.pop("is_logprob_gap_max", 0.0)]))[0]
    keys = sorted(tally.totals)
    summed = dict(zip(keys, world.sum(np.array([tally.totals[k] for k in keys]))))
    global_tokens, updates = batch.global_tokens, tally.updates
    per_token = max(global_tokens, 1.0) * settings.num_iterations  # token sums over every update
    metrics = {
        "loss": summed["loss"] / updates,
        "entropy": summed["entropy"] / per_token,
        **{FLAG_METRICS[flag]: summed[flag] / per_token for flag in SHARED_FLAGS},
        "kl": summed["kl"] / per_token if "kl" in summed else None,
        "grad_norm": summed["grad_norm"] / world.size / updates,  # every process computed the same all-reduced norm
        "loss_tokens": global_tokens,
        "optimizer_steps": updates,
        **{name: summed[flag] / per_token for flag, name in FLAG_METRICS.items() if flag not in SHARED_FLAGS and flag in summed},
    }
    if batch.selected is not None:
        metrics["entropy_selected_fraction"] = summed["selected"] / per_token
    if settings.importance_sampling_correction:
        metrics["is/weight_mean"] = summed["is_weight"] / max(global_tokens, 1.0)
        metrics["is/capped_fraction"] = summed["is_capped"] / max(global_tokens, 1.0)
        metrics["is/logprob_gap_max"] = gap_max
        sums = {key.removeprefix("gap_"): value for key, value in summed.items() if key.startswith("gap_")}
        metrics.update({f"is/{name}": value for name, value in off_policy_diagnostics(sums).items()})
    if batch.rejection is not None:
        tokens, rejected, sequences, rejected_sequences = batch.rejection
        metrics["rs/masked_fraction"] = rejected / max(tokens, 1.0)
        metrics["rs/seq_masked_fraction"] = rejected_sequences / max(sequences, 1.0)
    return {key: finite_or_none(value) if isinstance(value, float) else value for key, value in metrics.items()}


def high_entropy_tokens(entropy: np.ndarray, trained: np.ndarray, top_quantile: float, world: World) -> np.ndarray:
    """entropy, trained (B, T) -> (B, T) float32, 1 on the trained tokens among the top_quantile fraction of the
    step's (all processes') with the highest entropy."""
    threshold = entropy_threshold(world.gather(entropy[trained > 0].astype(np.float64)), top_quantile)
    return ((entropy >= threshold) & (trained > 0)).astype(np.float32)


def policy_hidden(model, batch, settings: UpdateSettings) -> paddle.Tensor:
    """-> (b, T, H) the final hidden states that predicted each completion token."""
    return completion_hidden(model, batch, settings.use_prefix_grouper and groups_prompts(model, settings.recompute))


def policy_logprobs(model, batch, settings: UpdateSettings, entropy_grad: bool = False, hidden: Optional[paddle.Tensor] = None) -> tuple:
    """-> (log-probs (b, T) with grad where the model has it, entropy (b, T), with grad only for entropy_grad)
    of the completion tokens under softmax(logits / temperature), logprob_chunk_tokens tokens' logits at a time;
    from `hidden` where the caller has the final hidden states already."""
    weight, bias = output_head(model)
    hidden = policy_hidden(model, batch, settings) if hidden is None else hidden
    return chunked_token_logprobs(
        hidden, weight, bias, batch.completion_ids, settings.temperature, settings.logprob_chunk_tokens, head_kernels(model), entropy_grad
    )
