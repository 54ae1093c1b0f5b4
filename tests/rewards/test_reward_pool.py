"""Scoring in process (use_rm_server false): the trainer's scorer runs the rule rewards in worker
processes (alignment/rewards/pool.py), each item under reward_item_timeout, as the reward server does;
the workers end with the scorer or with the process, however it ends."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from alignment.rewards import register_reward
from alignment.run.scorer import build_scorer
from alignment.config.cli import load_config

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "tests" / "plugins" / "server_rewards.py"

pytestmark = pytest.mark.timeout(120)  # a scorer that hangs fails its test instead of the suite


@register_reward("test_pool_in_process_only", "test only: 1.0, registered by this test module, not by a plugin file")
def in_process_only(completion, sample):
    return 1.0


def config(*flags: str):
    return load_config(["config/tiny/grpo_argument.json", "--external_plugins", str(PLUGIN), *flags])


def children() -> set:
    """Process ids whose parent is this process (each thread's children, as Linux lists them)."""
    found = set()
    for listing in Path("/proc/self/task").glob("*/children"):
        try:
            found.update(int(pid) for pid in listing.read_text().split())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def test_a_hanging_item_fails_alone_within_the_time_limit_and_the_others_are_scored():
    rewards = ["--reward_functions", "hang_on_marker", "format", "--reward_function_weights", "1.0", "1.0"]
    score = build_scorer(config(*rewards, "--reward_item_timeout", "1"))
    completions = ["<think>a</think><answer>1</answer>", "HANG", "fine", "HANG <answer>1</answer>", "fine"]
    started = time.monotonic()
    table = score(completions, [{"answer": "1"}] * len(completions))
    assert time.monotonic() - started < 5  # two hung items, each cut at 1 s
    assert table.totals == [2.0, None, 1.0, None, 1.0]  # None: NaN in the step, never 0
    assert table.errors[1] == table.errors[3] == "timed out after 1 s"
    assert table.columns["format"] == [1.0, None, 0.0, None, 0.0]
    assert table.columns["accuracy"] == [1.0, 0.0, 0.0, 1.0, 0.0]  # the accuracy metric, under the same limit
    assert score(["fine"] * 3, [{}] * 3).totals == [1.0] * 3  # the hung workers were replaced


def test_a_sample_too_deep_to_send_fails_alone_and_the_others_are_scored():
    """Rows and tool calls are bounded where they are read; a sample nested deeper still (from a plugin environment,
    say) gets its error instead of failing the batch while it is pickled for a worker (600 levels raised)."""
    score = build_scorer(config("--reward_functions", "format", "--reward_function_weights", "1.0"))
    deep = {"answer": "1", "tool_calls": []}
    for _ in range(600):
        deep["tool_calls"] = [deep["tool_calls"]]
    table = score(["<think>a</think><answer>1</answer>", "fine", "x"], [{"answer": "1"}, deep, {"answer": "1"}])
    assert table.totals == [1.0, None, 0.0]
    assert table.errors == [None, "the sample nests more than 72 levels deep (MAX_SAMPLE_DEPTH); it was not scored", None]


def test_the_workers_end_when_the_scorer_is_dropped():
    before = children()
    score = build_scorer(config("--reward_functions", "format", "--reward_function_weights", "1.0"))
    assert score(["<think>a</think><answer>1</answer>"], [{}]).totals == [1.0]
    workers = children() - before
    assert workers and all(alive(pid) for pid in workers)
    del score
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "workers outlived their scorer"
        time.sleep(0.05)


# A process that scores through a pool and reports its workers' ids; then it exits, or hangs in an item.
POOL_USER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from alignment.basics.plugins import plugin_sources
    from alignment.rewards.pool import ScoringPool

    pool = ScoringPool(2, 3600.0, plugin_sources([sys.argv[2]]))
    pool.start()
    assert pool.submit(["fine"], [{}], ["hang_on_marker"], [1.0]).table().totals == [1.0]
    print(" ".join(p.read_text() for p in Path("/proc/self/task").glob("*/children")), flush=True)
    if sys.argv[1] == "hang":
        pool.submit(["HANG"], [{}], ["hang_on_marker"], [1.0]).table()
    """
)


@pytest.mark.parametrize("end", ["exit", "hang"], ids=["exits", "killed while an item hangs"])
def test_no_worker_outlives_its_process(end):
    command = [sys.executable, "-c", POOL_USER, end, str(PLUGIN)]
    user = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in user.stdout.readline().split()]
    assert len(workers) == 2
    if end == "hang":
        time.sleep(0.5)  # the hanging item is running
        user.send_signal(signal.SIGKILL)  # no atexit, no finalizer: the kernel ends the workers
    assert user.wait(timeout=30) == (0 if end == "exit" else -signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers):
        assert time.monotonic() < deadline, f"workers {workers} outlived their process"
        time.sleep(0.05)


def test_a_reward_registered_by_the_calling_code_is_scored_in_process_with_a_warning():
    # The workers run the built-in rewards and the plugin files, not the code that called train().
    rewards = ["--reward_functions", "test_pool_in_process_only", "--reward_function_weights", "1"]
    with pytest.warns(UserWarning, match=r"\['test_pool_in_process_only'\] are not from a plugin file"):
        score = build_scorer(config(*rewards))
    assert score(["x"], [{"answer": "1"}]).totals == [1.0]
