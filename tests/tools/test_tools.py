"""The tools (alignment/tools): the calculator, the parsing of Qwen-style tool calls, the registry, and the `tools`
environment answering calls of built-in and plugin tools, including the ones that fail."""

import json
import pickle
import time
from pathlib import Path

import pytest

from alignment.basics.errors import ConfigError
from alignment.config.cli import load_config
from alignment.basics.plugins import load_plugins, plugin_sources
from alignment.tools import Episode, ToolSettings, get_environment, get_tool, register_tool
from alignment.tools.calculator import CalculatorError, calculate, calculator
from alignment.tools.calls import MalformedCall, ParsedCall, parse_tool_calls
from alignment.tools.sandbox import SandboxLimits

PLUGINS = "tests/plugins/tool_plugins.py"


@pytest.mark.parametrize(
    "expression, answer",
    [("12+7-5", "14"), ("(20-7)*2", "26"), ("7/2", "3.5"), ("6/2", "3"), ("-3**2", "-9"), ("2^10", "1024"),
     ("17//5", "3"), ("17%5", "2"), (" 1.5 * 4 ", "6"), ("1/3", "0.333333333333"), ("9×3", "27"), ("10**64", "1" + "0" * 64)],
)
def test_calculator_computes_arithmetic(expression, answer):
    assert calculator(expression) == answer


@pytest.mark.parametrize(
    "expression, error",
    [("1/0", "division by zero"), ("2**100000", "exponent"), ("9**9**9", "exponent"), ("10**64*10**64", "too large"),
     ("1e308*10", "too large"), ("(-8)**0.5", "not a real number"), ("__import__('os').system('true')", "only numbers"),
     ("x+1", "only numbers"), ("[1]*9", "only numbers"), ("1+", "not an arithmetic expression"), ("1" * 201, "longer than 200"),
     ("1e999", "too large"), ("1e999-1e999", "too large"), ("1" + "0" * 100, "too large"), ("9" * 199, "too large")],
)
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression, error):
    with pytest.raises(CalculatorError, match=error):
        calculate(expression)


@pytest.mark.parametrize(
    "turn, calls",
    [
        ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "19-5"}}\n</tool_call>',
         [ParsedCall("calculator", {"expression": "19-5"})]),
        ('<think>x</think><tool_call>{"name": "a", "arguments": {}}</tool_call> and <tool_call>{"name": "b"}</tool_call>',
         [ParsedCall("a", {}), ParsedCall("b", {})]),
        ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>', [ParsedCall("a", {"x": 1})]),  # arguments as a JSON string
        ("<answer>14</answer>", []),
        ("<tool_call>{bad}</tool_call>",
         [MalformedCall("{bad}", "the tool call is not valid JSON (Expecting property name enclosed in double quotes at column 2)")]),
        ('<tool_call>{"name": 3}</tool_call>',
         [MalformedCall('{"name": 3}', 'the tool call must be a JSON object with a "name" string and an "arguments" object')]),
        ('<tool_call>["a"]</tool_call>',
         [MalformedCall('["a"]', 'the tool call must be a JSON object with a "name" string and an "arguments" object')]),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
         [MalformedCall('{"name": "a", "arguments": [1]}', "the \"arguments\" of tool call 'a' must be a JSON object")]),
        ('<tool_call>{"name": "a", "arguments": {}}',
         [MalformedCall('{"name": "a", "arguments": {}}', "the tool call has no closing </tool_call>")]),
    ],
)
def test_tool_calls_are_parsed_as_qwen_writes_them(turn, calls):
    assert parse_tool_calls(turn) == calls


def test_a_tool_needs_typed_and_documented_arguments():
    def undocumented(x: int) -> str:
        return str(x)

    register_tool("undocumented")(undocumented)
    with pytest.raises(ValueError, match="tool 'undocumented'"):
        get_tool("undocumented").schema
    schema = get_tool("calculator").schema["function"]
    assert schema["name"] == "calculator" and schema["parameters"]["required"] == ["expression"]
    with pytest.raises(ValueError, match="unknown tool 'calculater'. Did you mean 'calculator'"):
        get_tool("calculater")


@pytest.fixture(scope="module")
def environment():
    from alignment.tools.sandbox import isolation_missing

    if isolation_missing():  # the python and plugin tools run isolated, or not at all
        pytest.skip(f"the sandbox cannot isolate here: {isolation_missing()}")
    load_plugins([PLUGINS])
    settings = ToolSettings(
        tools=("calculator", "python", "add", "sleepy", "flood", "crash", "clock"),
        limits=SandboxLimits(seconds=2.0, memory_mb=256, output_bytes=2048),
        plugin_sources=tuple(plugin_sources([PLUGINS])),
        parallel=8,
    )
    return get_environment("tools").factory(settings)


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def answers(environment, *turns: str) -> tuple:
    episodes = [Episode(sample={}, turns=[turn]) for turn in turns]
    replies = environment.reply(episodes)
    return [[m["content"] for m in reply] for reply in replies], episodes


def test_the_tools_environment_answers_each_call_in_order(environment):
    (first, second), episodes = answers(
        environment, call("calculator", expression="19-5") + call("add", a=2, b=3), call("python", code="print(6*7)")
    )
    assert first == ["14", "5"] and second == ["42\n"]
    assert [c.error for c in episodes[0].calls + episodes[1].calls] == [None, None, None]
    assert environment.done(Episode(sample={}, turns=["<answer>14</answer>"]))
    assert not environment.done(episodes[0])


@pytest.mark.parametrize(
    "turn, error",
    [
        ("<tool_call>{bad}</tool_call>", "error: the tool call is not valid JSON"),
        (call("calculater", expression="1"),
         "error: unknown tool 'calculater'; the tools are add, calculator, clock, crash, flood, python, sleepy"),
        (call("calculator", expr="1"), "error: tool 'calculator': unknown argument(s) expr; it takes expression"),
        (call("add", a=1), "error: tool 'add': missing argument(s) b; it takes a, b"),
        (call("calculator", expression="1/0"), "error: CalculatorError: division by zero"),
        (call("sleepy", seconds=300), "error: timed out after 2 s"),
        (call("flood", megabytes=10), "error: printed more than 2048 bytes"),
        (call("crash", code=0), "error: "),
        (call("python", code="while True: pass"), "error: timed out after 2 s"),
        (call("python", code="1/0"), "error: exited with code 1"),
    ],
)
def test_a_failing_call_is_answered_with_its_error_and_counted(environment, turn, error):
    started = time.monotonic()
    (reply,), (episode,) = answers(environment, turn)
    assert reply[0].startswith(error), reply
    assert episode.calls[0].error is not None and len(reply[0]) < 4000
    assert time.monotonic() - started < 60  # a hang costs the time limit (not 300 s), a flood does not wait for 10 MB


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "body, error",
    [
        ("[" * 1500, "the tool call nests arrays or objects 1500 deep; at most 64 are read"),
        ('{"name": "calculator", "arguments": {"a": ' + "7" * 4301 + ', "b": 1}}',
         "the tool call holds a number that cannot be read (Exceeds the limit (4300 digits)"),
        # Arguments written as a JSON string are parsed again, under the same bounds (the second parse raised).
        (json.dumps({"name": "calculator", "arguments": nested(3000)}),
         "the \"arguments\" string of tool call 'calculator' nests arrays or objects 3000 deep; at most 64 are read"),
        (json.dumps({"name": "calculator", "arguments": '{"a": ' + "7" * 5000 + ', "b": 1}'}),
         "the \"arguments\" string of tool call 'calculator' holds a number that cannot be read (Exceeds the limit (4300 digits)"),
        (json.dumps({"name": "calculator", "arguments": "{a"}),
         "the \"arguments\" string of tool call 'calculator' is not valid JSON (Expecting property name enclosed in double quotes"),
        (json.dumps({"name": "calculator", "arguments": "[" * 70 + "\ud800"}),  # a lone surrogate the first parse made
         "the \"arguments\" string of tool call 'calculator' nests arrays or objects 70 deep; at most 64 are read"),
        # Parsed without error, then too deep for what follows (pickling the sample to the scoring pool raised).
        (json.dumps({"name": "calculator", "arguments": {"a": json.loads(nested(600)), "b": 1}}),
         "the tool call nests arrays or objects 602 deep; at most 64 are read"),
        (json.dumps({"name": "python", "arguments": {"code": "#" * 100_000}}),
         "the tool call is 100,045 characters long; at most 100,000 are read"),
    ],
)
def test_a_call_that_breaks_the_json_parser_or_its_bounds_is_answered_not_raised(body, error):
    """Through done and reply as a run asks them: each is one error the model reads, nothing raised."""
    environment = get_environment("tools").factory(ToolSettings(tools=("calculator", "python"), limits=SandboxLimits()))
    turn = Episode(sample={}, turns=[f"<tool_call>{body}</tool_call>"])
    assert not environment.done(turn)
    (reply,) = environment.reply([turn])
    assert len(reply) == 1 and reply[0]["content"].startswith(f"error: {error}"), reply
    assert len(turn.calls) == 1 and turn.calls[0].error is not None and len(reply[0]["content"]) < 300
    pickle.dumps({"tool_calls": [call.as_dict() for call in turn.calls]})  # what the scoring pool sends is shallow


def test_a_turn_runs_at_most_max_tool_calls_per_turn_calls(environment):
    (replies,), (episode,) = answers(environment, "".join(call("add", a=i, b=1) for i in range(12)))
    assert replies == ["1", "2", "3", "4", "error: this turn made 12 tool calls; only the first 4 ran (max_tool_calls_per_turn)"]
    assert [c.error is None for c in episode.calls] == [True] * 4 + [False]


def test_calls_run_in_parallel(environment):
    (replies, _) = answers(environment, *[call("clock", seconds=1.5) for _ in range(4)])
    spans = [tuple(map(float, reply.split())) for (reply,) in replies]  # (start, end) of each call's sleep
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans  # all four were running at once


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"tools": ["calculater"]}, "tools: unknown tool 'calculater'. Did you mean 'calculator'"),
        ({"environment": "tool"}, "environment: unknown environment 'tool'. Did you mean 'tools'"),
        ({"environment": "tools"}, "environment is tools but tools is empty"),
        ({"tools": ["calculator"], "max_turns": 0}, "max_turns = 0: must be at least 1"),
        ({"tools": ["calculator"], "max_turn_tokens": 49}, r"max_turn_tokens = 49: must lie in \[1, max_dec_len \(48\)\]"),
        ({"tools": ["calculator"], "tool_timeout": 0}, "tool_timeout = 0"),
    ],
)
def test_tool_keys_are_checked_before_anything_loads(tmp_path, keys, message):
    config = json.loads(Path("config/tiny/grpo_argument.json").read_text())
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**config, **keys}))
    with pytest.raises(ConfigError, match=message):
        load_config([str(path)])
