"""A run never takes over another run's work: a second run in the same output_dir is refused (or replaces it
when told to), retention keeps what the run wrote, auto resumes this run's lineage, a damaged checkpoint is
skipped or named, a resume that changes what a step trains on is refused, and every reward failing stops
the run. Each test runs the trainer as a user does, in a subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Tiny steps: 2 prompts x 4 completions of at most 8 tokens, no evaluation.
RUN = [
    "run_grpo.py", "config/tiny/grpo_argument.json", "--max_dec_len", "8", "--per_device_prompt_batch_size", "2",
    "--rollout_n", "4", "--per_device_train_batch_size", "8", "--eval_datasets", "", "--save_total_limit", "100",
    "--logging_steps", "1",
]


def trainer(out: Path, *extra: str, expect: int = 0) -> str:
    done = subprocess.run([sys.executable, *RUN, "--output_dir", str(out), *extra], capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == expect, output[-3000:]
    return output


def error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("run_grpo: error: ")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def steps(out: Path) -> list:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # three runs in one folder (about 34 s)
def test_a_second_run_in_the_same_output_dir_is_refused_or_replaces_it_when_told(tmp_path):
    out = tmp_path / "run"
    trainer(out, "--max_steps", "2", "--save_steps", "1")
    before = (out / "metrics.jsonl").read_text()
    line = error_line(trainer(out, "--max_steps", "1", expect=2))
    assert (
        f"output_dir {out} holds another run (checkpoint-1, checkpoint-2, completions.jsonl, curves.png, grpo_config.json, metrics.jsonl"
        in line
    )
    assert "--resume_from_checkpoint auto" in line and "--overwrite_output_dir" in line
    assert (out / "metrics.jsonl").read_text() == before and (out / "checkpoint-2").is_dir()  # nothing touched

    output = trainer(out, "--max_steps", "1", "--overwrite_output_dir")
    assert "overwrite_output_dir: removed the previous run's" in output
    assert steps(out) == [1] and sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert len(list((out / "vdl_log").iterdir())) == 1  # one VisualDL log, not two runs mixed


@pytest.mark.slow
def test_retention_and_auto_follow_the_resumed_run_not_higher_steps_of_another(tmp_path):
    out = tmp_path / "run"
    trainer(out, "--max_steps", "4", "--save_steps", "1")  # checkpoints 1-4
    # resumed from checkpoint-1 with save_total_limit 1: the old rule kept the highest step numbers and
    # removed each checkpoint right after saving it
    output = trainer(
        out, "--max_steps", "3", "--save_steps", "1", "--save_total_limit", "1", "--resume_from_checkpoint", str(out / "checkpoint-1")
    )
    assert f"checkpoint: {out}/checkpoint-3" in output
    # checkpoint-1: resumed from; checkpoint-3: the newest of this lineage; checkpoint-4: the first run's, left alone
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-3", "checkpoint-4"]
    output = trainer(out, "--max_steps", "4", "--resume_from_checkpoint", "auto")
    assert f"resuming from {out}/checkpoint-3 after step 3" in output  # not the first run's checkpoint-4


@pytest.mark.slow
def test_a_damaged_checkpoint_is_skipped_by_auto_and_named_when_given(tmp_path):
    out = tmp_path / "run"
    trainer(out, "--max_steps", "2", "--save_steps", "1")
    weights = out / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    line = error_line(trainer(out, "--max_steps", "3", "--resume_from_checkpoint", str(out / "checkpoint-2"), expect=2))
    assert line == (
        f"run_grpo: error: resume_from_checkpoint: {out}/checkpoint-2 is damaged: {weights} has 1000 bytes, "
        f"{json.loads((out / 'checkpoint-2' / 'trainer_state.json').read_text())['files']['model.safetensors']['size']} "
        f"were written (truncated?); resume from an earlier checkpoint (or auto, which skips damaged ones)"
    )
    output = trainer(out, "--max_steps", "3", "--resume_from_checkpoint", "auto")
    assert f"skipped damaged checkpoint {out}/checkpoint-2: {weights} has 1000 bytes" in output
    assert f"resuming from {out}/checkpoint-1 after step 1" in output and steps(out) == [1, 2, 3]


@pytest.mark.slow
def test_resuming_with_changed_settings_refuses_what_changes_the_steps_and_prints_the_rest(tmp_path):
    out = tmp_path / "run"
    trainer(out, "--max_steps", "1")
    line = error_line(trainer(out, "--max_steps", "2", "--resume_from_checkpoint", "auto", "--rollout_n", "8", "--seed", "7", expect=2))
    assert "mini_batch_size: 8 -> 16; rollout_n: 4 -> 8; seed: 42 -> 7" in line and "--allow_config_change" in line
    output = trainer(out, "--max_steps", "2", "--resume_from_checkpoint", "auto", "--learning_rate", "1e-5")
    assert "resuming with changed settings: learning_rate: 4e-05 -> 1e-05; max_steps: 1 -> 2" in output
    output = trainer(out, "--max_steps", "3", "--resume_from_checkpoint", "auto", "--rollout_n", "8", "--allow_config_change")
    changed = next(line for line in output.splitlines() if line.startswith("resuming with changed settings: "))
    assert "mini_batch_size: 8 -> 16; rollout_n: 4 -> 8;" in changed and steps(out) == [1, 2, 3]  # refused keys first
    # max_steps at the checkpoint's step: nothing to do, said; below it: an error
    assert f"nothing to train: {out}/checkpoint-3 is the run's last step (3)" in trainer(
        out, "--max_steps", "3", "--rollout_n", "8", "--resume_from_checkpoint", "auto"
    )
    line = error_line(trainer(out, "--max_steps", "2", "--rollout_n", "8", "--resume_from_checkpoint", "auto", expect=2))
    assert line == (
        f"run_grpo: error: max_steps: the run ends at step 2, before {out}/checkpoint-3 (step 3); "
        "give --max_steps above 3 to train further"
    )


def test_a_run_whose_rewards_all_fail_stops_with_the_reason(tmp_path):
    plugin = tmp_path / "unit_reward.py"
    plugin.write_text(
        "from alignment.rewards import register_reward\n\n\n"
        "@register_reward('right_unit', 'reads a units column the bundled data does not have')\n"
        "def right_unit(completion, sample):\n"
        "    return float(sample['units'] in completion)\n"
    )
    out = tmp_path / "run"
    output = trainer(
        out, "--max_steps", "10", "--external_plugins", str(plugin), "--reward_functions", "right_unit", "accuracy",
        "--reward_function_weights", "1", "1", "--max_consecutive_skips", "2", expect=2,
    )
    assert error_line(output) == (
        "run_grpo: error: step 2: no completion could be scored in 2 consecutive steps (max_consecutive_skips), so nothing "
        "was learned from them; the first error: right_unit: KeyError: 'units'"
    )
    assert (
        f"{out}/checkpoint-2 holds the state after step 2; mend the data or the reward functions, "
        "then rerun with --resume_from_checkpoint auto"
    ) in output
    assert steps(out) == [1, 2]
