"""The fused engine's attention over its cache (grpo_cache_attention) alone, at real models' shapes: a decode step's
one query token per row against its cached keys and values, a call per layer as a decode step makes them; with
--prefill, a prompt's queries at once against themselves.

    .venv/bin/python bench/bench_cache_attention.py [--layers 30] [--repeats 3] [--cache_dtypes float32,bfloat16]
        [--prefill 16,64,256,1024,2048] [--cached_tokens N] [--shared_prompt W]

Shapes: SmolLM2-135M (9 heads, 3 KV heads, head size 64) at the step benchmark's 64 rows, Qwen2.5-0.5B (14 / 2 / 64)
and a Qwen3 / Llama-like layout (32 / 8 / 128) at 8 rows; about 130-150 cached tokens each, left padding of 0-7
slots; random values, a cache of --layers layers (as large as the model's, so it comes from memory), float32 and
bfloat16 (kv_cache_dtype), the bfloat16 one also with round_bf16 (the bf16 engine's: each query and the weights
rounded to bf16 as the actor's bf16 attention rounds them). Prints one JSON object per shape and variant with the best
milliseconds per call of --repeats passes over the layers, and the GB/s at which it reads the keys and values the step
needs. --cached_tokens N: each row's query sees N cached tokens instead. --shared_prompt W: rows come in groups of
GROUP that share their first W slots (a GRPO group's prompt), measured twice: each row holding its own copy of them
(`shared: false`) and the rows reading them from one prompt cache (`shared: true`, as the fused engine's decode
steps do on a CPU); the GB/s count each prompt's bytes once where it is shared.

--prefill (a comma-separated list of prompt lengths P) measures prefill instead: PREFILL_ROWS prompts of P tokens at
each shape's heads (a step's prompts, each prefilled once for its group), left padding of 0-7 slots, one call of P
queries (slots 0 .. P - 1) per layer, over a cache of --layers layers of P slots; milliseconds per call and GFLOP/s
(4 D flops per query and visible key: q k and p v).
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
import_paddle()

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from alignment.kernels.ops import load_ops  # noqa: E402

SHAPES = {  # name: rows, heads, KV heads, head size, cache slots, first query slot
    "smollm2-135m": (64, 9, 3, 64, 195, 130),
    "qwen2.5-0.5b": (8, 14, 2, 64, 200, 150),
    "heads-128": (8, 32, 8, 128, 200, 150),
}
PREFILL_ROWS = 8
GROUP = 8  # rows sharing a prompt with --shared_prompt (the step benchmark's rollout_n)


def best_ms_per_call(call, layers: int, repeats: int) -> float:
    """The best of --repeats passes over the layers (after one that warms up), in milliseconds per call."""
    best = float("inf")
    for repeat in range(repeats + 1):
        started = time.perf_counter()
        for layer in range(layers):
            call(layer)
        if repeat:
            best = min(best, (time.perf_counter() - started) / layers)
    return best * 1e3


def prefill(ops, rng, lengths: list, variants: list, layers: int, repeats: int) -> None:
    for (name, (_, heads, kv_heads, head_size, _, _)), length, (dtype, rounded) in itertools.product(SHAPES.items(), lengths, variants):
        values = rng.standard_normal((layers, 2, PREFILL_ROWS, length, kv_heads, head_size)).astype(np.float32)
        cache = paddle.to_tensor(values).astype(dtype)
        query = paddle.to_tensor(rng.standard_normal((PREFILL_ROWS, length, heads, head_size)).astype(np.float32))
        first = rng.integers(0, 8, size=PREFILL_ROWS)
        first_slot = paddle.to_tensor(first)
        call = lambda layer: ops.grpo_cache_attention(query, cache, first_slot, None, None, layer, 0, rounded)  # noqa: E731
        ms = best_ms_per_call(call, layers, repeats)
        visible = sum(max(0, t - f + 1) for f in first for t in range(length))  # (query, key) pairs a head computes
        print(json.dumps({
            "shape": name, "cache_dtype": dtype, "round_bf16": rounded, "rows": PREFILL_ROWS, "prompt_tokens": length,
            "heads": heads, "kv_heads": kv_heads, "head_size": head_size, "ms_per_call": round(ms, 3),
            "gflops": round(4 * head_size * heads * visible / ms / 1e6, 1),
        }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache_dtypes", default="float32,bfloat16", help="the cache's dtypes (kv_cache_dtype), comma-separated")
    parser.add_argument("--prefill", default="", help="prompt lengths, comma-separated: measure prefill instead of decode")
    parser.add_argument("--cached_tokens", type=int, default=0, help="decode: the tokens each query sees (0: each shape's own)")
    parser.add_argument("--shared_prompt", type=int, default=0, help="decode: slots shared by groups of 8 rows (0: none)")
    args = parser.parse_args()
    ops, why_not = load_ops()
    if ops is None:
        sys.exit(f"fused operators not available: {why_not}")
    rng = np.random.default_rng(0)
    dtypes = args.cache_dtypes.split(",")
    variants = [(dtype, rounded) for dtype in dtypes for rounded in ((False, True) if dtype == "bfloat16" else (False,))]
    if args.prefill:
        return prefill(ops, rng, [int(p) for p in args.prefill.split(",")], variants, args.layers, args.repeats)
    for (name, shape), (dtype, rounded) in itertools.product(SHAPES.items(), variants):
        for shared in (False, True) if args.shared_prompt else (False,):
            decode(ops, rng, name, shape, dtype, rounded, args, shared)


def decode(ops, rng, name: str, shape: tuple, dtype: str, rounded: bool, args, shared: bool) -> None:
    rows, heads, kv_heads, head_size, slots, start = shape
    if args.cached_tokens:
        slots, start = args.cached_tokens + 1, args.cached_tokens - 1
    values = rng.standard_normal((args.layers, 2, rows, slots, kv_heads, head_size)).astype(np.float32)
    cache = paddle.to_tensor(values).astype(dtype)
    query = paddle.to_tensor(rng.standard_normal((rows, 1, heads, head_size)).astype(np.float32))
    first = rng.integers(0, 8, size=rows)
    first_slot = paddle.to_tensor(first)
    prompts = prompt_of_row = None
    width = args.shared_prompt
    if shared:
        values = rng.standard_normal((args.layers, 2, rows // GROUP, width, kv_heads, head_size)).astype(np.float32)
        prompts, prompt_of_row = paddle.to_tensor(values).astype(dtype), paddle.to_tensor(np.arange(rows) // GROUP)
    call = lambda layer: ops.grpo_cache_attention(query, cache, first_slot, prompts, prompt_of_row, layer, start, rounded)  # noqa: E731
    ms = best_ms_per_call(call, args.layers, args.repeats)
    visible = (start + 1 - first).sum() - (rows - rows // GROUP) * width * shared  # the cached tokens a step must read
    needed = visible * kv_heads * head_size * 2 * (2 if dtype == "bfloat16" else 4)  # bytes of keys and values a layer
    print(json.dumps({
        "shape": name, "cache_dtype": dtype, "round_bf16": rounded, "rows": rows, "heads": heads, "kv_heads": kv_heads,
        "head_size": head_size, "cached_tokens": start + 1, **({"shared_prompt": width, "shared": shared} if width else {}),
        "ms_per_call": round(ms, 3), "gb_per_second": round(needed / ms / 1e6, 1),
    }))


if __name__ == "__main__":
    main()
