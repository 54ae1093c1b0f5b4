"""Prompt datasets: rows in five layouts (from any format data_files.py reads), chat templates, truncation, and the
step -> prompts map.

Layouts (detected per file from its first good row unless prompt_key / response_key say otherwise):
- PaddleNLP src/tgt: {"src": "question" | ["user turn", ...], "tgt": "reference" | ["reply", ..., "reference"]}
- question/answer:   {"question": "...", "answer": "... #### 72"}   (GSM8K; rewards read the number after ####)
- chat messages:     {"messages": [{"role": ..., "content": ...}, ...], "solution": "..."}; without a reference
                     column, a final assistant turn is the reference.
- TRL:               {"prompt": "text" (standard) | [{"role": ..., "content": ...}, ...] (conversational), "solution": ...}
- verl:              {"prompt": [messages], "reward_model": {"style": "rule", "ground_truth": "72"}, "data_source": ...,
                     "extra_info": {...}}; the reference is reward_model.ground_truth (a dotted key reads a nested field).
Every other column of a row travels with it to the reward functions (TRL passes each to its reward functions by name).
"""

import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from alignment.basics.errors import ChatTemplateError, ConfigError, DataError
from alignment.basics.data_files import read_rows

PROMPT_KEYS = ("src", "question", "messages", "prompt")
RESPONSE_KEYS = ("tgt", "answer", "solution", "response", "ground_truth", "reward_model.ground_truth")
ROLES = ("system", "user", "assistant")
SKIPPED_SHOWN = 20  # skipped rows printed per file; the count covers them all
# GSM8K's worked answers mark each calculation as <<48/2=24>>; the count of marks is the problem's number of steps.
CALCULATION_MARK = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class PromptRecord:
    messages: tuple  # chat turns ending with a user turn, each {"role": str, "content": str}
    answer: Optional[str]  # the reference answer, None where the row has none
    columns: dict = field(default_factory=dict)  # the row as read, every column, for reward functions
    source: str = ""  # "file.jsonl:12"
    prompt_text: Optional[str] = None  # the prompt as the model sees it (chat template applied), set by encode_prompts

    @property
    def question(self) -> str:
        return self.messages[-1]["content"]

    def reward_sample(self) -> dict:
        """What a reward function receives as `sample`: the row's columns, the question as "prompt", the
        reference as "answer" and, once encoded, the templated prompt as "prompt_text"."""
        sample = {**self.columns, "prompt": self.question, "answer": self.answer}
        return sample if self.prompt_text is None else {**sample, "prompt_text": self.prompt_text}


@dataclass(frozen=True)
class EncodedPrompt:
    record: PromptRecord
    ids: tuple  # prompt token ids, chat template applied, at most max_prompt_len


def _detect(row: dict, prompt_key: Optional[str], response_key: Optional[str], where: str) -> tuple:
    prompt_key = prompt_key or next((k for k in PROMPT_KEYS if k in row), None)
    if prompt_key is None:
        keys = ", ".join(map(str, list(row)[:20])) or "none"
        raise DataError(f"{where}: no prompt column: expected one of {', '.join(PROMPT_KEYS)} (or set prompt_key); the row's keys: {keys}")
    if response_key is None:
        preferred = {"src": "tgt", "question": "answer"}.get(prompt_key)
        response_key = preferred if preferred in row else next((k for k in RESPONSE_KEYS if _field(row, k) is not _MISSING), None)
    return prompt_key, response_key


_MISSING = object()


def _field(row: dict, key: str):
    """row[key], or for a dotted key absent as a column the nested field ("reward_model.ground_truth"), or _MISSING."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


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
        reference = _field(row, response_key)
        if reference is _MISSING:
            raise DataError(f"{where}: missing reference column '{response_key}'")
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
        elif isinstance(reference, int) and not isinstance(reference, bool) or isinstance(reference, float) and math.isfinite(reference):
            answer = str(reference)
        else:
            answer = _text(reference, f"'{response_key}'", where)
    elif turns[-1]["role"] == "assistant":  # chat messages whose last turn is the reference reply
        answer, turns = turns[-1]["content"], turns[:-1]
    if not turns or turns[-1]["role"] != "user":
        raise DataError(f"{where}: the prompt must end with a user turn")
    columns = dict(row)  # every column, the prompt's too: reward functions see the row as it is in the file
    return PromptRecord(messages=tuple(turns), answer=answer, columns=columns, source=where)


def read_prompt_records(paths: str, prompt_key: Optional[str] = None, response_key: Optional[str] = None, skip_bad_rows: bool = False,
                        reference_needed_by: Optional[str] = None, row_checks: Optional[dict] = None) -> list:
    """Comma-separated jsonl paths -> PromptRecords, each file's layout that of its first good row. The first bad
    row stops loading with DataError "file:line: what"; with skip_bad_rows it is left out, and each file's skipped
    rows are printed to stderr ("skipped file:line: what", the first SKIPPED_SHOWN) with their count. A file with
    no rows, or none left, is an error either way.

    reference_needed_by (e.g. "reward function accuracy") makes a row without a usable reference (none, or only
    whitespace) a bad row too, judged once the file is read: a file where no row has one is refused naming the
    file, the column and what needs it, whatever skip_bad_rows says.

    row_checks ({what needs it, e.g. "reward function ifeval": check(sample) raising ValueError}) makes a row that fails a
    check a bad row."""
    records = []
    for path in [p.strip() for p in paths.split(",") if p.strip()]:
        keys, kept, skipped, unreferenced = None, 0, [], []
        for line_number, row in read_rows(path, skipped.append if skip_bad_rows else None):
            where = f"{path}:{line_number}"
            try:
                row_keys = keys or _detect(row, prompt_key, response_key, where)
                record = parse_row(row, *row_keys, where)
            except DataError as e:
                if not skip_bad_rows:
                    raise unreferenced[0][0] if unreferenced else e  # the first bad row
                skipped.append(e)
                continue
            if reference_needed_by and not (record.answer or "").strip():  # a bad row: it does not fix the layout either
                what = "no reference" if record.answer is None else "a blank reference"
                error = DataError(f"{where}: {what} in {_reference_place(row_keys[1])} (needed by {reference_needed_by})")
                unreferenced.append((error, row_keys[1]))
                if skip_bad_rows:
                    skipped.append(error)
                continue
            problem = _row_problem(record, row_checks or {}, where)
            if problem is not None:
                if not skip_bad_rows:
                    raise unreferenced[0][0] if unreferenced else problem  # the first bad row
                skipped.append(problem)
                continue
            records.append(record)
            keys, kept = row_keys, kept + 1
        for error in skipped[:SKIPPED_SHOWN]:
            print(f"skipped {error}", file=sys.stderr)
        if skipped:
            hidden = len(skipped) - SKIPPED_SHOWN
            print(
                f"{path}: skipped {len(skipped)} bad rows (skip_bad_rows), kept {kept}" + (f"; {hidden} not shown" if hidden > 0 else ""),
                file=sys.stderr,
            )
        if unreferenced and kept == 0:
            raise DataError(
                f"{path}: no row has a usable reference in {_reference_place(unreferenced[0][1])} (needed by {reference_needed_by})"
            )
        if unreferenced and not skip_bad_rows:
            raise unreferenced[0][0]
        if kept == 0:
            raise DataError(
                f"{path}: no rows left, all {len(skipped)} are bad; the first: {skipped[0]}" if skipped else f"{path}: the file has no rows"
            )
    return records


def _row_problem(record: PromptRecord, row_checks: dict, where: str) -> Optional[DataError]:
    sample = record.reward_sample()
    for needed_by, check in row_checks.items():
        try:
            check(sample)
        except ConfigError:  # the installation, not the row (NLTK data missing)
            raise
        except ValueError as e:
            return DataError(f"{where}: {e} (needed by {needed_by})")
    return None


def parse_step_range(text: str) -> tuple:
    """calculation_steps' value -> (fewest, most): "2" -> (2, 2), "1-2" -> (1, 2); ValueError saying what is wrong."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise ValueError(f"'{text}': expected a count (2) or a range (1-2) of calculation steps")
    fewest, most = int(match[1]), int(match[2] or match[1])
    if fewest > most:
        raise ValueError(f"'{text}': the range runs backwards ({fewest} > {most})")
    return fewest, most


def calculation_steps(reference: Optional[str]) -> int:
    """The <<...>> calculations a GSM8K-layout reference answer marks; 0 for a row without a reference."""
    return len(CALCULATION_MARK.findall(reference or ""))


def select_by_calculation_steps(records: list, steps: Optional[str], paths: str) -> list:
    """The records whose reference marks a number of calculations within steps ("2", "1-2"; None: every record).
    A selection that keeps nothing is a DataError naming the files and what their references hold."""
    if steps is None:
        return records
    fewest, most = parse_step_range(steps)
    kept = [r for r in records if fewest <= calculation_steps(r.answer) <= most]
    if not kept:
        found = sorted({calculation_steps(r.answer) for r in records})
        raise DataError(
            f"{paths}: no row's reference marks {steps} <<...>> calculations (calculation_steps); "
            f"the counts found: {', '.join(map(str, found[:10]))}"
        )
    return kept


def _reference_place(response_key: Optional[str]) -> str:
    if response_key:
        return f"'{response_key}'"
    return f"any column ({', '.join(RESPONSE_KEYS)}; response_key names another) or a final assistant turn"


def with_system_prompt(messages: tuple, system_prompt: Optional[str]) -> list:
    if system_prompt and messages[0]["role"] != "system":
        return [{"role": "system", "content": system_prompt}, *messages]
    return list(messages)


def encode_messages(messages: tuple, tokenizer, system_prompt: Optional[str] = None, tools: Optional[list] = None) -> list:
    """Chat turns -> prompt token ids through the tokenizer's chat template, ending with the assistant's cue;
    tools: the JSON schemas of the tools the model may call, which the template shows it."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the tokenizer has no chat template: set chat_template in the config (text or a .jinja file)")
    try:
        ids = tokenizer.apply_chat_template(
            with_system_prompt(messages, system_prompt), tools=tools or None, add_generation_prompt=True, tokenize=True
        )
    except ChatTemplateError as error:
        raise DataError(f"the chat template {error} (alignment/models/template_limits.py)") from None
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def encode_prompts(records: list, tokenizer, max_prompt_len: int, truncation: str, system_prompt: Optional[str] = None,
                   tools: Optional[list] = None):
    """-> (EncodedPrompts, number truncated, number dropped). Prompts over max_prompt_len tokens are cut
    from the left (truncation="left", as TRL does: the question at the end survives) or dropped. Each record
    gets its prompt_text, the kept ids decoded: a reward can tell what the template put after the question
    (a chat template that ends in "<think>" opens the thinking block for the model)."""
    encoded, truncated, dropped = [], 0, 0
    for record in records:
        ids = encode_messages(record.messages, tokenizer, system_prompt, tools)
        if len(ids) > max_prompt_len:
            if truncation == "drop":
                dropped += 1
                continue
            ids, truncated = ids[-max_prompt_len:], truncated + 1
        record = replace(record, prompt_text=tokenizer.decode(ids))
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
