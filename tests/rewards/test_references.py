"""A dataset without the reference answers its rewards read is refused when the prompts load, before any model.

Rewards registered with needs_reference=True (accuracy, correctness, cosine, knights_knaves) read each row's
reference. A row with none (no reference column, or no final assistant turn) or a blank one is a bad row:
without skip_bad_rows it stops loading, with it the row is skipped and counted, as a null reference already
was. A file where no row has one is refused naming the file, the column and the function, either way.
"""

import json
import subprocess
import sys

import pytest

from alignment.basics.errors import DataError
from alignment.models.modeling import load_tokenizer
from alignment.rewards import available_rewards
from alignment.run.build import load_prompts
from alignment.config.cli import load_config

ANY_COLUMN = (r"any column \(tgt, answer, solution, response, ground_truth, reward_model.ground_truth; response_key names another\) "
              r"or a final assistant turn")
QUESTION = "Mia has 12 apples. She buys 7 more. How many apples does Mia have now?"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("data/tiny-qwen2")


def load(tmp_path, tokenizer, rows, *flags, rewards=()):
    """Writes rows to tmp_path/data.jsonl and loads them as the trainer does -> (EncodedPrompts, the path)."""
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    if rewards:  # instead of the tiny config's accuracy and format
        flags += ("--reward_functions", *rewards, "--reward_function_weights", *["1"] * len(rewards))
    config = load_config(["config/tiny/grpo_argument.json", "--train_datasets", str(path), *flags])
    return load_prompts(str(path), tokenizer, config)[0], path


REFUSED = [
    # (rows, reward functions (the tiny config's: accuracy, format), other flags, message after "FILE: ")
    ([{"src": QUESTION}] * 3, [], [], f"no row has a usable reference in {ANY_COLUMN} \\(needed by reward function accuracy\\)"),
    ([{"src": QUESTION, "tgt": ""}, {"src": QUESTION, "tgt": " \n"}], [], [],
     r"no row has a usable reference in 'tgt' \(needed by reward function accuracy\)"),
    ([{"question": QUESTION, "answer": "\t"}], [], ["--skip_bad_rows"],
     r"no row has a usable reference in 'answer' \(needed by reward function accuracy\)"),
    ([{"messages": [{"role": "user", "content": QUESTION}]}], [], [],
     f"no row has a usable reference in {ANY_COLUMN} \\(needed by reward function accuracy\\)"),
    ([{"src": QUESTION, "label": "  "}], ["correctness"], ["--response_key", "label"],
     r"no row has a usable reference in 'label' \(needed by reward function correctness\)"),
    ([{"src": QUESTION, "label": ""}], ["format", "knights_knaves"], ["--response_key", "label"],
     r"no row has a usable reference in 'label' \(needed by reward function knights_knaves\)"),
    ([{"src": QUESTION}], ["cosine"], [], f"no row has a usable reference in {ANY_COLUMN} \\(needed by reward function cosine\\)"),
    # The accuracy metric reads it too, whatever the rewards.
    ([{"src": QUESTION}], ["format"], [],
     f"no row has a usable reference in {ANY_COLUMN} \\(needed by accuracy_function accuracy; name one there that reads none\\)"),
]


@pytest.mark.parametrize("rows,rewards,flags,message", REFUSED)
def test_a_file_without_usable_references_is_refused_naming_file_column_and_function(tmp_path, tokenizer, rows, rewards, flags, message):
    with pytest.raises(DataError, match=f"^{tmp_path / 'data.jsonl'}: {message}$"):
        load(tmp_path, tokenizer, rows, *flags, rewards=rewards)


def test_rewards_that_read_no_reference_load_a_file_without_one(tmp_path, tokenizer):
    prompts, _ = load(tmp_path, tokenizer, [{"src": QUESTION}] * 2, "--accuracy_function", "format", rewards=["format", "repetition"])
    assert [p.record.answer for p in prompts] == [None, None]


SOME_ROWS = [{"src": QUESTION, "tgt": "19"}, {"src": QUESTION, "tgt": ""}, {"src": QUESTION}, {"src": QUESTION, "tgt": "19"}]


@pytest.mark.parametrize("rows", [SOME_ROWS, SOME_ROWS[:2] + SOME_ROWS[3:]], ids=["a bad row after it", "good rows after it"])
def test_a_row_without_a_reference_stops_loading_naming_its_line(tmp_path, tokenizer, rows):
    with pytest.raises(DataError, match=r"data.jsonl:2: a blank reference in 'tgt' \(needed by reward function accuracy\)$"):
        load(tmp_path, tokenizer, rows)


def test_with_skip_bad_rows_rows_without_a_reference_are_skipped_and_counted(tmp_path, tokenizer, capsys):
    prompts, path = load(tmp_path, tokenizer, SOME_ROWS, "--skip_bad_rows")
    assert [p.record.source for p in prompts] == [f"{path}:1", f"{path}:4"]
    printed = capsys.readouterr().err
    assert f"skipped {path}:2: a blank reference in 'tgt' (needed by reward function accuracy)" in printed
    assert f"skipped {path}:3: missing reference column 'tgt'" in printed  # the layout of row 1, as before
    assert f"{path}: skipped 2 bad rows (skip_bad_rows), kept 2" in printed


def test_the_rewards_that_read_the_reference_say_so():
    assert {spec.name for spec in available_rewards() if spec.needs_reference} >= {"accuracy", "correctness", "cosine", "knights_knaves"}
    assert not {spec.name for spec in available_rewards() if spec.needs_reference} & {
        "format", "xmlcount", "soft_format", "strict_format", "int_answer", "repetition", "soft_overlong"
    }


def test_run_grpo_stops_before_loading_a_model(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"question": QUESTION}) + "\n")
    command = [
        sys.executable, "run_grpo.py", "config/tiny/grpo_argument.json",
        "--train_datasets", str(path),
        "--output_dir", str(tmp_path / "out"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"run_grpo: error: {path}: no row has a usable reference in any column (tgt, answer, solution, response, ground_truth, "
        "reward_model.ground_truth; response_key names another) or a final assistant turn (needed by reward function accuracy)"
    )
    assert not (tmp_path / "out").exists()
