"""Full fine-tuning against LoRA on Qwen2.5-0.5B's shape: peak resident memory and seconds of one training
step (update_policy: forward, chunked log-probs, backward, AdamW step), and the trainable parameters.

    .venv/bin/python bench/bench_lora.py [--shape qwen2.5-0.5b] [--sequences 4] [--length 256] [--modes full,lora] [--recompute false,true]

Measured as bench/bench_memory.py measures: each point in one fresh subprocess (ru_maxrss is the process's
peak), a random-weight model of the shape (bench/bench_rollout.py's SHAPES: hidden 896, 24 layers, 14
heads, 2 KV heads, intermediate 4864, vocabulary 151936, tied embeddings), and a scored batch of
`sequences` rows of `length` tokens (a 64-token prompt and length - 64 completion tokens, random ids, half
the rows with advantage +1 and half -1) put through the trainer's own update_policy once in one micro-batch,
kl_loss_coeff 0, paddle's own kernels, with and without recompute (the stored activations are most of a
LoRA step's memory without it). LoRA: rank 8, alpha 32, dropout 0 on q/k/v/o/gate/up/down_proj (the
config defaults). Prints one JSON object per point: `parameters`, `trainable_parameters`, `load_mb`
(peak after building the model, the adapters and the optimizer), `peak_mb` (peak after the step), `step_mb`
(what the step added to the peak), `static_mb` (weights 4 bytes per parameter + gradient and two AdamW
moments 12 bytes per trainable parameter), `step_seconds`; then, per recompute setting, the LoRA / full ratios.
"""

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import numpy as np  # noqa: E402
from bench_memory import peak_mb, scored_batch, timed_update  # noqa: E402


def measure(mode: str, recompute: bool, shape: str, sequences: int, length: int) -> dict:
    from bench_rollout import build_model

    from alignment.models.lora import apply_lora
    from alignment.models.modeling import enable_recompute
    from alignment.parallel.optim import build_optimizer
    from alignment.run.build import optimizer_settings
    from alignment.config.schema import GRPOConfig
    from alignment.config.validation import validate

    config = validate(dataclasses.replace(
        GRPOConfig(), per_device_train_batch_size=sequences, mini_batch_size=sequences, learning_rate=1e-6, recompute=recompute,
        kl_loss_coeff=0.0, importance_sampling_correction=False,  # the random batch has no rollout log-probs
    ))
    model = build_model(shape, seed=0)
    if mode == "lora":  # the config's defaults: rank 8, alpha 32, dropout 0, the seven projections
        apply_lora(model, config.lora_rank, config.lora_alpha, config.lora_dropout, config.target_modules)
    if recompute:
        enable_recompute(model, "full")
    optimizer, _ = build_optimizer(model, optimizer_settings(config), total_steps=10)
    loaded, seconds, update = timed_update(model, None, optimizer, scored_batch(model.config.vocab_size, sequences, length), config)
    parameters = sum(int(np.prod(p.shape)) for p in model.parameters())
    trainable = sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)
    return {
        "mode": mode, "recompute": recompute, "shape": shape, "sequences": sequences, "length": length,
        "parameters": parameters, "trainable_parameters": trainable,
        "load_mb": round(loaded), "peak_mb": round(peak_mb()), "step_mb": round(peak_mb() - loaded),
        "static_mb": round((4 * parameters + 12 * trainable) / 2**20), "step_seconds": round(seconds, 1),
        "loss": round(update["loss"], 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--modes", default="full,lora")
    parser.add_argument("--recompute", default="false,true")
    parser.add_argument("--point", nargs=2, metavar=("MODE", "RECOMPUTE"), help="measure one point in this process")
    args = parser.parse_args()
    if args.point:
        mode, recompute = args.point
        print(json.dumps(measure(mode, recompute == "true", args.shape, args.sequences, args.length)), flush=True)
        return
    for recompute in args.recompute.split(","):
        results = {}
        for mode in args.modes.split(","):
            command = [sys.executable, __file__, "--point", mode, recompute, "--shape", args.shape,
                       "--sequences", str(args.sequences), "--length", str(args.length)]
            done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)  # stderr passes through
            line = done.stdout.strip().splitlines()[-1]
            print(line, flush=True)
            results[mode] = json.loads(line)
        if {"full", "lora"} <= results.keys():
            full, lora = results["full"], results["lora"]
            ratios = {key: round(lora[key] / full[key], 3) for key in ("trainable_parameters", "peak_mb", "step_mb", "step_seconds")}
            print(json.dumps({"recompute": recompute == "true", "lora_over_full": ratios}), flush=True)


if __name__ == "__main__":
    main()
