from pathlib import Path

from alignment.runtime import configure_cpu_runtime

configure_cpu_runtime()  # before anything imports paddle, as run_grpo.py does

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(autouse=True)
def _run_from_the_repository_root(monkeypatch):
    monkeypatch.chdir(REPO)  # configs and data are addressed relative to the checkout, as in the README


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """../shared/data/gsm8k beside the checkout (CI and developers have it; users may not)."""
    if not (GSM8K_DIR / "example_model_solutions.jsonl").is_file():
        pytest.skip(f"GSM8K data not found at {GSM8K_DIR} (it lives in ../shared beside the checkout)")
    return GSM8K_DIR
