"""What each importance_sampling_mode does to a real batch: one training-sized rollout from the fused engine, the
actor's log-probs of it computed as the update computes them (pi_old), and the weights every mode gives at its
usual cap: TRL's default sequence_mask at 3, ours token_truncate at 2, and the other two. Prints one JSON object
per compute setting (float32 matmuls, and bf16 ones where the CPU has them: cpu_bf16_matmul on; the engine's cache
as kv_cache_dtype gives it, auto: bfloat16 with bf16 matmuls), with the log-prob gap and, per mode, the mean and
spread of the weights, the tokens whose weight is not 1, and the sequences that lose all their weight (masked).
Beside the engine's gap, two floors for it: the actor against itself computed one sequence at a time, and (bf16) with
every projection's output moved by 1e-7 of itself.

    .venv/bin/python bench/bench_rollout_correction.py CONFIG.json [--key value ...]

CONFIG.json and the keys are run_grpo.py's; per_device_prompt_batch_size prompts x rollout_n completions are
sampled at the config's temperature, seed 0. use_fusemt and use_fused_train_ops are forced on.
"""

import contextlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

from alignment.algo.corrections import rollout_correction  # noqa: E402
from alignment.models.cpu_bf16 import cpu_bf16_flags  # noqa: E402
from alignment.models.fused_train import use_training_ops  # noqa: E402
from alignment.models.modeling import load_causal_lm, load_tokenizer, make_token_batch, stop_token_ids  # noqa: E402
from alignment.rollout import (  # noqa: E402
    SamplingParams,
    build_engine,
    generate,  # noqa: E402
)
from alignment.run.build import engine_settings, load_prompts, update_settings  # noqa: E402
from alignment.config.cli import load_config  # noqa: E402
from alignment.step.update import policy_logprobs  # noqa: E402

MODES = [("token_truncate", 2.0), ("token_mask", 2.0), ("sequence_truncate", 3.0), ("sequence_mask", 3.0)]


def actor_logprobs(model, rollout, tokenizer, config, rows_per_batch: int) -> np.ndarray:
    """log pi_old (B, T) of the rollout's completions as the update computes them, rows_per_batch sequences at a time."""
    old = []
    with paddle.no_grad():
        for start in range(0, len(rollout.completion_ids), rows_per_batch):
            rows = list(range(start, min(start + rows_per_batch, len(rollout.completion_ids))))
            batch = make_token_batch(
                [rollout.prompt_ids[r] for r in rows], rollout.completion_ids[rows], rollout.completion_mask[rows], tokenizer.pad_token_id
            )
            old.append(policy_logprobs(model, batch, update_settings(config))[0].numpy())
    return np.concatenate(old)


@contextlib.contextmanager
def projections_moved(model, relative: float):
    """While inside: each bf16 projection's output (model.bf16_matmuls.linear) times 1 + relative * N(0, 1), seed 0."""
    matmuls, draws = model.bf16_matmuls, np.random.default_rng(0)
    exact = matmuls.linear

    def moved(x, weights):
        out = exact(x, weights)
        return out * (1 + paddle.to_tensor(draws.standard_normal(out.shape).astype(np.float32) * relative))

    matmuls.linear = moved  # an attribute of this instance, over the class's method
    try:
        yield
    finally:
        del matmuls.linear


def measure(config, tokenizer, prompts, bf16: bool) -> dict:
    model = load_causal_lm(config.actor_model_name_or_path)
    use_training_ops(model, bf16)
    model.eval()
    engine = build_engine(engine_settings(config), model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, bf16)
    sampling = SamplingParams(max_new_tokens=config.max_dec_len, temperature=config.temperature, top_p=config.top_p, seed=0)
    rollout = generate(engine, prompts, config.rollout_n, sampling)
    mask = rollout.loss_mask.astype(np.float32)  # (B, T)
    old = actor_logprobs(model, rollout, tokenizer, config, config.per_device_train_batch_size)
    gap = (old - rollout.logprobs) * mask  # log pi_old - log pi_rollout on the loss tokens
    tokens = mask > 0
    # Floors for the engine's gap: the actor against itself, one sequence at a time (no padding, other shapes, so some
    # sums in another order), and with bf16 products, with every projection's output moved by 1e-7 of itself (about
    # one fp32 rounding, as a sum in another order moves it).
    self_gap = (old - actor_logprobs(model, rollout, tokenizer, config, 1)) * mask
    if bf16:
        with projections_moved(model, 1e-7):
            moved_gap = (old - actor_logprobs(model, rollout, tokenizer, config, config.per_device_train_batch_size)) * mask
    result = {
        "matmuls": "bf16" if bf16 else "float32",
        "kv_cache": engine.cache_dtype,  # kv_cache_dtype as build_engine resolved it
        "sequences": len(mask),
        "tokens": int(tokens.sum()),
        "token_gap_abs_mean": float(np.abs(gap[tokens]).mean()),
        "token_gap_abs_max": float(np.abs(gap[tokens]).max()),
        "sequence_gap_abs_mean": float(np.abs(gap.sum(axis=1)).mean()),
        "sequence_gap_abs_max": float(np.abs(gap.sum(axis=1)).max()),
        "actor_self_gap_abs_mean": float(np.abs(self_gap[tokens]).mean()),
        "actor_self_gap_abs_max": float(np.abs(self_gap[tokens]).max()),
        "actor_self_sequence_gap_abs_mean": float(np.abs(self_gap.sum(axis=1)).mean()),
        "actor_moved_gap_abs_mean": float(np.abs(moved_gap[tokens]).mean()) if bf16 else None,
        "actor_moved_gap_abs_max": float(np.abs(moved_gap[tokens]).max()) if bf16 else None,
        "actor_moved_sequence_gap_abs_mean": float(np.abs(moved_gap.sum(axis=1)).mean()) if bf16 else None,
        "modes": {},
    }
    for mode, cap in MODES:
        weights, outside = rollout_correction(paddle.to_tensor(old), paddle.to_tensor(rollout.logprobs), paddle.to_tensor(mask), mode, cap)
        weights, outside = weights.numpy(), outside.numpy()
        result["modes"][f"{mode}@{cap:g}"] = {
            "weight_mean": float(weights[tokens].mean()),
            "weight_std": float(weights[tokens].std()),
            "tokens_off_one_by_1e-3": float((np.abs(weights[tokens] - 1) > 1e-3).mean()),
            "tokens_outside_cap": float(outside[tokens].mean()),
            "sequences_zeroed": float(((weights * mask).sum(axis=1) == 0).mean()),
        }
    return result


def main() -> None:
    config = load_config([*sys.argv[1:], "--use_fusemt", "true", "--use_fused_train_ops", "true"])
    tokenizer = load_tokenizer(config.tokenizer_name_or_path or config.actor_model_name_or_path, config.chat_template)
    prompts = load_prompts(config.train_datasets, tokenizer, config)[0][: config.per_device_prompt_batch_size]
    settings = [False] + ([True] if cpu_bf16_flags() else [])
    for bf16 in settings:
        print(json.dumps({"command": " ".join(sys.argv), **measure(config, tokenizer, prompts, bf16)}), flush=True)


if __name__ == "__main__":
    main()
