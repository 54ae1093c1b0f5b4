"""What every rollout engine takes and returns."""

from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 keeps the whole vocabulary
    min_p: float = 0.0  # 0 keeps every token; else drops tokens less likely than min_p x the most likely
    repetition_penalty: float = 1.0
    greedy: bool = False
    # The fused engine keys each row's draws on (seed, decode step, first_row + row): the global batch
    # index, so a row samples the same tokens whichever process and batch it is in. seed None: drawn
    # from paddle's generator. The eager engine samples from paddle's generator and ignores both.
    seed: Optional[int] = None
    first_row: int = 0


@dataclass
class Rollout:
    """Completions for a batch of prompts, prompt-major: rows i*group_size ... (i+1)*group_size-1
    are the group of prompt i. B = len(prompts) * group_size, T = longest completion."""

    prompt_ids: list  # B lists of token ids (each prompt repeated group_size times)
    completion_ids: np.ndarray  # (B, T) int64, pad_token_id after each completion's end
    completion_mask: np.ndarray  # (B, T) float32, 1 on generated tokens, the eos token included
    logprobs: np.ndarray  # (B, T) float32: log pi(token) under the temperature-scaled policy, 0 on padding
    finish_reasons: list  # B strings: "eos" (stopped by an eos token) or "length" (hit max_new_tokens)
    group_size: int

    @property
    def lengths(self) -> np.ndarray:  # (B,)
        return self.completion_mask.sum(axis=1).astype(np.int64)


class WeightSyncError(RuntimeError):
    """A rollout engine no longer computes the actor's policy (stale weights or wrong operators)."""


# Called after each decode step with that step's (B,) int64 tokens, pad_token_id on rows already finished:
# how a chat streams its answer.
TokenStream = Optional[Callable[[np.ndarray], None]]


class RolloutEngine(Protocol):
    def generate(self, prompts: list, group_size: int, params: SamplingParams, on_tokens: TokenStream = None) -> Rollout: ...

    def sync(self) -> None:
        """Called after every optimizer step: from then on, generate with the actor's new weights."""
