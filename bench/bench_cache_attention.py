"""The fused engine's decode attention (grpo_cache_attention) alone, at real models' shapes: one query token per
row against its cached keys and values, a call per layer as a decode step makes them.

    .venv/bin/python bench/bench_cache_attention.py [--layers 30] [--repeats 3] [--cache_dtypes float32,bfloat16]

Shapes: SmolLM2-135M (9 heads, 3 KV heads, head size 64) at the step benchmark's 64 rows, Qwen2.5-0.5B (14 / 2 / 64)
and a Qwen3 / Llama-like layout (32 / 8 / 128) at 8 rows; about 130-150 cached tokens each, left padding of 0-7
slots; random values, a cache of --layers layers (as large as the model's, so it comes from memory), float32 and
bfloat16 (kv_cache_dtype), the bfloat16 one also with round_bf16 (the bf16 engine's: each query and the weights
rounded to bf16 as the actor's bf16 attention rounds them). Prints one JSON object per shape and variant with the best
milliseconds per call of --repeats passes over the layers.
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alignment.run.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
import_paddle()

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from alignment.rollout.ops import load_ops  # noqa: E402

SHAPES = {  # name: rows, heads, KV heads, head size, cache slots, first query slot
    "smollm2-135m": (64, 9, 3, 64, 195, 130),
    "qwen2.5-0.5b": (8, 14, 2, 64, 200, 150),
    "heads-128": (8, 32, 8, 128, 200, 150),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache_dtypes", default="float32,bfloat16", help="the cache's dtypes (kv_cache_dtype), comma-separated")
    args = parser.parse_args()
    ops, why_not = load_ops()
    if ops is None:
        sys.exit(f"fused operators not available: {why_not}")
    rng = np.random.default_rng(0)
    dtypes = args.cache_dtypes.split(",")
    variants = [(dtype, rounded) for dtype in dtypes for rounded in ((False, True) if dtype == "bfloat16" else (False,))]
    for (name, (rows, heads, kv_heads, head_size, slots, start)), (dtype, rounded) in itertools.product(SHAPES.items(), variants):
        values = rng.standard_normal((args.layers, 2, rows, slots, kv_heads, head_size)).astype(np.float32)
        cache = paddle.to_tensor(values).astype(dtype)
        query = paddle.to_tensor(rng.standard_normal((rows, 1, heads, head_size)).astype(np.float32))
        first_slot = paddle.to_tensor(rng.integers(0, 8, size=rows))
        best = float("inf")
        for repeat in range(args.repeats + 1):  # the first pass warms up
            started = time.perf_counter()
            for layer in range(args.layers):
                ops.grpo_cache_attention(query, cache, first_slot, layer, start, rounded)
            if repeat:
                best = min(best, (time.perf_counter() - started) / args.layers)
        print(json.dumps({
            "shape": name, "cache_dtype": dtype, "round_bf16": rounded, "rows": rows, "heads": heads, "kv_heads": kv_heads,
            "head_size": head_size,
            "cached_tokens": start + 1, "ms_per_call": round(best * 1e3, 3),
        }))


if __name__ == "__main__":
    main()
