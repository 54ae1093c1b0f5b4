"""Sampling cases that every machine builds bit for bit (integer hashing, exact conversions), for the comparison of
the CPU kernel and the CUDA kernel row for row: tests/kernels/test_ops.py checks that grpo_sample on the CPU still draws the
tokens recorded in tests/data/sampling_tokens.json, and tests/kernels/test_cuda_kernels.py that the GPU draws them too.

    .venv/bin/python tests/helpers/sampling_cases.py      rewrites the record from the CPU kernel (after a change of the
                                                  sampling definition, csrc/grpo_sampling.h, and only then)
"""

import json
from pathlib import Path

import numpy as np

RECORD = Path(__file__).resolve().parents[1] / "data" / "sampling_tokens.json"
ROWS = 64
VOCABS = (49152, 151936)  # SmolLM2, Qwen2.5

# name -> (logits kind, settings). Settings: seed, step, min_new_tokens, temperature, top_k, top_p, min_p,
# repetition_penalty, greedy. Together they take every path of the CUDA kernel: greedy, no filter, the candidate
# window (top-k, top-p within the 2,048 largest), and the full row (top-k above 4,096, a flat tail for top-p).
CASES = {
    "greedy": ("smooth", dict(seed=1, step=0, min_new_tokens=0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                              repetition_penalty=1.3, greedy=True)),
    "plain": ("smooth", dict(seed=2, step=3, min_new_tokens=0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                             repetition_penalty=1.0, greedy=False)),
    "top_p": ("smooth", dict(seed=3, step=7, min_new_tokens=0, temperature=0.7, top_k=0, top_p=0.95, min_p=0.0,
                             repetition_penalty=1.0, greedy=False)),
    "all_filters": ("smooth", dict(seed=4, step=1, min_new_tokens=0, temperature=0.8, top_k=50, top_p=0.9,
                                   min_p=0.05, repetition_penalty=1.2, greedy=False)),
    "eos_blocked": ("smooth", dict(seed=5, step=1, min_new_tokens=4, temperature=1.0, top_k=0, top_p=0.5,
                                   min_p=0.0, repetition_penalty=1.3, greedy=False)),
    "ties_top_p": ("ties", dict(seed=6, step=2, min_new_tokens=0, temperature=1.0, top_k=0, top_p=0.6, min_p=0.0,
                                repetition_penalty=1.0, greedy=False)),
    "ties_top_k": ("ties", dict(seed=7, step=2, min_new_tokens=0, temperature=1.0, top_k=300, top_p=0.8,
                                min_p=0.0, repetition_penalty=1.0, greedy=False)),
    "ties_greedy": ("ties", dict(seed=8, step=0, min_new_tokens=0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                 repetition_penalty=1.0, greedy=True)),
    "wide_top_k": ("smooth", dict(seed=9, step=5, min_new_tokens=0, temperature=1.0, top_k=6000, top_p=0.97,
                                  min_p=0.0, repetition_penalty=1.0, greedy=False)),
    "flat_top_p": ("flat", dict(seed=10, step=4, min_new_tokens=0, temperature=1.0, top_k=0, top_p=0.9,
                                min_p=0.0, repetition_penalty=1.0, greedy=False)),
    "flat_min_p": ("flat", dict(seed=11, step=4, min_new_tokens=0, temperature=1.3, top_k=0, top_p=1.0,
                                min_p=0.98, repetition_penalty=1.0, greedy=False)),
}
EOS = (2, 7)


def _hash(*keys) -> np.ndarray:
    """splitmix64 of the keys combined (uint64 arrays or ints), as in csrc/grpo_sampling.h."""
    x = np.zeros(np.broadcast_shapes(*(np.shape(k) for k in keys)), np.uint64)
    with np.errstate(over="ignore"):
        for k in keys:
            x = x ^ np.asarray(k, np.uint64)
            x = x + np.uint64(0x9E3779B97F4A7C15)
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x = x ^ (x >> np.uint64(31))
    return x


def _unit(bits: np.ndarray) -> np.ndarray:
    """24 random bits -> float32 in [0, 1), exactly."""
    return (bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


def inputs(kind: str, V: int, case: str):
    """logits (ROWS, V) float32, presence (ROWS, V) uint8, row keys (ROWS,) int64."""
    salt = int(_hash(np.uint64(sum(map(ord, kind + case)))))
    rows = np.arange(ROWS, dtype=np.uint64)[:, None]
    cols = np.arange(V, dtype=np.uint64)[None, :]
    h = _hash(salt, rows, cols)
    if kind == "smooth":  # a sum of four uniforms: a bell of width ~3, a long tail of unlikely tokens
        g = _hash(h, 1)
        logits = (_unit(h) + _unit(g) + _unit(_hash(g, 2)) + _unit(_hash(g, 3)) - np.float32(2)) * np.float32(6)
        logits[:, :5] += np.float32(4)  # a few likely tokens
    elif kind == "ties":  # multiples of 1/4 in [-4, 4): every value shared by thousands of tokens, signed zeros
        logits = ((h >> np.uint64(61)).astype(np.float32) - np.float32(4)) + (
            (h >> np.uint64(59)) & np.uint64(3)).astype(np.float32) * np.float32(0.25)
        zero = logits == 0
        logits[zero & ((h & np.uint64(1)) == 1)] = np.float32(-0.0)
    else:  # flat: within 0.05 of each other, so top-p needs most of the row
        logits = _unit(h) * np.float32(0.05)
    logits = logits.astype(np.float32)
    logits[ROWS - 1, :] = -np.inf  # a row with nothing left but the eos ids (and nothing at all while they are blocked)
    logits[ROWS - 1, list(EOS)] = np.float32(1.0)
    presence = ((_hash(h, 9) >> np.uint64(59)) == 0).astype(np.uint8)  # 1 in 32 tokens already generated
    row_keys = (np.arange(ROWS) * 3 + 11).astype(np.int64)
    return logits, presence, row_keys


def all_cases():
    for V in VOCABS:
        for name, (kind, settings) in CASES.items():
            yield f"{name}-{V}", V, kind, settings


def record_cpu_tokens() -> None:
    from alignment.kernels.ops import load_ops
    from alignment.basics.runtime import import_paddle

    paddle = import_paddle()
    ops = load_ops()[0]
    record = {}
    for key, V, kind, s in all_cases():
        logits, presence, row_keys = inputs(kind, V, key)
        tokens, _ = ops.grpo_sample(paddle.to_tensor(logits), paddle.to_tensor(presence),
                                    paddle.to_tensor(np.asarray(EOS, np.int64)), paddle.to_tensor(row_keys),
                                    s["seed"], s["step"], s["min_new_tokens"], s["temperature"], s["top_k"],
                                    s["top_p"], s["min_p"], s["repetition_penalty"], s["greedy"])
        record[key] = tokens.numpy().tolist()
    RECORD.write_text(json.dumps(record, indent=0) + "\n")
    print(f"wrote {RECORD} ({len(record)} cases)")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    record_cpu_tokens()
