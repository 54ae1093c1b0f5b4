"""Pictures of a run: OUTPUT_DIR/metrics.jsonl -> OUTPUT_DIR/curves.png (step/trainer.py at the end of every run,
`python -m alignment.curves OUTPUT_DIR` on demand), four panels (reward, accuracy, response length, KL) against the
step, training and evaluation series together where both exist, and a fifth, each reward function's mean, where the run
has several."""

import re
from pathlib import Path

from matplotlib.figure import Figure

from alignment.basics.data_files import read_jsonl

# panel -> [(label, kind, key)]: the series read from the records of that kind ("train" or "eval").
PANELS = {
    "reward": [("train reward_mean", "train", "reward_mean"), ("eval reward_mean", "eval", "eval_reward_mean")],
    "accuracy": [("train accuracy", "train", "accuracy"), ("eval greedy accuracy", "eval", "eval_accuracy")],
    "response length": [
        ("train response_length_mean", "train", "response_length_mean"),
        ("eval response_length_mean", "eval", "eval_response_length_mean"),
    ],
    "KL": [("train kl", "train", "kl")],
}
REWARD_FUNCTION_KEY = {"train": re.compile(r"reward/(.+)"), "eval": re.compile(r"eval_reward/(.+)")}
SAMPLED_EVAL_KEY = re.compile(r"eval_(mean|pass)@\d+")  # eval_mean@8, eval_pass@8: only when the run asked for them
EMPTY_TEXT = {"KL": "KL not computed (kl_loss_coeff = 0)"}  # kl is null in every record when its weight is 0


def read_records(path: Path) -> list:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (is this a run's output_dir?)")
    records = []
    for line_number, record in read_jsonl(str(path)):
        if not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{line_number}: expected an integer 'step'")
        records.append(record)
    if not records:
        raise ValueError(f"{path}: empty, no metrics to plot")
    return records


def extract_series(records: list) -> dict:
    """records -> {panel: {label: (steps, values)}}, steps ascending; a series with no values is left out."""
    by_kind = {"train": {}, "eval": {}}  # kind -> {step: record}; a resumed run repeats steps, the last record wins
    for record in records:
        kind = "eval" if any(key.startswith("eval_") for key in record) else "train"
        by_kind[kind][record["step"]] = record
    sampled = sorted({key for record in by_kind["eval"].values() for key in record if SAMPLED_EVAL_KEY.fullmatch(key)})
    sampled_lines = [(f"eval {key.removeprefix('eval_')}", "eval", key) for key in sampled]
    wanted = {**PANELS, "accuracy": PANELS["accuracy"] + sampled_lines}
    function_lines = [  # (label, kind, key) of each reward function's mean, in the order the run logged them
        (f"{kind} {match[1]}", kind, key)
        for kind, records in by_kind.items()
        for key in dict.fromkeys(key for record in records.values() for key in record)
        if (match := REWARD_FUNCTION_KEY[kind].fullmatch(key))
    ]
    if len({label.split(" ", 1)[1] for label, _, _ in function_lines}) > 1:
        wanted["reward by function"] = function_lines

    series = {}
    for panel, lines in wanted.items():
        series[panel] = {}
        for label, kind, key in lines:
            points = [(step, r[key]) for step, r in sorted(by_kind[kind].items()) if r.get(key) is not None]
            if points:
                series[panel][label] = ([s for s, _ in points], [v for _, v in points])
    return series


def plot_curves(output_dir: str | Path) -> Path:
    output_dir = Path(output_dir)
    series = extract_series(read_records(output_dir / "metrics.jsonl"))
    columns = 2 if len(series) <= 4 else 3
    fig = Figure(figsize=(6 * columns, 8), layout="constrained")  # no pyplot: savefig to .png renders with Agg
    fig.suptitle(str(output_dir))
    axes = fig.subplots(2, columns).flat
    for ax in axes[len(series) :]:
        ax.set_visible(False)
    for ax, (panel, lines) in zip(axes, series.items()):
        ax.set_title(panel)
        ax.set_xlabel("step")
        for label, (steps, values) in lines.items():
            # markers so a one-step run still shows; evaluations are sparse (every eval_steps), so bigger ones
            ax.plot(steps, values, "o-" if label.startswith("eval") else ".-", label=label, markersize=4)
        if lines:
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
        else:
            ax.set(xticks=[], yticks=[])
            ax.text(0.5, 0.5, EMPTY_TEXT.get(panel, "no data"), ha="center", va="center", transform=ax.transAxes)
    path = output_dir / "curves.png"
    fig.savefig(path, dpi=100)
    return path
