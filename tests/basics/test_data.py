import json

import pytest

from alignment.basics.errors import DataError
from alignment.models.modeling import load_tokenizer
from alignment.basics.data import PromptSchedule, encode_prompts, parse_step_range, read_prompt_records, select_by_calculation_steps


def jsonl(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("data/tiny-qwen2")


def test_paddlenlp_src_tgt(tmp_path):
    (record,) = read_prompt_records(jsonl(tmp_path, [{"src": "What is 2+3?", "tgt": "5", "level": 1}]))
    assert record.messages == ({"role": "user", "content": "What is 2+3?"},)
    assert record.answer == "5"
    assert record.reward_sample() == {"src": "What is 2+3?", "tgt": "5", "level": 1, "prompt": "What is 2+3?", "answer": "5"}
    assert record.source.endswith("data.jsonl:1")


def test_paddlenlp_multi_turn_src_list_and_tgt_list(tmp_path):
    row = {"src": ["Hi, I need help.", "What is 2+3?"], "tgt": ["Sure, ask.", "5"]}
    (record,) = read_prompt_records(jsonl(tmp_path, [row]))
    assert [m["role"] for m in record.messages] == ["user", "assistant", "user"]
    assert record.messages[1]["content"] == "Sure, ask." and record.answer == "5"


def test_gsm8k_question_answer_rows(gsm8k_dir):
    records = read_prompt_records(str(gsm8k_dir / "train.jsonl"))
    assert len(records) == 7473
    assert records[0].question.startswith("Natalia sold clips")
    assert records[0].answer.endswith("#### 72")  # the accuracy reward reads the number after ####


# Hand-made GSM8K-layout references and the number of <<...>> calculations each marks.
STEP_ROWS = [
    ("Tom has 3 + 5 = <<3+5=8>>8 apples.\n#### 8", 1),
    ("16 - 3 - 4 = <<16-3-4=9>>9 eggs.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18", 2),
    ("<<2*3=6>>6, then <<6+1=7>>7, then <<7*2=14>>14\n#### 14", 3),
    ("No marked calculation here.\n#### 4", 0),
    ("A stray << without its end, 2 + 2 = 4\n#### 4", 0),
    ("Two marks on one line: <<1+1=2>><<2+2=4>>\n#### 4", 2),
]


@pytest.mark.parametrize(
    "steps, kept",
    [("1", [1]), ("2", [2, 6]), ("1-2", [1, 2, 6]), ("0", [4, 5]), ("0-3", [1, 2, 3, 4, 5, 6]), (" 3 ", [3]), (None, [1, 2, 3, 4, 5, 6])],
)
def test_calculation_steps_select_rows_by_their_marked_calculations(tmp_path, steps, kept):
    path = jsonl(tmp_path, [{"question": f"q{i}", "answer": answer} for i, (answer, _) in enumerate(STEP_ROWS, 1)])
    records = select_by_calculation_steps(read_prompt_records(path), steps, path)
    assert [r.question for r in records] == [f"q{i}" for i in kept]
    assert [r.source for r in records] == [f"{path}:{i}" for i in kept]  # each keeps its file and line


def test_calculation_steps_that_keep_nothing_name_the_files_and_the_counts_found(tmp_path):
    path = jsonl(tmp_path, [{"question": f"q{i}", "answer": answer} for i, (answer, _) in enumerate(STEP_ROWS, 1)])
    with pytest.raises(DataError, match=r"data.jsonl: no row's reference marks 4-5 <<...>> calculations \(calculation_steps\); "
                                        r"the counts found: 0, 1, 2, 3"):
        select_by_calculation_steps(read_prompt_records(path), "4-5", path)


@pytest.mark.parametrize("text, message", [("two", "expected a count"), ("1-", "expected a count"), ("-1", "expected a count"),
                                           ("1,2", "expected a count"), ("3-1", "runs backwards")])
def test_step_ranges_are_refused_with_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_step_range(text)


def test_gsm8k_test_split_has_65_one_step_and_357_two_step_problems(gsm8k_dir):
    path = str(gsm8k_dir / "test.jsonl")
    records = read_prompt_records(path)
    counts = {steps: len(select_by_calculation_steps(records, steps, path)) for steps in ("1", "2", "1-2", "3")}
    assert counts == {"1": 65, "2": 357, "1-2": 422, "3": 364}


def test_chat_messages_with_final_assistant_turn_as_reference(tmp_path):
    row = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]
    }
    (record,) = read_prompt_records(jsonl(tmp_path, [row]))
    assert [m["role"] for m in record.messages] == ["system", "user"] and record.answer == "5"


def test_chat_messages_with_solution_column(tmp_path):
    row = {"messages": [{"role": "user", "content": "2+3?"}], "solution": "5"}
    (record,) = read_prompt_records(jsonl(tmp_path, [row]))
    assert record.answer == "5" and record.reward_sample()["solution"] == "5"


def test_explicit_keys(tmp_path):
    (record,) = read_prompt_records(jsonl(tmp_path, [{"problem": "2+3?", "final": 5}]), prompt_key="problem", response_key="final")
    assert record.question == "2+3?" and record.answer == "5"


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"src": "a", "tgt": "1"}, "{not json"], r"data.jsonl:2: not valid JSON"),
        ([{"src": "a", "tgt": "1"}, "[1, 2]"], r"data.jsonl:2: expected a JSON object, got list"),
        ([{"src": "a", "tgt": "1"}, {"tgt": "2"}], r"data.jsonl:2: missing prompt column 'src'"),
        ([{"src": "a", "tgt": "1"}, {"src": "b"}], r"data.jsonl:2: missing reference column 'tgt'"),
        ([{"src": 3, "tgt": "1"}], r"data.jsonl:1: 'src' must be a string or a non-empty list"),
        ([{"src": "a", "tgt": {"x": 1}}], r"data.jsonl:1: 'tgt' must be a string"),
        ([{"src": ["a", "b"], "tgt": ["1"]}], r"data.jsonl:1: 'src' has 2 user turns"),
        ([{"messages": [{"role": "robot", "content": "hi"}]}], r"data.jsonl:1: 'messages'\[0\] must be"),
        (
            [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}], "answer": "1"}],
            r"data.jsonl:1: the prompt must end with a user turn",
        ),
        ([{"text": "no prompt here"}], r"data.jsonl:1: no prompt column"),
        ([], r"data.jsonl: the file has no rows"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, rows, message):
    with pytest.raises(DataError, match=message):
        read_prompt_records(jsonl(tmp_path, rows))


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"src": "ok", "tgt": "1"}\n{"src": "\xff\xfe", "tgt": "2"}\n')
    with pytest.raises(DataError, match=r"data.jsonl:2: not valid UTF-8"):
        read_prompt_records(str(path))


def test_missing_file():
    with pytest.raises(DataError, match="nope.jsonl: cannot open"):
        read_prompt_records("nope.jsonl")


def test_chat_template_and_truncation(tmp_path, tokenizer):
    records = read_prompt_records(
        jsonl(tmp_path, [{"src": "Mia has 3 apples.", "tgt": "3"}, {"src": "Mia has 3 apples. " * 30, "tgt": "3"}])
    )
    full, truncated, dropped = encode_prompts(records, tokenizer, 10_000, "left", system_prompt="Be brief.")
    text = tokenizer.decode(list(full[0].ids))
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nMia has 3 apples.<|im_end|>\n<|im_start|>assistant\n"
    limit = len(full[0].ids) + 5
    cut, truncated, dropped = encode_prompts(records, tokenizer, limit, "left", system_prompt="Be brief.")
    assert (truncated, dropped) == (1, 0) and len(cut[1].ids) == limit
    assert cut[1].ids == full[1].ids[-limit:]  # cut from the left: the end of the question and the assistant header survive
    kept, truncated, dropped = encode_prompts(records, tokenizer, limit, "drop", system_prompt="Be brief.")
    assert (truncated, dropped, len(kept)) == (0, 1, 1)


def test_schedule_is_disjoint_across_ranks_and_deterministic():
    schedule = PromptSchedule(num_prompts=40, prompts_per_rank=4, world_size=2, seed=7)
    assert schedule.steps_per_epoch == 5
    epoch = [i for step in range(5) for rank in range(2) for i in schedule.indices(step, rank)]
    assert sorted(epoch) == list(range(40))  # one epoch visits every prompt once, ranks never overlap
    assert schedule.indices(3, 1) == PromptSchedule(40, 4, 2, 7).indices(3, 1)
    assert schedule.indices(5, 0) != schedule.indices(0, 0)  # the next epoch is a new permutation
    with pytest.raises(DataError, match="cannot fill one step"):
        PromptSchedule(num_prompts=3, prompts_per_rank=4, world_size=1, seed=0)
