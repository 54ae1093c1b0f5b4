"""Seconds per GRPO step and per phase for one fixed workload: the eager engine with paddle's own kernels
against the fused one (use_fusemt and use_fused_train_ops), and with --trl-python TRL's GRPOTrainer on the same workload (bench/trl_step.py).

    .venv/bin/python bench/bench_step.py [--max_steps 6] [--engines eager,fused]
        [--trl-python /work/torch-venv/bin/python] [-- extra run_grpo overrides]

Workload: the bundled tiny model (data/tiny-qwen2) on data/arith with config/tiny/grpo_argument.json,
overridden to 4 prompts x rollout_n 8 per step (one micro-batch of 32), max_dec_len = min_dec_len = 64
(eos blocked, so every completion is 64 tokens and the work per step is fixed), kl_loss_coeff 0 (no
reference model), no evaluation. Each engine is one `python -m paddle.distributed.launch --nproc_per_node 1
run_grpo.py ...` into output/bench-step-<engine>; its metrics.jsonl gives each step's `time/*`. Prints one
JSON object per engine with the median over the steps after the first (the warm-up) of: the whole step,
rollout, reward, logprobs (null in this workload: with kl_loss_coeff 0 and one update per rollout neither
this trainer nor TRL runs a separate log-prob pass; the old log-probs come with the rollout), update (time/train: forward,
backward and optimizer step), sync (the fused engine's weight refresh and check), and a last object with
the ratios between engines. A fused run that could not use the fused engine (the trainer then rolls out
with the eager engine) is reported on stderr and left out.
"""

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = {
    "per_device_prompt_batch_size": "4",
    "rollout_n": "8",
    "per_device_train_batch_size": "32",
    "max_dec_len": "64",
    "min_dec_len": "64",
    "kl_loss_coeff": "0",
    "eval_datasets": "",
    "save_steps": "0",
    "logging_steps": "1",
}
PHASES = {"rollout": "time/rollout", "reward": "time/reward", "logprobs": "time/logprobs", "update": "time/train", "sync": "time/sync"}


def median_after_first(steps: list, key: str):
    values = [s[key] for s in steps[1:] if s.get(key) is not None]
    return round(statistics.median(values), 4) if values else None


def run_paddle(engine: str, max_steps: int, overrides: list):
    """-> the JSON object for one engine, or None (reason on stderr)."""
    out = REPO / f"output/bench-step-{engine}"
    shutil.rmtree(out, ignore_errors=True)
    settings = {**WORKLOAD, "max_steps": str(max_steps), "output_dir": str(out), "use_fusemt": "true" if engine == "fused" else "false",
                "use_fused_train_ops": "true" if engine == "fused" else "false"}
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir", str(out / "launch_log"),
        "run_grpo.py", "config/tiny/grpo_argument.json", *[a for key, value in settings.items() for a in (f"--{key}", value)], *overrides,
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    log_file = out / "launch_log" / "workerlog.0"
    log = log_file.read_text(errors="replace") if log_file.is_file() else ""
    if done.returncode:
        tail = "\n".join(log.splitlines()[-15:])
        print(f"bench_step: the {engine} run failed (exit {done.returncode}); {log_file}:\n{tail}", file=sys.stderr)
        return None
    used = re.search(r"rollout with the (\w+)", log)
    engine_class = used.group(1) if used else None
    if engine == "fused" and engine_class != "FusedEngine":
        why = re.search(r"use_fusemt: (.*)", log)
        print(f"bench_step: the fused run rolled out with the {engine_class or 'unknown engine'}"
              f"{' (' + why.group(1) + ')' if why else ''}; leaving it out", file=sys.stderr)
        return None
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "time/step" in line]
    config = json.loads((out / "grpo_config.json").read_text())
    sequences = config["per_device_prompt_batch_size"] * config["rollout_n"]
    extra = sorted({k for s in steps for k in s if k.startswith("time/")} - set(PHASES.values()) - {"time/step"})
    return {
        "engine": engine,
        "seconds_per_step": median_after_first(steps, "time/step"),
        **{phase: median_after_first(steps, key) for phase, key in PHASES.items()},
        **{key[len("time/"):]: median_after_first(steps, key) for key in extra},
        "steps_measured": max(len(steps) - 1, 0),
        "completion_tokens_per_step": round(statistics.median(s["response_length_mean"] for s in steps) * sequences),
        "engine_class": engine_class,
        "wall_seconds": round(wall, 1),
        "command": " ".join(command[1:]),
    }


def run_trl(python: str, max_steps: int):
    command = [python, str(REPO / "bench/trl_step.py"), "--max_steps", str(max_steps), "--output_dir", str(REPO / "output/bench-step-trl")]
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"engine"')]  # not the Trainer's log dicts
    if done.returncode or not records:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        print(f"bench_step: bench/trl_step.py failed (exit {done.returncode}):\n{tail}", file=sys.stderr)
        return None
    return records[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=6)
    parser.add_argument("--engines", default="eager,fused")
    parser.add_argument("--trl-python", default=None, help="a Python with torch, transformers and trl: also run bench/trl_step.py")
    args, overrides = parser.parse_known_args()
    overrides = [o for o in overrides if o != "--"]
    results = {}
    for engine in [e for e in args.engines.split(",") if e]:
        if engine not in ("eager", "fused"):
            parser.error(f"unknown engine '{engine}' (eager, fused; trl comes with --trl-python)")
        if (record := run_paddle(engine, args.max_steps, overrides)) is not None:
            results[engine] = record
            print(json.dumps(record), flush=True)
    if args.trl_python and (record := run_trl(args.trl_python, args.max_steps)) is not None:
        results["trl"] = record
        print(json.dumps(record), flush=True)
    ratios = {}
    for a, b in (("eager", "fused"), ("trl", "fused"), ("trl", "eager")):
        if a in results and b in results:
            for phase in ("seconds_per_step", "rollout", "update"):
                if results[a].get(phase) and results[b].get(phase):
                    ratios[f"{phase}_{a}_over_{b}"] = round(results[a][phase] / results[b][phase], 2)
    print(json.dumps({"ratios": ratios}))


if __name__ == "__main__":
    main()
