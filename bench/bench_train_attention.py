"""The training attention of one decoder layer, forward and backward: grpo_attention (csrc/grpo_attention.cc: the
weights never stored, keys that a block of queries cannot see skipped), with fp32 products and with bf16 ones (where
the operators were built for AVX512-BF16; else they are fp32 too), against the path before it (two paddle matmuls
around grpo_masked_softmax, the (B, KVH, G T, S) weights kept for backward), interleaved in one process.

    .venv/bin/python bench/bench_train_attention.py [--rows 64] [--prompt 64] [--completion 128] [--heads 9]
        [--kv_heads 3] [--head_dim 64] [--repeats 5]

Defaults: SmolLM2-135M's heads at bench/bench_step.py's micro-batch (64 rows of a 64-token prompt and 128 completion
tokens), causal with each row's prompt left-padded by a random 0-31 tokens, as paddleformers' additive mask (float32's
lowest where hidden). Prints one JSON object per path (best of --repeats: forward, backward, both) and the ratios.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import numpy as np  # noqa: E402

from alignment.kernels.ops import load_ops  # noqa: E402


def causal_padded_mask(rows: int, length: int, rng) -> np.ndarray:
    """(rows, 1, T, T) additive: query t sees keys pad <= s <= t, its row's pad drawn in [0, 32)."""
    lowest = np.finfo(np.float32).min
    mask = np.full((rows, 1, length, length), lowest, np.float32)
    for row, pad in enumerate(rng.integers(0, 32, size=rows)):
        visible = np.tril(np.ones((length, length), bool))
        visible[:, :pad] = False
        mask[row, 0][visible] = 0.0
    return mask


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv_heads", type=int, default=3)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ops, why_not = load_ops()
    if ops is None or not hasattr(ops, "grpo_attention"):
        sys.exit(f"bench_train_attention: grpo_attention is not available: {why_not or 'built without oneDNN'}")
    rng = np.random.default_rng(0)
    length, groups = args.prompt + args.completion, args.heads // args.kv_heads
    shape_q = (args.rows, args.kv_heads, groups * length, args.head_dim)
    shape_kv = (args.rows, args.kv_heads, length, args.head_dim)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (shape_q, shape_kv, shape_kv)]
    mask = paddle.to_tensor(causal_padded_mask(args.rows, length, rng))
    dout = paddle.to_tensor(rng.standard_normal(shape_q).astype(np.float32))
    scale = args.head_dim**-0.5

    def stored_weights(q, k, v):
        return paddle.matmul(ops.grpo_masked_softmax(paddle.matmul(q, k, transpose_y=True), mask, scale), v)

    def fused(q, k, v):
        return ops.grpo_attention(q, k, v, mask, scale)[0]

    def fused_bf16(q, k, v):
        return ops.grpo_attention(q, k, v, mask, scale, True)[0]

    best = {}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, attention in (("stored_weights", stored_weights), ("grpo_attention", fused), ("grpo_attention_bf16", fused_bf16)):
            q, k, v = [paddle.to_tensor(a, stop_gradient=False) for a in arrays]
            began = time.perf_counter()
            out = attention(q, k, v)
            middle = time.perf_counter()
            out.backward(dout)
            ended = time.perf_counter()
            times = {"forward": middle - began, "backward": ended - middle, "both": ended - began}
            best[name] = {key: min(value, best.get(name, {}).get(key, value)) for key, value in times.items()}
    for name, seconds in best.items():
        print(json.dumps({"path": name, **{f"{key}_s": round(value, 4) for key, value in seconds.items()}, "q": list(shape_q)}))
    both = {name: seconds["both"] for name, seconds in best.items()}
    print(json.dumps({"grpo_attention_speedup": round(both["stored_weights"] / both["grpo_attention"], 2),
                      "bf16_products_speedup": round(both["grpo_attention"] / both["grpo_attention_bf16"], 2)}))


if __name__ == "__main__":
    main()
