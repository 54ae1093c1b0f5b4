"""The bf16 roofline of the policy update's matmuls on this CPU, and how close the update's operators come to it.

    .venv/bin/python bench/bench_bf16_gemm.py [--model models/SmolLM2-135M-Instruct] [--tokens 12288] [--repeats 5]

For each product of one decoder layer's forward and backward (q|k|v, o, gate|up, down: out = X W, dX = dY W^T,
dW = X^T dY) at --tokens rows (one micro-batch: 64 sequences of 192 tokens by default), and the log-prob head's
three products on a 512-token chunk (logprob_chunk_tokens), interleaved in one process:
- fp32: paddle.matmul on float32 tensors, what the update runs with cpu_bf16_matmul off;
- bf16_gemm: grpo_bf16_matmul on inputs converted to bf16 beforehand, the GEMM alone (oneDNN's
  dnnl_gemm_bf16bf16f32): the roofline for that shape on this machine;
- bf16_ops: the operators as the update calls them, from float32 activations (their conversion to bf16 included;
  the weights' bf16 copies are made once per optimizer step and are not counted).
Prints one JSON object per shape (GFLOP/s each, best of --repeats) and a last one with the totals over a layer
and the head: bf16_ops / bf16_gemm (the issue asks at least 0.6) and bf16_ops / fp32.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.run.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

from alignment.rollout.ops import load_ops  # noqa: E402


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: oneDNN's kernel generation, first-touch of the output
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def shapes(config: dict, tokens: int, chunk: int) -> list:
    """(name, M, K, N, transpose_x, transpose_y, converted) of every product in one layer's forward and backward and
    the head's; converted: which operands the update's operators convert from fp32 for this product ("x", "y",
    "xy" or ""): grpo_bf16_linear converts X in the forward and keeps it for dW, and dY once for dX and dW; the
    head's PyLayer converts its activations on every product."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim
    attention = config["num_attention_heads"] * head_dim
    out = []
    for name, k, n in (("qkv", hidden, qkv), ("o_proj", attention, hidden), ("gate_up", hidden, 2 * inter), ("down_proj", inter, hidden)):
        out += [
            (f"{name} X W", tokens, k, n, False, False, "x"),
            (f"{name} dY W^T", tokens, n, k, False, True, "x"),
            (f"{name} X^T dY", k, tokens, n, True, False, ""),
        ]
    vocab = config["vocab_size"]
    out += [
        ("head h W^T", chunk, hidden, vocab, False, True, "x"),
        ("head G W", chunk, vocab, hidden, False, False, "x"),
        ("head G^T h", vocab, chunk, hidden, True, False, "xy"),
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct", help="a model folder (only its config.json is read)")
    parser.add_argument("--tokens", type=int, default=64 * 192, help="rows of one micro-batch: sequences x (prompt + completion) tokens")
    parser.add_argument("--chunk", type=int, default=512, help="logprob_chunk_tokens")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ops, why_not = load_ops()
    if ops is None or not hasattr(ops, "grpo_bf16_matmul"):
        sys.exit(f"bench_bf16_gemm: the bf16 operators are not available: {why_not or 'built without oneDNN'}")
    config = json.loads((Path(args.model) / "config.json").read_text())
    paddle.seed(0)
    totals = {"fp32": 0.0, "bf16_gemm": 0.0, "bf16_ops": 0.0}
    flops_total = 0
    for name, m, k, n, transpose_x, transpose_y, converted in shapes(config, args.tokens, args.chunk):
        x = paddle.randn([k, m] if transpose_x else [m, k])
        y = paddle.randn([n, k] if transpose_y else [k, n])
        x_bf16, y_bf16 = ops.grpo_to_bf16(x), ops.grpo_to_bf16(y)
        x_ops, y_ops = (x if "x" in converted else x_bf16), (y if "y" in converted else y_bf16)
        seconds = {
            "fp32": best_seconds(lambda: paddle.matmul(x, y, transpose_x, transpose_y)._clear_data(), args.repeats),
            "bf16_gemm": best_seconds(lambda: ops.grpo_bf16_matmul(x_bf16, y_bf16, transpose_x, transpose_y)._clear_data(), args.repeats),
            "bf16_ops": best_seconds(lambda: ops.grpo_bf16_matmul(x_ops, y_ops, transpose_x, transpose_y)._clear_data(), args.repeats),
        }
        flops = 2 * m * k * n
        flops_total += flops
        for key, value in seconds.items():
            totals[key] += value
        print(json.dumps({
            "product": name, "m": m, "k": k, "n": n, **{f"{key}_gflops": round(flops / s / 1e9, 1) for key, s in seconds.items()}
        }))
    print(json.dumps({
        "total_gflop": round(flops_total / 1e9, 2),
        **{f"{key}_gflops": round(flops_total / s / 1e9, 1) for key, s in totals.items()},
        "bf16_ops_over_bf16_gemm": round(totals["bf16_gemm"] / totals["bf16_ops"], 3),
        "bf16_ops_speedup_over_fp32": round(totals["fp32"] / totals["bf16_ops"], 2),
        "tokens": args.tokens,
        "model": args.model,
    }))


if __name__ == "__main__":
    main()
