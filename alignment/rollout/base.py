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
    row_keys: Optional[tuple] = None  # each row's key in place of first_row + row (a multi-turn rollout's later turns)


@dataclass
class Rollout:
    """Completions for a batch of prompts, prompt-major: rows i*group_size ... (i+1)*group_size-1
    are the group of prompt i. B = len(prompts) * group_size, T = longest completion."""

    prompt_ids: list  # B lists of token ids (each prompt repeated group_size times)
    completion_ids: np.ndarray  # (B, T) int64, pad_token_id after each completion's end
    completion_mask: np.ndarray  # (B, T) float32, 1 on generated tokens, the eos token included
    logprobs: np.ndarray  # (B, T) float32: log pi(token) under the temperature-scaled policy, 0 on padding
    finish_reasons: list  # B strings: "eos" (stopped by an eos token), "length" (a token budget), "max_turns"
    group_size: int
    # Multi-turn rollouts (alignment/rollout/multi_turn.py): (B, T) float32, 1 on tokens the environment put between
    # the model's turns (tool answers, the template's markup), which the loss leaves out; and B Episodes.
    environment_mask: Optional[np.ndarray] = None
    episodes: Optional[list] = None

    @property
    def lengths(self) -> np.ndarray:  # (B,) tokens after the prompt, the environment's included
        return self.completion_mask.sum(axis=1).astype(np.int64)

    @property
    def loss_mask(self) -> np.ndarray:  # (B, T) float32: 1 on the tokens the model generated
        if self.environment_mask is None:
            return self.completion_mask
        return self.completion_mask * (1.0 - self.environment_mask)

    def groups(self, indices: list) -> "Rollout":
        """The groups at `indices` (prompt positions), in that order."""
        rows = [group * self.group_size + member for group in indices for member in range(self.group_size)]
        return Rollout(
            prompt_ids=[self.prompt_ids[row] for row in rows],
            completion_ids=self.completion_ids[rows],
            completion_mask=self.completion_mask[rows],
            logprobs=self.logprobs[rows],
            finish_reasons=[self.finish_reasons[row] for row in rows],
            group_size=self.group_size,
            environment_mask=None if self.environment_mask is None else self.environment_mask[rows],
            episodes=None if self.episodes is None else [self.episodes[row] for row in rows],
        )


def concat_rollouts(rollouts: list, pad_token_id: int) -> Rollout:
    """Rollouts of the same group size, one after the other; shorter completions are padded to the longest."""
    width = max(r.completion_ids.shape[1] for r in rollouts)
    multi_turn = next((r for r in rollouts if r.episodes is not None), None)  # all are, or none

    def padded(array: np.ndarray, value) -> np.ndarray:
        return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=value)

    return Rollout(
        prompt_ids=[ids for r in rollouts for ids in r.prompt_ids],
        completion_ids=np.concatenate([padded(r.completion_ids, pad_token_id) for r in rollouts]),
        completion_mask=np.concatenate([padded(r.completion_mask, 0.0) for r in rollouts]),
        logprobs=np.concatenate([padded(r.logprobs, 0.0) for r in rollouts]),
        finish_reasons=[reason for r in rollouts for reason in r.finish_reasons],
        group_size=rollouts[0].group_size,
        environment_mask=None if multi_turn is None else np.concatenate([padded(r.environment_mask, 0.0) for r in rollouts]),
        episodes=None if multi_turn is None else [episode for r in rollouts for episode in r.episodes],
    )


# Called after each decode step with that step's (B,) int64 tokens, pad_token_id on rows already finished:
# how a chat streams its answer.
TokenStream = Optional[Callable[[np.ndarray], None]]


class RolloutEngine(Protocol):
    def generate(
        self, prompts: list, group_size: int, params: SamplingParams, samples: Optional[list] = None, on_tokens: TokenStream = None
    ) -> Rollout:
        """group_size completions of each prompt (token ids). samples: each prompt's reward sample, which a multi-turn
        engine's environment sees (the others ignore it); on_tokens: a token stream (single-turn engines)."""

    def generate_turn(self, contexts: list, known: list, params: SamplingParams) -> tuple:
        """One turn of a multi-turn rollout: one completion of each context. known[r]: what the engine kept of
        contexts[r]'s start at its last turn (None: nothing). -> (Rollout of group size 1, what it keeps of each row)."""

    def sync(self) -> Optional[float]:
        """Called after every optimizer step: from then on, generate with the actor's new weights. -> the engine's
        largest |log-prob difference| from the actor on its check, or None where it computes with the actor itself."""
