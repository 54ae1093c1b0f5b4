"""Property-based tests of read_prompt_records on files mixing good and bad rows (hypothesis).

Each generated file holds good rows of one layout (src/tgt, question/answer or chat messages), blank lines and
bad rows, each bad by construction whatever its place: bytes that are not UTF-8, text that is not JSON, JSON
that is not an object, no prompt column, a prompt or reference of the wrong type, chat turns with a bad role
or not ending with a user turn, a missing reference column (placed after a good row, or with explicit keys:
as the first row it would define a layout without references, as documented).
The property: without skip_bad_rows, DataError whose message starts with "file:line: " of the first bad row
(or loads every good row when there is none); with it, exactly the good rows come back, in order, each with its
columns and file:line, and stderr counts the bad rows; a file with no good row is a DataError naming the file.
"""

import contextlib
import io
import json
import re
import time

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from alignment.basics.errors import DataError
from alignment.basics.data import SKIPPED_SHOWN, read_prompt_records
from alignment.basics.data_files import MAX_LINE_BYTES

FUZZ = settings(derandomize=True, deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
LAYOUTS = {"src": "tgt", "question": "answer", "messages": "solution"}  # prompt column -> reference column
text = st.text(max_size=20)
others = st.dictionaries(
    st.sampled_from(["id", "level", "meta", "tests"]), st.integers() | text | st.lists(st.integers(), max_size=2), max_size=2
)


def good_row(prompt_key: str):
    reference = LAYOUTS[prompt_key]
    if prompt_key == "messages":
        turns = st.lists(
            st.sampled_from(["system", "user", "assistant"]).flatmap(lambda r: text.map(lambda c: {"role": r, "content": c})), max_size=3
        )
        prompt = st.tuples(turns, text).map(lambda t: t[0] + [{"role": "user", "content": t[1]}])
        answer = text | st.integers().map(str)
    elif prompt_key == "src":  # one turn, or PaddleNLP's multi-turn: n user turns and n replies, the last the reference
        prompt, answer = text, text | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
        return st.one_of(
            st.tuples(prompt, answer, others).map(lambda t: {"src": t[0], "tgt": t[1], **t[2]}),
            st.lists(st.tuples(text, text), min_size=1, max_size=3).map(
                lambda pairs: {"src": [u for u, _ in pairs], "tgt": [r for _, r in pairs]}
            ),
        )
    else:
        prompt, answer = text, text
    return st.tuples(prompt, answer, others).map(lambda t: {prompt_key: t[0], reference: t[1], **t[2]})


one_line_bytes = st.binary(max_size=10).map(lambda b: b.replace(b"\n", b""))


def bad_line(prompt_key: str, after_good: bool):
    """-> (line bytes, kind): bad under the layout prompt_key and also as the first row of a file."""
    reference = LAYOUTS[prompt_key]
    wrong_prompt = st.sampled_from(
        [3, 2.5, True, None, {}, [], [1, "a"], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 5}], [{"role": "user"}]]
    )
    kinds = {
        "not utf-8": st.tuples(one_line_bytes, st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\x80"]), one_line_bytes).map(
            lambda t: t[0] + t[1] + t[2]
        ),
        "not json": st.sampled_from(
            ["{not json", "{'src': 'x'}", '{"src": "a",}', "NaN", "}{", "[1,", '{"src": "a"} {"src": "b"}', "\x00"]
        ).map(str.encode),
        "truncated": good_row(prompt_key).map(json.dumps).flatmap(lambda s: st.integers(1, len(s) - 1).map(lambda i: s[:i].encode())),
        "not an object": st.one_of(st.lists(st.integers(), max_size=3), text, st.integers(), st.booleans(), st.none()).map(
            lambda v: json.dumps(v).encode()
        ),
        "no prompt column": st.dictionaries(st.sampled_from(["tgt", "answer", "text", "id"]), text, max_size=3).map(
            lambda d: json.dumps(d).encode()
        ),
        "wrong prompt type": st.tuples(wrong_prompt, text).map(lambda t: json.dumps({prompt_key: t[0], reference: t[1]}).encode()),
        "wrong reference type": st.tuples(text, st.sampled_from([None, True, {}, [], [1], ["a", 2]])).map(
            lambda t: json.dumps(
                {prompt_key: t[0] if prompt_key != "messages" else [{"role": "user", "content": t[0]}], reference: t[1]}
            ).encode()
        ),
        "ends with a reply": text.map(
            lambda c: json.dumps(
                {prompt_key: [{"role": "user", "content": c}, {"role": "assistant", "content": c}], reference: c}
            ).encode()
        ),
        "too deep": st.just(b'{"src": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
        "huge number": st.just(b'{"tgt": ' + b"9" * 5000 + b"}"),
    }
    if prompt_key == "src":
        kinds["turns and replies differ"] = st.just(json.dumps({"src": ["a", "b"], "tgt": ["1"]}).encode())
        kinds["nan reference"] = st.just(b'{"src": "a", "tgt": NaN}')
    if after_good:  # first, it would be a good row of a layout without references
        kinds["no reference column"] = text.map(
            lambda c: json.dumps({prompt_key: c if prompt_key != "messages" else [{"role": "user", "content": c}]}).encode()
        )
    return st.sampled_from(sorted(kinds)).flatmap(lambda kind: kinds[kind].map(lambda line: (line, kind)))


@st.composite
def jsonl_files(draw):
    """-> (explicit keys or None, files): each file a list of (line bytes, kind), kind "good", "blank" or what is bad."""
    prompt_key = draw(st.sampled_from(sorted(LAYOUTS)))
    explicit = draw(st.booleans())
    files = []
    for _ in range(draw(st.integers(1, 2))):
        lines, any_good = [], False
        for _ in range(draw(st.integers(0, 8))):
            kind = draw(st.sampled_from(["good", "good", "good", "bad", "bad", "blank"]))
            if kind == "good":
                lines.append((json.dumps(draw(good_row(prompt_key)), ensure_ascii=draw(st.booleans())).encode(), "good"))
                any_good = True
            elif kind == "blank":
                lines.append((draw(st.sampled_from([b"", b"  ", b"\t", b"\r"])), "blank"))
            else:
                lines.append(draw(bad_line(prompt_key, after_good=any_good or explicit)))
        files.append(lines)
    return ((prompt_key, LAYOUTS[prompt_key]) if explicit else None), files


def write(tmp_dir, files, crlf=False) -> list:
    paths = []
    for i, lines in enumerate(files):
        path = tmp_dir / f"part{i}.jsonl"
        path.write_bytes(b"".join(line + (b"\r\n" if crlf else b"\n") for line, _ in lines))
        paths.append(str(path))
    return paths


def read(paths, keys, skip_bad_rows):
    """-> (records or the DataError, what was printed to stderr)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            result = read_prompt_records(",".join(paths), *(keys or (None, None)), skip_bad_rows=skip_bad_rows)
        except DataError as e:  # any other exception fails the test with its traceback
            result = e
    return result, stderr.getvalue()


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_data")


@FUZZ
@given(jsonl_files(), st.booleans())
@example((None, [[(b"\xef\xbb\xbf" + json.dumps({"src": "a", "tgt": "1"}).encode(), "good")]]), False)  # a byte-order mark
@example(
    (None, [[(b'{"src": 3, "tgt": "1"}', "wrong prompt type"), (json.dumps({"question": "q", "answer": "a"}).encode(), "good")]]), False
)
@example((None, [[]]), False)
def test_bad_rows_stop_or_are_skipped_and_counted(tmp_dir, case, crlf):
    keys, files = case
    paths = write(tmp_dir, files, crlf)
    located = [(path, number, kind) for path, lines in zip(paths, files) for number, (_, kind) in enumerate(lines, start=1)]
    good = [(path, number) for path, number, kind in located if kind == "good"]
    bad = [(path, number, kind) for path, number, kind in located if kind not in ("good", "blank")]
    empty = [path for path, lines in zip(paths, files) if not any(kind == "good" for _, kind in lines)]

    result, _ = read(paths, keys, skip_bad_rows=False)
    first_fault = min([(paths.index(p), n) for p, n, _ in bad] + [(paths.index(p), float("inf")) for p in empty], default=None)
    if first_fault is None:
        assert [r.source for r in result] == [f"{p}:{n}" for p, n in good]
    elif first_fault[1] == float("inf"):  # a file without rows, before any bad row
        assert isinstance(result, DataError) and str(result).startswith(f"{paths[first_fault[0]]}: "), result
    else:
        path, number = paths[first_fault[0]], first_fault[1]
        event(next(kind for p, n, kind in bad if (p, n) == (path, number)))
        assert isinstance(result, DataError) and str(result).startswith(f"{path}:{number}: "), (result, bad)

    result, stderr = read(paths, keys, skip_bad_rows=True)
    if empty:  # a file with no good row: an error naming it, the first such file
        assert isinstance(result, DataError) and str(result).startswith(f"{empty[0]}: ") and "no rows" in str(result), result
        return
    assert [r.source for r in result] == [f"{p}:{n}" for p, n in good]
    rows = [json.loads(line.decode("utf-8-sig")) for lines in files for line, kind in lines if kind == "good"]
    assert [r.columns for r in result] == rows  # every column, as in the file
    for path in paths:
        bad_here = [n for p, n, _ in bad if p == path]
        counted = re.search(rf"^{re.escape(path)}: skipped (\d+) bad rows", stderr, re.M)
        assert (int(counted[1]) if counted else 0) == len(bad_here), stderr
        shown = re.findall(rf"^skipped {re.escape(path)}:(\d+): ", stderr, re.M)
        assert [int(n) for n in shown] == bad_here[:SKIPPED_SHOWN], stderr


def test_many_bad_rows_print_the_first_and_count_all(tmp_dir):
    rows = [b'{"src": "a", "tgt": "1"}'] + [b"{broken"] * 500
    path = tmp_dir / "many.jsonl"
    path.write_bytes(b"\n".join(rows) + b"\n")
    records, stderr = read([str(path)], None, skip_bad_rows=True)
    assert len(records) == 1
    assert stderr.count(f"skipped {path}:") == SKIPPED_SHOWN
    assert f"{path}: skipped 500 bad rows (skip_bad_rows), kept 1; {500 - SKIPPED_SHOWN} not shown" in stderr


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"\r\n\t\r\n"])
def test_an_empty_or_blank_file_is_an_error_naming_it(tmp_dir, content):
    path = tmp_dir / "empty.jsonl"
    path.write_bytes(content)
    for skip in (False, True):
        result, _ = read([str(path)], None, skip)
        assert isinstance(result, DataError) and str(result) == f"{path}: the file has no rows"


def test_a_file_of_bad_rows_skipped_is_an_error_naming_it(tmp_dir):
    path = tmp_dir / "all_bad.jsonl"
    path.write_bytes(b'{"text": "no prompt"}\n[1]\n')
    result, stderr = read([str(path)], None, skip_bad_rows=True)
    assert str(result).startswith(f"{path}: no rows left, all 2 are bad; the first: {path}:1: no prompt column")
    assert f"{path}: skipped 2 bad rows (skip_bad_rows), kept 0" in stderr


def test_a_50_mb_row_loads_in_seconds(tmp_dir):
    path = tmp_dir / "huge.jsonl"
    solution = "x" * (50 * 2**20)
    path.write_text(
        json.dumps({"src": "Sum the list.", "tgt": "5", "tests": solution}) + "\n" + json.dumps({"src": "b", "tgt": "2"}) + "\n"
    )
    start = time.perf_counter()
    records = read_prompt_records(str(path))
    assert time.perf_counter() - start < 10
    assert len(records[0].columns["tests"]) == len(solution) and records[1].question == "b"


def test_a_line_over_the_limit_is_a_bad_row_read_past(tmp_dir):
    # one line of MAX_LINE_BYTES + 1 MiB with no newline inside, as a binary file mistaken for jsonl would be
    path = tmp_dir / "too_long.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"src": "a", "tgt": "1"}\n{"src": "' + b"y" * (MAX_LINE_BYTES + 2**20) + b'", "tgt": "2"}\n{"src": "c", "tgt": "3"}\n')
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: longer than 64 MiB"):
        read_prompt_records(str(path))
    records, stderr = read([str(path)], None, skip_bad_rows=True)
    assert [r.source for r in records] == [f"{path}:1", f"{path}:3"]  # the line after it is read whole
    assert f"{path}: skipped 1 bad rows" in stderr


def test_read_prompt_records_reads_what_the_first_good_row_lays_out(tmp_dir):
    # skipping: a bad first row does not choose the layout; the first good row does, with its reference column
    path = tmp_dir / "layout.jsonl"
    path.write_text('{"src": 3}\n{"src": "a", "tgt": "1"}\n{"src": "b", "tgt": "2"}\n')
    records, _ = read([str(path)], None, skip_bad_rows=True)
    assert [(r.question, r.answer) for r in records] == [("a", "1"), ("b", "2")]
