"""The rollout phase: prompts -> G completions each, scored; or the rollout processes' batch; dynamic sampling's refills."""

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from alignment.algo.stats import groups_with_signal
from alignment.parallel.distributed import World
from alignment.rollout import RolloutEngine, SamplingParams, concat_rollouts, generate
from alignment.rollout.trainer_link import TrainerLink
from alignment.run.seeding import seed_phase
from alignment.run.settings import RolloutSettings
from alignment.step.records import ScoredBatch, concat_scored
from alignment.step.scoring import score_rollout


@dataclass(frozen=True)
class Sampler:
    """What sampling and scoring completions needs: training's rollout, dynamic sampling's refills, evaluation."""

    engine: RolloutEngine
    scorer: Callable  # (completions, samples) -> ScoreTable
    tokenizer: Any
    settings: RolloutSettings
    world: World
    sampling: SamplingParams  # training's sampling settings


def sample_and_score(sampler: Sampler, prompts: list, step: int, phase: str, attempt: int = 0) -> tuple:
    """rollout_n completions of each prompt, scored -> (ScoredBatch without advantages, {"rollout": s, "reward": s})."""
    settings, world = sampler.settings, sampler.world
    started = time.perf_counter()
    first_row = world.rank * len(prompts) * settings.rollout_n  # this rank's rows in the global batch
    params = dataclasses.replace(sampler.sampling, seed=seed_phase(settings.seed, step, world.rank, phase, attempt), first_row=first_row)
    rollout = generate(sampler.engine, prompts, settings.rollout_n, params)
    rolled_out = time.perf_counter()
    scored = score_rollout(prompts, rollout, sampler.scorer, sampler.tokenizer, settings.scoring)
    return scored, {"rollout": rolled_out - started, "reward": time.perf_counter() - rolled_out}


def received_batch(link: TrainerLink, sampler: Sampler, prompts: list, step: int) -> tuple:
    """Step `step`'s completions from the rollout processes, scored with the sampler's scorer -> (ScoredBatch without
    advantages, timings, metrics: how stale the batch is and how long generating it took)."""
    seed_phase(sampler.settings.seed, step, 0, "train")  # paddle's generator as a colocated run leaves it (dropout in the update)
    parts, waited, broadcast = link.take(step)
    started = time.perf_counter()
    rollout = concat_rollouts([part.rollout for part in parts], sampler.tokenizer.pad_token_id)
    scored = score_rollout(prompts, rollout, sampler.scorer, sampler.tokenizer, sampler.settings.scoring)
    timings = {"rollout": waited, "reward": time.perf_counter() - started, "weights": broadcast}
    gaps = [part.sync_gap for part in parts if part.sync_gap is not None]  # none before the first weights arrive
    return scored, timings, {
        "rollout/staleness": step - 1 - min(part.weights_step for part in parts),  # optimizer steps behind
        "rollout/generate_seconds": max(part.seconds for part in parts),
        "rollout/engine_sync_seconds": max(part.sync_seconds for part in parts),  # the rollout process's weight refresh and check
        **({"rollout/weight_sync_gap": max(gaps)} if gaps else {}),
    }


def keep_groups_with_signal(sampler: Sampler, scored: ScoredBatch, train_prompts: list, step: int, timings: dict) -> tuple:
    """DAPO's dynamic sampling: groups whose rewards (nearly) agree are dropped and replaced by groups of
    other prompts, sampled and scored in up to max_resample_times further rounds; if the rounds run out,
    dropped groups fill the gap (they add no policy gradient) and are counted. Refill prompts are a seeded
    draw from the whole training set per (step, round, process), so resuming draws them again exactly and
    the epoch's data order is left alone. No collective runs here, so a process whose scoring fails cannot
    leave the others waiting. -> (the batch to train on, this process's counts)."""
    settings, world = sampler.settings, sampler.world
    wanted = len(scored.prompts)
    kept, dropped = [], []  # (batch, group) pairs
    batches = [scored]
    rounds = 0
    while True:
        informative = groups_with_signal(batches[-1].rewards, settings.rollout_n, settings.dynamic_sampling_min_std)  # (P,) bool
        kept += [(batches[-1], g) for g in np.flatnonzero(informative)]
        dropped += [(batches[-1], g) for g in np.flatnonzero(~informative)]
        if len(kept) >= wanted or rounds == settings.max_resample_times:
            break
        rounds += 1
        rng = np.random.default_rng(seed_phase(settings.seed, step, world.rank, "resample", rounds))
        picks = rng.choice(len(train_prompts), wanted, replace=wanted > len(train_prompts))
        refill, spent = sample_and_score(sampler, [train_prompts[i] for i in picks], step, "resample", rounds)
        batches.append(refill)
        for phase, seconds in spent.items():
            timings[phase] += seconds
    chosen = (kept + dropped)[:wanted]
    parts = [batch.groups([g for b, g in chosen if b is batch]) for batch in batches]
    counts = {"dropped_groups": len(dropped), "unfilled_groups": max(0, wanted - len(kept)), "rounds": rounds}
    return concat_scored([part for part in parts if part.prompts], sampler.tokenizer.pad_token_id), counts


def dynamic_sampling_metrics(counts: dict, world: World) -> dict:
    """keep_groups_with_signal's counts of this process -> summed over processes (rounds: the most any took)."""
    dropped, unfilled = world.sum(np.array([counts["dropped_groups"], counts["unfilled_groups"]], dtype=np.float64))
    rounds = world.max(np.array([counts["rounds"]], dtype=np.float64))[0]
    return {
        "dynamic_sampling/dropped_groups": int(dropped),
        "dynamic_sampling/unfilled_groups": int(unfilled),
        "dynamic_sampling/rounds": int(rounds),
    }
