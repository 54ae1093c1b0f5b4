"""The documentation site as the README has it read: built by mkdocs as `make docs` builds it (strict, offline), then
opened from the disk (file://, no web server) in headless Chromium: its search box finds pages, and a long command
wraps at the right edge instead of running under it (the page tests skip where no Chromium is installed)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.headless_chromium import Chromium

ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)], cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def wait_for(browser: Chromium, page: str, expression: str, seconds: float = 60.0):
    """The expression's value once it is truthy; fails naming it after `seconds`."""
    deadline = time.monotonic() + seconds
    while not (value := browser.evaluate(page, expression)):
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {expression}"
        time.sleep(0.25)
    return value


def open_page(browser: Chromium, path: Path) -> str:
    page = browser.open(path.as_uri())
    wait_for(browser, page, "location.protocol === 'file:' && document.readyState === 'complete'")
    return page


def test_no_page_loads_anything_from_the_network(site):
    # the offline plugin would add iframe-worker's shim from a CDN: the site carries its own copy instead
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        assert "<script src=\"http" not in page.read_text() and "<link rel=\"stylesheet\" href=\"http" not in page.read_text(), page


@pytest.mark.browser
def test_search_finds_pages_from_the_disk(site, chromium):
    browser = chromium
    page = open_page(browser, site / "index.html")
    browser.evaluate(page, """(() => {
        const input = document.querySelector(".md-search__input");
        input.focus();
        input.value = "McNemar";
        input.dispatchEvent(new Event("input", {bubbles: true}));
        input.dispatchEvent(new KeyboardEvent("keyup", {bubbles: true}));
    })()""")
    links = wait_for(browser, page, "[...document.querySelectorAll('.md-search-result__item a')].map(a => a.getAttribute('href'))")
    assert any(link.split("#")[0].endswith("/evaluation.html") for link in links), links


OVERFLOWING = "[...document.querySelectorAll('pre > code')].filter(c => c.scrollWidth > c.clientWidth).map(c => c.textContent.slice(0, 60))"


@pytest.mark.browser
def test_long_commands_wrap_instead_of_running_past_the_edge(site, chromium):
    browser = chromium
    page = open_page(browser, site / "getting-started.html")
    assert browser.evaluate(page, OVERFLOWING) == []
    # without docs/stylesheets/code.css the same blocks run past the column's edge (mkdocs-material scrolls them)
    browser.evaluate(page, "document.querySelector('link[href$=\"code.css\"]').disabled = true")
    assert len(browser.evaluate(page, OVERFLOWING)) >= 2
