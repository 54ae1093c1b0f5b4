"""The bundled run with each algorithm variant, at several seeds: held-out greedy accuracy after every evaluation,
seconds per step, and one picture of the accuracy curves (a panel per variant: mean over seeds, the band spanning them).

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
    # issue 34's: the surrogates that differ from the clip only off-policy get GSPO's two optimizer steps per batch
    "sapo": ["--loss_type", "sapo", "--mini_batch_size", "32"],  # TRL's spelling: surrogate sapo, per-sequence mean
    "gmpo": ["--surrogate", "gmpo", "--clip_range_ratio_low", "0.4", "--clip_range_ratio_high", "0.4", "--loss_type", "grpo",
             "--mini_batch_size", "32"],
    "bnpo": ["--loss_type", "bnpo"],  # the bundled config's two micro-batches of 32 a step, each its own token mean
    # delta 0.001: this run's drift after one optimizer step (0.5 masks nothing here; 0.001 masks 0-25% of the tokens)
    "off-policy-mask": ["--off_policy_mask_threshold", "0.001", "--mini_batch_size", "32"],
    "low-var-kl-loss": ["--kl_loss_coeff", "0.01", "--kl_estimator", "low_var_kl"],
    "kl-in-reward": ["--use_kl_in_reward", "true", "--kl_in_reward_coeff", "0.01"],
    "rejection-geometric": ["--rejection_sampling", "geometric", "--rejection_sampling_threshold", "0.999_1.001"],
    "grpo-passk": ["--advantage_estimator", "grpo_passk"],
    "opo": ["--advantage_estimator", "opo"],
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
            result["step_means"] = step_means(REPO / f"output/bench-variant-{variant}-{seed}/metrics.jsonl")
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
            "step_means": {key: float(f"{statistics.mean(r['step_means'][key] for r in results):.3g}") for key in results[0]["step_means"]},
        }), flush=True)
    plot(runs, REPO / args.plot)


# what the variants act on, averaged over a run's training steps where it logs them
SHOWN_METRICS = ("clip_fraction", "off_policy_masked_fraction", "kl", "kl_in_reward/kl", "rs/masked_fraction", "is/chi2_token")


def step_means(metrics_file: Path) -> dict:
    steps = [record for record in map(json.loads, metrics_file.read_text().splitlines()) if "reward_mean" in record]
    return {
        key: statistics.mean(record[key] for record in steps)
        for key in SHOWN_METRICS if all(record.get(key) is not None for record in steps)
    }


def plot(runs: dict, path: Path) -> None:
    """One small panel per variant (its seeds' mean and band), each with the default's mean dashed for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4
    rows = -(-len(runs) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(3.0 * columns, 2.4 * rows), sharex=True, sharey=True, squeeze=False)
    reference = curve_mean(runs["default"]) if "default" in runs else None
    for axes, (variant, results) in zip(grid.flat, runs.items()):
        steps, mean, low, high = curve_mean(results)
        if reference is not None and variant != "default":
            axes.plot(reference[0], reference[1], color="grey", linestyle="--", linewidth=1, label="default")
        axes.plot(steps, mean, marker="o", markersize=3, color="C0")
        axes.fill_between(steps, low, high, color="C0", alpha=0.2)
        axes.set_title(f"{variant} ({len(results)} seeds)", fontsize=9)
        axes.grid(alpha=0.3)
    for axes in grid.flat[len(runs):]:
        axes.axis("off")
    for axes in grid[:, 0]:
        axes.set_ylabel("held-out greedy acc. (%)", fontsize=8)
    for axes in grid[-1, :]:
        axes.set_xlabel("step", fontsize=8)
    figure.suptitle("Bundled tiny run, 40 steps: each variant (mean over seeds, band: min to max; dashed: the default)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def curve_mean(results: list) -> tuple:
    """-> (steps, mean, min, max) of the seeds' held-out accuracy in percent."""
    steps = [int(s) for s in results[0]["eval_accuracy"]]
    curves = [[100 * r["eval_accuracy"][str(s)] for s in steps] for r in results]
    return steps, [statistics.mean(v) for v in zip(*curves)], [min(v) for v in zip(*curves)], [max(v) for v in zip(*curves)]


if __name__ == "__main__":
    main()
