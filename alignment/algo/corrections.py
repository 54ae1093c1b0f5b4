"""The rollout correction (config key importance_sampling_mode): the rollout engine samples from pi_rollout,
numerically not quite the trainer's pi_old (other kernels, other summation order, bf16 weights; with vLLM in
other trainers, often more than that). Each token's policy loss is weighted by the ratio pi_old / pi_rollout
(Yao et al. 2025), detached, per token or per sequence (the product of its loss tokens' ratios), and either
truncated into [floor, cap] or set to 0 outside it ("mask": IcePop's rejection): TRL's
vllm_importance_sampling_mode values.

A mode takes log(pi_old / pi_rollout) (B, T), 0 off the loss tokens and detached, the cap and the floor (None:
no floor), and returns (weights, outside: bool, the ratio left [floor, cap]), both (B, T) or (B, 1)."""

import paddle

from alignment.algo.registry import Registry

ROLLOUT_CORRECTIONS = Registry("importance sampling mode must be one of {listed}, not {name!r}")


@ROLLOUT_CORRECTIONS.register("token_truncate")
def token_truncate(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _truncated(paddle.exp(log_ratio), cap, floor)


@ROLLOUT_CORRECTIONS.register("token_mask")
def token_mask(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _masked(paddle.exp(log_ratio), cap, floor)


@ROLLOUT_CORRECTIONS.register("sequence_truncate")
def sequence_truncate(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _truncated(_sequence_ratio(log_ratio), cap, floor)


@ROLLOUT_CORRECTIONS.register("sequence_mask")
def sequence_mask(log_ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    return _masked(_sequence_ratio(log_ratio), cap, floor)


def _sequence_ratio(log_ratio: paddle.Tensor) -> paddle.Tensor:  # (B, T) -> (B, 1) the product of the sequence's ratios
    return paddle.exp(log_ratio.sum(axis=-1, keepdim=True))


def _outside(ratio: paddle.Tensor, cap: float, floor: float | None) -> paddle.Tensor:
    outside = ratio > cap
    if floor is not None:
        outside = outside | (ratio < floor)
    return outside


def _truncated(ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    outside = _outside(ratio, cap, floor)
    return paddle.clip(ratio, min=floor, max=cap), outside


def _masked(ratio: paddle.Tensor, cap: float, floor: float | None) -> tuple:
    outside = _outside(ratio, cap, floor)
    return paddle.where(outside, paddle.zeros_like(ratio), ratio), outside


def rollout_correction(
    old_logprobs: paddle.Tensor,
    rollout_logprobs: paddle.Tensor,
    mask: paddle.Tensor,
    mode: str = "token_truncate",
    cap: float = 2.0,
    floor: float | None = None,
) -> tuple:
    """old_logprobs, rollout_logprobs, mask (B, T) -> (weights (B, T), outside (B, T) bool: the ratio of the token
    (or of its sequence) left [floor, cap] and was truncated or masked)."""
    correct = ROLLOUT_CORRECTIONS.get(mode)
    weights, outside = correct(((old_logprobs - rollout_logprobs) * mask).detach(), cap, floor)
    return paddle.expand(weights, mask.shape), paddle.expand(outside, mask.shape)
