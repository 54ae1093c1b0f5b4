"""Where tools run: every python and plugin tool call in a child process that the operating system isolates
(bubblewrap, the sandbox Flatpak uses), so that code a model wrote can neither see nor touch the host, and a call
that hangs, crashes, floods its output or exhausts memory costs that call an error, never the run.

What the child gets (bwrap --die-with-parent --new-session, run with an empty environment):
- an unprivileged uid on the host: as a user, a user namespace whose nobody is that user; as root, no user namespace
  (its uid 0 would be the host's: the last version's nobody could write the host's /proc/sys), and setpriv makes the
  command the host's nobody (uid and gid 65534, no groups) before Python starts. Either way no capabilities (bounding
  set empty), no_new_privs, and a seccomp filter refusing the system calls a tool never needs (REFUSED_SYSCALLS: mounts
  and namespaces, ptrace, kexec and modules, bpf, the keyring, perf, userfaultfd, io_uring, ...);
- namespaces of its own: PID (it sees only its own processes, so nothing outside is visible or can be signalled, and
  every process it starts dies when the call ends, setsid() or not), mount, network (a loopback of its own: no network,
  and no abstract Unix socket of the host), IPC, UTS, cgroup;
- a read-only view of what Python needs and nothing else: /usr (with /bin, /lib, /lib64), the Python installation,
  the environment it runs in (its site-packages) and the project's alignment/ package, /proc of its own PID namespace
  with /proc/sys read-only, no /sys; no /home, /root, /run, /var or /etc of the host, so no file outside those can be
  read and no Unix socket of a host service reached;
- two writable places, each a tmpfs of at most tool_disk_mb: its private folder (its working folder, HOME, TMPDIR,
  and /tmp, a link to it) and /dev/shm; / itself is read-only;
- an empty environment: no variable of the trainer's (an API key) is readable;
- limits: wall-clock seconds (the whole sandbox is killed at tool_timeout), address space of each process (RLIMIT_AS),
  file size (RLIMIT_FSIZE), CPU time of each process (RLIMIT_CPU), output (the child is killed once it has written
  tool_output_bytes). The call as a whole: as root, cgroups of its own bound its processes (tool_processes), its memory
  (tool_memory_mb for all its processes together, plus what its two tmpfs hold) and its CPU (one core); as a user, who
  cannot make cgroups, RLIMIT_NPROC bounds its processes, and its memory and CPU are bounded only per process
  (tool_memory_mb and a core times tool_processes at most).

What it does not stop: an exploit of the kernel through the system calls it allows; reading the files it is shown
(the Python installation, its site-packages, the alignment/ package); a core used for tool_timeout.

Where bubblewrap is missing or cannot make its namespaces, libseccomp is missing, or (as root) setpriv or a writable
pids, memory or cpu cgroup is (isolation_missing() says which), the python tool and plugin tools refuse to start
unless tool_isolation is none, which runs them with the per-process limits only.
"""

import errno
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
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from alignment.basics.errors import IsolationError

PACKAGE = Path(__file__).resolve().parents[1]  # alignment/: a plugin tool's process imports the registry from it
WORKDIR = "/sandbox"  # the private folder's path inside the sandbox
NOBODY = 65534  # the uid and gid a call runs as: as root, the host's own; in a user namespace, the one inside
CGROUPS = Path("/sys/fs/cgroup")  # v2's root, or where v1 mounts one hierarchy per controller
CONTROLLERS = ("pids", "memory", "cpu")  # as root, a call's processes, memory and CPU are bounded together, in groups of its own
CPU_PERIOD_US = 100_000  # the cpu group's quota is one period per period: one core for the call, however many processes
# System calls a tool never needs, refused (EPERM) by the seccomp filter: the kernel's surface an escape goes through
# (mounts and namespaces, other processes' memory, kernel code and BPF programs, the keyring, perf, userfaultfd and
# io_uring, file handles that bypass the mount view, the machine's clock, swap, modules and power)
REFUSED_SYSCALLS = (
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf", "keyctl", "add_key", "request_key", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at", "swapon",
    "swapoff", "reboot", "acct", "quotactl", "syslog", "uselib", "vhangup", "iopl", "ioperm", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "lookup_dcookie",
)
# clone's flags that make namespaces (CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): refused too
NAMESPACE_FLAGS = (0x80, 0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)

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
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash writes no core file and starts no core_pattern handler of the host
    if job["processes"]:  # None where a pids cgroup bounds the call (as root: nobody's count is the whole host's)
        resource.setrlimit(resource.RLIMIT_NPROC, (job["processes"],) * 2)

if job["kind"] == "python":
    code = compile(job["code"], "<tool>", "exec")
    limit()
    del job
    exec(code, {"__name__": "__main__"})
else:
    from alignment.basics.plugins import PluginSource, load_plugin_sources
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
    memory_mb: int = 512  # RLIMIT_AS of each process; as root, all the call's processes together as well (a memory cgroup)
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
    out_of_memory: bool = False  # the call's memory cgroup killed one of its processes

    def error(self) -> Optional[str]:
        """None on success; else one sentence for the model and the logs."""
        if self.timed_out:
            return f"timed out after {self.limits.seconds:g} s (tool_timeout)"
        if self.output_truncated:
            return f"printed more than {self.limits.output_bytes} bytes (tool_output_bytes) and was stopped"
        if self.exit_code == 0:
            return None
        if self.out_of_memory or "MemoryError" in self.stderr:
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
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "as root a call drops to an unprivileged user with setpriv, which is not installed: apt-get install util-linux"
    if os.geteuid() == 0 and (missing := [name for name in CONTROLLERS if name not in _cgroup_roots()]):
        return (f"as root a call's processes, memory and CPU are bounded by cgroups of its own, and no writable hierarchy has "
                f"{', '.join(missing)} (cgroup v1's /sys/fs/cgroup/NAME, or v2's /sys/fs/cgroup with NAME in cgroup.subtree_control)")
    try:
        seccomp = _seccomp_fd()
    except (ImportError, OSError) as error:  # pyseccomp loads libseccomp.so.2 when imported
        return f"the seccomp filter cannot be compiled here ({error}): apt-get install libseccomp2 (Debian, Ubuntu), dnf install libseccomp"
    try:
        trial = subprocess.run(_bwrap(64, ["true"], seccomp), capture_output=True, text=True, timeout=30, env={}, pass_fds=(seccomp,))
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap does not run here ({error})"
    finally:
        os.close(seccomp)
    if trial.returncode != 0:
        return ("bwrap cannot make its namespaces here "
                f"({trial.stderr.strip().splitlines()[-1] if trial.stderr.strip() else trial.returncode}): "
                "unprivileged user namespaces may be off (sysctl kernel.unprivileged_userns_clone=1, or a container that forbids them)")
    return None


def run_python(code: str, limits: SandboxLimits) -> SandboxResult:
    """Runs code as a script in a fresh interpreter, isolated."""
    return _run({"kind": "python", "code": code}, limits)


def call_in_sandbox(plugin_sources: list, tool_name: str, arguments: dict, limits: SandboxLimits) -> SandboxResult:
    """Calls a plugin file's registered tool in a child process; its answer is the result's stdout."""
    job = {"kind": "tool", "plugins": [[s.path, s.text] for s in plugin_sources], "tool": tool_name, "arguments": arguments}
    return _run(job, limits)


def _bwrap(disk_mb: int, command: list, seccomp: int) -> list:
    """The bwrap command line that runs `command` isolated (the module docstring says how), under the compiled seccomp
    filter that file descriptor `seccomp` holds."""
    if os.geteuid() == 0:  # no user namespace: its uid would be the host's 0; setpriv makes the command the host's nobody
        arguments = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                     "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        command = [shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs",
                   "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--", *command]
    else:  # a user namespace whose nobody is this user
        arguments = ["bwrap", "--unshare-all", "--cap-drop", "ALL", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    arguments += ["--die-with-parent", "--new-session", "--clearenv", "--seccomp", str(seccomp), "--ro-bind", "/usr", "/usr",
                  "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):  # merged /usr: symlinks into it; else the folders themselves
        path = Path("/") / top
        if path.is_symlink():
            arguments += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            arguments += ["--ro-bind", str(path), str(path)]
    # each folder at its real path and, where a symlink leads to it (a linked .venv), at the path python is run by too
    binds = {(os.path.realpath(path), place) for path in (sys.base_prefix, sys.prefix, PACKAGE)
             for place in (os.path.realpath(path), os.path.abspath(path))}
    bound = sorted(place for source, place in binds if not place.startswith("/usr/"))
    for source, place in sorted(binds, key=lambda bind: bind[1]):
        if place.startswith("/usr/"):
            continue
        for folder in reversed(Path(place).parents[:-1]):  # the folders on its way open to nobody (bwrap makes them 0700)
            arguments += ["--perms", "0755", "--dir", str(folder)]
        arguments += ["--ro-bind", source, place]
    # the writable places, each a tmpfs of disk_mb; /tmp is the private folder unless a bound path is under it (a
    # checkout in /tmp: then /tmp is read-only, as the rest of / and /dev are; their device nodes stay writable)
    for place in (WORKDIR, "/dev/shm"):
        arguments += ["--size", str(disk_mb * 2**20), "--perms", "1777", "--tmpfs", place]
    if not any(Path("/tmp") in Path(path).parents for path in bound):
        arguments += ["--symlink", WORKDIR, "/tmp"]
    arguments += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR]  # /dev: a tmpfs of the user's own in a user namespace
    for name, value in (("HOME", WORKDIR), ("TMPDIR", WORKDIR), ("LANG", "C.UTF-8"), ("PYTHONIOENCODING", "utf-8"),
                        ("PYTHONPATH", str(PACKAGE.parent)), ("PATH", "/usr/bin:/bin")):
        arguments += ["--setenv", name, value]
    return [*arguments, "--", *command]


@lru_cache(maxsize=1)
def _seccomp_program() -> bytes:
    """The seccomp filter, compiled to BPF by libseccomp: REFUSED_SYSCALLS and clone with a namespace flag get EPERM,
    clone3 ENOSYS (its flags are in memory, which a filter cannot read; glibc then falls back to clone); the rest runs.
    Another architecture's system calls (x86's 32-bit ones on x86_64) kill the process, libseccomp's default. A call
    that this libseccomp predates has no number it knows, and is left out (2.5.4, Debian 12's, knows them all)."""
    import pyseccomp  # only where a tool runs isolated

    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in REFUSED_SYSCALLS:
        if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) != -1:  # -1: unknown to it (other negatives: its pseudo-calls)
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    for flag in NAMESPACE_FLAGS:
        rules.add_rule(pyseccomp.ERRNO(errno.EPERM), "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as program:
        rules.export_bpf(program)
        program.seek(0)
        return program.read()


def _seccomp_fd() -> int:
    """A file descriptor holding the filter, for one bwrap (which reads it to its end)."""
    fd = os.memfd_create("grpo-tool-seccomp")
    os.write(fd, _seccomp_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _cgroup_roots() -> dict:
    """Controller -> the writable hierarchy a call's group of it goes in: v2's root where the controller is in its
    cgroup.subtree_control, else v1's mount of that controller."""
    if (CGROUPS / "cgroup.subtree_control").exists():
        enabled = (CGROUPS / "cgroup.subtree_control").read_text().split()
        roots = {name: CGROUPS for name in CONTROLLERS if name in enabled}
    else:
        roots = {name: CGROUPS / name for name in CONTROLLERS if (CGROUPS / name / "cgroup.procs").exists()}
    return {name: root for name, root in roots.items() if os.access(root, os.W_OK)}


def _call_cgroups(limits: SandboxLimits) -> list:
    """The call's own groups (v1: one in each hierarchy; v2: one), made with its limits: processes (+ bwrap and the
    namespace's init), memory (its processes together, with the tmpfs files it writes, which the kernel charges to it:
    memory_mb + both tmpfs, no swap) and CPU (one core)."""
    name, memory, processes = f"grpo-tool-{uuid.uuid4().hex}", (limits.memory_mb + 2 * limits.disk_mb) * 2**20, limits.processes + 2
    settings = {  # v1's files, v2's files -> value; a file the kernel lacks (swap not accounted) is left out
        "pids": ({"pids.max": processes}, {"pids.max": processes}),
        "memory": ({"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}, {"memory.max": memory, "memory.swap.max": 0}),
        "cpu": ({"cpu.cfs_period_us": CPU_PERIOD_US, "cpu.cfs_quota_us": CPU_PERIOD_US}, {"cpu.max": f"{CPU_PERIOD_US} {CPU_PERIOD_US}"}),
    }
    groups = []
    try:
        for controller, root in _cgroup_roots().items():
            group = root / name
            if group not in groups:
                group.mkdir()
                groups.append(group)
            for file, value in settings[controller][root == CGROUPS].items():
                if (group / file).exists():
                    (group / file).write_text(str(value))
    except OSError:
        for group in groups:
            _remove_cgroup(group)
        raise
    return groups


@contextmanager
def _child(python: list, limits: SandboxLimits):
    """-> (command, working folder, environment, fds to pass, the call's cgroups) of the child that runs `python`;
    what it made for the call (folder, cgroups, filter) is removed after."""
    if not limits.isolated:  # tool_isolation none: a fresh folder and the resource limits, no more
        folder = tempfile.mkdtemp(prefix="grpo-tool-")
        environment = {
            "PATH": "/usr/bin:/bin", "HOME": folder, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(PACKAGE.parent)
        }
        try:
            yield python, folder, environment, (), []
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    if isolation_missing():
        raise IsolationError(f"a tool call cannot be isolated here: {isolation_missing()}")
    groups = _call_cgroups(limits) if os.geteuid() == 0 else []
    seccomp = _seccomp_fd()
    try:
        command = _bwrap(limits.disk_mb, python, seccomp)
        if groups:  # bwrap and all it starts in the call's groups, from its first instruction
            procs = [str(group / "cgroup.procs") for group in groups]
            command = ["/bin/sh", "-c", 'for procs; do [ "$procs" = -- ] && break; echo $$ > "$procs" || exit 125; shift; done; '
                       'shift; exec "$@"', "sh", *procs, "--", *command]
        yield command, "/", {}, (seccomp,), groups
    finally:
        os.close(seccomp)
        for group in groups:
            _remove_cgroup(group)


def _run(job: dict, limits: SandboxLimits) -> SandboxResult:
    as_root = limits.isolated and os.geteuid() == 0  # the pids cgroup bounds the processes, not RLIMIT_NPROC
    job = {**job, "memory_mb": limits.memory_mb, "file_mb": limits.file_mb, "cpu_seconds": int(limits.seconds) + 1,
           "processes": None if as_root else limits.processes}
    # the python tool in isolated mode (-I: no PYTHON* variables, no user site-packages); a plugin tool imports the registry
    python = [sys.executable, *(["-I"] if job["kind"] == "python" else []), "-B", "-c", BOOTSTRAP]
    with _child(python, limits) as (command, cwd, environment, fds, groups):
        started = time.monotonic()
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                 env=environment, start_new_session=True, pass_fds=fds)
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
        out_of_memory = any(_oom_kills(group) for group in groups)
    stdout, stderr = (streams[name].decode("utf-8", "replace") for name in ("stdout", "stderr"))
    return SandboxResult(stdout, stderr, exit_code, timed_out, truncated, time.monotonic() - started, limits, out_of_memory)


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


def _oom_kills(group: Path) -> int:
    """How many processes the group's memory limit killed (v2's memory.events, v1's memory.oom_control); 0 elsewhere."""
    for name in ("memory.events", "memory.oom_control"):
        if (group / name).exists():
            counts = dict(line.split() for line in (group / name).read_text().splitlines())
            return int(counts.get("oom_kill", 0))
    return 0


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
