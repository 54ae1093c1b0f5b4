"""The VisualDL dashboard shows a run's scalars: a log written by RunLogger as a run writes it (an evaluation
before the first step), served by the real `visualdl` command, read back through its HTTP API and drawn by
headless Chromium, which opens on the training reward.
Run with `pytest -m browser`; the page test skips where no Chromium is installed (`apt-get install chromium`)."""

import os
import subprocess
import sys
import time

import httpx
import pytest
from helpers.processes import stop
from helpers.reward_servers import free_port

from alignment.storage.dashboards import DashboardSettings
from alignment.step.logger import RunLogger

pytestmark = pytest.mark.browser

# tag -> [(step, value)] as RunLogger writes them: train/* every step, validation/* every eval_steps.
# Values are exact in float32, which is what VisualDL stores.
SCALARS = {
    "train/reward_mean": [(1, 0.25), (2, 0.375), (3, 0.5), (4, 0.625), (5, 0.75)],
    "train/accuracy": [(1, 0.125), (2, 0.25), (3, 0.25), (4, 0.375), (5, 0.5)],
    "validation/accuracy": [(0, 0.0), (5, 0.5)],
}
API = "/app/api"  # VisualDL serves the page under its public path /app, and the API under /app/api


def wait_for(read, done, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done(seen := read()):
            return seen
        time.sleep(0.2)
    pytest.fail(f"waited {timeout:g} s for {what}; last saw {seen!r}")


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """(url, logdir) of a running `visualdl` serving a three-tag log."""
    folder = tmp_path_factory.mktemp("dashboard")
    logdir = str(folder / "vdl_log")
    boards = DashboardSettings(("visualdl",), logdir, str(folder), {})
    logger = RunLogger(str(folder), boards, logging_steps=1, total_steps=5, first_step=0, enabled=True)
    evaluations = dict(SCALARS["validation/accuracy"])
    logger.log_eval(0, {"eval_accuracy": evaluations[0]})  # eval_on_start: the evaluation is written first
    for (step, reward), (_, accuracy) in zip(SCALARS["train/reward_mean"], SCALARS["train/accuracy"]):
        logger.log_step(step, {"reward_mean": reward, "accuracy": accuracy})
        if step in evaluations:
            logger.log_eval(step, {"eval_accuracy": evaluations[step]})
    logger.close()

    port = free_port()
    # --language en: without it, a request with no English or Chinese Accept-Language gets a 500 on the page;
    # --disable-telemetry: no update check over the network and no analytics script in the page
    command = [os.path.join(os.path.dirname(sys.executable), "visualdl"), "--logdir", logdir,
               "--host", "127.0.0.1", "--port", str(port), "--language", "en", "--disable-telemetry"]
    with open(folder / "visualdl.txt", "w+") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: answers(url, process, output), bool, f"visualdl to answer at {url}")
            yield url, logdir
        finally:
            stop(process, timeout=10)


def answers(url: str, process: subprocess.Popen, output) -> bool:
    if process.poll() is not None:
        output.seek(0)
        pytest.fail(f"visualdl exited with code {process.returncode}:\n{output.read()}")
    try:
        return httpx.get(f"{url}/alive", timeout=1).status_code == 204
    except httpx.TransportError:
        return False


def api(url: str, path: str, **params):
    reply = httpx.get(f"{url}{API}/{path}", params=params, timeout=30).json()  # {"status", "msg", "data"}
    assert reply["status"] == 0, reply
    return reply["data"]


def test_api_serves_the_written_scalars_training_reward_first(dashboard):
    url, logdir = dashboard
    tags = api(url, "scalar/tags")
    assert tags["runs"] == [logdir]  # a run is named by its logdir as given on the command line
    assert sorted(tags["tags"][0]) == sorted(SCALARS)
    for tag, points in SCALARS.items():
        rows = api(url, "scalar/list", run=logdir, tag=tag)  # [[wall time ms, step, value], ...]
        assert [(step, value) for _, step, value in rows] == points, tag
    # The page groups the charts by the tags' first path component, sorts the groups by name (upper-cased) and
    # opens the first; within a group, charts keep the API's order.
    groups = sorted({tag.split("/")[0] for tag in tags["tags"][0]}, key=str.upper)
    assert groups == ["train", "validation"]
    assert [tag for tag in tags["tags"][0] if tag.startswith("train/")][0] == "train/reward_mean"




GROUP_TITLES = "[...document.querySelectorAll('h3')].map(h => h.textContent)"
LINE_PIXELS = 200  # a drawn five-point line is 700 to 1,000 pixels; it animates in, so wait for a good part of it
# Every chart on the page as {title, points, blue}: its title and first series read back from the page's own
# echarts instance (chart titles are drawn on the canvas, not in the DOM), and how many of its canvas pixels
# are the strong blue of a run's line. The title, axes and grid (black and greys) have none, the loading
# spinner a few dozen.
CHARTS = """(async () => {
    const echarts = await import("/app/__snowpack__/pkg/echarts.js");  // the module the page uses
    return [...document.querySelectorAll("[_echarts_instance_]")].map(div => {
        const option = echarts.getInstanceByDom(div).getOption();
        const canvas = div.querySelector("canvas");
        const rgba = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        let blue = 0;
        for (let i = 0; i < rgba.length; i += 4) blue += rgba[i + 3] > 0 && rgba[i + 2] > 150 && rgba[i] < 120;
        // series[0].data rows: [wall time ms, step, value, smoothed value, relative time]; no series until loaded
        const rows = option.series[0]?.data ?? [];
        return {title: option.title[0]?.text, points: rows.map(row => [row[1], row[2]]), blue};
    });
})()"""


def test_scalar_page_opens_on_the_training_reward_chart(dashboard, chromium):
    url, _ = dashboard
    page = chromium.open(f"{url}/app/scalar")
    # charts come in groups by tag prefix, sorted; only the first group ("train") starts open.
    # Until the tags arrive the page shows "Loading..." placeholders (and about:blank before that).
    groups = wait_for(lambda: chromium.evaluate(page, GROUP_TITLES), lambda titles: "train" in titles, "the tag groups")
    assert groups == ["train", "validation"]
    opened = wait_for(lambda: chromium.evaluate(page, CHARTS), lambda charts: len(charts) == 2, "the train group's two charts")
    assert [chart["title"] for chart in opened] == ["train/reward_mean", "train/accuracy"]  # drawn without a click
    chromium.evaluate(page, "[...document.querySelectorAll('h3')].find(h => h.textContent === 'validation').click()")

    charts = wait_for(
        lambda: {chart["title"]: chart for chart in chromium.evaluate(page, CHARTS)},
        lambda charts: charts.keys() == SCALARS.keys() and all(c["blue"] > LINE_PIXELS for c in charts.values()),
        "the three charts to draw their lines",
    )
    for tag, points in SCALARS.items():
        assert [tuple(point) for point in charts[tag]["points"]] == points, tag
