"""Tool calls as Qwen2.5 / Qwen3 (and Hermes-style templates) have models write them:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "19-5"}}
    </tool_call>

A turn may hold several. A call that cannot be run (not JSON, no name, arguments that are not an object, an
unclosed tag) is kept as a MalformedCall: its error text is answered to the model in place of a tool's answer, as
TRL does, and counted in the metrics."""

import json
import re
from dataclasses import dataclass

CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


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
        if not closed:
            calls.append(MalformedCall(body, "the tool call has no closing </tool_call>"))
            continue
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(MalformedCall(body, f"the tool call is not valid JSON ({exc.msg} at column {exc.colno})"))
            continue
        except RecursionError:  # brackets nested past the parser's recursion limit
            calls.append(MalformedCall(body, "the tool call's JSON is nested too deeply"))
            continue
        except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
            calls.append(MalformedCall(body, f"the tool call's JSON holds a number that cannot be read ({str(exc).split(';')[0]})"))
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append(MalformedCall(body, 'the tool call must be a JSON object with a "name" string and an "arguments" object'))
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append(MalformedCall(body, f'the "arguments" of tool call {call["name"]!r} must be a JSON object'))
            continue
        calls.append(ParsedCall(call["name"], arguments))
    return calls
