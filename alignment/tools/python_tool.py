"""The built-in `python` tool: the model's code runs as a script in a fresh interpreter under the sandbox's limits
(alignment/tools/sandbox.py says what they are and what they do not cover); the model reads what it printed."""

from alignment.tools.registry import ToolError, register_tool


def run(arguments: dict, limits) -> str:
    from alignment.tools.sandbox import run_python

    result = run_python(arguments["code"], limits)
    error = result.error()
    if error:
        raise ToolError(f"{error}" + (f"\noutput before it:\n{result.stdout}" if result.stdout else ""))
    return result.stdout


def python(code: str) -> str:
    """Runs Python code in a fresh interpreter and returns what it printed (no network, a temporary folder, time and memory limits).

    Args:
        code: a Python script; print what you want to read back
    """
    from alignment.tools.sandbox import SandboxLimits

    return run({"code": code}, SandboxLimits())


register_tool("python", runner=run)(python)
