"""What one isolated tool call costs: seconds per call of the python tool (print(6*7) in a fresh interpreter) and
of a plugin tool (tests/plugins/tool_plugins.py's add), one after another, with the sandbox's default limits.

    .venv/bin/python bench/bench_tool_call.py [--calls 20] [--repo TREE] [--against TREE]

--repo runs another checkout's alignment/ (a worktree of an earlier commit: before and after side by side).
--against TREE times that checkout's alignment/tools/sandbox.py too, its calls alternating with this one's call by
call, so that both meet the same load on a shared machine.
Prints one JSON object: the median and the fastest seconds per call of each kind (under "against", TREE's).
"""

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def sandbox_of(tree: str):
    """Another checkout's sandbox module, loaded beside this one's (its children import that checkout's alignment/)."""
    spec = importlib.util.spec_from_file_location("sandbox_against", Path(tree) / "alignment" / "tools" / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(calls: dict, count: int) -> dict:
    """name -> call, each called `count` times, alternating -> name -> its median and fastest seconds."""
    seconds = {name: [] for name in calls}
    for _ in range(count):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - started)
    return {name: {"median_s": round(statistics.median(each), 4), "fastest_s": round(min(each), 4)} for name, each in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repo", default=str(BENCH.parent), help="the checkout whose alignment/ runs the calls")
    parser.add_argument("--against", help="another checkout whose sandbox runs every other call")
    args = parser.parse_args()
    sys.path.insert(0, args.repo)
    from alignment.basics.plugins import plugin_sources
    from alignment.tools import sandbox

    modules = {"this": sandbox, **({"against": sandbox_of(args.against)} if args.against else {})}
    sources = plugin_sources([str(BENCH.parent / "tests" / "plugins" / "tool_plugins.py")])
    for module in modules.values():
        limits = module.SandboxLimits()
        assert module.run_python("print(6*7)", limits).stdout.strip() == "42"
        assert module.call_in_sandbox(sources, "add", {"a": 2, "b": 40}, limits).stdout == "42"
    python = timed({name: lambda m=m: m.run_python("print(6*7)", m.SandboxLimits()) for name, m in modules.items()}, args.calls)
    add = {name: lambda m=m: m.call_in_sandbox(sources, "add", {"a": 2, "b": 40}, m.SandboxLimits()) for name, m in modules.items()}
    plugin = timed(add, args.calls)
    print(json.dumps({"repo": args.repo, "python_tool": python.pop("this"), "plugin_tool": plugin.pop("this"),
                      **({"against": {"repo": args.against, "python_tool": python["against"], "plugin_tool": plugin["against"]}}
                         if args.against else {})}))


if __name__ == "__main__":
    main()
