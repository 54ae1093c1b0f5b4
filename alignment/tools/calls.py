"""Tool calls as Qwen2.5 / Qwen3 (and Hermes-style templates) have models write them:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "19-5"}}
    </tool_call>

A turn may hold several. A call that cannot be run (not JSON, no name, arguments that are not an object, an
unclosed tag) is kept as a MalformedCall: its error text is answered to the model in place of a tool's answer, as
TRL does, and counted in the metrics. Parsing never raises: whatever the model wrote is a call or a MalformedCall."""

import json
import re
from dataclasses import dataclass

from alignment.basics.json_depth import MAX_JSON_DEPTH, json_too_deep

CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
# A call's JSON, and arguments written as a JSON string inside it, nest at most MAX_JSON_DEPTH deep (the parser, the
# pickling of the sample to the scoring pool and the rollout's records all recurse a level at a time) and hold at most
# this many characters, far more than a tool's arguments need (the python tool's code among them): a call is kept in
# the episode's records, sent with its sample to the scoring pool and written into the rollout's rows.
MAX_CALL_CHARS = 100_000


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class MalformedCall:
    text: str  # what stood between the tags
    error: str


def parse_tool_calls(turn: str) -> list:
    """A model turn's text -> its calls in order, each a ParsedCall or a MalformedCall."""
    calls = []
    for match in CALL.finditer(turn):
        body, closed = match.group(1).strip(), bool(match.group(2))
        calls.append(_parse_call(body) if closed else MalformedCall(body, "the tool call has no closing </tool_call>"))
    return calls


def _parse_call(body: str):
    call, error = _load(body, "the tool call")
    if error:
        return MalformedCall(body, error)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return MalformedCall(body, 'the tool call must be a JSON object with a "name" string and an "arguments" object')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments, error = _load(arguments, f'the "arguments" string of tool call {call["name"]!r}')
        if error:
            return MalformedCall(body, error)
    if not isinstance(arguments, dict):
        return MalformedCall(body, f'the "arguments" of tool call {call["name"]!r} must be a JSON object')
    return ParsedCall(call["name"], arguments)


def _load(text: str, what: str) -> tuple:
    """JSON text -> (value, None), or (None, error) where it is not JSON or passes a bound."""
    if len(text) > MAX_CALL_CHARS:
        return None, f"{what} is {len(text):,} characters long; at most {MAX_CALL_CHARS:,} are read"
    if depth := json_too_deep(text):
        return None, f"{what} nests arrays or objects {depth} deep; at most {MAX_JSON_DEPTH} are read"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"{what} is not valid JSON ({exc.msg} at column {exc.colno})"
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        return None, f"{what} holds a number that cannot be read ({str(exc).split(';')[0]})"
