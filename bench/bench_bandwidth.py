"""How fast this machine streams float32 weights: the bound on a decode step, which reads every weight once.

    .venv/bin/python bench/bench_bandwidth.py

Prints one JSON object per measurement, the best of 3: paddle's sum and numpy's sum (one thread) over
418 MB, and paddle's matmul of 8 and 32 rows against 24 (896, 4864) weight matrices (418 MB in all,
Qwen2.5-0.5B's MLP shape), as GB/s of weights read and GFLOP/s.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import numpy as np  # noqa: E402

HIDDEN, INTER, LAYERS = 896, 4864, 24
BYTES = LAYERS * HIDDEN * INTER * 4


def best_seconds(run) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    weights = [paddle.randn([HIDDEN, INTER]) for _ in range(LAYERS)]  # far beyond the caches
    flat = paddle.randn([LAYERS, HIDDEN * INTER])
    host = np.random.default_rng(0).random(LAYERS * HIDDEN * INTER, dtype=np.float32)
    results = [
        ("paddle sum", best_seconds(lambda: float(flat.sum())), 0),
        ("numpy sum, 1 thread", best_seconds(host.sum), 0),
    ]
    for rows in (8, 32):
        x = paddle.randn([rows, HIDDEN])
        seconds = best_seconds(lambda: [paddle.matmul(x, w) for w in weights][-1].numpy())
        results.append((f"matmul of {rows} rows", seconds, 2 * rows * HIDDEN * INTER * LAYERS))
    for name, seconds, flops in results:
        print(json.dumps({"measure": name, "megabytes": round(BYTES / 1e6), "gb_per_second": round(BYTES / seconds / 1e9, 1),
                          "gflop_per_second": round(flops / seconds / 1e9, 1) if flops else None}))


if __name__ == "__main__":
    main()
