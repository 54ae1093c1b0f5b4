"""Peak memory and seconds of the log-prob step alone (lm_head + log-probs + a sum loss + backward), with
the full (B, T, V) logits (token_logprobs) against chunked_token_logprobs at a few chunk sizes.

    .venv/bin/python bench/bench_logprobs_memory.py [--tokens 4096] [--vocab 151936] [--hidden 896] [--chunks 512,2048]

Defaults: Qwen2.5-0.5B's head (V = 151,936, H = 896) over a micro-batch of 8 x 512 completion tokens.
Each variant runs in a fresh subprocess, so that ru_maxrss (the process's peak resident memory) is its
own; `setup_mb` is the peak before the step (paddle, the weight and the hidden states) and `step_mb`
what the step added to it. Runs under contiguous_kernels, as the trainer's update does. Prints one JSON
object per variant.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.basics.runtime import configure_cpu_runtime, contiguous_kernels, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

from alignment.algo.logprobs import chunked_token_logprobs, token_entropy, token_logprobs  # noqa: E402


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def full_step(hidden, weight, tokens, temperature: float) -> tuple:
    """As the trainer did: (B, T, V) logits, log-probs, backward, then the entropy of the kept logits."""
    logits = paddle.matmul(hidden, weight, transpose_y=True)  # (B, T, V)
    logprobs = token_logprobs(logits, tokens, temperature)
    logprobs.sum().backward()
    with paddle.no_grad():
        entropy = token_entropy(logits.detach(), temperature)
    return logprobs, entropy


def chunked_step(hidden, weight, tokens, temperature: float, chunk_tokens: int) -> tuple:
    logprobs, entropy = chunked_token_logprobs(hidden, weight, None, tokens, temperature, chunk_tokens)
    logprobs.sum().backward()
    return logprobs, entropy


def measure(args) -> dict:
    paddle.seed(0)
    batch = 8
    hidden = paddle.randn([batch, args.tokens // batch, args.hidden]) * 0.5  # (B, T, H): logits of a few units
    hidden.stop_gradient = False
    # (V, H), as lm_head holds it; initialised in place, so no temporary copy inflates setup_mb
    weight = paddle.create_parameter([args.vocab, args.hidden], "float32", default_initializer=paddle.nn.initializer.Normal(std=0.05))
    tokens = paddle.randint(0, args.vocab, [batch, args.tokens // batch])
    setup = peak_mb()
    started = time.perf_counter()
    with contiguous_kernels():
        if args.variant == "full":
            logprobs, entropy = full_step(hidden, weight, tokens, args.temperature)
        else:
            logprobs, entropy = chunked_step(hidden, weight, tokens, args.temperature, int(args.variant))
    seconds = time.perf_counter() - started
    return {
        "variant": "full logits" if args.variant == "full" else f"chunked {args.variant}",
        "tokens": args.tokens, "vocab": args.vocab, "hidden": args.hidden,
        "seconds": round(seconds, 2), "setup_mb": round(setup), "peak_mb": round(peak_mb()),
        "step_mb": round(peak_mb() - setup),
        # the same inputs in every variant: these agree between variants up to float32 rounding
        "logprob_mean": round(float(logprobs.mean()), 5), "entropy_mean": round(float(entropy.mean()), 5),
        "grad_weight_norm": round(float(weight.grad.norm()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8 * 512)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--chunks", default="512,2048")
    parser.add_argument("--variant", help="run one variant in this process: 'full' or a chunk size")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args)), flush=True)
        return
    shared = [
        "--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--temperature", str(args.temperature)
    ]
    for variant in ["full", *args.chunks.split(",")]:
        subprocess.run([sys.executable, __file__, *shared, "--variant", variant], check=True)


if __name__ == "__main__":
    main()
