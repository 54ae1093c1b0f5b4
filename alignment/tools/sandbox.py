"""Where tools run: a child process per call with limits, so a call that hangs, crashes, floods its output or
exhausts memory costs that call an error, never the run.

The limits: wall-clock seconds (the child's whole process group is killed), an address-space limit (RLIMIT_AS), a
file-size limit (RLIMIT_FSIZE), a CPU-time backstop (RLIMIT_CPU) and an output limit (the child is killed once it
has written more; a 10 MB print is never read whole). The child runs in a fresh temporary folder, removed after the
call, with an empty environment (no PYTHONPATH, proxies or credentials of the parent's) and no network: a fresh
network namespace (`unshare -rn`) where the kernel lets unprivileged users make one, and everywhere a Python audit
hook that refuses sockets, subprocesses, os.system / exec / fork / kill, ctypes, and writing, creating, renaming or
removing files outside the temporary folder (the code sees PermissionError).

What it does not do: it is no security boundary against code written to escape it. An extension module loaded
before the hook, or a way around the audit events, is not stopped; files the user can read can be read. For
untrusted code at scale, run the whole trainer in a container.
"""

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]

# The child's first code: its input arrives as JSON on stdin. Limits are set and the hook installed before the
# code (or, for a plugin tool, after its plugin file is loaded: importing a project's modules needs more address
# space than the tool's own work, and the plugin is the user's code, not the model's).
BOOTSTRAP = r"""
import json, os, resource, sys
job = json.loads(sys.stdin.read())
folder = os.path.realpath(os.getcwd())

def limit():
    megabyte = 2**20
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_mb"] * megabyte,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_mb"] * megabyte,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_seconds"],) * 2)
    refused = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
               "os.kill", "os.killpg", "ctypes.", "pty.")
    changes = {"os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,),
               "os.chown": (0,), "os.symlink": (0, 1), "os.link": (0, 1), "os.truncate": (0,), "os.utime": (0,),
               "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (0, 1)}
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def outside(path):
        if isinstance(path, int):
            return False
        resolved = os.path.realpath(os.fsdecode(path))
        return resolved != folder and not resolved.startswith(folder + os.sep)

    def hook(event, args):
        if event.startswith(refused):
            raise PermissionError(f"the sandbox does not allow {event}")
        if event == "open" and args[0] is not None:
            mode, flags = args[1] or "", args[2] or 0
            if (any(c in mode for c in "wax+") or flags & writing) and outside(args[0]):
                raise PermissionError(f"the sandbox does not allow writing outside its folder: {args[0]}")
        if event in changes and any(outside(args[i]) for i in changes[event] if i < len(args)):
            raise PermissionError(f"the sandbox does not allow {event} outside its folder")

    sys.addaudithook(hook)

if job["kind"] == "python":
    code = compile(job["code"], "<tool>", "exec")
    limit()
    del job
    exec(code, {"__name__": "__main__"})
else:
    sys.path.insert(0, job["repo"])
    from alignment.plugins import PluginSource, load_plugin_sources
    from alignment.tools.registry import get_tool
    load_plugin_sources([PluginSource(path, text) for path, text in job["plugins"]])
    tool = get_tool(job["tool"])
    limit()
    answer_stream, sys.stdout = sys.stdout, sys.stderr  # the tool's own prints go to stderr, its answer to stdout
    answer = tool.fn(**job["arguments"])
    if not isinstance(answer, str):
        raise TypeError(f"tool {job['tool']!r} returned {type(answer).__name__}, not str")
    answer_stream.write(answer)
"""


@dataclass(frozen=True)
class SandboxLimits:
    seconds: float = 10.0  # wall clock; the child and anything it started are killed at the limit
    memory_mb: int = 512  # RLIMIT_AS of the child
    output_bytes: int = 16_384  # stdout + stderr kept; the child is killed once it has written more
    file_mb: int = 16  # RLIMIT_FSIZE


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: Optional[int]  # None when killed at the time or output limit
    timed_out: bool
    output_truncated: bool
    seconds: float
    limits: SandboxLimits

    def error(self) -> Optional[str]:
        """None on success; else one sentence for the model and the logs."""
        if self.timed_out:
            return f"timed out after {self.limits.seconds:g} s (tool_timeout)"
        if self.output_truncated:
            return f"printed more than {self.limits.output_bytes} bytes (tool_output_bytes) and was stopped"
        if self.exit_code == 0:
            return None
        if "MemoryError" in self.stderr:
            return f"ran out of memory ({self.limits.memory_mb} MB limit, tool_memory_mb)"
        if self.exit_code is not None and self.exit_code < 0:
            return f"was killed by {signal.Signals(-self.exit_code).name}"
        last = next((line for line in reversed(self.stderr.splitlines()) if line.strip()), "")
        return f"exited with code {self.exit_code}" + (f": {last}" if last else "")


@lru_cache(maxsize=1)
def network_namespace() -> bool:
    """Whether `unshare -rn` (a user and a network namespace) works here; containers often forbid it."""
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_python(code: str, limits: SandboxLimits) -> SandboxResult:
    """Runs code as a script in a fresh interpreter (isolated mode: no site packages of the user, no PYTHON* variables)."""
    return _run({"kind": "python", "code": code}, limits, isolated=True)


def call_in_sandbox(plugin_sources: list, tool_name: str, arguments: dict, limits: SandboxLimits) -> SandboxResult:
    """Calls a plugin file's registered tool in a child process; its answer is the result's stdout."""
    job = {"kind": "tool", "repo": str(REPO), "plugins": [[s.path, s.text] for s in plugin_sources], "tool": tool_name, "arguments": arguments}
    return _run(job, limits, isolated=False)


def _run(job: dict, limits: SandboxLimits, isolated: bool) -> SandboxResult:
    job = {**job, "memory_mb": limits.memory_mb, "file_mb": limits.file_mb, "cpu_seconds": int(limits.seconds) + 1}
    command = [sys.executable, *(["-I"] if isolated else []), "-B", "-c", BOOTSTRAP]
    if network_namespace():
        command = ["unshare", "-rn", *command]
    folder = tempfile.mkdtemp(prefix="grpo-tool-")
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": folder, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    started = time.monotonic()
    try:
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=folder,
                                 env=environment, start_new_session=True)
        try:
            child.stdin.write(json.dumps(job).encode())
            child.stdin.close()
        except BrokenPipeError:  # it died at once; its stderr says why
            pass
        streams, timed_out, truncated = _read(child, started + limits.seconds, limits.output_bytes)
        if not (timed_out or truncated):
            try:  # its pipes are closed, but it may still be running
                exit_code = child.wait(max(0.0, started + limits.seconds - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        _kill(child)
        exit_code = None if timed_out or truncated else exit_code
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    stdout, stderr = (streams[name].decode("utf-8", "replace") for name in ("stdout", "stderr"))
    return SandboxResult(stdout, stderr, exit_code, timed_out, truncated, time.monotonic() - started, limits)


def _read(child: subprocess.Popen, deadline: float, cap: int) -> tuple:
    """Both pipes until they close, the deadline passes or more than `cap` bytes came -> (streams, timed out, over cap)."""
    streams = {"stdout": bytearray(), "stderr": bytearray()}
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ, "stdout")
    selector.register(child.stderr, selectors.EVENT_READ, "stderr")
    with selector:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return streams, True, False
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                streams[key.data] += chunk
                if sum(map(len, streams.values())) > cap:
                    for name in streams:
                        del streams[name][cap:]
                    return streams, False, True
    return streams, False, False


def _kill(child: subprocess.Popen) -> None:
    """The child's whole process group (its own session: the child and anything it started), even after it exited."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()
    child.stdout.close()
    child.stderr.close()
