"""The scorer a run builds once: (completions, samples) -> ScoreTable over its reward functions, from rule functions in
worker processes, the reward server, or a reward model."""

import functools
import os
import warnings
import weakref
from typing import Optional

from alignment.basics.key_files import key_from_environment
from alignment.rewards import REWARD_MODEL, ScoreTable, score_completions
from alignment.rewards.pool import ScoringPool
from alignment.rewards.remote import RewardServer, score_remote
from alignment.config.schema import GRPOConfig
from alignment.basics.plugins import plugin_sources

API_KEY_VARIABLE = "GRPO_REWARD_SERVER_API_KEY"  # or GRPO_REWARD_SERVER_API_KEY_FILE: a file only its user can read


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
        server = RewardServer(
            url=config.reward_server,
            protocol=config.reward_server_protocol,
            timeout=config.reward_server_timeout,
            retries=config.reward_server_retries,
            api_key=reward_server_key(config),
        )
        score_rules = functools.partial(score_remote, server=server, settings=settings)
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
            return ScoreTable(
                totals=[model_weight * v for v in model_scores], columns={REWARD_MODEL: model_scores}, errors=[None] * len(completions)
            )
        totals = [None if t is None else t + model_weight * v for t, v in zip(table.totals, model_scores)]
        return ScoreTable(totals=totals, columns={**table.columns, REWARD_MODEL: model_scores}, errors=table.errors)

    return score


def reward_server_key(config: GRPOConfig) -> Optional[str]:
    """reward_server_api_key, else the key in the file $GRPO_REWARD_SERVER_API_KEY_FILE names, else
    $GRPO_REWARD_SERVER_API_KEY (a warning under paddle.distributed.launch, which writes the environment to its log
    folder). "set" and "unset", what grpo_config.json holds in the key's place (SECRET_KEYS), are no key."""
    if config.reward_server_api_key not in (None, "", "set", "unset"):
        return config.reward_server_api_key
    if os.environ.get(API_KEY_VARIABLE) and not os.environ.get(f"{API_KEY_VARIABLE}_FILE") and "PADDLE_TRAINER_ENDPOINTS" in os.environ:
        warnings.warn(
            f"{API_KEY_VARIABLE}: paddle.distributed.launch writes the environment, this key included, to its log folder "
            f"(envlog.N, backup_env.N.json); put the key in a file only you can read (chmod 600) and set {API_KEY_VARIABLE}_FILE "
            "to its path instead"
        )
    return key_from_environment(API_KEY_VARIABLE)


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
