"""A request's JSON body, bounded before it is parsed and parsed off the event loop.

FastAPI parses a body with json.loads on the event loop, then validates it: a 16 MB body of empty objects in an extra
column made 5.6 million dicts (550 MB; six at once 2.1 GB) while /health went unanswered for 0.8 s (5.7 s). Here the
raw bytes are measured first, with no Python object made of them: the strings set aside one by one (each found in C,
the event loop's thread getting its turn between them), then the commas and brackets of what is left counted and the
nesting measured in C and numpy. A body with more values or deeper nesting than the
server takes (--max_json_values, --max_json_depth) is refused with a 422 naming the field where it went past; the
parse itself runs in a worker thread.
"""

import json
import re

import anyio.to_thread
import numpy as np
from fastapi import HTTPException, Request
from fastapi.routing import APIRoute

STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"')  # a JSON string, escapes included
TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[][{}:,]')  # a string, or a character of the structure
NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))  # bytes.translate deletes these: the brackets stay
MAX_JSON_VALUES = 1 << 18  # a body's values (64 an item at the most items a request may hold, 4,096): 20 MB as empty dicts
# a body's nesting: the trainer's data rows and tool-call arguments nest up to 64 levels (alignment/basics/data.py,
# alignment/tools/calls.py), to which a request adds the body, items, an item, tool_calls, a call and its arguments
MAX_JSON_DEPTH = 100


class BoundedRequest(Request):
    """A Request whose json() measures the body (check_shape) and parses it in a worker thread, one body at a time (a
    thread more would only wait for the GIL, and hold its body's copies meanwhile)."""

    async def json(self):
        if not hasattr(self, "_json"):
            body, state = await self.body(), self.app.state
            if not hasattr(state, "parsing"):
                state.parsing = anyio.CapacityLimiter(1)  # made inside the event loop, as anyio wants
            self._json = await anyio.to_thread.run_sync(parse, body, *state.json_limits, limiter=state.parsing)
        return self._json


class BoundedRoute(APIRoute):
    """The app's routes read their JSON bodies through BoundedRequest (FastAPI's documented custom-request pattern)."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def bounded(request: Request):
            return await handler(BoundedRequest(request.scope, request.receive))

        return bounded


def parse(body: bytes, max_values: int, max_depth: int):
    """The body's JSON, once check_shape let it through; HTTPException 422 naming the field otherwise (FastAPI turns
    a JSONDecodeError into its own 422)."""
    if why := check_shape(body, max_values, max_depth):
        raise HTTPException(422, f"invalid request: {why}")
    return json.loads(body)


def check_shape(body: bytes, max_values: int, max_depth: int):
    """None when the body's JSON holds at most max_values values nested at most max_depth deep, else what went past
    and where. Values are counted as commas + opening brackets + 1, which no valid JSON text with more values has
    fewer of; strings are at most two a value (a key and its value), so a body with more is over at once."""
    rest = _without_strings(body, 2 * max_values + 2)  # numbers, literals, whitespace and the structure
    if rest is None:
        return _first_excess(body, max_values, max_depth)
    brackets = rest.translate(None, NOT_BRACKETS)
    if rest.count(b",") + brackets.count(b"{") + brackets.count(b"[") + 1 > max_values:
        return _first_excess(body, max_values, max_depth)
    steps = np.frombuffer(brackets, np.uint8)
    if steps.size and np.cumsum(np.where((steps == ord("{")) | (steps == ord("[")), 1, -1), dtype=np.int64).max() > max_depth:
        return _first_excess(body, max_values, max_depth)
    return None


def _without_strings(body: bytes, most: int) -> bytes | None:
    """The body with its strings taken out, or None where it holds more than `most` of them. String by string (each
    found in C), so that the event loop's thread gets its turn between them: one regular expression over the whole
    body would hold the GIL for as long as json.loads does."""
    kept, last, count = [], 0, 0
    while (start := body.find(b'"', last)) >= 0:
        count += 1
        if count > most:
            return None
        kept.append(body[last:start])
        string = STRING.match(body, start)
        last = string.end() if string else len(body)  # an unterminated string: json.loads will say so
    kept.append(body[last:])
    return b"".join(kept)


def _first_excess(body: bytes, max_values: int, max_depth: int) -> str:
    """Walks the body's tokens up to the first value past max_values or nesting past max_depth -> what and where,
    as the field's path (items.3.tests). Called only for a body check_shape refuses: the walk is bounded by the limits."""
    stack: list = []  # per open container: [its key in its parent or its index, expecting a key (objects)]
    values, strings = 1, 0
    for match in TOKEN.finditer(body):
        token = match.group()
        if token in (b"{", b"["):
            if len(stack) == max_depth:
                return f"{_path(stack)}: nested deeper than {max_depth} levels (--max_json_depth)"
            stack.append([None if token == b"{" else 0, token == b"{"])
            values += 1
        elif token in (b"}", b"]"):
            if stack:
                stack.pop()
        elif token == b",":
            values += 1
            if stack and isinstance(stack[-1][0], int):  # the next item of an array
                stack[-1][0] += 1
            elif stack:  # the next member of an object: its key comes first
                stack[-1][1] = True
        elif token != b":":  # a string: a key where an object expects one
            strings += 1
            if strings > 2 * max_values + 2:
                return f"{_path(stack)}: the request holds more than {2 * max_values + 2} strings, so more than {max_values} JSON values " \
                       "(--max_json_values)"
            if stack and stack[-1][1]:
                stack[-1][0], stack[-1][1] = _key(token), False
        if values > max_values:
            return f"{_path(stack)}: the request holds more than {max_values} JSON values (--max_json_values)"
    return f"the body holds more than {max_values} JSON values or nests deeper than {max_depth} levels"


def _key(token: bytes) -> str:
    try:
        return json.loads(token)
    except ValueError:
        return token.decode("utf-8", "replace")


def _path(stack: list) -> str:
    return ".".join(str(frame[0]) for frame in stack if frame[0] is not None) or "the body"
