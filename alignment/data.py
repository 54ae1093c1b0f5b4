"""Prompt datasets: jsonl rows in three layouts, chat templates, truncation, and the step -> prompts map.

Layouts (detected per file from its first row unless prompt_key / response_key say otherwise):
- PaddleNLP src/tgt: {"src": "question" | ["user turn", ...], "tgt": "reference" | ["reply", ..., "reference"]}
- question/answer:   {"question": "...", "answer": "... #### 72"}   (GSM8K; rewards read the number after ####)
- chat messages:     {"messages": [{"role": ..., "content": ...}, ...], "solution": "..."}; without a reference
                     column, a final assistant turn is the reference.
Every other column of a row travels with it to the reward functions.
"""

import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

PROMPT_KEYS = ("src", "question", "messages", "prompt")
RESPONSE_KEYS = ("tgt", "answer", "solution", "response")
ROLES = ("system", "user", "assistant")


class DataError(ValueError):
    """A problem with a data file; the message starts with file:line."""


@dataclass(frozen=True)
class PromptRecord:
    messages: tuple  # chat turns ending with a user turn, each {"role": str, "content": str}
    answer: Optional[str]  # the reference answer, None where the row has none
    columns: dict = field(default_factory=dict)  # the row as read, every column, for reward functions
    source: str = ""  # "file.jsonl:12"

    @property
    def question(self) -> str:
        return self.messages[-1]["content"]

    def reward_sample(self) -> dict:
        """What a reward function receives as `sample`."""
        return {**self.columns, "prompt": self.question, "answer": self.answer}


@dataclass(frozen=True)
class EncodedPrompt:
    record: PromptRecord
    ids: tuple  # prompt token ids, chat template applied, at most max_prompt_len


def read_jsonl(path: str):
    """Yields (line_number, row) for each non-blank line; a line that is not a JSON object is an error."""
    try:
        handle = open(path, "rb")  # decoded line by line, so a bad byte is reported on its own line
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror}") from None
    with handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{line_number}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{line_number}: not valid JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}")
            yield line_number, row


def _detect(row: dict, prompt_key: Optional[str], response_key: Optional[str], where: str) -> tuple:
    prompt_key = prompt_key or next((k for k in PROMPT_KEYS if k in row), None)
    if prompt_key is None:
        raise DataError(f"{where}: no prompt column: expected one of {', '.join(PROMPT_KEYS)} (or set prompt_key)")
    if response_key is None:
        preferred = {"src": "tgt", "question": "answer"}.get(prompt_key)
        response_key = preferred if preferred in row else next((k for k in RESPONSE_KEYS if k in row), None)
    return prompt_key, response_key


def _text(value, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: {what} must be a string, got {type(value).__name__}")
    return value


def _turns(value, where: str, key: str) -> list:
    """A prompt column -> chat turns. A string is one user turn; a list of strings alternates user and
    assistant turns starting with the user; a list of objects is taken as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: '{key}' must be a string or a non-empty list, got {json.dumps(value)[:80]}")
    if all(isinstance(v, str) for v in value):
        return [{"role": ("user", "assistant")[i % 2], "content": v} for i, v in enumerate(value)]
    turns = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise DataError(
                f"{where}: '{key}'[{i}] must be {{\"role\": one of {'/'.join(ROLES)}, \"content\": string}}, "
                f"got {json.dumps(message)[:80]}"
            )
        turns.append({"role": message["role"], "content": message["content"]})
    return turns


def parse_row(row: dict, prompt_key: str, response_key: Optional[str], where: str) -> PromptRecord:
    if prompt_key not in row:
        raise DataError(f"{where}: missing prompt column '{prompt_key}'")
    turns = _turns(row[prompt_key], where, prompt_key)
    answer = None
    if response_key is not None:
        if response_key not in row:
            raise DataError(f"{where}: missing reference column '{response_key}'")
        reference = row[response_key]
        if isinstance(reference, list):  # PaddleNLP multi-turn: tgt holds the assistant replies, the reference last
            if not reference or not all(isinstance(r, str) for r in reference):
                raise DataError(f"{where}: '{response_key}' must be a string or a list of strings")
            if prompt_key == "src" and isinstance(row["src"], list):
                users = [t["content"] for t in turns]
                if len(reference) != len(users):
                    raise DataError(
                        f"{where}: 'src' has {len(users)} user turns, so 'tgt' needs {len(users)} strings "
                        f"(the replies between them, then the reference); it has {len(reference)}"
                    )
                turns = [
                    {"role": role, "content": text}
                    for user, reply in zip(users, reference[:-1] + [None])
                    for role, text in (("user", user), ("assistant", reply))
                    if text is not None
                ]
            answer = reference[-1]
        elif isinstance(reference, (int, float)) and not isinstance(reference, bool):
            answer = str(reference)
        else:
            answer = _text(reference, f"'{response_key}'", where)
    elif turns[-1]["role"] == "assistant":  # chat messages whose last turn is the reference reply
        answer, turns = turns[-1]["content"], turns[:-1]
    if not turns or turns[-1]["role"] != "user":
        raise DataError(f"{where}: the prompt must end with a user turn")
    columns = dict(row)  # every column, the prompt's too: reward functions see the row as it is in the file
    return PromptRecord(messages=tuple(turns), answer=answer, columns=columns, source=where)


def read_prompt_records(paths: str, prompt_key: Optional[str] = None, response_key: Optional[str] = None) -> list:
    """Comma-separated jsonl paths -> PromptRecords. The first bad row stops loading with file:line."""
    records = []
    for path in [p.strip() for p in paths.split(",") if p.strip()]:
        keys = None
        for line_number, row in read_jsonl(path):
            where = f"{path}:{line_number}"
            keys = keys or _detect(row, prompt_key, response_key, where)
            records.append(parse_row(row, *keys, where))
        if keys is None:
            raise DataError(f"{path}: the file has no rows")
    return records


def with_system_prompt(messages: tuple, system_prompt: Optional[str]) -> list:
    if system_prompt and messages[0]["role"] != "system":
        return [{"role": "system", "content": system_prompt}, *messages]
    return list(messages)


def encode_messages(messages: tuple, tokenizer, system_prompt: Optional[str] = None) -> list:
    """Chat turns -> prompt token ids through the tokenizer's chat template, ending with the assistant's cue."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the tokenizer has no chat template: set chat_template in the config (text or a .jinja file)")
    ids = tokenizer.apply_chat_template(with_system_prompt(messages, system_prompt), add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def encode_prompts(records: list, tokenizer, max_prompt_len: int, truncation: str, system_prompt: Optional[str] = None):
    """-> (EncodedPrompts, number truncated, number dropped). Prompts over max_prompt_len tokens are cut
    from the left (truncation="left", as TRL does: the question at the end survives) or dropped."""
    encoded, truncated, dropped = [], 0, 0
    for record in records:
        ids = encode_messages(record.messages, tokenizer, system_prompt)
        if len(ids) > max_prompt_len:
            if truncation == "drop":
                dropped += 1
                continue
            ids, truncated = ids[-max_prompt_len:], truncated + 1
        encoded.append(EncodedPrompt(record=record, ids=tuple(ids)))
    return encoded, truncated, dropped


class PromptSchedule:
    """Which prompts each step takes: epoch e visits a permutation seeded by (seed, e); step s takes the
    next global batch of it and rank r takes the r-th disjoint slice. A pure function of the step, so a
    resumed run takes exactly the prompts an uninterrupted run would."""

    def __init__(self, num_prompts: int, prompts_per_rank: int, world_size: int, seed: int):
        self.num_prompts, self.per_rank, self.world_size, self.seed = num_prompts, prompts_per_rank, world_size, seed
        self.global_batch = prompts_per_rank * world_size
        self.steps_per_epoch = num_prompts // self.global_batch
        if self.steps_per_epoch == 0:
            raise DataError(
                f"{num_prompts} training prompts cannot fill one step of {self.global_batch} prompts "
                f"(per_device_prompt_batch_size {prompts_per_rank} x {world_size} processes)"
            )

    def indices(self, step: int, rank: int) -> list:
        epoch, offset = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.num_prompts)
        start = offset * self.global_batch + rank * self.per_rank
        return order[start : start + self.per_rank].tolist()
