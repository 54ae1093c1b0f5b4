"""The MLP of one decoder layer in bf16, forward and backward: grpo_bf16_mlp (SwiGLU writing the bf16 values the
next product reads, both ways) against the path it replaced (grpo_bf16_linear, grpo_silu_mul, grpo_bf16_linear), and
both against their products alone, so that what is left is SwiGLU and its conversions.

    .venv/bin/python bench/bench_mlp.py [--model models/SmolLM2-135M-Instruct] [--tokens 8192] [--repeats 5]

- fused: grpo_bf16_mlp's forward and backward, with the gradients of x and the three weights;
- separate: grpo_bf16_linear (gate|up), grpo_silu_mul, grpo_bf16_linear (down), forward and backward;
- products: the six products of either (X W and dY W^T of gate|up and down, X^T dY of each) through
  grpo_bf16_matmul on operands in bf16 beforehand, and the conversions both make whatever SwiGLU does (x and dY
  to bf16, grpo_to_bf16).
Prints one JSON object: milliseconds of each (best of --repeats), and fused - products, separate - products: SwiGLU
and what it writes and reads, in each.
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

from alignment.kernels.ops import load_ops  # noqa: E402


def best_ms(fn, repeats: int) -> float:
    fn()  # warm-up: oneDNN's kernel generation, first touch of the outputs
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return round(min(times) * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--tokens", type=int, default=8192, help="rows of x (one micro-batch: 64 rows of 128 tokens)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ops = load_ops()[0]
    if ops is None or not hasattr(ops, "grpo_bf16_mlp"):
        sys.exit("bench_mlp: the operators were built without oneDNN, or not built (make ops)")
    config = json.loads((Path(args.model) / "config.json").read_text())
    k, inter = config["hidden_size"], config["intermediate_size"]
    x = paddle.randn([args.tokens, k])
    x.stop_gradient = False
    gate, up, down = paddle.randn([k, inter]) * 0.05, paddle.randn([k, inter]) * 0.05, paddle.randn([inter, k]) * 0.05
    for weight in (gate, up, down):
        weight.stop_gradient = False
    gate_up_bf16, down_bf16 = ops.grpo_to_bf16(paddle.concat([gate, up], axis=1)), ops.grpo_to_bf16(down)
    dy = paddle.randn([args.tokens, k])
    inputs = [x, gate, up, down]

    def fused():
        out = ops.grpo_bf16_mlp(x, [gate, up], down, gate_up_bf16, down_bf16, True)[0]
        paddle.grad(out, inputs, dy)

    def separate():
        gate_up = ops.grpo_bf16_linear(x, [gate, up], gate_up_bf16, True)[0]
        out = ops.grpo_bf16_linear(ops.grpo_silu_mul(gate_up), [down], down_bf16, True)[0]
        paddle.grad(out, inputs, dy)

    x_bf16, dy_bf16 = ops.grpo_to_bf16(x), ops.grpo_to_bf16(dy)
    gate_up_out_bf16 = ops.grpo_to_bf16(paddle.randn([args.tokens, 2 * inter]))  # stands for SwiGLU's gradient
    h_bf16 = ops.grpo_to_bf16(paddle.randn([args.tokens, inter]))  # and its output

    def products():
        ops.grpo_to_bf16(x), ops.grpo_to_bf16(dy)
        ops.grpo_bf16_matmul(x_bf16, gate_up_bf16, False, False)  # forward
        ops.grpo_bf16_matmul(h_bf16, down_bf16, False, False)
        ops.grpo_bf16_matmul(dy_bf16, down_bf16, False, True)  # dh
        ops.grpo_bf16_matmul(h_bf16, dy_bf16, True, False)  # d down
        ops.grpo_bf16_matmul(gate_up_out_bf16, gate_up_bf16, False, True)  # dx
        ops.grpo_bf16_matmul(x_bf16, gate_up_out_bf16, True, False)  # d gate|up

    rounds = {"fused": [], "separate": [], "products": []}
    for _ in range(2):  # taking turns, twice
        for name, fn in (("fused", fused), ("separate", separate), ("products", products)):
            rounds[name].append(best_ms(fn, args.repeats))
    best = {name: min(times) for name, times in rounds.items()}
    print(json.dumps({
        "tokens": args.tokens, "hidden": k, "intermediate": inter,
        **{f"{name}_ms": times for name, times in rounds.items()},
        "fused_minus_products_ms": round(best["fused"] - best["products"], 2),
        "separate_minus_products_ms": round(best["separate"] - best["products"], 2),
        "model": args.model,
    }), flush=True)


if __name__ == "__main__":
    main()
