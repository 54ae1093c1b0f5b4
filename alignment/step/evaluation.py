"""The evaluation phase: greedy accuracy (and mean@k, pass@k) on the held-out prompts."""

import dataclasses

import numpy as np

from alignment.algo.stats import mean_and_pass_at_k
from alignment.errors import RewardServerError
from alignment.rollout import SamplingParams, generate
from alignment.rollout.multi_turn import tool_use
from alignment.run.seeding import seed_phase
from alignment.step.rollout import Sampler
from alignment.step.scoring import reported_reward_functions, score_rollout


def evaluate(sampler: Sampler, prompts: list, step: int) -> tuple:
    """Greedy decoding of the evaluation prompts (a contiguous slice per rank, at most max_evaluate_steps
    batches each), scored like training. With eval_rollout_n = k, also k samples per prompt at the training
    sampling settings: mean@k is the samples' mean accuracy, pass@k the fraction of prompts with at least
    one correct sample. -> (metrics, None), or (None, the error) when scoring failed in any process: the
    failure travels in the one all-reduce, so no process is left waiting."""
    engine, scorer, tokenizer, config, world = sampler.engine, sampler.scorer, sampler.tokenizer, sampler.config, sampler.world
    sampling = dataclasses.replace(sampler.sampling, seed=seed_phase(config, step, world.rank, "eval"))
    share = -(-len(prompts) // world.size)
    first, end = world.rank * share, min((world.rank + 1) * share, len(prompts))  # this rank's prompts
    size, k = config.per_device_eval_batch_size, config.eval_rollout_n
    starts = range(first, end, size)
    starts = starts[: config.max_evaluate_steps] if config.max_evaluate_steps > 0 else starts
    greedy = SamplingParams(max_new_tokens=config.max_dec_len, greedy=True)
    columns = reported_reward_functions(config)
    # count, correct, length, truncated, reward sum, valid rewards, mean@k, pass@k, failed processes, per function,
    # then tool_use's two counts
    sums, failure = np.zeros(9 + len(columns) + 2), None
    for start in starts:
        chunk = prompts[start : min(start + size, end)]
        mean_at_k = pass_at_k = np.zeros(len(chunk))
        try:
            scored = score_rollout(chunk, generate(engine, chunk, 1, greedy), scorer, tokenizer, config)
            if k:
                samples = generate(engine, chunk, k, dataclasses.replace(sampling, first_row=start * k))
                sampled = score_rollout(chunk, samples, scorer, tokenizer, config)
                mean_at_k, pass_at_k = mean_and_pass_at_k(sampled.correct.reshape(len(chunk), k))
        except RewardServerError as error:
            failure = error
            sums[8] = 1
            break
        sums[:8] += [
            len(chunk), scored.correct.sum(), scored.rollout.lengths.sum(),
            sum(r == "length" for r in scored.rollout.finish_reasons),
            np.nansum(scored.rewards), np.isfinite(scored.rewards).sum(),
            mean_at_k.sum(), pass_at_k.sum(),
        ]
        sums[9 : 9 + len(columns)] += [np.nansum(scored.reward_columns[c]) for c in columns]
        if scored.rollout.episodes is not None:
            sums[-2:] += list(tool_use(scored.rollout.episodes, scored.correct).values())
    count, correct, length, truncated, reward_sum, valid, mean_at_k, pass_at_k, failed, *per_function, called, useful = world.sum(sums)
    if failed:
        return None, failure or RewardServerError("another process's reward scoring failed during evaluation: its log names the cause")
    count = max(count, 1)
    return {
        "eval_accuracy": correct / count,
        **({f"eval_mean@{k}": mean_at_k / count, f"eval_pass@{k}": pass_at_k / count} if k else {}),
        "eval_reward_mean": reward_sum / max(valid, 1),
        **{f"eval_reward/{c}": per_function[i] / count for i, c in enumerate(columns)},
        "eval_response_length_mean": length / count,
        "eval_truncated_fraction": truncated / count,
        **({"eval_tool_call_rate": called / count, "eval_useful_call_rate": useful / count} if config.resolved_environment else {}),
        "eval_samples": int(count),
    }, None
