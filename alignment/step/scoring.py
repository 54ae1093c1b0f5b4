"""The scoring phase: decoded completions -> rewards (rule functions in worker processes, the reward server, a reward model)."""

import functools
import os
import warnings
import weakref

import numpy as np

from alignment.parallel.distributed import World
from alignment.rewards import REWARD_MODEL, ScoreTable, score_completions
from alignment.rewards.pool import ScoringPool
from alignment.rewards.remote import score_remote
from alignment.rollout import Rollout
from alignment.run.config import GRPOConfig
from alignment.run.plugins import plugin_sources
from alignment.step.records import ScoredBatch


class RewardsFailedError(RuntimeError):
    """Every completion of max_consecutive_skips steps in a row failed to score."""


def nothing_scored(scored: ScoredBatch, world: World) -> bool:
    return not world.max(np.array([float(np.isfinite(scored.rewards).any())]))[0]


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


def _as_array(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def reported_reward_functions(config: GRPOConfig) -> list:
    """Functions whose values come back one by one: all of them, except from a PaddleNLP-protocol server,
    which answers totals only."""
    paddlenlp_server = config.use_rm_server and config.reward_server_protocol == "paddlenlp"
    return [] if paddlenlp_server else list(config.reward_functions)
