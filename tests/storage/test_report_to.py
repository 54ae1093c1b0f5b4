"""report_to: each dashboard gets the scalars of metrics.jsonl under the same tags and steps, read back with each
dashboard's own reader: VisualDL's LogReader (the file the visualdl server serves), the tensorboard package's
EventAccumulator, and wandb's `wandb leet inspect --json` over the offline run's .wandb file (W&B in offline mode: no
network, no login). A resumed run's dashboards show the whole run, each step once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from visualdl import LogReader

from alignment.basics.errors import ConfigError
from alignment.config.schema import GRPOConfig
from alignment.config.cli import load_config
from alignment.storage.dashboards import DashboardSettings
from alignment.step.logger import RunLogger

TINY = "config/tiny/grpo_argument.json"
ALL = ("visualdl", "tensorboard", "wandb")
# A run as RunLogger sees it: (kind, step, metrics). Values are exact in float32, which VisualDL and TensorBoard store;
# NaN and None are not drawn; an integer is drawn as a number; a name keeps its '@' (eval_mean@4: validation/mean@4).
RUN = [
    ("eval", 0, {"eval_accuracy": 0.25, "eval_mean@4": 0.1875, "eval_pass@4": 0.5, "eval_samples": 16}),
    ("step", 1, {"reward_mean": 0.5, "accuracy": 0.25, "kl": None}),
    ("step", 2, {"reward_mean": 0.625, "accuracy": 0.375, "kl": None, "loss": float("nan")}),
    ("eval", 2, {"eval_accuracy": 0.5, "eval_mean@4": 0.375, "eval_pass@4": 0.75, "eval_samples": 16}),
    ("step", 3, {"reward_mean": 0.75, "accuracy": 0.5, "kl": None}),
]


def expected_scalars(run) -> dict:
    """tag -> [(step, value)] by hand: train/<key> for steps, validation/<key without eval_> for evaluations."""
    tags = {}
    for kind, step, metrics in run:
        for key, value in metrics.items():
            if value is not None and np.isfinite(value):
                tag = f"validation/{key.removeprefix('eval_')}" if kind == "eval" else f"train/{key}"
                tags.setdefault(tag, []).append((step, value))
    return tags


def write(logger: RunLogger, run) -> None:
    for kind, step, metrics in run:
        (logger.log_eval if kind == "eval" else logger.log_step)(step, dict(metrics))


def visualdl_scalars(logdir: Path) -> dict:
    """What the visualdl server shows: it serves the newest vdlrecords file of the folder."""
    served = LogReader(logdir=str(logdir)).logs()
    assert list(served) == [str(logdir)], served
    reader = LogReader(file_path=str(logdir / served[str(logdir)]))
    return {tag: [(r.id, r.value) for r in reader.get_data("scalar", tag)] for tag in reader.get_tags()["scalar"]}


def tensorboard_scalars(logdir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_records(run_folder: Path) -> list:
    """The records of an offline run's .wandb transaction log, as wandb's own reader prints them."""
    (log,) = run_folder.glob("run-*.wandb")
    wandb = Path(sys.executable).parent / "wandb"
    done = subprocess.run([str(wandb), "leet", "inspect", "--json", str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def wandb_run(run_folder: Path) -> tuple:
    """-> (the run record, tag -> [(step, value)] from its history rows)."""
    records = wandb_records(run_folder)
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    tags = {}
    for row in (r["history"] for r in records if r["type"] == "history"):
        for tag, value in row["item"].items():
            if not tag.startswith("_"):  # wandb's own: _step, _runtime, _timestamp
                tags.setdefault(tag, []).append((row["step"].get("num", 0), value))
    return run, tags


def assert_same(seen: dict, expected: dict, what: str) -> None:
    assert sorted(seen) == sorted(expected), what
    for tag, points in expected.items():
        assert [step for step, _ in seen[tag]] == [step for step, _ in points], f"{what}: {tag}"
        np.testing.assert_array_equal([v for _, v in seen[tag]], [v for _, v in points], err_msg=f"{what}: {tag}")


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)


def test_each_dashboard_gets_the_same_tags_steps_and_values(tmp_path, offline):
    logdir = tmp_path / "vdl_log"
    settings = DashboardSettings(ALL, str(logdir), str(tmp_path), {"rollout_n": 8, "output_dir": str(tmp_path)})
    with RunLogger(str(tmp_path), settings, logging_steps=1, total_steps=3, first_step=0, enabled=True) as logger:
        write(logger, RUN)
    expected = expected_scalars(RUN)
    assert expected["validation/samples"] == [(0, 16), (2, 16)] and "train/loss" not in expected  # the hand count's shape
    assert expected["validation/pass@4"] == [(0, 0.5), (2, 0.75)]

    assert_same(visualdl_scalars(logdir), expected, "VisualDL")
    assert_same(tensorboard_scalars(logdir), expected, "TensorBoard")  # the two share logging_dir; neither reads the other's
    (run_folder,) = (tmp_path / "wandb").glob("offline-run-*")  # under output_dir when WANDB_DIR is not set
    run, scalars = wandb_run(run_folder)
    assert_same(scalars, expected, "W&B")
    assert run["display_name"] == tmp_path.name and run["project"] == "paddle-grpo"
    assert {k: v for k, v in run["config"]["update"].items() if k != "_wandb"} == settings.run_config
    assert (tmp_path / "wandb_run_id").read_text() == run["run_id"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 2, 3]


def test_a_resumed_log_shows_the_whole_run_each_step_once(tmp_path, offline, monkeypatch):
    """A crash after step 3, resumed from the checkpoint of step 2: step 3 is logged again (with other values here, to
    tell the two apart) and step 4 follows. Every dashboard shows steps 0 to 4, step 3 once, with the resumed values."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("WANDB_PROJECT", "resumed")
    logdir = tmp_path / "vdl_log"
    settings = DashboardSettings(ALL, str(logdir), str(tmp_path / "out"), {})
    with RunLogger(settings.output_dir, settings, 1, 4, 0, True) as logger:
        write(logger, RUN[:4])
        offsets = logger.offsets()  # the checkpoint of step 2
        write(logger, RUN[4:])  # then the crash
    resumed = [("step", 3, {"reward_mean": 0.875, "accuracy": 0.625}), ("step", 4, {"reward_mean": 1.0, "accuracy": 0.75})]
    with RunLogger(settings.output_dir, settings, 1, 4, 2, True, resume_offsets=offsets) as logger:
        write(logger, resumed)
    expected = expected_scalars(RUN[:4] + resumed)
    assert expected["train/reward_mean"] == [(1, 0.5), (2, 0.625), (3, 0.875), (4, 1.0)]

    assert_same(visualdl_scalars(logdir), expected, "VisualDL")
    assert_same(tensorboard_scalars(logdir), expected, "TensorBoard")
    assert len(list(logdir.glob("vdlrecords.*.log"))) == 1 and len(list(logdir.glob("events.out.tfevents.*"))) == 1
    # W&B keeps the run's history itself: the resumed session continues the same run (one id) from the checkpoint's step
    first, second = sorted((tmp_path / "elsewhere" / "wandb").glob("offline-run-*"))
    (run, before), (again, after) = wandb_run(first), wandb_run(second)
    assert run["run_id"] == again["run_id"] and again["project"] == "resumed"
    assert_same(before, expected_scalars(RUN), "W&B before the crash")
    assert_same(after, expected_scalars(resumed), "W&B after the resume")


def test_a_dashboard_added_at_a_resume_gets_the_earlier_steps(tmp_path, offline):
    logdir = tmp_path / "vdl_log"
    with RunLogger(str(tmp_path), DashboardSettings(("visualdl",), str(logdir), str(tmp_path), {}), 1, 4, 0, True) as logger:
        write(logger, RUN[:4])
        offsets = logger.offsets()
    settings = DashboardSettings(("tensorboard", "wandb"), str(logdir), str(tmp_path), {})
    with RunLogger(str(tmp_path), settings, 1, 4, 2, True, resume_offsets=offsets) as logger:
        write(logger, RUN[4:])
    assert_same(tensorboard_scalars(logdir), expected_scalars(RUN), "TensorBoard")
    (run_folder,) = (tmp_path / "wandb").glob("offline-run-*")
    assert_same(wandb_run(run_folder)[1], expected_scalars(RUN), "W&B")


def test_none_writes_no_dashboard_files(tmp_path, offline):
    settings = GRPOConfig(output_dir=str(tmp_path), report_to=["none"]).dashboard_settings()
    assert settings.report_to == ()
    with RunLogger(str(tmp_path), settings, 1, 3, 0, True) as logger:
        write(logger, RUN)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["completions.jsonl", "metrics.jsonl"]


def test_the_default_is_visualdl_alone():
    assert GRPOConfig().report_to == ["visualdl"]
    assert load_config([TINY]).dashboard_settings().report_to == ("visualdl",)


def test_report_to_takes_a_json_list_or_several_values(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(Path(TINY).read_text()), "report_to": ["tensorboard", "wandb"]}))
    assert load_config([str(path)]).report_to == ["tensorboard", "wandb"]
    assert load_config([TINY, "--report_to", "wandb", "visualdl"]).report_to == ["wandb", "visualdl"]
    assert load_config([TINY, "--report_to", "none"]).report_to == ["none"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--report_to", "visualdl", "all"],
         'command line: --report_to: invalid choice "all" (choose from "visualdl", "tensorboard", "wandb", "none")'),
        (["--report_to", "none", "wandb"], 'report_to = ["none", "wandb"]: none means no dashboard, so it goes alone'),
        (["--report_to", "wandb", "wandb"], 'report_to = ["wandb", "wandb"] names a dashboard twice'),
    ],
)
def test_bad_report_to_is_refused(args, message):
    with pytest.raises(ConfigError) as error:
        load_config([TINY, *args])
    assert str(error.value) == message


def test_a_json_value_outside_the_choices_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"report_to": ["tensorbaord"]}))
    with pytest.raises(ConfigError, match=r"key 'report_to'\[0\]: invalid choice \"tensorbaord\""):
        load_config([str(path)])


@pytest.mark.parametrize("name, module", [("tensorboard", "tensorboardX"), ("wandb", "wandb")])
def test_a_missing_package_is_named_with_its_pip_command(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # as where it is not installed: importlib finds no spec
    with pytest.raises(ConfigError) as error:
        load_config([TINY, "--report_to", "visualdl", name])
    assert str(error.value) == (
        f"report_to {name}: its package is not installed in this environment: pip install {module} "
        f"(or, in this repository, pip install -e '.[{name}]')"
    )


RUN_ARGS = [
    "run_grpo.py", TINY, "--max_dec_len", "16", "--rollout_n", "4", "--per_device_prompt_batch_size", "2",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--max_evaluate_steps", "1", "--eval_rollout_n", "0",
    "--eval_steps", "0", "--save_steps", "2", "--report_to", *ALL,
]


@pytest.mark.slow  # two runs of the tiny model: 80 s on 2 busy cores
def test_a_resumed_training_run_shows_whole_on_every_dashboard(tmp_path):
    """Two steps, then a resume to three: every dashboard holds the evaluation of step 0 and steps 1 to 3, each once,
    with metrics.jsonl's values."""
    out = tmp_path / "out"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, "WANDB_MODE": "offline"}
    for steps, extra in (("2", []), ("3", ["--resume_from_checkpoint", "auto"])):
        done = subprocess.run([sys.executable, *RUN_ARGS, "--output_dir", str(out), "--max_steps", steps, *extra],
                              capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    assert f"tensorboard --logdir {out}/vdl_log --port 6006" in done.stdout and f"sync {out}/wandb/offline-run-*" in done.stdout

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    run = [("eval" if "eval_accuracy" in r else "step", r["step"], {k: v for k, v in r.items() if k != "step"}) for r in records]
    expected = expected_scalars(run)
    assert [step for step, _ in expected["train/reward_mean"]] == [1, 2, 3]
    assert [step for step, _ in expected["validation/accuracy"]] == [0, 2, 3]
    # float32 on the file dashboards: values to float32's precision
    for what, seen in (("VisualDL", visualdl_scalars(out / "vdl_log")), ("TensorBoard", tensorboard_scalars(out / "vdl_log"))):
        assert_same(seen, {t: [(s, np.float32(v)) for s, v in points] for t, points in expected.items()}, what)
    first, second = sorted((out / "wandb").glob("offline-run-*"))
    (run_record, before), (again, after) = wandb_run(first), wandb_run(second)
    assert run_record["run_id"] == again["run_id"]
    joined = {tag: before.get(tag, []) + after.get(tag, []) for tag in expected}
    assert_same(joined, expected, "W&B, both sessions")
