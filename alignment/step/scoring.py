"""The scoring phase: decoded completions -> rewards (rule functions in worker processes, the reward server, a reward model)."""


import numpy as np

from alignment.parallel.distributed import World
from alignment.rewards import ScoreTable, score_completions
from alignment.rollout import Rollout
from alignment.run.settings import ScoringSettings
from alignment.step.records import ScoredBatch


def nothing_scored(scored: ScoredBatch, world: World) -> bool:
    return not world.max(np.array([float(np.isfinite(scored.rewards).any())]))[0]


def decode_completions(rollout: Rollout, tokenizer) -> list:
    lengths = rollout.lengths
    return tokenizer.batch_decode(
        [row[:length].tolist() for row, length in zip(rollout.completion_ids, lengths)], skip_special_tokens=True
    )


def score_rollout(prompts: list, rollout: Rollout, scorer, tokenizer, settings: ScoringSettings) -> ScoredBatch:
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
    accuracy_function = settings.accuracy_function
    if accuracy_function not in columns:  # the accuracy metric is computed here whatever scores the reward
        accuracy = score_completions(written, samples, [accuracy_function], [1.0], settings=settings.reward_settings)
        columns[accuracy_function] = _as_array(accuracy.columns[accuracy_function])
    return ScoredBatch(
        prompts=prompts,
        rollout=rollout,
        completions=completions,
        rewards=_as_array(table.totals),
        reward_columns={name: columns[name] for name in settings.reported_functions},
        errors=table.errors,
        correct=np.nan_to_num(columns[accuracy_function]) > 0,
    )


def _as_array(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)

