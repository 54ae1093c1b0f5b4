"""Stride kernels (paddle 3.3.1's default) against contiguous kernels (alignment.basics.runtime.contiguous_kernels)
for the bundled tiny model: seconds per decode step and per training step, interleaved in one process.

    .venv/bin/python bench/bench_kernels.py [--model data/tiny-qwen2] [--batch 64] [--repeats 5]

Prints one JSON object per measurement and a last one with the ratios.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.basics.runtime import configure_cpu_runtime, contiguous_kernels, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import contextlib  # noqa: E402

from alignment.algo.logprobs import token_logprobs  # noqa: E402
from alignment.models.modeling import completion_logits, load_causal_lm, make_token_batch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="data/tiny-qwen2")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = load_causal_lm(args.model)
    vocab = model.config.vocab_size
    paddle.seed(0)
    prompts = paddle.randint(3, vocab, [args.batch, args.prompt])
    completion = paddle.randint(3, vocab, [args.batch, args.completion]).numpy()
    batch = make_token_batch(prompts.numpy().tolist(), completion, completion * 0 + 1.0, 0)
    positions = paddle.arange(args.prompt).expand([args.batch, args.prompt])

    def decode_step() -> float:
        with paddle.no_grad():
            cache = model(prompts, position_ids=positions, use_cache=True, return_dict=True).past_key_values
            token = prompts[:, -1:]
            started = time.perf_counter()
            for i in range(8):
                out = model(token, position_ids=positions[:, -1:] + 1 + i, past_key_values=cache, use_cache=True, return_dict=True)
                cache = out.past_key_values
            return (time.perf_counter() - started) / 8

    def train_step() -> float:
        started = time.perf_counter()
        token_logprobs(completion_logits(model, batch), batch.completion_ids).mean().backward()
        model.clear_gradients()
        return time.perf_counter() - started

    results = {}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for kernels, context in (("stride", contextlib.nullcontext), ("contiguous", contiguous_kernels)):
            for phase, measure in (("decode_step", decode_step), ("train_step", train_step)):
                with context():
                    seconds = measure()
                if repeat:
                    results.setdefault((phase, kernels), []).append(seconds)
    for (phase, kernels), values in results.items():
        print(json.dumps({"phase": phase, "kernels": kernels, "batch": args.batch, "seconds_median": round(statistics.median(values), 4)}))
    ratios = {
        f"{phase}_stride_over_contiguous": round(
            statistics.median(results[(phase, "stride")]) / statistics.median(results[(phase, "contiguous")]), 2
        )
        for phase in ("decode_step", "train_step")
    }
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
