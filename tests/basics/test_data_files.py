"""Users' data as they have it: parquet (verl), datasets folders and json / csv files (TRL), read into the same prompts
as the bundled jsonl; verl's and TRL's row layouts; a file of another layout or format refused in one line."""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from alignment.basics.errors import DataError
from alignment.rewards import get_reward
from alignment.basics.data import read_prompt_records

ARITH = "data/arith/train.jsonl"
GSM8K = Path("../shared/data/gsm8k/train.jsonl")
datasets.disable_progress_bars()  # writing the files here; the reading is what is tested
VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def jsonl_rows(path, limit=None) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines()[:limit]]


def written(rows: list, tmp_path: Path, form: str) -> str:
    """rows written as a user's tools write them: datasets' to_parquet and save_to_disk, a JSON array, csv."""
    path = tmp_path / f"data.{form}" if form != "folder" else tmp_path / "saved"
    if form == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif form == "folder":
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    elif form == "json":
        path.write_text(json.dumps(rows, indent=1))
    elif form == "csv":
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return str(path)


def prompts_and_references(records) -> list:
    return [(record.messages, record.answer) for record in records]


@pytest.mark.parametrize("form", ["parquet", "folder", "json", "csv"])
def test_the_bundled_arith_data_reads_the_same_from_each_format(tmp_path, form):
    from_jsonl = read_prompt_records(ARITH)
    from_form = read_prompt_records(written(jsonl_rows(ARITH), tmp_path, form))
    assert len(from_form) == len(from_jsonl) == 4000
    assert prompts_and_references(from_form) == prompts_and_references(from_jsonl)
    assert from_form[4].columns == from_jsonl[4].columns


@pytest.mark.parametrize("form", ["parquet", "folder", "json", "csv"])
def test_gsm8k_reads_the_same_from_each_format(tmp_path, form):
    if not GSM8K.is_file():
        pytest.skip("GSM8K is read from ../shared/data/gsm8k, absent here (a checkout without ../shared)")
    head = tmp_path / "head.jsonl"
    head.write_text("".join(GSM8K.read_text().splitlines(keepends=True)[:300]))
    from_form = read_prompt_records(written(jsonl_rows(head), tmp_path, form))
    assert prompts_and_references(from_form) == prompts_and_references(read_prompt_records(str(head)))


def verl_gsm8k_rows(limit: int) -> list:
    """GSM8K rows as verl's examples/data_preprocess/gsm8k.py makes them: the question with its instruction as one user
    message, the number after #### as reward_model.ground_truth, the original row in extra_info."""
    rows = []
    for index, row in enumerate(jsonl_rows(GSM8K, limit)):
        ground_truth = re.search(r"#### (\-?[0-9\.\,]+)", row["answer"]).group(1).replace(",", "")
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": row["question"] + " " + VERL_INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": "train", "index": index, "answer": row["answer"], "question": row["question"]},
        })
    return rows


def test_a_verl_gsm8k_parquet_reads_with_its_ground_truth_as_the_reference(tmp_path):
    if not GSM8K.is_file():
        pytest.skip("GSM8K is read from ../shared/data/gsm8k, absent here (a checkout without ../shared)")
    rows = verl_gsm8k_rows(50)
    records = read_prompt_records(written(rows, tmp_path, "parquet"), reference_needed_by="reward function accuracy")
    assert [record.answer for record in records] == [row["reward_model"]["ground_truth"] for row in rows]
    assert records[0].messages == tuple(rows[0]["prompt"])
    sample = records[0].reward_sample()
    assert sample["extra_info"] == rows[0]["extra_info"] and sample["data_source"] == "openai/gsm8k"  # every column, nested
    right = f"The answer is {rows[0]['reward_model']['ground_truth']}."
    assert get_reward("accuracy").fn(right, sample) == 1.0
    assert get_reward("accuracy").fn("The answer is -1.", sample) == 0.0


@pytest.mark.parametrize("prompt", ["Ann has 3 apples. She gets 2 more. How many now?",
                                    [{"role": "user", "content": "Ann has 3 apples. She gets 2 more. How many now?"}]],
                         ids=["standard", "conversational"])
def test_trl_layouts_read_from_a_saved_dataset_with_their_own_columns(tmp_path, prompt):
    rows = [{"prompt": prompt, "solution": "5", "difficulty": "easy"}]
    (record,) = read_prompt_records(written(rows, tmp_path, "folder"))
    assert record.messages == ({"role": "user", "content": "Ann has 3 apples. She gets 2 more. How many now?"},)
    assert record.answer == "5" and record.reward_sample()["difficulty"] == "easy"


def test_a_dotted_response_key_reads_a_nested_field(tmp_path):
    rows = [{"prompt": "What is 2 + 3?", "meta": {"gold": "5", "source": "hand"}}]
    (record,) = read_prompt_records(written(rows, tmp_path, "json"), response_key="meta.gold")
    assert record.answer == "5"


def saved_dataset_dict(tmp_path: Path) -> str:
    rows = [{"prompt": "What is 2 + 3?", "solution": "5"}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "dict"))
    return str(tmp_path / "dict")


def bad_files(tmp_path: Path) -> list:
    """(path, the one line its loading stops with)."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "fake.parquet").write_text('{"prompt": "not parquet"}\n')
    (tmp_path / "ragged.csv").write_text('prompt,solution\n"What is 2 + 3?",5\n"What is 2 + 4?",6,extra\n')
    (tmp_path / "mixed.json").write_text('[{"prompt": "What is 2 + 3?", "solution": "5"}, 7]')
    (tmp_path / "broken.json").write_text('[{"prompt": "What is 2 + 3?",\n "solution": }]')
    other_layout = written([{"instruction": "Add 2 and 3.", "output": "5"}], tmp_path, "parquet")
    dict_folder = saved_dataset_dict(tmp_path)
    return [
        (f"{tmp_path}/plain", f"{tmp_path}/plain: a folder, but not one written by datasets' save_to_disk (no state.json); "
                              "datasets are .jsonl, .json, .parquet, .csv or a folder written by datasets' save_to_disk"),
        (dict_folder, f"{dict_folder}: a DatasetDict with splits train, test: give one split's folder, e.g. {dict_folder}/train"),
        (f"{tmp_path}/fake.parquet", f"{tmp_path}/fake.parquet: not a readable parquet file: "),
        (f"{tmp_path}/ragged.csv", f"{tmp_path}/ragged.csv:3: 2 columns in the header, another number here"),
        (f"{tmp_path}/mixed.json", f"{tmp_path}/mixed.json:2: expected a JSON object, got int"),
        (f"{tmp_path}/broken.json", f"{tmp_path}/broken.json: not valid JSON: Expecting value (line 2, column 14)"),
        (other_layout, f"{other_layout}:1: no prompt column: expected one of src, question, messages, prompt (or set prompt_key); "
                       "the row's keys: instruction, output"),
    ]


def test_a_bad_file_of_each_format_is_refused_in_one_line_naming_it(tmp_path):
    for path, message in bad_files(tmp_path):
        with pytest.raises(DataError) as refused:
            read_prompt_records(path)
        assert str(refused.value).startswith(message) and "\n" not in str(refused.value), path


def test_skip_bad_rows_skips_a_ragged_csv_row_and_a_json_array_element(tmp_path):
    (tmp_path / "ragged.csv").write_text('prompt,solution\n"What is 2 + 3?",5\n"What is 2 + 4?",6,extra\n"What is\n1 + 1?",2\n')
    (tmp_path / "mixed.json").write_text('[{"prompt": "What is 2 + 3?", "solution": "5"}, 7]')
    from_csv = read_prompt_records(f"{tmp_path}/ragged.csv", skip_bad_rows=True)
    assert [(r.question, r.answer, r.source) for r in from_csv] == [
        ("What is 2 + 3?", "5", f"{tmp_path}/ragged.csv:2"), ("What is\n1 + 1?", "2", f"{tmp_path}/ragged.csv:4")]
    assert [r.answer for r in read_prompt_records(f"{tmp_path}/mixed.json", skip_bad_rows=True)] == ["5"]


def step_prompts(out: Path) -> list:
    return [(row["step"], row["prompt"]) for row in map(json.loads, (out / "completions.jsonl").read_text().splitlines())]


def two_steps(tmp_path: Path, name: str, *flags: str) -> Path:
    """The bundled run's config for 2 steps with flags -> its output folder."""
    out = tmp_path / name.replace(" ", "_")
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir", str(out / "launch"),
               "run_grpo.py", "config/tiny/grpo_argument.json", "--eval_datasets", "", "--max_steps", "2", "--output_dir",
               str(out / "run"), *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{name}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return out / "run"


@pytest.mark.slow
def test_a_verl_parquet_a_trl_folder_and_a_csv_train_on_the_prompts_of_their_jsonl(tmp_path):
    """The bundled run's config, 2 steps, from each format; each run's prompts are the jsonl run's, step by step."""
    rows = jsonl_rows(ARITH)
    verl_rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": row["src"]}], "ability": "math",
                  "reward_model": {"style": "rule", "ground_truth": row["tgt"]}, "extra_info": {"index": i}}
                 for i, row in enumerate(rows)]
    trl_rows = [{"prompt": [{"role": "user", "content": row["src"]}], "solution": row["tgt"]} for row in rows]
    data = {"jsonl": ARITH, "verl parquet": written(verl_rows, tmp_path, "parquet"),
            "trl folder": written(trl_rows, tmp_path, "folder"), "csv": written(rows, tmp_path, "csv")}
    prompts = {name: step_prompts(two_steps(tmp_path, name, "--train_datasets", path)) for name, path in data.items()}
    assert prompts["jsonl"] and {prompt for _, prompt in prompts["jsonl"]} <= {row["src"] for row in rows}
    for name in ("verl parquet", "trl folder", "csv"):
        assert prompts[name] == prompts["jsonl"], name


@pytest.mark.slow
def test_a_verl_gsm8k_parquet_trains_with_no_conversion(tmp_path):
    if not GSM8K.is_file():
        pytest.skip("GSM8K is read from ../shared/data/gsm8k, absent here (a checkout without ../shared)")
    rows = verl_gsm8k_rows(200)
    run = two_steps(tmp_path, "verl gsm8k", "--train_datasets", written(rows, tmp_path, "parquet"), "--max_prompt_len", "320",
                    "--max_dec_len", "16")
    logged = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    references = {row["prompt"][0]["content"]: row["reward_model"]["ground_truth"] for row in rows}
    assert logged and all(references[row["prompt"]] == row["answer"] for row in logged)  # verl's ground truth, as the reference
