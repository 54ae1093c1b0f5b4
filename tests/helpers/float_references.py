"""The float64 references and the comparison the compiled operators' tests share (tests/kernels/test_ops.py,
tests/models/test_train_ops.py, tests/models/test_cpu_bf16.py)."""

import numpy as np


def close(actual, expected, rng, what, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=f"{what} (seed {rng.seed})")


def bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bf16 value (ties to even), as float64: the reference conversion."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def rope_tables(P, D):
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, D, 2, dtype=np.float64) / D))
    freqs = np.outer(np.arange(P, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (P, D), the halves equal as in HF
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
