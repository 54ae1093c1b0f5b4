"""What a checkpoint costs: seconds of save_checkpoint (model, tokenizer, optimizer state, fsync, the checksums
trainer_state.json lists, rename), of the verification a resume runs, and of loading it back (the model and the
optimizer state), at a real model's shape with its AdamW state.

    .venv/bin/python bench/bench_checkpoint.py [--shape smollm2-135m] [--repo TREE] [--out /tmp/bench_checkpoint]

--repo runs another checkout's alignment/ (a worktree of an earlier commit: before and after side by side). The
model has random weights of the shape (bench/bench_rollout.py's SHAPES); one AdamW step on 8 tokens gives it its
moments, so the optimizer file is the size a run writes. Prints one JSON object: the checkpoint's `bytes`, the
optimizer file's name and `optimizer_bytes`, `save_seconds`, `checksum_seconds` (hashing the files again, warm in
the page cache), `verify_seconds` (damage(): what resume_from_checkpoint adds), `load_model_seconds`,
`load_optimizer_seconds` (load_training_state: read and set_state_dict).
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--repo", default=str(BENCH.parent), help="the checkout whose alignment/ saves and loads")
    parser.add_argument("--out", default="/tmp/bench_checkpoint")
    args = parser.parse_args()
    sys.path[:0] = [args.repo, str(BENCH)]

    from alignment.basics.runtime import configure_cpu_runtime, import_paddle

    configure_cpu_runtime()
    paddle = import_paddle()
    from bench_rollout import build_model

    from alignment.models.modeling import load_causal_lm, load_tokenizer
    from alignment.storage.checkpoint import CheckpointContents, save_checkpoint
    from alignment.storage.optimizer_state import load_training_state
    from alignment.storage.resume import Lineage, damage, read_checkpoint, sha256

    model = build_model(args.shape, seed=0)
    model.train()
    optimizer = paddle.optimizer.AdamW(1e-6, parameters=model.parameters())
    model(paddle.to_tensor([[5, 6, 7, 8, 9, 10, 11, 12]]))[0].mean().backward()
    optimizer.step()
    optimizer.clear_grad()

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    path = save_checkpoint(
        str(out),
        1,
        CheckpointContents(model, load_tokenizer(str(BENCH.parent / "data" / "tiny-qwen2")), optimizer.state_dict(), "{}", {}),
        None,
        Lineage.new(),
    )
    save_seconds = time.perf_counter() - started
    files = [p for p in path.rglob("*") if p.is_file() and p.name != "trainer_state.json"]
    (optimizer_file,) = [p for p in files if p.name.startswith("optimizer.")]
    sizes = {
        "bytes": sum(p.stat().st_size for p in files), "optimizer_file": optimizer_file.name,
        "optimizer_bytes": optimizer_file.stat().st_size,
    }

    started = time.perf_counter()
    for file in files:
        sha256(file)
    checksum_seconds = time.perf_counter() - started
    started = time.perf_counter()
    state, _ = read_checkpoint(path)
    assert damage(path, state) is None
    verify_seconds = time.perf_counter() - started
    started = time.perf_counter()
    loaded = load_causal_lm(str(path))
    load_model_seconds = time.perf_counter() - started
    fresh = paddle.optimizer.AdamW(1e-6, parameters=loaded.parameters())
    started = time.perf_counter()
    load_training_state(path, fresh, list(model.named_parameters()))  # the names the file holds: a fresh process gives `loaded` these
    load_optimizer_seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({
        "shape": args.shape, "repo": args.repo, **sizes, "save_seconds": round(save_seconds, 2),
        "checksum_seconds": round(checksum_seconds, 2),
        "verify_seconds": round(verify_seconds, 2), "load_model_seconds": round(load_model_seconds, 2),
        "load_optimizer_seconds": round(load_optimizer_seconds, 2),
    }))


if __name__ == "__main__":
    main()
