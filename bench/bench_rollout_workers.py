"""Colocated against rollout processes: the same run generated in the training process (colocated), in one
rollout process beside it that the trainer waits for (sync), and one step off (async: the next step's completions
generated while this one trains). Seconds per step and held-out accuracy, at several seeds.

    .venv/bin/python bench/bench_rollout_workers.py [--seeds 1 2 3] [--modes colocated sync async]
        [--config config/tiny/grpo_argument.json] [-- extra run_grpo overrides]

Each (mode, seed) is one bench/bench_tiny_run.py run into output/bench-rollout-MODE-SEED. Under the launcher every
process gets cores / processes threads (alignment/basics/runtime.py): colocated, the one process has them all; with a
rollout process, each of the two has half (async-all-threads gives each all of them, GRPO_CPU_THREADS).
Prints one JSON object per run as it ends, then one per mode.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = {  # processes, keys, threads per process (None: the runtime's default, cores / processes)
    "colocated": (1, [], None),
    "sync": (2, ["--rollout_workers", "1"], None),
    "async": (2, ["--rollout_workers", "1", "--async_generate", "true"], None),
    # every core for each process: the update and decoding overlap, each slowed by the other where they meet
    "async-all-threads": (2, ["--rollout_workers", "1", "--async_generate", "true"], os.cpu_count()),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--config", default="config/tiny/grpo_argument.json")
    args, overrides = parser.parse_known_args()
    overrides = [o for o in overrides if o != "--"]
    runs = {}
    for seed in args.seeds:
        for mode in args.modes:
            processes, keys, threads = MODES[mode]
            env = {**os.environ, **({"GRPO_CPU_THREADS": str(threads)} if threads else {})}
            command = [
                sys.executable, "bench/bench_tiny_run.py", "--output_dir", f"output/bench-rollout-{mode}-{seed}", "--config", args.config,
                "--processes", str(processes), "--", "--seed", str(seed), *keys, *overrides,
            ]
            result = json.loads(
                subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            )
            runs.setdefault(mode, []).append(result)
            print(json.dumps({"mode": mode, "seed": seed, **result}), flush=True)
    colocated = statistics.median(r["median_seconds"]["step"] for r in runs["colocated"]) if "colocated" in runs else None
    for mode, results in runs.items():
        seconds = statistics.median(r["median_seconds"]["step"] for r in results)
        final = [list(r["eval_accuracy"].values())[-1] for r in results if r["eval_accuracy"]]
        print(json.dumps({
            "mode": mode,
            "keys": " ".join(MODES[mode][1]) or "(colocated)",
            "threads_per_process": MODES[mode][2] or "cores / processes",
            "seeds": args.seeds,
            "median_seconds_per_step": round(seconds, 3),
            **({"speed_vs_colocated": round(colocated / seconds, 2)} if colocated else {}),
            "wall_seconds": [r["wall_seconds"] for r in results],
            "final_accuracy": final,
            **({"final_accuracy_mean": round(statistics.mean(final), 4)} if final else {}),
        }), flush=True)


if __name__ == "__main__":
    main()
