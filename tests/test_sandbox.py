"""The sandbox every python and plugin tool call runs in (alignment/tools/sandbox.py): real child processes, each
limit reached for real."""

import os
import socket

import pytest

from alignment.plugins import plugin_sources
from alignment.tools.sandbox import SandboxLimits, call_in_sandbox, network_namespace, run_python

LIMITS = SandboxLimits(seconds=2.0, memory_mb=256, output_bytes=4096)
PLUGINS = "tests/plugins/tool_plugins.py"


def test_the_code_runs_in_a_fresh_folder_that_is_removed_after():
    result = run_python("import os; open('note.txt', 'w').write('kept'); print(open('note.txt').read(), os.getcwd())", LIMITS)
    assert result.error() is None and result.exit_code == 0
    text, folder = result.stdout.split()
    assert text == "kept" and os.path.basename(folder).startswith("grpo-tool-") and not os.path.exists(folder)


@pytest.mark.parametrize(
    "code, error",
    [
        ("print(", "exited with code 1: SyntaxError"),
        ("raise ValueError('no')", "exited with code 1: ValueError: no"),
        ("import os; os.abort()", "was killed by SIGABRT"),
        ("x = bytearray(2 * 1024**3)", "ran out of memory (256 MB limit, tool_memory_mb)"),
        ("open('big', 'wb').write(b'x' * 32 * 2**20)", "exited with code 1: OSError: [Errno 27] File too large"),  # file_mb 16
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


def test_the_environment_is_empty(monkeypatch):
    monkeypatch.setenv("GRPO_SECRET_TOKEN", "do-not-leak")
    result = run_python("import os; print(sorted(os.environ))", LIMITS)
    assert "GRPO_SECRET_TOKEN" not in result.stdout and "PYTHONPATH" not in result.stdout


def test_nothing_is_written_outside_the_folder(tmp_path):
    target = tmp_path / "escaped.txt"
    for code in [f"open({str(target)!r}, 'w').write('x')", f"import os; os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)",
                 f"import shutil; shutil.copyfile('/etc/hostname', {str(target)!r})"]:
        result = run_python(code, LIMITS)
        assert "PermissionError: the sandbox does not allow" in result.stderr, code
    (tmp_path / "kept.txt").write_text("mine")
    result = run_python(f"import os; os.remove({str(tmp_path / 'kept.txt')!r})", LIMITS)
    assert "PermissionError" in result.stderr and (tmp_path / "kept.txt").read_text() == "mine"
    assert not target.exists()


def test_no_network_no_subprocesses_no_ctypes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        result = run_python(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)", LIMITS)
        assert "PermissionError: the sandbox does not allow socket" in result.stderr
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing connected
    for code, event in [("import subprocess; subprocess.run(['true'])", "subprocess.Popen"), ("import os; os.system('true')", "os.system"),
                        ("import os; os.fork()", "os.fork"), ("import ctypes; ctypes.CDLL(None)", "ctypes.dlopen")]:
        assert f"PermissionError: the sandbox does not allow {event}" in run_python(code, LIMITS).stderr


@pytest.mark.skipif(not network_namespace(), reason="unshare -rn is not allowed here: the audit hook alone refuses sockets")
def test_where_the_kernel_allows_it_the_child_has_no_network_at_all():
    code = "import socket; print(sorted(name for _, name in socket.if_nameindex()))"  # no socket is created
    assert run_python(code, LIMITS).stdout.strip() == "['lo']"


def test_a_plugin_tool_runs_in_the_sandbox_and_its_prints_are_not_its_answer():
    sources = plugin_sources([PLUGINS])
    result = call_in_sandbox(sources, "add", {"a": 2, "b": 40}, LIMITS)
    assert result.error() is None and result.stdout == "42"
    assert call_in_sandbox(sources, "sleepy", {"seconds": 30}, LIMITS).timed_out
    assert call_in_sandbox(sources, "flood", {"megabytes": 10}, LIMITS).output_truncated
    assert call_in_sandbox(sources, "crash", {"code": 0}, LIMITS).error() == "was killed by SIGABRT"
    assert "TypeError: unsupported operand" in call_in_sandbox(sources, "add", {"a": 2, "b": "x"}, LIMITS).error()
