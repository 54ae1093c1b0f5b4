"""paddle's CPU log_softmax against x - logsumexp(x) (alignment.algo.logprobs.log_softmax) at growing vocabulary sizes.

    .venv/bin/python bench/bench_log_softmax.py [--rows 46] [--vocabs 4096,20000,151936]

paddle 3.3.1's CPU log_softmax kernel slows down far faster than the size of its input; every
log-prob in the trainer and both engines goes through alignment.algo.logprobs instead. Prints one JSON object
per vocabulary size with both timings (one call each, after a warm-up call of the fast one).
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

from alignment.algo.logprobs import log_softmax  # noqa: E402


def seconds(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=46)
    parser.add_argument("--vocabs", default="4096,20000,151936")
    args = parser.parse_args()
    for vocab in map(int, args.vocabs.split(",")):
        logits = paddle.randn([args.rows, vocab])
        log_softmax(logits)
        ours = seconds(lambda: log_softmax(logits))
        paddles = seconds(lambda: paddle.nn.functional.log_softmax(logits, axis=-1))
        print(json.dumps({
            "rows": args.rows, "vocab": vocab, "paddle_log_softmax_s": round(paddles, 4),
            "x_minus_logsumexp_s": round(ours, 4), "ratio": round(paddles / ours, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
