"""Helpers for tests that start real server processes."""

import subprocess


def stop(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within timeout seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
