"""The sandbox every python and plugin tool call runs in (alignment/tools/sandbox.py): real child processes isolated
by bubblewrap, each limit reached for real, and hostile code, run through the tools environment as a run runs it,
trying the ways out that an audit hook did not stop (the ones found against the last version, and more)."""

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

import alignment
from alignment.errors import ConfigError
from alignment.run.config import load_config
from alignment.run.plugins import load_plugins, plugin_sources
from alignment.tools import Episode, ToolSettings, get_environment
from alignment.tools.sandbox import SandboxLimits, call_in_sandbox, isolation_missing, run_python

LIMITS = SandboxLimits(seconds=2.0, memory_mb=256, output_bytes=4096, file_mb=16, disk_mb=24, processes=8)
PLUGINS = "tests/plugins/tool_plugins.py"


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
    bound = sorted({os.path.realpath(path) for path in (sys.base_prefix, sys.prefix, os.path.dirname(alignment.__file__))})
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
found = [p for p in os.listdir("/proc") if p.isdigit() and b"do-not-leak" in open(f"/proc/{p}/environ", "rb").read()]
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
