"""A step's rollout as JSON and raw arrays: what a rollout process sends the trainer, and what a checkpoint of a
one-step-off run keeps of the rollout it had received ahead. Nothing here ever unpickles.

A record is (header, arrays): the header a JSON object of plain values (numbers, strings, lists, objects), the
arrays numpy arrays of the dtypes in DTYPES, each named in the header with its dtype and shape. Reading one back
checks every field's type, every array's dtype and shape against the others, and the sizes against MAX_ROWS and
MAX_TOKENS, so a damaged or forged record is an error that names the field, never a crash later in the step.

Over the link (a multiprocessing.connection, whose handshake proves both ends hold the run's key) a message is one
frame of UTF-8 JSON followed by one frame of raw bytes per array, read with recv_bytes only (never recv, which
unpickles); in a checkpoint, one safetensors file whose metadata holds the header.
"""

import json
import math
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Optional

import numpy as np
from safetensors.numpy import load_file, save

from alignment.basics.errors import WireError
from alignment.rollout.base import Rollout
from alignment.tools.environment import Episode, ToolCall

DTYPES = {"int64": np.int64, "float32": np.float32}  # every array a rollout holds is one of these
MAX_ROWS = 1 << 20  # completions in one rollout
MAX_TOKENS = 1 << 20  # tokens of one completion (and of one prompt)
MAX_FRAME_BYTES = 1 << 31  # one frame on the link: a longer one is refused before it is read


@dataclass
class RolloutPart:
    """One rollout process's share of a step's completions."""

    step: int
    rollout: Rollout
    weights_step: int  # the optimizer step whose weights generated it (0: the starting weights)
    seconds: float  # generation time
    sync_seconds: float  # before it: the engine's refresh and check once the weights it came from arrived
    sync_gap: Optional[float] = None  # that check's largest |log-prob difference| from the actor (None: no check, or the eager engine)


# --- records --------------------------------------------------------------------------------------------


def parts_record(step: int, parts: list) -> tuple:
    """(step, [RolloutPart]) -> (header, {name: array}): part i's arrays are named "i.<field>"."""
    header = {"step": step, "parts": []}
    arrays = {}
    for index, part in enumerate(parts):
        rollout = part.rollout
        fields = {
            "step": part.step, "weights_step": part.weights_step, "seconds": part.seconds, "sync_seconds": part.sync_seconds,
            "sync_gap": part.sync_gap, "group_size": rollout.group_size, "prompt_ids": [list(map(int, ids)) for ids in rollout.prompt_ids],
            "finish_reasons": list(rollout.finish_reasons),
            "episodes": None if rollout.episodes is None else [_episode_fields(episode) for episode in rollout.episodes],
        }
        header["parts"].append(fields)
        for name in ("completion_ids", "completion_mask", "logprobs", "environment_mask"):
            value = getattr(rollout, name)
            if value is not None:
                arrays[f"{index}.{name}"] = np.ascontiguousarray(value)
    return header, arrays


def parts_from_record(header, arrays: dict, vocab_size: Optional[int] = None) -> tuple:
    """The inverse of parts_record, checking everything (token ids below vocab_size, where given) -> (step, [RolloutPart])."""
    record = _Fields(header, "the record")
    step = record.integer("step")
    parts = []
    for index, fields in enumerate(record.items("parts", dict)):
        part = _Fields(fields, f"part {index}")
        prompt_ids = [
            _Fields({"ids": ids}, f"part {index} prompt {row}").tokens("ids") for row, ids in enumerate(part.items("prompt_ids", list))
        ]
        rows = len(prompt_ids)
        group_size = part.integer("group_size")
        if not 0 < rows <= MAX_ROWS or group_size < 1 or rows % group_size:
            raise WireError(f"part {index}: {rows} rows in groups of {group_size}")
        completion_ids = _array(arrays, f"{index}.completion_ids", "int64", rows)
        shape = completion_ids.shape
        if completion_ids.size and completion_ids.min() < 0:
            raise WireError(f"part {index}: completion_ids holds a negative token id")
        largest = max([int(completion_ids.max()) if completion_ids.size else -1, *(max(ids, default=-1) for ids in prompt_ids)])
        if vocab_size is not None and largest >= vocab_size:
            raise WireError(f"part {index}: token id {largest} is past the model's vocabulary of {vocab_size}")
        finish_reasons = part.items("finish_reasons", str)
        episodes = part.optional_items("episodes", dict)
        if len(finish_reasons) != rows or (episodes is not None and len(episodes) != rows):
            raise WireError(
                f"part {index}: {rows} rows but {len(finish_reasons)} finish reasons"
                + (f" and {len(episodes)} episodes" if episodes is not None else "")
            )
        environment_mask = _array(arrays, f"{index}.environment_mask", "float32", rows, shape, optional=True)
        if (environment_mask is None) != (episodes is None):
            raise WireError(f"part {index}: a multi-turn rollout has both episodes and environment_mask, others neither")
        rollout = Rollout(
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            completion_mask=_array(arrays, f"{index}.completion_mask", "float32", rows, shape),
            logprobs=_array(arrays, f"{index}.logprobs", "float32", rows, shape),
            finish_reasons=finish_reasons,
            group_size=group_size,
            environment_mask=environment_mask,
            episodes=None if episodes is None else [_episode(e, f"part {index} episode {row}") for row, e in enumerate(episodes)],
        )
        parts.append(RolloutPart(
            part.integer("step"), rollout, part.integer("weights_step"), part.number("seconds"), part.number("sync_seconds"),
            part.number("sync_gap", optional=True),
        ))
    expected = {
        f"{index}.{name}" for index, fields in enumerate(header["parts"]) for name in ("completion_ids", "completion_mask", "logprobs")
    }
    extra = set(arrays) - expected - {f"{index}.environment_mask" for index in range(len(parts))}
    if extra:
        raise WireError(f"arrays that belong to no part: {', '.join(sorted(extra))}")
    return step, parts


def _episode_fields(episode: Episode) -> dict:
    return {
        "sample": episode.sample, "turns": list(episode.turns),
        "calls": [{**call.as_dict(), "seconds": call.seconds} for call in episode.calls],
    }


def _episode(fields, where: str) -> Episode:
    episode = _Fields(fields, where)
    calls = []
    for number, call_fields in enumerate(episode.items("calls", dict)):
        call = _Fields(call_fields, f"{where} call {number}")
        calls.append(ToolCall(
            call.text("name"), call.mapping("arguments"), call.text("answer"), call.text("error", optional=True), call.number("seconds")
        ))
    return Episode(sample=episode.mapping("sample"), turns=episode.items("turns", str), calls=calls)


class _Fields:
    """A JSON object read field by field, each read checking its type; errors name the place and the field."""

    def __init__(self, value, where: str):
        if not isinstance(value, dict):
            raise WireError(f"{where} is {type(value).__name__}, not an object")
        self.value, self.where = value, where

    def _get(self, name: str, optional: bool):
        if name not in self.value:
            raise WireError(f"{self.where} lacks {name}")
        found = self.value[name]
        return None if found is None and optional else found

    def _wrong(self, name: str, wanted: str):
        return WireError(f"{self.where}: {name} is {type(self.value[name]).__name__}, not {wanted}")

    def integer(self, name: str) -> int:
        found = self._get(name, False)
        if type(found) is not int:
            raise self._wrong(name, "an integer")
        return found

    def number(self, name: str, optional: bool = False):
        found = self._get(name, optional)
        if found is None and optional:
            return None
        if type(found) not in (int, float) or not math.isfinite(found):
            raise self._wrong(name, "a finite number")
        return float(found)

    def text(self, name: str, optional: bool = False):
        found = self._get(name, optional)
        if found is None and optional:
            return None
        if not isinstance(found, str):
            raise self._wrong(name, "a string")
        return found

    def mapping(self, name: str) -> dict:
        found = self._get(name, False)
        if not isinstance(found, dict):
            raise self._wrong(name, "an object")
        return found

    def items(self, name: str, kind: type) -> list:
        found = self._get(name, False)
        if not isinstance(found, list) or not all(isinstance(item, kind) for item in found):
            raise self._wrong(name, f"a list of {kind.__name__}")
        return found

    def optional_items(self, name: str, kind: type) -> Optional[list]:
        return None if self._get(name, True) is None else self.items(name, kind)

    def tokens(self, name: str) -> list:
        found = self.items(name, int)
        if len(found) > MAX_TOKENS or any(type(token) is not int or token < 0 for token in found):
            raise WireError(f"{self.where}: {name} is not a list of at most {MAX_TOKENS} token ids")
        return found


def _array(arrays: dict, name: str, dtype: str, rows: int, shape: Optional[tuple] = None, optional: bool = False):
    if name not in arrays:
        if optional:
            return None
        raise WireError(f"the array {name} is missing")
    array = arrays[name]
    if array.dtype != DTYPES[dtype] or array.ndim != 2 or array.shape[0] != rows or array.shape[1] > MAX_TOKENS:
        raise WireError(f"the array {name} is {array.dtype} {array.shape}, not {dtype} ({rows}, <= {MAX_TOKENS} tokens)")
    if shape is not None and array.shape != shape:
        raise WireError(f"the array {name} is {array.shape}, not {shape} as completion_ids")
    if array.dtype == np.float32 and not np.isfinite(array).all():
        raise WireError(f"the array {name} holds NaN or infinity")
    return array


# --- the link ------------------------------------------------------------------------------------------


def send_message(connection: Connection, kind: str, fields: dict, arrays: Optional[dict] = None) -> None:
    """One message: a JSON frame {"kind", "fields", "arrays": [[name, dtype, shape], ...]}, then each array's bytes."""
    arrays = arrays or {}
    listing = [[name, array.dtype.name, list(array.shape)] for name, array in arrays.items()]
    connection.send_bytes(json.dumps({"kind": kind, "fields": fields, "arrays": listing}).encode())
    for array in arrays.values():
        connection.send_bytes(memoryview(np.ascontiguousarray(array)).cast("B"))


def receive_message(connection: Connection) -> tuple:
    """-> (kind, fields, {name: array}); WireError for anything but a message send_message wrote."""
    try:
        header = json.loads(connection.recv_bytes(MAX_FRAME_BYTES).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WireError(f"a message that is not JSON ({error})") from None
    message = _Fields(header, "a message")
    kind, fields = message.text("kind"), message.mapping("fields")
    arrays = {}
    for entry in message.items("arrays", list):
        if len(entry) != 3 or not isinstance(entry[0], str) or entry[1] not in DTYPES or not isinstance(entry[2], list) \
                or not all(type(n) is int and n >= 0 for n in entry[2]):
            raise WireError(f"a message lists an array as {entry!r}, not [name, one of {', '.join(DTYPES)}, shape]")
        name, dtype, shape = entry
        data = connection.recv_bytes(MAX_FRAME_BYTES)
        expected = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
        if len(data) != expected:
            raise WireError(f"the array {name} came as {len(data)} bytes; {dtype} {tuple(shape)} is {expected}")
        arrays[name] = np.frombuffer(data, DTYPES[dtype]).reshape(shape)
    return kind, fields, arrays


# --- the checkpoint ------------------------------------------------------------------------------------


def pending_bytes(step: int, parts: list) -> bytes:
    """(step, [RolloutPart]) -> a safetensors file's bytes, the header in its metadata."""
    header, arrays = parts_record(step, parts)
    return save(arrays, metadata={"grpo_rollout": json.dumps(header)})


def load_parts(path, vocab_size: Optional[int] = None) -> tuple:
    """A checkpoint's rollout in flight -> (step, [RolloutPart]); WireError naming the file when it is not one (or holds
    a token id at or past vocab_size)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "numpy") as opened:
            header = json.loads((opened.metadata() or {})["grpo_rollout"])
        return parts_from_record(header, load_file(str(path)), vocab_size)
    except WireError as error:
        raise WireError(f"{path}: {error}") from None
    except Exception as error:  # a missing file or key, a header that is not JSON, safetensors' own SafetensorError
        raise WireError(f"{path}: not a rollout record ({type(error).__name__}: {error})") from None
