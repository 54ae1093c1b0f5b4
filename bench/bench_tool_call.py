"""What one isolated tool call costs: seconds per call of the python tool (print(6*7) in a fresh interpreter) and
of a plugin tool (tests/plugins/tool_plugins.py's add), one after another, with the sandbox's default limits.

    .venv/bin/python bench/bench_tool_call.py [--calls 20] [--repo TREE]

--repo runs another checkout's alignment/ (a worktree of an earlier commit: before and after side by side).
Prints one JSON object: the median and the fastest seconds per call of each kind.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def timed(call, count: int) -> dict:
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return {"median_s": round(statistics.median(seconds), 4), "fastest_s": round(min(seconds), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repo", default=str(BENCH.parent), help="the checkout whose alignment/ runs the calls")
    args = parser.parse_args()
    sys.path.insert(0, args.repo)
    from alignment.run.plugins import plugin_sources
    from alignment.tools.sandbox import SandboxLimits, call_in_sandbox, run_python

    limits, sources = SandboxLimits(), plugin_sources([str(BENCH.parent / "tests" / "plugins" / "tool_plugins.py")])
    assert run_python("print(6*7)", limits).stdout.strip() == "42"
    assert call_in_sandbox(sources, "add", {"a": 2, "b": 40}, limits).stdout == "42"
    print(json.dumps({
        "repo": args.repo,
        "python_tool": timed(lambda: run_python("print(6*7)", limits), args.calls),
        "plugin_tool": timed(lambda: call_in_sandbox(sources, "add", {"a": 2, "b": 40}, limits), args.calls),
    }))


if __name__ == "__main__":
    main()
