"""What the checkpoint checksums cost: seconds of save_checkpoint (which now lists every file with its size and
SHA-256 in trainer_state.json), of hashing those files alone, and of the verification a resume runs, at a real
model's shape with its AdamW state.

    .venv/bin/python bench/bench_checkpoint.py [--shape qwen2.5-0.5b] [--out /tmp/bench_checkpoint]

The model has random weights of the shape (bench/bench_rollout.py's SHAPES); one AdamW step on 8 tokens
gives it its moments, so optimizer.pdopt is the size a run writes. Prints one JSON object: the checkpoint's
`bytes`, `save_seconds` (the whole save: write, fsync, checksums, rename), `checksum_seconds` (hashing the
files again, warm in the page cache as the save finds them), `checksum_share` of the save, and
`verify_seconds` (damage(): what resume_from_checkpoint adds), with GB/s.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alignment.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

from alignment.checkpoint import Lineage, _sha256, damage, read_checkpoint, save_checkpoint  # noqa: E402
from alignment.modeling import load_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--out", default="/tmp/bench_checkpoint")
    args = parser.parse_args()
    from bench_rollout import build_model

    model = build_model(args.shape, seed=0)
    model.train()
    optimizer = paddle.optimizer.AdamW(1e-6, parameters=model.parameters())
    model(paddle.to_tensor([[5, 6, 7, 8, 9, 10, 11, 12]]))[0].mean().backward()
    optimizer.step()
    optimizer.clear_grad()

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    path = save_checkpoint(str(out), 1, model, load_tokenizer("data/tiny-qwen2"), optimizer.state_dict(), "{}", {}, None, Lineage.new())
    save_seconds = time.perf_counter() - started
    files = [p for p in path.rglob("*") if p.is_file() and p.name != "trainer_state.json"]
    size = sum(p.stat().st_size for p in files)

    started = time.perf_counter()
    for file in files:
        _sha256(file)
    checksum_seconds = time.perf_counter() - started
    started = time.perf_counter()
    state, _ = read_checkpoint(path)
    assert damage(path, state) is None
    verify_seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({
        "shape": args.shape, "bytes": size, "save_seconds": round(save_seconds, 2), "checksum_seconds": round(checksum_seconds, 2),
        "checksum_share": round(checksum_seconds / save_seconds, 3), "verify_seconds": round(verify_seconds, 2),
        "checksum_gb_per_s": round(size / checksum_seconds / 1e9, 2),
    }))


if __name__ == "__main__":
    main()
