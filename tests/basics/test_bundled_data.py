"""The bundled task and tiny model are what their committed scripts make."""

import hashlib
import json
import operator
import re
import subprocess
import sys

import pytest

from alignment.models.modeling import load_tokenizer

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("variant, folder", [("bundled", "data/arith"), ("one_step", "data/arith_one_step")])
def test_task_script_rewrites_the_committed_splits(tmp_path, variant, folder):
    subprocess.run([sys.executable, "data/arith_task.py", str(tmp_path), "--variant", variant], check=True, capture_output=True)
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == open(f"{folder}/{split}.jsonl", "rb").read()


def test_kk_script_rewrites_the_committed_splits(tmp_path):
    command = [sys.executable, "data/kk/make_kk.py", "--seed", "0", "--train", "2000", "--test", "200", "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True)
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == open(f"data/kk/{split}.jsonl", "rb").read()


@pytest.mark.parametrize("variant, folder", [("bundled", "data/arith"), ("one_step", "data/arith_one_step")])
def test_splits_are_disjoint_and_answers_are_right(variant, folder):
    rows = {split: [json.loads(line) for line in open(f"{folder}/{split}.jsonl")] for split in ("train", "test")}
    assert (len(rows["train"]), len(rows["test"])) == (4000, 200)
    assert not {r["src"] for r in rows["train"]} & {r["src"] for r in rows["test"]}
    sys.path.insert(0, "data")
    import arith_task

    problems = arith_task.unique_problems(arith_task.TEST_SEED, 200, variant=arith_task.VARIANTS[variant])
    assert [p.question for p in problems] == [r["src"] for r in rows["test"]]
    for problem in problems:
        assert len(problem.equations) in arith_task.VARIANTS[variant].steps
        previous = None
        for equation in problem.equations:  # "12+7=19": each step starts from the previous result
            first, operator, second, result = re.fullmatch(r"(\d+)([-+*])(\d+)=(\d+)", equation).groups()
            assert previous in (None, first)
            assert OPERATIONS[operator](int(first), int(second)) == int(result)
            previous = result
        assert int(previous) == problem.answer


@pytest.mark.slow
def test_model_script_is_deterministic(tmp_path):
    hashes = []
    for run in ("a", "b"):
        out = tmp_path / run
        command = [sys.executable, "data/make_tiny_model.py", "--out", str(out), "--steps", "6", "--skip_eval"]
        subprocess.run(command, check=True, capture_output=True, timeout=600)
        hashes.append((sha256(out / "model.safetensors"), sha256(out / "tokenizer.json")))
    assert hashes[0] == hashes[1]


def test_bundled_model_and_tokenizer():
    config = json.load(open("data/tiny-qwen2/config.json"))
    assert config["model_type"] == "qwen2" and config["num_key_value_heads"] < config["num_attention_heads"]
    tokenizer = load_tokenizer("data/tiny-qwen2")
    assert tokenizer.eos_token == "<|im_end|>" and config["eos_token_id"] == tokenizer.eos_token_id
    assert tokenizer.tokenize("x 128")[-3:] == ["Ġ1", "2", "8"]  # digits one by one
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
