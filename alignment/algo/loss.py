"""One micro-batch's loss: the policy objective (objectives.py) on the importance ratio, times the entropy
selection and the rollout correction's weights, plus the KL term (kl.py), weighted per token (aggregation.py);
and the entropy bonus."""

import math
from dataclasses import dataclass

import numpy as np
import paddle

from alignment.algo.corrections import off_policy_sequence_mask
from alignment.algo.kl import kl_estimate
from alignment.algo.loss_settings import LossSettings
from alignment.algo.objectives import OBJECTIVES, importance_ratio


@dataclass(frozen=True)
class LossInputs:
    """What policy_loss needs of a micro-batch besides the log-probs being trained: (B, T) tensors, advantages (B,)."""

    old_logprobs: paddle.Tensor
    advantages: paddle.Tensor
    weights: paddle.Tensor  # from loss_token_weights
    mask: paddle.Tensor  # 1 on loss tokens
    importance_weights: paddle.Tensor | None = None  # the rollout correction's; None: off
    ref_logprobs: paddle.Tensor | None = None  # needed with kl_coeff > 0
    selected: paddle.Tensor | None = None  # 1 on the tokens the entropy selection keeps; None: all
    sampling_logprobs: paddle.Tensor | None = None  # the rollout engine's, needed with off_policy_mask_threshold
    kl: paddle.Tensor | None = None  # kl_estimator full: the exact KL per token (chunked_full_kl), in place of an estimate


def policy_loss(logprobs: paddle.Tensor, inputs: LossInputs, settings: LossSettings) -> tuple:
    """Loss of one micro-batch: sum over its tokens of weights x (surrogate x selected x importance weight
    + kl_loss_coeff x KL [x ratio]), logprobs (B, T) with their gradient. As in TRL, the selection and the importance
    weights touch the policy term only, never the KL. Summing these losses over micro-batches and processes
    gives the global batch's loss however the batch is cut.

    Returns (loss, sums): token sums over the mask of the objective's flags, the KL, the selected tokens, which the
    caller divides by the global token count once all micro-batches are in."""
    mask = inputs.mask
    ratio = importance_ratio(logprobs, inputs.old_logprobs, mask, settings.importance_sampling_level)  # (B, T) or (B, 1)
    per_token, flags = OBJECTIVES.get(settings.surrogate)(ratio, logprobs, inputs.advantages, mask, settings)
    if settings.off_policy_mask_threshold is not None:
        threshold = settings.off_policy_mask_threshold
        kept = off_policy_sequence_mask(inputs.advantages, logprobs.detach(), inputs.sampling_logprobs, mask, threshold)
        per_token = per_token * kept  # (B, 1): the policy term of a dropped sequence, never its KL
        flags["off_policy_masked"] = paddle.expand(kept == 0, mask.shape)
    sums = {name: float((flag.astype("float32") * mask).sum()) for name, flag in flags.items()}
    if inputs.selected is not None:
        per_token = per_token * inputs.selected
        sums["selected"] = float((inputs.selected * mask).sum())
    if inputs.importance_weights is not None:
        per_token = per_token * inputs.importance_weights
    if settings.kl_loss_coeff > 0:
        if inputs.ref_logprobs is None and inputs.kl is None:
            raise ValueError("kl_loss_coeff > 0 needs ref_logprobs (or the exact kl)")
        kl = kl_estimate(logprobs, inputs.ref_logprobs, settings.kl_estimator) if inputs.kl is None else inputs.kl
        sums["kl"] = float((kl * mask).sum())
        if settings.use_bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + settings.kl_loss_coeff * kl
    return (per_token * inputs.weights).sum(), sums


def entropy_threshold(entropies: np.ndarray, top_quantile: float) -> float:
    """entropies (N,) of every loss token of the step (all processes) -> the entropy at quantile 1 - top_quantile
    (linear interpolation, as torch.quantile in TRL): tokens at or above it are the top_quantile fraction with
    the highest entropy ("Beyond the 80/20 rule", Wang et al. 2025; top_quantile 0.2 there). -inf without tokens."""
    return float(np.quantile(entropies, 1.0 - top_quantile)) if len(entropies) else -math.inf


def entropy_bonus(entropy: paddle.Tensor, effective: np.ndarray, tokens: float, coeff: float) -> paddle.Tensor:
    """-coeff x the mean entropy over the tokens the policy term trains on, as a loss to add: entropy (B, T) with
    its gradient, effective (B, T) the loss mask (times the entropy selection), tokens their count over the
    global mini-batch, so the micro-batches' terms sum to the mini-batch's mean. TRL's entropy_coef: the mean
    whatever loss_type normalises the policy term by."""
    return -coeff * (entropy * paddle.to_tensor(effective.astype(np.float32))).sum() / max(tokens, 1.0)
