"""The bundled run with each algorithm variant, at several seeds: held-out greedy accuracy after every evaluation,
seconds per step, and one picture of the accuracy curves (mean over seeds, the band spanning them).

    .venv/bin/python bench/bench_variants.py [--seeds 1 2 3] [--variants default gspo rloo] [--plot bench/variants_curves.png]

Each (variant, seed) is one bench/bench_tiny_run.py run (the bundled config/tiny run, 40 steps) into
output/bench-variant-VARIANT-SEED with the variant's keys below and --seed SEED. Prints one JSON object per run
as it ends, then one summary object per variant.
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "default": [],  # GRPO: group-normalised advantages, PPO clip 0.2, one optimizer step per rollout batch
    # GSPO as its paper runs it: sequence ratios clipped at 3e-4 / 4e-4, the per-sequence mean, and mini-batches
    # (with one optimizer step per batch the ratio is 1 and GSPO's gradient is GRPO's)
    "gspo": ["--importance_sampling_level", "sequence", "--clip_range_ratio_low", "3e-4", "--clip_range_ratio_high", "4e-4",
             "--loss_type", "grpo", "--mini_batch_size", "32"],
    "grpo-minibatches": ["--mini_batch_size", "32"],  # the default with GSPO's two optimizer steps per batch
    "rloo": ["--advantage_estimator", "rloo"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--plot", default="bench/variants_curves.png")
    args = parser.parse_args()
    runs = {}
    for variant in args.variants:
        for seed in args.seeds:
            command = [
                sys.executable, "bench/bench_tiny_run.py", "--output_dir", f"output/bench-variant-{variant}-{seed}",
                "--", "--seed", str(seed), *VARIANTS[variant],
            ]
            result = json.loads(
                subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            )
            runs.setdefault(variant, []).append(result)
            print(json.dumps({"variant": variant, "seed": seed, **result}), flush=True)
    for variant, results in runs.items():
        steps = list(results[0]["eval_accuracy"])
        print(json.dumps({
            "variant": variant,
            "keys": " ".join(VARIANTS[variant]) or "(bundled config)",
            "seeds": args.seeds,
            "eval_accuracy_mean": {step: round(statistics.mean(r["eval_accuracy"][step] for r in results), 4) for step in steps},
            "final_accuracy": [r["eval_accuracy"][steps[-1]] for r in results],
            "median_seconds_per_step": round(statistics.median(r["median_seconds"]["step"] for r in results), 3),
        }), flush=True)
    plot(runs, REPO / args.plot)


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for variant, results in runs.items():
        steps = [int(s) for s in results[0]["eval_accuracy"]]
        curves = [[100 * r["eval_accuracy"][str(s)] for s in steps] for r in results]
        mean = [statistics.mean(values) for values in zip(*curves)]
        line, = axes.plot(steps, mean, marker="o", label=f"{variant} ({len(results)} seeds)")
        axes.fill_between(steps, [min(v) for v in zip(*curves)], [max(v) for v in zip(*curves)], color=line.get_color(), alpha=0.15)
    axes.set_xlabel("step")
    axes.set_ylabel("held-out greedy accuracy (%)")
    axes.set_title("Bundled tiny run: GRPO variants (mean over seeds, band: min to max)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
