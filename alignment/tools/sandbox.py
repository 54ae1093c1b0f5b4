"""Where tools run: every python and plugin tool call in a child process that the operating system isolates
(bubblewrap, the sandbox Flatpak uses), so that code a model wrote can neither see nor touch the host, and a call
that hangs, crashes, floods its output or exhausts memory costs that call an error, never the run.

What the child gets (bwrap --unshare-all --die-with-parent --new-session, run with an empty environment):
- namespaces of its own: user (it runs as nobody, with no capabilities), PID (it sees only its own processes, so
  nothing outside is visible or can be signalled, and every process it starts dies when the call ends, setsid() or
  not), mount, network (a loopback of its own: no network, and no abstract Unix socket of the host), IPC, UTS;
- a read-only view of what Python needs and nothing else: /usr (with /bin, /lib, /lib64), the Python installation,
  the environment it runs in (its site-packages) and the project's alignment/ package; no /home, /root, /tmp, /run,
  /var or /etc of the host, so no file outside those can be read and no Unix socket of a host service reached;
- one private writable folder, a tmpfs of at most tool_disk_mb, as its working folder, HOME and TMPDIR;
- an empty environment, and a /proc of its own namespace: no variable of the trainer's (an API key) is readable;
- limits: wall-clock seconds (the whole sandbox is killed at tool_timeout), address space (RLIMIT_AS), file size
  (RLIMIT_FSIZE), CPU time (RLIMIT_CPU), processes (tool_processes: RLIMIT_NPROC; as root, where the kernel does not
  apply that limit, a pids cgroup as well), output (the child is killed once it has written tool_output_bytes).

What it does not stop: an exploit of the kernel itself; reading the files it is shown (the Python installation, its
site-packages, the alignment/ package); CPU time up to the limits (a call may still use a core for tool_timeout).

Where bubblewrap is missing or cannot make its namespaces (isolation_missing() says why), the python tool and plugin
tools refuse to start unless tool_isolation is none, which runs them with the resource limits only.
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
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from alignment.errors import IsolationError

PACKAGE = Path(__file__).resolve().parents[1]  # alignment/: a plugin tool's process imports the registry from it
WORKDIR = "/sandbox"  # the private folder's path inside the sandbox
PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1's pids hierarchy, v2's root

# The child's first code: its input arrives as JSON on stdin. Limits are set before the model's code runs (for a
# plugin tool, after its plugin file is loaded: importing a project's modules needs more address space than the
# tool's own work, and the plugin is the user's code, not the model's).
BOOTSTRAP = r"""
import json, os, resource, sys
job = json.loads(sys.stdin.read())

def limit():
    megabyte = 2**20
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_mb"] * megabyte,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_mb"] * megabyte,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_seconds"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (job["processes"],) * 2)

if job["kind"] == "python":
    code = compile(job["code"], "<tool>", "exec")
    limit()
    del job
    exec(code, {"__name__": "__main__"})
else:
    from alignment.run.plugins import PluginSource, load_plugin_sources
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
    disk_mb: int = 64  # the private folder (a tmpfs): all the call may write
    processes: int = 16  # processes and threads the call may have at once
    isolated: bool = True  # False: tool_isolation none, the resource limits only


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
def isolation_missing() -> Optional[str]:
    """None where a tool call can be isolated here, else what is missing, in a sentence that says how to mend it."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap (Debian, Ubuntu) or dnf install bubblewrap (Fedora)"
    try:
        trial = subprocess.run(_bwrap(64, ["true"]), capture_output=True, text=True, timeout=30, env={})
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap does not run here ({error})"
    if trial.returncode != 0:
        return ("bwrap cannot make its namespaces here "
                f"({trial.stderr.strip().splitlines()[-1] if trial.stderr.strip() else trial.returncode}): "
                "unprivileged user namespaces may be off (sysctl kernel.unprivileged_userns_clone=1, or a container that forbids them)")
    if os.geteuid() == 0 and _pids_cgroup_root() is None:
        return ("as root the kernel does not apply RLIMIT_NPROC inside the sandbox, and no pids cgroup is writable "
                "(/sys/fs/cgroup/pids, or cgroup v2 with the pids controller) to bound the processes of a call")
    return None


def run_python(code: str, limits: SandboxLimits) -> SandboxResult:
    """Runs code as a script in a fresh interpreter, isolated."""
    return _run({"kind": "python", "code": code}, limits)


def call_in_sandbox(plugin_sources: list, tool_name: str, arguments: dict, limits: SandboxLimits) -> SandboxResult:
    """Calls a plugin file's registered tool in a child process; its answer is the result's stdout."""
    job = {"kind": "tool", "plugins": [[s.path, s.text] for s in plugin_sources], "tool": tool_name, "arguments": arguments}
    return _run(job, limits)


def _bwrap(disk_mb: int, command: list) -> list:
    """The bwrap command line that runs `command` isolated (the module docstring says how)."""
    arguments = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
                 "--uid", "65534", "--gid", "65534", "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):  # merged /usr: symlinks into it; else the folders themselves
        path = Path("/") / top
        if path.is_symlink():
            arguments += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            arguments += ["--ro-bind", str(path), str(path)]
    for path in dict.fromkeys(map(os.path.realpath, (sys.base_prefix, sys.prefix, PACKAGE))):
        if not path.startswith("/usr/"):
            arguments += ["--ro-bind", path, path]
    arguments += ["--size", str(disk_mb * 2**20), "--tmpfs", WORKDIR, "--chdir", WORKDIR]
    for name, value in (("HOME", WORKDIR), ("TMPDIR", WORKDIR), ("LANG", "C.UTF-8"), ("PYTHONIOENCODING", "utf-8"),
                        ("PYTHONPATH", str(PACKAGE.parent)), ("PATH", "/usr/bin:/bin")):
        arguments += ["--setenv", name, value]
    return [*arguments, "--", *command]


def _pids_cgroup_root() -> Optional[Path]:
    """A pids cgroup hierarchy this process may make groups in: v1's pids mount, or v2's root with pids enabled."""
    for root in PIDS_CGROUPS:
        if not os.access(root, os.W_OK):
            continue
        if root.name == "pids" and (root / "cgroup.procs").exists():
            return root
        controllers = root / "cgroup.subtree_control"
        if controllers.exists() and "pids" in controllers.read_text().split():
            return root
    return None


def _run(job: dict, limits: SandboxLimits) -> SandboxResult:
    job = {**job, "memory_mb": limits.memory_mb, "file_mb": limits.file_mb, "cpu_seconds": int(limits.seconds) + 1,
           "processes": limits.processes}
    # the python tool in isolated mode (-I: no PYTHON* variables, no user site-packages); a plugin tool imports the registry
    python = [sys.executable, *(["-I"] if job["kind"] == "python" else []), "-B", "-c", BOOTSTRAP]
    cgroup, folder = None, None
    if limits.isolated:
        if isolation_missing():
            raise IsolationError(f"a tool call cannot be isolated here: {isolation_missing()}")
        command = _bwrap(limits.disk_mb, python)
        if os.geteuid() == 0:  # the bwrap process and all it starts in a pids cgroup of this call's own
            cgroup = _pids_cgroup_root() / f"grpo-tool-{uuid.uuid4().hex}"
            cgroup.mkdir()
            (cgroup / "pids.max").write_text(str(limits.processes + 2))  # + bwrap and the namespace's init
            command = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *command]
        cwd, environment = "/", {}
    else:  # tool_isolation none: a fresh folder and the resource limits, no more
        folder = tempfile.mkdtemp(prefix="grpo-tool-")
        cwd = folder
        environment = {
            "PATH": "/usr/bin:/bin", "HOME": folder, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(PACKAGE.parent)
        }
    started = time.monotonic()
    try:
        child = subprocess.Popen(command if limits.isolated else python, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, cwd=cwd, env=environment, start_new_session=True)
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
        if limits.isolated and exit_code is not None and exit_code > 128:  # bwrap exits 128 + N for a child killed by signal N
            exit_code = 128 - exit_code
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        if cgroup:
            _remove_cgroup(cgroup)
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
    """The child's whole process group (its own session: bwrap, and with it the sandbox's PID namespace), even after
    it exited."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()
    child.stdout.close()
    child.stderr.close()


def _remove_cgroup(cgroup: Path) -> None:
    """Once its processes are gone (the namespace's end kills them all, asynchronously): a cgroup with processes
    cannot be removed."""
    for _ in range(200):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(0.01)
