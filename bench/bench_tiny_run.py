"""The bundled run, measured: wall time, seconds per phase, and held-out accuracy before and after.

    .venv/bin/python bench/bench_tiny_run.py [--output_dir output/bench-tiny] [--config FILE] [--processes N] [-- extra run_grpo overrides]

Runs `python -m paddle.distributed.launch --nproc_per_node 1 run_grpo.py config/tiny/grpo_argument.json`
(or the --config and process count given) and prints one JSON object summarising its metrics.jsonl.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="output/bench-tiny")
    parser.add_argument("--config", default="config/tiny/grpo_argument.json")
    parser.add_argument("--processes", type=int, default=1, help="--nproc_per_node: 2 with --rollout_workers 1")
    args, overrides = parser.parse_known_args()
    out = REPO / args.output_dir
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(args.processes), "--log_dir", str(out / "launch_log"),
        "run_grpo.py", args.config, "--output_dir", str(out), *[o for o in overrides if o != "--"],
    ]
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward_mean" in line]
    evals = [line for line in lines if "eval_accuracy" in line]
    median = lambda key: round(statistics.median(s[key] for s in steps), 3)  # noqa: E731
    print(json.dumps({
        "command": " ".join(command[1:]),
        "steps": len(steps),
        "wall_seconds": round(wall, 1),
        "eval_accuracy": {str(e["step"]): e["eval_accuracy"] for e in evals},
        **{
            key: {str(e["step"]): e[key] for e in evals}
            for key in (evals[0] if evals else {}) if key.startswith(("eval_mean@", "eval_pass@"))
        },
        "median_seconds": {
            phase: median(f"time/{phase}")
            for phase in ("step", "rollout", "reward", "train", "sync", "weights") if f"time/{phase}" in steps[0]
        },
        **(
            {"median_generate_seconds": median("rollout/generate_seconds"), "staleness": [s["rollout/staleness"] for s in steps]}
            if "rollout/staleness" in steps[0] else {}
        ),
        "median_tokens_per_second": median("tokens_per_second"),
        "train_reward_first_5": round(statistics.mean(s["reward_mean"] for s in steps[:5]), 3),
        "train_reward_last_5": round(statistics.mean(s["reward_mean"] for s in steps[-5:]), 3),
    }))


if __name__ == "__main__":
    main()
