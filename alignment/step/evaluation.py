"""The evaluation phase: greedy accuracy (and mean@k, pass@k) on the held-out prompts."""

import dataclasses

import numpy as np

from alignment.algo.stats import mean_and_pass_at_k
from alignment.basics.errors import RewardServerError
from alignment.rollout import SamplingParams, generate
from alignment.rollout.multi_turn import tool_use
from alignment.run.seeding import seed_phase
from alignment.run.settings import EvaluationSettings
from alignment.step.rollout import Sampler
from alignment.step.scoring import score_rollout


def decoded(sampler: Sampler, prompts: list, k: int, sampling: SamplingParams):
    """Some prompts decoded k times at `sampling`, scored as training scores -> ScoredBatch."""
    rollout = generate(sampler.engine, prompts, k, sampling)
    return score_rollout(prompts, rollout, sampler.scorer, sampler.tokenizer, sampler.settings.scoring)


def greedy_and_sampled(sampler: Sampler, prompts: list, k: int, sampling: SamplingParams) -> tuple:
    """Evaluation's decoding of some prompts, scored as training scores: each decoded greedily and, with k > 0, sampled
    k times at `sampling` (whose first_row places the prompts in the evaluation's rows) -> (the greedy ScoredBatch,
    the sampled one or None)."""
    scored = decoded(sampler, prompts, 1, SamplingParams(max_new_tokens=sampler.sampling.max_new_tokens, greedy=True))
    return scored, decoded(sampler, prompts, k, sampling) if k else None


def evaluate(sampler: Sampler, settings: EvaluationSettings, prompts: list, step: int) -> tuple:
    """Greedy decoding of the evaluation prompts (a contiguous slice per rank, at most max_evaluate_steps
    batches each), scored like training. With eval_rollout_n = k, also k samples per prompt at the training
    sampling settings: mean@k is the samples' mean accuracy, pass@k the fraction of prompts with at least
    one correct sample. -> (metrics, None), or (None, the error) when scoring failed in any process: the
    failure travels in the one all-reduce, so no process is left waiting."""
    world = sampler.world
    sampling = dataclasses.replace(sampler.sampling, seed=seed_phase(sampler.settings.seed, step, world.rank, "eval"))
    share = -(-len(prompts) // world.size)
    first, end = world.rank * share, min((world.rank + 1) * share, len(prompts))  # this rank's prompts
    size, k = settings.per_device_eval_batch_size, settings.eval_rollout_n
    starts = range(first, end, size)
    starts = starts[: settings.max_evaluate_steps] if settings.max_evaluate_steps > 0 else starts
    columns = sampler.settings.scoring.reported_functions
    names = ["count", "correct", "length", "truncated", "reward_sum", "valid", "mean@k", "pass@k", "failed"]
    names += [f"reward/{c}" for c in columns] + ["called_tools", "useful_calls"]
    sums, failure = dict.fromkeys(names, 0.0), None  # this process's, summed over the chunks
    for start in starts:
        chunk = prompts[start : min(start + size, end)]
        mean_at_k = pass_at_k = np.zeros(len(chunk))
        try:
            scored, sampled = greedy_and_sampled(sampler, chunk, k, dataclasses.replace(sampling, first_row=start * k))
            if k:
                mean_at_k, pass_at_k = mean_and_pass_at_k(sampled.correct.reshape(len(chunk), k))
        except RewardServerError as error:
            failure = error
            sums["failed"] = 1.0
            break
        chunk_sums = {
            "count": len(chunk), "correct": scored.correct.sum(), "length": scored.rollout.lengths.sum(),
            "truncated": sum(r == "length" for r in scored.rollout.finish_reasons),
            "reward_sum": np.nansum(scored.rewards), "valid": np.isfinite(scored.rewards).sum(),
            "mean@k": mean_at_k.sum(), "pass@k": pass_at_k.sum(),
            **{f"reward/{c}": np.nansum(scored.reward_columns[c]) for c in columns},
            **(tool_use(scored.rollout.episodes, scored.correct) if scored.rollout.episodes is not None else {}),
        }
        for name, value in chunk_sums.items():
            sums[name] += value
    total = world.sum_named(sums)
    if total["failed"]:
        return None, failure or RewardServerError("another process's reward scoring failed during evaluation: its log names the cause")
    count = max(total["count"], 1)
    return {
        "eval_accuracy": total["correct"] / count,
        **({f"eval_mean@{k}": total["mean@k"] / count, f"eval_pass@{k}": total["pass@k"] / count} if k else {}),
        "eval_reward_mean": total["reward_sum"] / max(total["valid"], 1),
        **{f"eval_reward/{c}": total[f"reward/{c}"] / count for c in columns},
        "eval_response_length_mean": total["length"] / count,
        "eval_truncated_fraction": total["truncated"] / count,
        **({"eval_tool_call_rate": total["called_tools"] / count, "eval_useful_call_rate": total["useful_calls"] / count}
           if settings.multi_turn else {}),
        "eval_samples": int(count),
    }, None
