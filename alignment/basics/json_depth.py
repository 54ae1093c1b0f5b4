"""How deep JSON from outside (a dataset row, a model's tool call) nests, measured before it is parsed.

Every walk of parsed JSON recurses a level at a time (the parser, pickling a sample to the scoring pool, json.dumps
of a record), and Python's limit of 1,000 frames broke pickling at 600 levels. Real rows nest a few."""

import re
from typing import Optional

MAX_JSON_DEPTH = 64
# A JSON string with its escapes ("a\\"b"): what json_too_deep skips, so that brackets inside strings do not count.
JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_too_deep(text: str) -> Optional[int]:
    """How deep JSON text nests arrays and objects where that is over MAX_JSON_DEPTH, else None; read off its brackets
    outside strings without parsing it (a parser recurses once a level). Text that is not JSON may get a number too:
    it is refused either way."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:  # most rows: too few brackets to be deep
        return None
    # numpy only here: the tools' sandboxed processes import this module, and numpy would double their start-up time
    import numpy as np

    # brackets are ASCII, in UTF-8 too; a lone surrogate (arguments parsed from "\\ud800") passes as its three bytes
    chars = np.frombuffer(JSON_STRING.sub("", text).encode("utf-8", "surrogatepass"), np.int8)
    steps = (chars == ord("[")).view(np.int8) + (chars == ord("{")) - (chars == ord("]")) - (chars == ord("}"))
    depth = int(np.cumsum(steps, dtype=np.int32).max(initial=0))
    return depth if depth > MAX_JSON_DEPTH else None
