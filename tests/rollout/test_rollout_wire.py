"""A rollout as JSON and raw arrays (alignment/rollout/wire.py): round trips over a real connection and through a
checkpoint file, every field checked on the way back in, and a pickle that is refused rather than run."""

import json
import pickle
from multiprocessing import Pipe

import numpy as np
import pytest

from alignment.rollout.base import Rollout
from alignment.rollout.wire import (
    RolloutPart,
    WireError,
    load_parts,
    parts_from_record,
    parts_record,
    pending_bytes,
    receive_message,
    send_message,
)
from alignment.tools.environment import Episode, ToolCall


def rollout(multi_turn: bool = False) -> Rollout:
    ids = np.array([[5, 6, 2, 0], [7, 2, 0, 0], [8, 9, 10, 2], [3, 2, 0, 0]], np.int64)
    mask = (np.arange(4) <= np.array([[2], [1], [3], [1]])).astype(np.float32)
    episodes = [Episode({"prompt": f"q{row}", "answer": "7", "extra": [1, {"a": None}]}, [f"turn {row}"],
                        [ToolCall("calculator", {"expression": "3+4"}, "7", None, 0.25)] if row == 0 else []) for row in range(4)]
    return Rollout(
        prompt_ids=[[1, 4], [1, 4], [1, 4, 4], [1, 4, 4]], completion_ids=ids, completion_mask=mask,
        logprobs=-np.arange(16, dtype=np.float32).reshape(4, 4) / 7 * mask, finish_reasons=["eos", "eos", "length", "eos"],
        group_size=2, environment_mask=(mask * (np.arange(4) == 1)).astype(np.float32) if multi_turn else None,
        episodes=episodes if multi_turn else None,
    )


def parts(multi_turn: bool = False) -> list:
    return [RolloutPart(3, rollout(multi_turn), 2, 1.5, 0.125, 6.2e-6), RolloutPart(3, rollout(multi_turn), 2, 1.25, 0.5, None)]


def assert_same(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert (a.step, a.weights_step, a.seconds, a.sync_seconds, a.sync_gap) == (
            b.step, b.weights_step, b.seconds, b.sync_seconds, b.sync_gap
        )
        for name in ("completion_ids", "completion_mask", "logprobs", "environment_mask"):
            left, right = getattr(a.rollout, name), getattr(b.rollout, name)
            assert (left is None) == (right is None), name
            if left is not None:
                assert left.dtype == right.dtype and np.array_equal(left, right), name
        assert (a.rollout.prompt_ids, a.rollout.finish_reasons, a.rollout.group_size) == (
            b.rollout.prompt_ids, b.rollout.finish_reasons, b.rollout.group_size
        )
        assert a.rollout.episodes == b.rollout.episodes


@pytest.mark.parametrize("multi_turn", [False, True], ids=["single-turn", "multi-turn"])
def test_parts_cross_a_connection_and_a_checkpoint_file_unchanged(multi_turn, tmp_path):
    sent = parts(multi_turn)
    here, there = Pipe()
    header, arrays = parts_record(3, sent)
    send_message(here, "rollout", header, arrays)
    kind, fields, received = receive_message(there)
    assert kind == "rollout"
    step, got = parts_from_record(fields, received)
    assert step == 3
    assert_same(got, sent)
    (tmp_path / "pending.safetensors").write_bytes(pending_bytes(3, sent))
    step, loaded = load_parts(tmp_path / "pending.safetensors")
    assert step == 3
    assert_same(loaded, sent)


def corrupt(change) -> tuple:
    header, arrays = parts_record(3, parts(multi_turn=True))
    header, arrays = json.loads(json.dumps(header)), dict(arrays)
    change(header, arrays)
    return header, arrays


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda h, a: h.pop("step"), "the record lacks step"),
        (lambda h, a: h.update(step="3"), "the record: step is str, not an integer"),
        (lambda h, a: h["parts"][0].update(group_size=3), "part 0: 4 rows in groups of 3"),
        (lambda h, a: h["parts"][1].update(seconds=float("nan")), "part 1: seconds is float, not a finite number"),
        (lambda h, a: h["parts"][0]["prompt_ids"][1].append(-1), "part 0 prompt 1: ids is not a list of at most"),
        (lambda h, a: h["parts"][0]["finish_reasons"].pop(), "part 0: 4 rows but 3 finish reasons"),
        (lambda h, a: a.pop("0.logprobs"), "the array 0.logprobs is missing"),
        (lambda h, a: a.update({"0.logprobs": a["0.logprobs"].astype(np.float64)}), "the array 0.logprobs is float64"),
        (lambda h, a: a.update({"1.completion_mask": a["1.completion_mask"][:, :3]}), "the array 1.completion_mask is (4, 3), not (4, 4)"),
        (lambda h, a: a.update({"0.completion_ids": -a["0.completion_ids"]}), "part 0: completion_ids holds a negative token id"),
        (lambda h, a: a.update({"0.logprobs": np.full((4, 4), np.inf, np.float32)}), "the array 0.logprobs holds NaN or infinity"),
        (lambda h, a: a.pop("1.environment_mask"), "part 1: a multi-turn rollout has both episodes and environment_mask"),
        (lambda h, a: a.update({"7.logprobs": a["0.logprobs"]}), "arrays that belong to no part: 7.logprobs"),
        (lambda h, a: h["parts"][0]["episodes"][0]["calls"][0].update(answer=7), "part 0 episode 0 call 0: answer is int, not a string"),
        (lambda h, a: h["parts"][0]["episodes"][2].update(turns="turn"), "part 0 episode 2: turns is str, not a list of str"),
    ],
)
def test_a_record_that_is_not_right_is_an_error_naming_the_field(change, error):
    with pytest.raises(WireError, match=error.replace("(", r"\(").replace(")", r"\)")):
        parts_from_record(*corrupt(change))


class Exploit:
    """Unpickling this runs a command; nothing on the link may ever unpickle."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_on_the_link_is_refused_not_run(tmp_path):
    marker = tmp_path / "ran"
    here, there = Pipe()
    here.send_bytes(pickle.dumps(Exploit(marker)))
    with pytest.raises(WireError, match="a message that is not JSON"):
        receive_message(there)
    here.send(Exploit(marker))  # as multiprocessing's own send() would
    with pytest.raises(WireError, match="a message that is not JSON"):
        receive_message(there)
    assert not marker.exists()


@pytest.mark.parametrize(
    "frames, error",
    [
        ([b'{"kind": "rollout"}'], "a message lacks fields"),
        ([b'["rollout"]'], "a message is list, not an object"),
        ([b'{"kind": "x", "fields": {}, "arrays": [["a", "object", [2]]]}'], r"lists an array as \['a', 'object', \[2\]\]"),
        ([b'{"kind": "x", "fields": {}, "arrays": [["a", "int64", [-1]]]}'], "not \\[name, one of int64, float32, shape\\]"),
        ([b'{"kind": "x", "fields": {}, "arrays": [["a", "int64", [2]]]}', b"\0" * 15],
         "the array a came as 15 bytes; int64 \\(2,\\) is 16"),
    ],
)
def test_a_message_that_is_not_one_is_an_error(frames, error):
    here, there = Pipe()
    for frame in frames:
        here.send_bytes(frame)
    with pytest.raises(WireError, match=error):
        receive_message(there)


def test_a_file_that_is_not_a_rollout_record_is_an_error_naming_it(tmp_path):
    for path, content in [(tmp_path / "garbage.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......"),
                          (tmp_path / "pickle.safetensors", pickle.dumps(Exploit(tmp_path / "ran")))]:
        path.write_bytes(content)
        with pytest.raises(WireError, match=f"{path}: not a rollout record"):
            load_parts(path)
    assert not (tmp_path / "ran").exists()
