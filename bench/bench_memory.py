"""Peak resident memory and seconds of the training phase (update_policy: forward, chunked log-probs,
backward, AdamW step) for 8 sequences, with and without recompute, against the memory of weights +
gradients + AdamW state (16 bytes per parameter in fp32); with --kl true also with a KL penalty, which
loads a frozen reference model (kl_loss_coeff 0 loads none: the difference is the memory that saves).

    .venv/bin/python bench/bench_memory.py [--shapes tiny,qwen2.5-0.5b] [--lengths 128,256,512] [--recompute false,true] [--kl false,true]

Each point is one fresh subprocess (ru_maxrss is the process's peak): a random-weight model of the shape
(bench/bench_rollout.py's SHAPES), and a scored batch of 8 sequences of `length` tokens (a 64-token
prompt and length - 64 completion tokens, random ids, half the rows with advantage +1 and half -1, no
padding) put through the trainer's own update_policy once, in one micro-batch of 8
(per_device_train_batch_size 8), kl_loss_coeff 0 (or 0.01 with a reference model of the same shape),
importance_sampling_correction off (the random batch has no rollout log-probs). Rollout is left out: its memory is the weights plus a
KV cache of a few MB at these sizes. Prints one JSON object per point: `load_mb` (peak after building
the model and the optimizer), `peak_mb` (peak after the update), `update_mb` (what the update added to the
peak), `static_mb` (16 bytes per parameter),
`peak_over_static`, and `update_seconds`.
"""

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alignment.basics.runtime import configure_cpu_runtime, contiguous_kernels, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import numpy as np  # noqa: E402

SEQUENCES, PROMPT = 8, 64


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def scored_batch(vocab: int, sequences: int, length: int):
    """A scored batch of `sequences` rows: a PROMPT-token prompt and length - PROMPT completion tokens of
    random ids, half the rows with advantage +1 and half -1, no padding."""
    from alignment.rollout import Rollout
    from alignment.step.records import ScoredBatch

    completion = length - PROMPT
    rng = np.random.default_rng(0)
    rollout = Rollout(
        prompt_ids=rng.integers(3, vocab, (sequences, PROMPT)).tolist(),
        completion_ids=rng.integers(3, vocab, (sequences, completion)),
        completion_mask=np.ones((sequences, completion), np.float32),
        logprobs=np.zeros((sequences, completion), np.float32),
        finish_reasons=["length"] * sequences,
        group_size=sequences,
    )
    rewards = np.array([1.0, 0.0] * (sequences // 2))
    return ScoredBatch(
        prompts=[], rollout=rollout, completions=[""] * sequences, rewards=rewards, reward_columns={}, errors=[None] * sequences,
        correct=rewards > 0, advantages=np.where(rewards > 0, 1.0, -1.0).astype(np.float32),
    )


def timed_update(model, reference, optimizer, scored, config) -> tuple:
    """The trainer's update_policy once, in one process -> (peak MB before it, its seconds, its metrics)."""
    from alignment.parallel.distributed import World
    from alignment.run.build import update_settings
    from alignment.step.update import Learner, update_policy

    loaded = peak_mb()
    started = time.perf_counter()
    with contiguous_kernels():
        update = update_policy(Learner(model, reference, optimizer), scored, update_settings(config), World(0, 1), pad_token_id=0, step=1)
    return loaded, time.perf_counter() - started, update.metrics


def measure(shape: str, length: int, recompute: bool, kl: bool) -> dict:
    from bench_rollout import build_model

    from alignment.models.modeling import enable_recompute
    from alignment.parallel.optim import build_optimizer
    from alignment.run.build import optimizer_settings
    from alignment.config.schema import GRPOConfig
    from alignment.config.validation import validate

    model = build_model(shape, seed=0)
    if recompute:
        enable_recompute(model, "full")
    config = validate(dataclasses.replace(
        GRPOConfig(), per_device_train_batch_size=SEQUENCES, mini_batch_size=SEQUENCES, learning_rate=1e-6, recompute=recompute,
        kl_loss_coeff=0.01 if kl else 0.0, importance_sampling_correction=False,
    ))
    reference = None
    if kl:  # as the trainer builds it: a second copy of the weights, frozen
        reference = build_model(shape, seed=1)
        reference.eval()
        for parameter in reference.parameters():
            parameter.stop_gradient = True
    optimizer, _ = build_optimizer(model, optimizer_settings(config), total_steps=10)
    loaded, seconds, update = timed_update(model, reference, optimizer, scored_batch(model.config.vocab_size, SEQUENCES, length), config)
    parameters = sum(int(np.prod(p.shape)) for p in model.parameters())
    static = parameters * 16 / 2**20
    return {
        "shape": shape, "sequences": SEQUENCES, "length": length, "recompute": recompute, "kl": kl, "parameters": parameters,
        "load_mb": round(loaded), "peak_mb": round(peak_mb()), "update_mb": round(peak_mb() - loaded), "static_mb": round(static),
        "peak_over_static": round(peak_mb() / static, 2), "update_seconds": round(seconds, 1),
        "loss": round(update["loss"], 6), "grad_norm": round(update["grad_norm"], 6),  # equal with and without recompute
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="tiny,qwen2.5-0.5b")
    parser.add_argument("--lengths", default="128,256,512")
    parser.add_argument("--recompute", default="false,true")
    parser.add_argument("--kl", default="false", help="false,true: also measure with a reference model")
    parser.add_argument("--point", nargs=4, metavar=("SHAPE", "LENGTH", "RECOMPUTE", "KL"), help="measure one point in this process")
    args = parser.parse_args()
    if args.point:
        shape, length, recompute, kl = args.point
        print(json.dumps(measure(shape, int(length), recompute == "true", kl == "true")), flush=True)
        return
    for shape in args.shapes.split(","):
        for length in args.lengths.split(","):
            for recompute in args.recompute.split(","):
                for kl in args.kl.split(","):
                    subprocess.run([sys.executable, __file__, "--point", shape, length, recompute, kl], check=True)


if __name__ == "__main__":
    main()
