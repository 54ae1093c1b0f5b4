"""Records passed between the step's phases."""

from dataclasses import dataclass

import numpy as np

from alignment.rollout import Rollout, concat_rollouts


@dataclass
class ScoredBatch:
    """One rank's rollout with its rewards; B = len(prompts) * G rows, prompt-major."""

    prompts: list  # P EncodedPrompts
    rollout: Rollout
    completions: list  # B decoded completions
    rewards: np.ndarray  # (B,) weighted sum of the reward functions, NaN where one failed
    reward_columns: dict  # function name -> (B,) values, NaN where it failed
    errors: list  # B entries: None or "name: error" of the first failing function
    correct: np.ndarray  # (B,) bool: accuracy_function gave a positive value
    advantages: np.ndarray | None = None  # (B,) float32, set once the step's batch is final
    ref_logprobs: np.ndarray | None = None  # (B, T) the reference model's, where the KL in the reward needed them first

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


def loss_mask(scored: ScoredBatch, overlong_filter: bool) -> np.ndarray:
    """(B, T) 1 on the tokens the update trains: the model's own (not the tool answers), of completions whose
    reward could be computed, and not cut off at max_dec_len under overlong_filter."""
    rollout = scored.rollout
    mask = rollout.loss_mask * np.isfinite(scored.rewards)[:, None]
    if overlong_filter:
        mask = mask * np.array([reason != "length" for reason in rollout.finish_reasons])[:, None]
    return mask
