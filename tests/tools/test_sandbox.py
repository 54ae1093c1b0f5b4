"""The sandbox every python and plugin tool call runs in (alignment/tools/sandbox.py): real child processes isolated
by bubblewrap, each limit reached for real, and hostile code, run through the tools environment as a run runs it,
trying the ways out that an audit hook did not stop (the ones found against the last version, and more)."""

import ast
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from pyseccomp import Arch, resolve_syscall

import alignment
from alignment.basics.errors import ConfigError
from alignment.config.cli import load_config
from alignment.basics.plugins import load_plugins, plugin_sources
from alignment.tools import Episode, ToolSettings, get_environment
from alignment.tools.sandbox import SandboxLimits, call_in_sandbox, isolation_missing, run_python

LIMITS = SandboxLimits(seconds=2.0, memory_mb=256, output_bytes=4096, file_mb=16, disk_mb=24, processes=8)
PLUGINS = "tests/plugins/tool_plugins.py"
# system calls a tool never needs, which the sandbox's seccomp filter refuses (io_uring: a large kernel surface)
REFUSED = ("mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "clone", "ptrace", "process_vm_writev", "kexec_load",
           "kexec_file_load", "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "init_module", "finit_module",
           "delete_module", "swapon", "swapoff", "reboot", "userfaultfd", "open_by_handle_at", "io_uring_setup")


@pytest.fixture(scope="module", autouse=True)
def isolation():
    if isolation_missing():
        pytest.skip(f"the sandbox cannot isolate here: {isolation_missing()}")


@pytest.fixture(scope="module")
def environment():
    """The tools environment with the python tool, as a run with `tools: [python]` builds it."""
    load_plugins([PLUGINS])
    settings = ToolSettings(tools=("python", "add"), limits=LIMITS, plugin_sources=tuple(plugin_sources([PLUGINS])), parallel=4)
    return get_environment("tools").factory(settings)


def python_call(environment, code: str) -> str:
    """The model's turn calling the python tool with `code` -> the answer the model reads."""
    turn = f'<tool_call>{json.dumps({"name": "python", "arguments": {"code": code}})}</tool_call>'
    (reply,) = environment.reply([Episode(sample={}, turns=[turn])])
    return reply[0]["content"]


def test_the_code_runs_in_a_private_folder_of_its_own():
    result = run_python("import os; open('note.txt', 'w').write('kept'); print(open('note.txt').read(), os.getcwd(), os.getuid())", LIMITS)
    assert result.error() is None and result.exit_code == 0
    assert result.stdout.split() == ["kept", "/sandbox", "65534"]  # nobody, in a folder of its own


@pytest.mark.parametrize(
    "code, error",
    [
        ("print(", "exited with code 1: SyntaxError"),
        ("raise ValueError('no')", "exited with code 1: ValueError: no"),
        ("import os; os.abort()", "was killed by SIGABRT"),
        ("x = bytearray(2 * 1024**3)", "ran out of memory (256 MB limit, tool_memory_mb)"),
        ("open('big', 'wb').write(b'x' * 32 * 2**20)", "exited with code 1: OSError: [Errno 27] File too large"),  # file_mb 16
        # disk_mb 24
        ("for i in range(3): open(f'f{i}', 'wb').write(b'x' * 10 * 2**20)",
         "exited with code 1: OSError: [Errno 28] No space left on device"),
    ],
)
def test_failures_are_one_sentence(code, error):
    assert run_python(code, LIMITS).error().startswith(error)


def test_a_hang_is_killed_at_the_time_limit_with_what_it_started():
    result = run_python("import time\nwhile True: time.sleep(0.01)", LIMITS)  # without the limit: for ever
    assert result.timed_out and result.exit_code is None and result.error() == "timed out after 2 s (tool_timeout)"
    assert LIMITS.seconds <= result.seconds < LIMITS.seconds + 30


def test_a_flood_is_stopped_at_the_output_limit_without_reading_it_all():
    # 10 MB over 10 s: read to its end, the call would meet the 2 s time limit instead
    flood = "import sys, time\nfor _ in range(1000): sys.stdout.write('x' * 10**4); sys.stdout.flush(); time.sleep(0.01)"
    result = run_python(flood, LIMITS)
    assert result.output_truncated and len(result.stdout) + len(result.stderr) <= LIMITS.output_bytes
    assert result.error().startswith("printed more than 4096 bytes") and not result.timed_out


# --- hostile code, through the tools environment ---------------------------------------------------------


def test_the_host_is_read_only_and_mostly_absent(environment, tmp_path):
    """Of the host's /etc, /home, /run, /tmp and /var the code sees only what the sandbox binds read-only on purpose
    (the Python installation, the virtual environment and the package at their own paths, which are under /tmp or /home
    where the checkout is) and the folders on the way to them; none of its writes reaches the host."""
    target, kept = tmp_path / "escaped.txt", tmp_path / "kept.txt"
    kept.write_text("mine")
    bound = sorted({place(path) for path in (sys.base_prefix, sys.prefix, os.path.dirname(alignment.__file__))
                    for place in (os.path.realpath, os.path.abspath)})  # a symlinked .venv: at both its paths
    code = f"""
import json, os
tries = {{}}
for name, attempt in [
    ("open", lambda: open({str(target)!r}, "w")),
    ("dir_fd create", lambda: os.open("escaped.txt", os.O_CREAT | os.O_WRONLY, dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY))),
    ("dir_fd rename", lambda: os.rename("kept.txt", "moved.txt", src_dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY))),
    ("remove", lambda: os.remove({str(kept)!r})),
    ("write /usr", lambda: open("/usr/grpo-escape", "w")),
    *[("write " + path, lambda path=path: open(os.path.join(path, "grpo-escape"), "w")) for path in {bound!r}],
    ("read /etc/shadow", lambda: open("/etc/shadow").read()),
]:
    try:
        attempt()
        tries[name] = "done"
    except OSError as error:
        tries[name] = type(error).__name__
seen = []  # every path under the five folders, without descending into the bound ones
for top in ("/etc", "/home", "/run", "/tmp", "/var"):
    if os.path.realpath(top) == os.getcwd():  # the call's own private folder (/tmp, where no bound path is under it)
        continue
    for folder, folders, files in os.walk(top):
        seen += [os.path.join(folder, name) for name in folders + files]
        folders[:] = [name for name in folders if os.path.join(folder, name) not in {bound!r}]
print(json.dumps({{"tries": tries, "seen": seen[:40], "count": len(seen)}}))  # 40: within the output limit
"""
    answer = python_call(environment, code)
    assert answer.startswith("{"), answer
    tries, seen, count = json.loads(answer).values()
    assert "done" not in tries.values() and len(tries) == 6 + len(bound), tries
    on_the_way = {str(folder) for path in bound for folder in Path(path).parents}  # the folders bwrap makes to mount them on
    beyond = sorted(set(seen) - set(bound) - on_the_way)
    assert not beyond and count == len(seen), f"{count} paths, the host's own besides the binds {bound} and the folders to them: {beyond}"
    assert kept.read_text() == "mine" and not target.exists() and not (tmp_path / "moved.txt").exists()


def host_status(name: str, call: threading.Thread) -> dict:
    """/proc/PID/status, as this process sees it, of the first process named `name` to appear while `call` runs."""
    while call.is_alive():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if open(f"/proc/{pid}/comm").read().strip() == name:
                    return dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
            except OSError:  # gone meanwhile
                pass
        time.sleep(0.005)
    return {}


def test_as_root_or_not_the_code_holds_no_privilege_on_the_host(environment):
    # the escape found as root: the sandbox's nobody was the host's uid 0 and /proc/sys was writable, so the model's
    # code could set kernel.core_pattern to a pipe that the kernel runs as root outside every namespace. Here the
    # write puts back the value it read (harmless); each call a tool never needs is made with null arguments
    # (unfiltered, several succeed: unshare, ptrace, io_uring); and the ids the code has on the host are read from the
    # host's /proc while it waits under a name of its own (inside, a nested user namespace hides them)
    numbers, name = {name: resolve_syscall(Arch.NATIVE, name) for name in REFUSED}, f"grpo{uuid.uuid4().hex[:11]}"
    code = f"""
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, {name.encode()!r})  # PR_SET_NAME
time.sleep(0.3)  # long enough for the host to find it; the call has 2 s in all
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
def attempt(action):
    try:
        action(); return "done"
    except OSError as error:
        return errno.errorcode[error.errno]
def write_back(path):
    value = open(path).read()
    with open(path, "w") as sysctl:
        sysctl.write(value)
def call(number, *arguments):  # -> "done" or the errno's name
    result = libc.syscall(number, *arguments, *[0] * (5 - len(arguments)))
    if result == 0 and number == {numbers["clone"]}:  # the child of a clone that went through
        os._exit(0)
    return "done" if result >= 0 else errno.errorcode[ctypes.get_errno()]
io_uring_params = ctypes.create_string_buffer(120)
print({{
    **{{key: status[key].strip() for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")}},
    "core_pattern": attempt(lambda: write_back("/proc/sys/kernel/core_pattern")),
    "sysrq-trigger": attempt(lambda: open("/proc/sysrq-trigger", "w")),
    "unshare a user namespace": call({numbers["unshare"]}, 0x10000000),
    "clone into a user namespace": call({numbers["clone"]}, 0x10000000 | 17),
    "io_uring_setup": call({numbers["io_uring_setup"]}, 1, ctypes.byref(io_uring_params)),
    **{{name: call(number) for name, number in {numbers!r}.items() if name not in ("clone", "io_uring_setup")}},
}})
"""
    answers = []
    call = threading.Thread(target=lambda: answers.append(python_call(environment, code)))
    call.start()
    host = host_status(name, call)
    call.join()
    answer = ast.literal_eval(answers[0])
    assert host, f"no process named {name} appeared: {answer}"
    ids = {int(i) for key in ("Uid", "Gid", "Groups") for i in host[key].split()}  # real, effective, saved, fs; supplementary
    assert 0 not in ids and (os.geteuid() == 0 or ids == {os.geteuid(), os.getegid()}), host  # as root, nobody; else this user
    assert {answer[key] for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}, answer
    assert (answer["NoNewPrivs"], answer["Seccomp"]) == ("1", "2"), answer
    assert answer["core_pattern"] in ("EROFS", "EACCES") and answer["sysrq-trigger"] in ("EROFS", "EACCES", "ENOENT"), answer
    refused = [name for name in answer if name in REFUSED or name.startswith(("unshare ", "clone "))]
    assert {answer[name] for name in refused} == {"EPERM"}, answer  # the seccomp filter's answer to each


def test_no_network_no_unix_socket_of_the_host(environment, tmp_path):
    path, abstract = tmp_path / "host.sock", f"\0grpo-test-{uuid.uuid4().hex}"
    servers = []
    for family, address in ((socket.AF_UNIX, str(path)), (socket.AF_UNIX, abstract), (socket.AF_INET, ("127.0.0.1", 0))):
        server = socket.socket(family)
        server.bind(address)
        server.listen()
        server.setblocking(False)
        servers.append(server)
    port = servers[2].getsockname()[1]
    code = f"""
import socket
tries = []
for family, address in [(socket.AF_UNIX, {str(path)!r}), (socket.AF_UNIX, {abstract!r}), (socket.AF_INET, ("127.0.0.1", {port})),
                        (socket.AF_INET, ("10.255.255.1", 80))]:
    try:
        socket.socket(family).connect(address); tries.append("connected")
    except OSError as error:
        tries.append(type(error).__name__)
print(tries, sorted(name for _, name in socket.if_nameindex()))
"""
    answer = python_call(environment, code)
    assert "connected" not in answer and "['lo']" in answer, answer
    for server in servers:
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the host's sockets
        server.close()


def test_nothing_outside_is_visible_or_killable_and_nothing_outlives_the_call(environment):
    marker = f"grpo-outlive-{uuid.uuid4().hex}"
    code = f"""
import os, signal, subprocess
seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
tries = {{}}
for name, attempt in [("kill {os.getpid()}", lambda: os.kill({os.getpid()}, signal.SIGKILL)),
                      ("pidfd parent", lambda: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL))]:
    try:
        attempt(); tries[name] = "sent"
    except OSError as error:
        tries[name] = type(error).__name__
subprocess.Popen(["/bin/sh", "-c", "sleep 60 # {marker}"], start_new_session=True)  # setsid: its own session
print(seen, tries)
"""
    answer = python_call(environment, code)
    pids = json.loads(answer.split("] ")[0] + "]")
    assert max(pids) < 50, answer  # its own PID namespace: a handful of processes, numbered from 1
    assert "'kill " + str(os.getpid()) + "': 'ProcessLookupError'" in answer, answer
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert left == "", f"a process outlived the call: {left}"


def test_the_environment_is_empty_and_no_process_shows_another(environment, monkeypatch):
    monkeypatch.setenv("GRPO_REWARD_SERVER_API_KEY", "do-not-leak")
    code = """
import os
def environ(pid):  # as root, the namespace's init is bubblewrap's, the host's uid 0: nobody may not read it
    try:
        return open(f"/proc/{pid}/environ", "rb").read()
    except PermissionError:
        return b""
found = [p for p in os.listdir("/proc") if p.isdigit() and b"do-not-leak" in environ(p)]
print(sorted(os.environ), found)
"""
    answer = python_call(environment, code)
    assert answer.strip() == "['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONIOENCODING', 'PYTHONPATH', 'TMPDIR'] []", answer


def test_a_fork_bomb_meets_the_process_limit(environment):
    code = """
import os, time
children = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(5); os._exit(0)
        children += 1
except OSError as error:
    print(f"stopped after {children}: {type(error).__name__}")
"""
    answer = python_call(environment, code)
    assert answer.startswith("stopped after "), answer
    assert int(answer.split()[2].rstrip(":")) < LIMITS.processes, answer


def test_every_writable_place_is_bounded():
    # the last version bounded its folder, but / and anything made in it (/tmp) and /dev/shm were tmpfs without a size
    code = """
import errno, os
outcome = {}
for place in ("/sandbox", "/tmp", "/dev/shm", "/", "/dev", "/new"):
    try:
        os.makedirs(place, exist_ok=True)
        for i in range(5):  # 50 MB in files of 10 (file_mb is 16)
            with open(os.path.join(place, f"filler{i}"), "wb") as filler:
                filler.write(b"x" * 10 * 2**20)
        outcome[place] = "done"
    except OSError as error:
        outcome[place] = errno.errorcode[error.errno]
    for name in [name for name in os.listdir(place) if name.startswith("filler")] if os.path.isdir(place) else []:
        os.remove(os.path.join(place, name))
print(outcome)
"""
    outcome = ast.literal_eval(run_python(code, LIMITS).stdout)  # disk_mb 24
    assert [outcome[place] for place in ("/sandbox", "/dev/shm")] == ["ENOSPC"] * 2, outcome
    # /tmp: the private folder, or read-only where the checkout is under /tmp (its bound paths are there)
    assert {outcome[place] for place in ("/tmp", "/", "/dev", "/new")} <= {"EROFS", "EACCES", "ENOSPC"}, outcome


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="as a user, a call's memory and CPU are bounded per process (docs/security.md)")


@ROOT_ONLY
def test_memory_is_bounded_for_the_call_as_a_whole():
    # the last version's tool_memory_mb was each process's address space: 8 processes x 400 MB passed under 512 MB
    code = """
import os, time
children = []
for _ in range(8):
    if (pid := os.fork()) == 0:
        block = bytearray(b"x") * (400 * 2**20)  # every page written
        time.sleep(2)
        os._exit(0)
    children.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
"""
    result = run_python(code, SandboxLimits(seconds=20, memory_mb=512, disk_mb=24))
    exits = json.loads(result.stdout)
    assert exits.count(0) <= 1 and set(exits) <= {0, -9} and result.out_of_memory, result  # the rest killed by the call's limit


@ROOT_ONLY
def test_a_call_uses_one_core_at_most():
    # the last version let one call keep both cores busy
    code = """
import os, time
until = time.monotonic() + 2
children = []
for _ in range(2):
    if (pid := os.fork()) == 0:
        while time.monotonic() < until:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print((os.times().children_user + os.times().children_system) / 2)  # the cores the two used over their 2 s
"""
    cores = float(run_python(code, SandboxLimits(seconds=20, processes=8)).stdout)
    assert cores < 1.2, cores


def test_a_plugin_tool_runs_in_the_sandbox_and_its_prints_are_not_its_answer():
    sources = plugin_sources([PLUGINS])
    result = call_in_sandbox(sources, "add", {"a": 2, "b": 40}, LIMITS)
    assert result.error() is None and result.stdout == "42"
    assert call_in_sandbox(sources, "sleepy", {"seconds": 30}, LIMITS).timed_out
    assert call_in_sandbox(sources, "flood", {"megabytes": 10}, LIMITS).output_truncated
    assert call_in_sandbox(sources, "crash", {"code": 0}, LIMITS).error() == "was killed by SIGABRT"
    assert "TypeError: unsupported operand" in call_in_sandbox(sources, "add", {"a": 2, "b": "x"}, LIMITS).error()


# --- where the machine cannot isolate ------------------------------------------------------------------------


def test_without_bubblewrap_the_python_tool_refuses_to_start_naming_what_is_missing(monkeypatch):
    from alignment.tools import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation_missing.cache_clear()
    try:
        with pytest.raises(
            ConfigError,
            match=r"tools: python run\(s\) code in a child process that must be isolated from this machine, "
            r"and here bubblewrap \(bwrap\) is not installed: apt-get install bubblewrap .*set tool_isolation none",
        ):
            load_config(["config/tiny_tools/grpo_argument.json", "--tools", "python", "calculator"])
        assert load_config(["config/tiny_tools/grpo_argument.json", "--tools", "calculator"]).tools == ["calculator"]  # runs in process
        unisolated = load_config(["config/tiny_tools/grpo_argument.json", "--tools", "python", "--tool_isolation", "none"])
        limits = SandboxLimits(seconds=5, isolated=unisolated.tool_isolation == "bwrap")
        result = run_python("import os; print(os.getuid() == %d)" % os.getuid(), limits)  # the user's own process: the opt-in
        assert result.stdout.strip() == "True"
    finally:
        sandbox.isolation_missing.cache_clear()


@ROOT_ONLY
def test_as_root_without_cgroups_for_the_call_the_python_tool_refuses_to_start(monkeypatch):
    from alignment.tools import sandbox

    monkeypatch.setattr(sandbox, "CGROUPS", Path("/nonexistent"))  # no hierarchy: as a container that has none writable
    sandbox.isolation_missing.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"tools: python run\(s\) code .* and here as root a call's processes, memory and CPU are "
                           r"bounded by cgroups of its own, and no writable hierarchy has pids, memory, cpu .*set tool_isolation none"):
            load_config(["config/tiny_tools/grpo_argument.json", "--tools", "python"])
    finally:
        sandbox.isolation_missing.cache_clear()


def test_a_call_runs_alongside_others_without_sharing_their_folder():
    results = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                run_python(
                    f"open('mine', 'w').write('{i}'); import time; time.sleep(0.5); print(open('mine').read())", LIMITS
                ).stdout.strip()
            )
        )
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["0", "1", "2"]
