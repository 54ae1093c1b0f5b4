import json
import subprocess
import sys

import matplotlib.image
import pytest

from alignment.storage.curves import extract_series, plot_curves


def train(step, reward, accuracy, length, kl=None):
    return {"step": step, "reward_mean": reward, "reward_std": 0.1, "reward/accuracy": accuracy, "accuracy": accuracy,
            "kl": kl, "response_length_mean": length, "loss": -0.05, "time/step": 3.9}


def evaluation(step, accuracy, reward, length, **sampled):
    return {"step": step, "eval_accuracy": accuracy, "eval_reward_mean": reward, "eval_response_length_mean": length,
            "eval_samples": 200, **sampled}


# A run evaluated at steps 0 and 2, resumed after step 2: step 2 (train and eval) was written twice, the
# last records win. kl is null throughout (kl_loss_coeff = 0).
RUN = [
    evaluation(0, 0.0, 0.2, 22.0),
    train(1, 0.3, 0.1, 24.0),
    train(2, 0.9, 0.9, 99.0),
    evaluation(2, 0.9, 0.9, 99.0),
    train(2, 0.4, 0.2, 25.0),
    evaluation(2, 0.15, 0.35, 24.5),
    train(3, 0.5, 0.3, 26.5),
]


@pytest.mark.parametrize(
    "records, panel, expected",
    [
        (RUN, "reward", {"train reward_mean": ([1, 2, 3], [0.3, 0.4, 0.5]), "eval reward_mean": ([0, 2], [0.2, 0.35])}),
        (RUN, "accuracy", {"train accuracy": ([1, 2, 3], [0.1, 0.2, 0.3]), "eval greedy accuracy": ([0, 2], [0.0, 0.15])}),
        (RUN, "response length", {"train response_length_mean": ([1, 2, 3], [24.0, 25.0, 26.5]),
                                  "eval response_length_mean": ([0, 2], [22.0, 24.5])}),
        (RUN, "KL", {}),
        # a KL weight > 0: the series appears; a null kl (a non-finite value) leaves a gap, not a zero
        ([train(1, 0.3, 0.1, 24.0, kl=0.0), train(2, 0.4, 0.2, 25.0, kl=None), train(3, 0.5, 0.3, 26.0, kl=0.02)], "KL",
         {"train kl": ([1, 3], [0.0, 0.02])}),
        # mean@k / pass@k join the accuracy panel only when the run wrote them
        ([evaluation(0, 0.0, 0.2, 22.0, **{"eval_mean@8": 0.1, "eval_pass@8": 0.5}),
          evaluation(4, 0.3, 0.5, 23.0, **{"eval_mean@8": 0.4, "eval_pass@8": 0.75})], "accuracy",
         {"eval greedy accuracy": ([0, 4], [0.0, 0.3]), "eval mean@8": ([0, 4], [0.1, 0.4]),
          "eval pass@8": ([0, 4], [0.5, 0.75])}),
        # evaluation only (max_steps 0): no train series anywhere
        ([evaluation(0, 0.0, 0.2, 22.0)], "reward", {"eval reward_mean": ([0], [0.2])}),
    ],
    ids=["reward", "accuracy", "length", "kl-null", "kl-weighted", "mean-pass-at-k", "eval-only"],
)
def test_series(records, panel, expected):
    assert extract_series(records)[panel] == expected


def test_every_panel_is_always_present():
    assert list(extract_series(RUN)) == ["reward", "accuracy", "response length", "KL"]  # one reward function: no fifth


def test_several_reward_functions_get_a_panel_of_their_own():
    two = [
        evaluation(0, 0.0, 0.2, 22.0, **{"eval_reward/accuracy": 0.0, "eval_reward/format": 0.4}),
        {**train(1, 0.3, 0.1, 24.0), "reward/format": 0.6},
        {**train(2, 0.4, 0.2, 25.0), "reward/format": 0.8},
    ]
    assert extract_series(two)["reward by function"] == {
        "train accuracy": ([1, 2], [0.1, 0.2]), "train format": ([1, 2], [0.6, 0.8]),
        "eval accuracy": ([0], [0.0]), "eval format": ([0], [0.4]),
    }


def write_metrics(folder, lines):
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize("functions", [1, 2], ids=["four-panels", "five-panels"])
def test_plot_writes_a_png_with_content(tmp_path, functions):
    run = RUN + [{**train(step, 0.5 + step / 100, 0.3 + step / 100, 26.0 + step / 10), **({"reward/format": 0.1} if functions == 2 else {})}
                 for step in range(4, 30)]
    write_metrics(tmp_path, [json.dumps(record) for record in run])
    path = plot_curves(tmp_path)
    assert path == tmp_path / "curves.png"
    pixels = matplotlib.image.imread(path)  # (H, W, 4) floats in [0, 1]
    assert pixels.shape[0] >= 400 and pixels.shape[1] >= 600 and pixels.shape[2] in (3, 4)
    assert pixels[..., :3].std() > 0.05  # lines and text on white, not a blank page


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "alignment.curves", *args], capture_output=True, text=True, timeout=120)


def test_cli_writes_curves_png(tmp_path):
    write_metrics(tmp_path, [json.dumps(record) for record in RUN])
    result = run_cli(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "lines, message",
    [
        (None, "metrics.jsonl: no such file"),
        ([], "metrics.jsonl: empty"),
        (["", "  "], "metrics.jsonl: empty"),
        ([json.dumps(RUN[0]), '{"step": 1, "reward_mean": 0.3'], "metrics.jsonl:2: not valid JSON"),
        ([json.dumps(RUN[0]), "[1, 2]"], "metrics.jsonl:2: expected a JSON object, got list"),
        (['{"reward_mean": 0.3}'], "metrics.jsonl:1: expected an integer 'step'"),
    ],
    ids=["missing", "empty", "blank-lines", "truncated-line", "not-an-object", "no-step"],
)
def test_cli_errors_name_the_file(tmp_path, lines, message):
    if lines is not None:
        write_metrics(tmp_path, lines)
    result = run_cli(str(tmp_path))
    assert result.returncode == 2
    assert f"curves: error: {tmp_path / message}" in result.stderr
    assert not (tmp_path / "curves.png").exists()
