"""The bf16 roofline of the policy update's matmuls on this CPU, how close the update's operators come to it, and
oneDNN's matmul primitive on prepacked weights against both (and against the fused engine's decode products).

    .venv/bin/python bench/bench_bf16_gemm.py [--model models/SmolLM2-135M-Instruct] [--tokens 12288] [--repeats 5]
        [--decode_rows 8,64] [--no-update]

For each product of one decoder layer's forward and backward (q|k|v, o, gate|up, down: out = X W, dX = dY W^T,
dW = X^T dY) at --tokens rows (one micro-batch: 64 sequences of 192 tokens by default), and the log-prob head's
three products on a 512-token chunk (logprob_chunk_tokens), interleaved in one process:
- fp32: paddle.matmul on float32 tensors, what the update runs with cpu_bf16_matmul off;
- bf16_gemm: grpo_bf16_matmul on inputs converted to bf16 beforehand, the GEMM alone (oneDNN's
  dnnl_gemm_bf16bf16f32, which copies B into its blocked layout on every call);
- bf16_prepacked: grpo_prepacked_matmul, oneDNN's matmul primitive with B reordered beforehand into the layout the
  primitive picks for that many rows (grpo_prepack_bf16, not timed) and op(X) given in bf16, row-major: the
  primitive alone. B is the right-hand operand whatever it holds (dY in X^T dY, h in G^T h), so this is a roofline,
  not what the update could run: it would have to pack activations on every step;
- bf16_ops: the operators as the update calls them, from float32 activations (their conversion to bf16 included;
  the weights' bf16 copies are made once per optimizer step and are not counted).
Prints one JSON object per shape (GFLOP/s each, best of --repeats) and a last one with the totals over a layer
and the head: bf16_ops / bf16_gemm (the issue asks at least 0.6), bf16_ops / bf16_prepacked and bf16_ops / fp32.

With --decode_rows (a comma-separated list of row counts, e.g. 8,64: sequences decoding at once), also the fused
engine's decode products at those rows: x (rows, K) float32 times each layer weight and the head, as the engine runs
them (grpo_prepacked_matmul on copies packed for PACKED_ROWS = 64 rows, alignment/rollout/fused.py) against oneDNN's
gemm on a plain bf16 copy held (N, K) (grpo_bf16_matmul with transpose_y, which copies it into its blocked layout on
every call); both convert x. One JSON object per product (microseconds, mean of a batch of calls, best of --repeats)
and one per row count with a decode step's products (num_hidden_layers layers and the head) in milliseconds.
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

from alignment.rollout.fused import PACKED_ROWS  # noqa: E402
from alignment.kernels.ops import load_ops  # noqa: E402


def best_seconds(fn, repeats: int, calls: int = 1) -> float:
    """The fastest of repeats batches of calls, per call."""
    fn()  # warm-up: oneDNN's kernel generation, first-touch of the output
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - began) / calls)
    return min(times)


def weights(config: dict) -> list:
    """(name, K, N) of one decoder layer's projections (q|k|v, o, gate|up, down) and the head."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim
    attention = config["num_attention_heads"] * head_dim
    return [("qkv", hidden, qkv), ("o_proj", attention, hidden), ("gate_up", hidden, 2 * inter), ("down_proj", inter, hidden),
            ("head", hidden, config["vocab_size"])]


def shapes(config: dict, tokens: int, chunk: int) -> list:
    """(name, M, K, N, transpose_x, transpose_y, converted) of every product in one layer's forward and backward and
    the head's; converted: which operands the update's operators convert from fp32 for this product ("x", "y",
    "xy" or ""): grpo_bf16_linear converts X in the forward and keeps it for dW, and dY once for dX and dW; the
    head's PyLayer converts its activations on every product."""
    out = []
    *layer, (_, hidden, vocab) = weights(config)
    for name, k, n in layer:
        out += [
            (f"{name} X W", tokens, k, n, False, False, "x"),
            (f"{name} dY W^T", tokens, n, k, False, True, "x"),
            (f"{name} X^T dY", k, tokens, n, True, False, ""),
        ]
    out += [
        ("head h W^T", chunk, hidden, vocab, False, True, "x"),
        ("head G W", chunk, vocab, hidden, False, False, "x"),
        ("head G^T h", vocab, chunk, hidden, True, False, "xy"),
    ]
    return out


def update_products(ops, config: dict, args) -> None:
    totals = {"fp32": 0.0, "bf16_gemm": 0.0, "bf16_prepacked": 0.0, "bf16_ops": 0.0}
    flops_total = 0
    for name, m, k, n, transpose_x, transpose_y, converted in shapes(config, args.tokens, args.chunk):
        x = paddle.randn([k, m] if transpose_x else [m, k])
        y = paddle.randn([n, k] if transpose_y else [k, n])
        x_bf16, y_bf16 = ops.grpo_to_bf16(x), ops.grpo_to_bf16(y)
        x_ops, y_ops = (x if "x" in converted else x_bf16), (y if "y" in converted else y_bf16)
        a_bf16 = ops.grpo_to_bf16(paddle.transpose(x, [1, 0])) if transpose_x else x_bf16  # op(X) (M, K), row-major
        packed = ops.grpo_prepack_bf16(y_bf16, transpose_y, m)  # op(Y) (K, N) in the primitive's layout for M rows
        seconds = {
            "fp32": best_seconds(lambda: paddle.matmul(x, y, transpose_x, transpose_y)._clear_data(), args.repeats),
            "bf16_gemm": best_seconds(lambda: ops.grpo_bf16_matmul(x_bf16, y_bf16, transpose_x, transpose_y)._clear_data(), args.repeats),
            "bf16_prepacked": best_seconds(lambda: ops.grpo_prepacked_matmul(a_bf16, packed, k, n, m)._clear_data(), args.repeats),
            "bf16_ops": best_seconds(lambda: ops.grpo_bf16_matmul(x_ops, y_ops, transpose_x, transpose_y)._clear_data(), args.repeats),
        }
        flops = 2 * m * k * n
        flops_total += flops
        for key, value in seconds.items():
            totals[key] += value
        print(json.dumps({
            "product": name, "m": m, "k": k, "n": n, **{f"{key}_gflops": round(flops / s / 1e9, 1) for key, s in seconds.items()}
        }), flush=True)
    print(json.dumps({
        "total_gflop": round(flops_total / 1e9, 2),
        **{f"{key}_gflops": round(flops_total / s / 1e9, 1) for key, s in totals.items()},
        "bf16_ops_over_bf16_gemm": round(totals["bf16_gemm"] / totals["bf16_ops"], 3),
        "bf16_ops_over_bf16_prepacked": round(totals["bf16_prepacked"] / totals["bf16_ops"], 3),
        "bf16_ops_speedup_over_fp32": round(totals["fp32"] / totals["bf16_ops"], 2),
        "tokens": args.tokens,
        "model": args.model,
    }), flush=True)


def decode_products(ops, config: dict, rows: int, repeats: int) -> None:
    step = {"bf16_gemm": 0.0, "bf16_prepacked": 0.0}
    for name, k, n in weights(config):
        x = paddle.randn([rows, k])  # the engine's float32 activations
        w = ops.grpo_to_bf16(paddle.randn([n, k]))  # a plain bf16 copy, (N, K)
        packed = ops.grpo_prepack_bf16(w, True, PACKED_ROWS)  # the engine's
        calls = max(1, int(2e8 // (2 * rows * k * n)))  # about 0.2 GFLOP per timed batch
        seconds = {
            "bf16_gemm": best_seconds(lambda: ops.grpo_bf16_matmul(x, w, False, True)._clear_data(), repeats, calls),
            "bf16_prepacked": best_seconds(
                lambda: ops.grpo_prepacked_matmul(x, packed, k, n, PACKED_ROWS)._clear_data(), repeats, calls
            ),
        }
        count = 1 if name == "head" else config["num_hidden_layers"]
        for key, value in seconds.items():
            step[key] += count * value
        flops = 2 * rows * k * n
        print(json.dumps({
            "decode_rows": rows, "product": name, "k": k, "n": n,
            **{f"{key}_us": round(s * 1e6, 1) for key, s in seconds.items()},
            **{f"{key}_gflops": round(flops / s / 1e9, 1) for key, s in seconds.items()},
        }), flush=True)
    print(json.dumps({
        "decode_rows": rows,
        **{f"{key}_step_ms": round(s * 1e3, 2) for key, s in step.items()},
        "prepacked_speedup": round(step["bf16_gemm"] / step["bf16_prepacked"], 2),
        "layers": config["num_hidden_layers"],
    }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct", help="a model folder (only its config.json is read)")
    parser.add_argument("--tokens", type=int, default=64 * 192, help="rows of one micro-batch: sequences x (prompt + completion) tokens")
    parser.add_argument("--chunk", type=int, default=512, help="logprob_chunk_tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--update", action=argparse.BooleanOptionalAction, default=True, help="the update's products")
    parser.add_argument("--decode_rows", default="", help="comma-separated rows for the decode products, e.g. 8,64 (none by default)")
    args = parser.parse_args()
    ops, why_not = load_ops()
    if ops is None or not hasattr(ops, "grpo_prepacked_matmul"):
        sys.exit(f"bench_bf16_gemm: the bf16 operators are not available: {why_not or 'built without oneDNN'}")
    try:
        ops.grpo_prepack_bf16(paddle.ones([32, 32]), False, 1)
    except OSError as error:  # an AVX2-only CPU: oneDNN's gemm emulates bf16, its matmul primitive does not
        reason = str(error).splitlines()[0]
        sys.exit(f"bench_bf16_gemm: no bf16 matmul primitive on this CPU ({reason}): it is for CPUs with AVX512-BF16 or AMX")
    config = json.loads((Path(args.model) / "config.json").read_text())
    paddle.seed(0)
    if args.update:
        update_products(ops, config, args)
    for rows in (int(r) for r in args.decode_rows.split(",") if r.strip()):
        decode_products(ops, config, rows, args.repeats)


if __name__ == "__main__":
    main()
