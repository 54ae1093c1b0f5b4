"""Reading a config file: CONFIG.json's text -> {canonical key: value of the key's type}, every problem noted before
any is reported. The file's values must have their key's JSON type ("4" is not an integer; a boolean is true, false,
0 or 1, as PaddleNLP's files write them), and every number must be finite; PaddleNLP's keys this trainer spells
otherwise or does not have are read as paddlenlp_keys.py says."""

import codecs
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from alignment.config.aliases import ALIASES
from alignment.config.checks import show
from alignment.config.paddlenlp_keys import PADDLENLP_ALIASES, PADDLENLP_KEYS, PADDLENLP_VALUES, Refusal, read_key
from alignment.config.schema import canonical_key, check_choice, value_type
from alignment.basics.errors import ConfigError


@dataclass
class FileReading:
    """What a config file says: {canonical key: value of the key's type}; every problem found (an unknown key, a value
    of the wrong type, a PaddleNLP key's value this run cannot honour); the lines to print at start (PaddleNLP keys
    with no effect here); and the canonical keys whose values were refused (checks of them would judge defaults)."""

    values: dict
    problems: list
    notes: list
    unread: set


def read_json_config(path: str) -> dict:
    """CONFIG.json -> {canonical key: value of the key's type}. Mistakes raise one ConfigError naming each, with the
    file and the key as written (file:line:column where the text is not JSON)."""
    reading = read_config_file(path)
    if reading.problems:
        raise ConfigError(problems_message(path, reading.problems))
    return reading.values


def read_config_file(path: str, given_on_the_command_line: Optional[dict] = None) -> FileReading:
    """CONFIG.json -> its FileReading: every key is read, and each mistake noted, before any is reported. PaddleNLP's
    keys given on the command line ({key: value}) are read as if the file gave them."""
    raw = _json_object(path) | (given_on_the_command_line or {})
    reading, written, settings = FileReading({}, [], [], set()), {}, {}
    for key, value in raw.items():
        try:
            if key in PADDLENLP_KEYS and key not in PADDLENLP_ALIASES:
                settings |= {name: (setting, key) for name, setting in _paddlenlp_key(path, key, value, raw, reading.notes).items()}
                continue
            name = canonical_key(key, path)
            if name in reading.values:
                raise ConfigError(f"{path}: '{written[name]}' and '{key}' both set '{name}'; keep one")
            written[name] = key
            value = PADDLENLP_VALUES.get(name, lambda v: v)(value)
            reading.values[name] = _typed(name, value, f"{path}: key '{key}'" + (f" ({name})" if key != name else ""))
        except ConfigError as e:
            reading.problems.append(str(e))
            reading.unread.add(ALIASES.get(key, key))
    for name, (setting, key) in settings.items():
        given = reading.values.get(name, setting)
        if given != setting and not PADDLENLP_KEYS[key].wins:
            reading.problems.append(f"{path}: '{key}' sets {name} to {show(setting)} but '{written[name]}' is {show(given)}; keep one")
        reading.values[name] = setting
    return reading


def _paddlenlp_key(path: str, key: str, value, raw: dict, notes: list) -> dict:
    """PaddleNLP's key = value -> {canonical key: value} it sets; its note (no effect here) added to notes."""
    try:
        settings, note = read_key(key, value, raw)
    except Refusal as e:
        raise ConfigError(f"{path}: key '{key}' = {show(value)}: {e}") from None
    if note:
        notes.append(f"{key} = {show(value)} has no effect here: {note}")
    return {name: _typed(name, setting, f"{path}: key '{key}' sets {name}") for name, setting in settings.items()}


def problems_message(source: str, problems: list) -> str:
    """One problem: its message as it is; more: a count and one line each, the source's name said once."""
    if len(problems) == 1:
        return problems[0]
    lines = [p.removeprefix(f"{source}: ") for p in problems]
    return f"{source}: {len(problems)} problems, each to fix before the run can start:\n" + "\n".join(f"  - {line}" for line in lines)


def _json_object(path: str) -> dict:
    """CONFIG.json's text -> the JSON object it holds; ConfigError where it cannot be read or is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    body = data.removeprefix(codecs.BOM_UTF8)  # some Windows editors start UTF-8 files with one
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        start = e.start + len(data) - len(body)
        line, column = data.count(b"\n", 0, start) + 1, start - data.rfind(b"\n", 0, start)
        raise ConfigError(f"{path}:{line}:{column}: not valid UTF-8 ({e.reason})") from None
    try:
        raw = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, path))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid JSON for a config: arrays or objects nested too deeply") from None
    except ConfigError:
        raise
    except ValueError as e:  # an integer longer than int() converts (sys.get_int_max_str_digits())
        raise ConfigError(f"{path}: not valid JSON: {str(e).split(';')[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object of key: value pairs, got {show(raw)}")
    return raw


def _unique_keys(pairs: list, path: str) -> dict:
    keys = [key for key, _ in pairs]
    twice = next((key for i, key in enumerate(keys) if key in keys[:i]), None)
    if twice is not None:  # json.loads would keep the last silently
        raise ConfigError(f"{path}: key '{twice}' is given twice")
    return dict(pairs)


def _typed(key: str, value, where: str):
    """A JSON value for key -> the value, checked against the key's type. JSON's types are taken as written:
    "4" is not an integer nor 2 a boolean (0 and 1 are, as PaddleNLP writes them; text becomes a number on the command line
    only); numbers are finite."""
    kind, nullable = value_type(key)
    if value is None:
        if nullable:
            return None
        raise ConfigError(f"{where} cannot be null")
    if isinstance(value, dict):
        raise ConfigError(f"{where} must not be an object")
    if typing.get_origin(kind) is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} takes a list, got {show(value)}")
        (item,) = typing.get_args(kind)
        return [_scalar(item, v, key, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, list):
        raise ConfigError(f"{where} takes one value, not a list")
    return _scalar(kind, value, key, where)


def _scalar(kind: type, value, key: str, where: str):
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok, expected = {
        bool: (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)), "true or false (or 0 or 1, PaddleNLP's)"),
        int: (number and isinstance(value, int), "an integer"),
        float: (number and _finite(value), "a finite number"),
        str: (isinstance(value, str), "a string"),
    }[kind]
    if not ok:
        raise ConfigError(f"{where} must be {expected}, got {show(value)}")
    check_choice(key, value, where)
    return float(value) if kind is float else bool(value) if kind is bool else value


def _finite(number) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer past float's range
        return False
