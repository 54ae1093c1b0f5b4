"""Memory per process with and without sharding stage1, two processes under paddle.distributed.launch:
the trainer's own update_policy (and save's optimizer-state gather) on a random-weight model of the shape.

    .venv/bin/python bench/bench_sharding.py [--shape qwen2.5-0.5b] [--length 256] [--sequences 4] [--updates 2]

For each layout (plain data parallel, then sharding: stage1), one launch of 2 processes; each builds the
model (the same seed: the same weights), takes `sequences` rows of `length` tokens (bench_memory's random
scored batch), runs `updates` updates (the first creates the AdamW moments) with recompute on, then
gathers the optimizer state as a checkpoint save does. Prints one JSON object per layout: the peak
resident MB of each process after the updates and after the gather, the MB of AdamW state each process
holds, the seconds of the last update, and its loss and gradient norm (equal in both layouts: the same
update).
"""

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def worker(shape: str, length: int, sequences: int, updates: int, sharding: str) -> None:
    from alignment.basics.runtime import configure_cpu_runtime, contiguous_kernels, import_paddle

    configure_cpu_runtime()
    paddle = import_paddle()
    import numpy as np
    from bench_memory import peak_mb, scored_batch
    from bench_rollout import build_model

    from alignment.models.modeling import enable_recompute
    from alignment.parallel.distributed import init_world
    from alignment.parallel.optim import build_optimizer
    from alignment.run.build import optimizer_settings, update_settings
    from alignment.config.schema import GRPOConfig
    from alignment.config.validation import validate
    from alignment.step.update import Learner, update_policy

    world = init_world(sharding, -1)
    model = build_model(shape, seed=0)
    enable_recompute(model, "full")
    config = validate(dataclasses.replace(
        GRPOConfig(), per_device_train_batch_size=sequences, mini_batch_size=sequences, learning_rate=1e-6, recompute=True,
        kl_loss_coeff=0.0, importance_sampling_correction=False, sharding=sharding,
    ))
    optimizer, _ = build_optimizer(model, optimizer_settings(config), total_steps=10, world=world)
    scored = scored_batch(model.config.vocab_size, sequences, length)
    for _ in range(updates):
        started = time.perf_counter()
        with contiguous_kernels():
            update = update_policy(Learner(model, None, optimizer), scored, update_settings(config), world, pad_token_id=0, step=1).metrics
        seconds = time.perf_counter() - started
    after_updates = peak_mb()
    local = optimizer.sharded.state_dict() if sharding else optimizer.state_dict()
    held = sum(value.numel().item() * value.element_size() for value in local.values() if isinstance(value, paddle.Tensor)) / 2**20
    started = time.perf_counter()
    gathered = optimizer.state_dict()  # what a checkpoint save does: every process takes part
    gather_seconds = time.perf_counter() - started
    del gathered
    per_rank = np.zeros((4, world.size))
    per_rank[:, world.rank] = [after_updates, peak_mb(), held, seconds]
    per_rank = world.sum(per_rank)
    if world.is_main:
        print(json.dumps({
            "layout": sharding or "data parallel", "processes": world.size, "shape": shape, "sequences_per_process": sequences,
            "length": length, "peak_mb_after_updates": [round(v) for v in per_rank[0]],
            "peak_mb_after_gather": [round(v) for v in per_rank[1]], "optimizer_state_mb": [round(v) for v in per_rank[2]],
            "update_seconds": [round(v, 2) for v in per_rank[3]], "gather_seconds": round(gather_seconds, 2),
            "loss": update["loss"], "grad_norm": update["grad_norm"],
        }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--worker", metavar="SHARDING", help="run as one launched process (empty: no sharding)")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.shape, args.length, args.sequences, args.updates, args.worker)
        return
    for sharding in ("", "stage1"):
        log_dir = Path("output/bench-sharding") / (sharding or "dp")
        command = [
            sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir), __file__,
            "--shape", args.shape, "--length", str(args.length), "--sequences", str(args.sequences),
            "--updates", str(args.updates), "--worker", sharding,
        ]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        print(next(line for line in output.splitlines() if line.startswith("{")), flush=True)


if __name__ == "__main__":
    main()
