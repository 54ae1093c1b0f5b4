"""The compiled rollout operators (csrc/) against float64 numpy references on fresh random inputs.

Every test draws its inputs from the `rng` fixture (tests/conftest.py): a fresh seed each run unless GRPO_TEST_SEED
pins it (CI does), named in the failure message, so GRPO_TEST_SEED=<seed> replays a failure.
"""

import importlib.util
import itertools
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers.float_references import bf16_round, close, rope_tables

from alignment.basics.runtime import import_paddle
from alignment.kernels import ops as ops_module

paddle = import_paddle()
REPO = Path(__file__).resolve().parents[2]


def t(a, dtype=None):
    return paddle.to_tensor(np.ascontiguousarray(a), dtype=dtype)


def as_cache(a: np.ndarray, dtype: str):
    """A float32 array as a cache tensor of dtype (bfloat16: a's values rounded)."""
    return t(a) if dtype == "float32" else t(a).astype("bfloat16")


def rotate_ref(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------------------------------------


def test_load_reports_a_missing_build(monkeypatch, tmp_path):
    monkeypatch.setattr(ops_module, "LIBRARY", tmp_path / "grpo_ops.so")
    loaded, reason = ops_module.load_ops.__wrapped__()
    assert loaded is None and "make ops" in reason


@pytest.mark.parametrize("shape", [(1, 64), (3, 5, 96), (2, 2, 3, 32)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm(ops, rng, shape, with_residual):
    x = rng.standard_normal(shape).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    eps = 1e-6
    out, res_out = ops.grpo_add_rms_norm(t(x), t(res) if with_residual else None, t(w), eps)
    h = x.astype(np.float64) + (res if with_residual else 0.0)
    ref = h / np.sqrt((h**2).mean(-1, keepdims=True) + eps) * w
    close(res_out.numpy(), h, rng, "residual_out")
    close(out.numpy(), ref, rng, "out")


def test_add_rms_norm_rejects_a_mismatched_weight(ops):
    with pytest.raises(Exception, match="weight must be"):
        ops.grpo_add_rms_norm(paddle.ones([2, 8]), None, paddle.ones([4]), 1e-6)


ATTN_CASES = [  # B, Bcap, T, start, H, KVH, D, S
    (1, 1, 1, 0, 4, 2, 64, 8),  # first decode step of a single row
    (1, 2, 1, 5, 4, 2, 64, 8),  # decode, spare cache rows
    (3, 4, 6, 0, 14, 2, 32, 10),  # prefill, Qwen2-0.5B head layout
    (2, 2, 1, 9, 14, 2, 32, 10),  # decode into the last slot
    (4, 5, 3, 2, 4, 4, 64, 7),  # multi-token append after a prefix, no grouping
    (5, 6, 1, 44, 9, 3, 64, 48),  # decode over up to 45 slots: blocks of 16 keys and a tail (SmolLM2's heads)
    (3, 3, 1, 37, 14, 2, 64, 40),  # decode, 7 query heads a KV head at D = 64 (Qwen2.5-0.5B's layout)
    (3, 3, 2, 31, 4, 1, 128, 40),  # D = 128, exactly 32 slots for the first query
    (2, 2, 20, 0, 4, 2, 64, 24),  # prefill of 20 tokens
    # prefills in blocks of 64 queries (grpo::prefill_in_blocks): on bf16 pairs from 64 queries on (a bfloat16 cache
    # with round_bf16), through sgemm where the last query sees 512 keys or more; one query at a time otherwise
    (2, 3, 150, 0, 9, 3, 64, 160),  # the last block short (SmolLM2's heads)
    (3, 3, 65, 5, 4, 2, 48, 72),  # a last block of one query, D = 48
    (2, 2, 520, 0, 4, 2, 64, 520),  # through sgemm too
    (2, 2, 96, 430, 4, 2, 64, 530),  # 96 tokens appended after 430 (a later turn)
    (1, 2, 66, 460, 4, 1, 128, 530),  # D = 128
    (3, 3, 1, 37, 4, 2, 48, 40),  # D without an AVX-512 path
]


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B,Bcap,T,start,H,KVH,D,S", ATTN_CASES)
def test_rope_kv_write(ops, rng, B, Bcap, T, start, H, KVH, D, S, cache_dtype):
    L, layer, P = 3, 1, 64
    cos, sin = rope_tables(P, D)
    qkv = rng.standard_normal((B, T, (H + 2 * KVH) * D)).astype(np.float32)
    positions = rng.integers(0, P, size=(B, T))
    cache0 = rng.standard_normal((L, 2, Bcap, S, KVH, D)).astype(np.float32)
    cache = as_cache(cache0, cache_dtype)
    q, cache_out = ops.grpo_rope_kv_write(t(qkv), t(positions, "int64"), t(cos), t(sin), cache, layer, start, H, KVH)
    if cache_dtype == "bfloat16":  # keys and values rounded once from what the float32 cache holds, the rest untouched
        fp32_cache = t(cache0)
        ops.grpo_rope_kv_write(t(qkv), t(positions, "int64"), t(cos), t(sin), fp32_cache, layer, start, H, KVH)
        np.testing.assert_array_equal(cache.astype("float32").numpy(), bf16_round(fp32_cache.numpy()))
        assert cache_out.dtype == paddle.bfloat16
        return

    c, s = cos[positions][:, :, None, :], sin[positions][:, :, None, :]  # (B, T, 1, D)
    x = qkv.astype(np.float64)
    q_ref = rotate_ref(x[..., : H * D].reshape(B, T, H, D), c, s)
    k_ref = rotate_ref(x[..., H * D : (H + KVH) * D].reshape(B, T, KVH, D), c, s)
    v_ref = x[..., (H + KVH) * D :].reshape(B, T, KVH, D)
    expected = cache0.astype(np.float64).copy()
    expected[layer, 0, :B, start : start + T] = k_ref
    expected[layer, 1, :B, start : start + T] = v_ref
    close(q.numpy(), q_ref, rng, "rotated q")
    close(cache.numpy(), expected, rng, "cache written in place (untouched elsewhere)")
    close(cache_out.numpy(), expected, rng, "returned cache")


def test_the_cache_ops_name_a_cache_of_another_dtype(ops):
    cache = paddle.zeros([1, 2, 2, 4, 2, 8], "float64")
    table = paddle.ones([16, 8])
    with pytest.raises(Exception, match=r"cache must be float32 \(or bfloat16 on the CPU\), got float64"):
        ops.grpo_rope_kv_write(paddle.zeros([2, 1, 64]), paddle.zeros([2, 1], "int64"), table, table, cache, 0, 0, 4, 2)
    with pytest.raises(Exception, match=r"cache must be float32 \(or bfloat16 on the CPU\), got float64"):
        ops.grpo_cache_attention(paddle.zeros([2, 1, 4, 8]), cache, paddle.zeros([2], "int64"), None, None, 0, 0)


def test_rope_kv_write_checks_the_cache_bounds(ops):
    cache = paddle.zeros([1, 2, 2, 4, 2, 8])
    qkv, pos = paddle.zeros([2, 3, 8 * 8]), paddle.zeros([2, 3], dtype="int64")
    table = paddle.ones([16, 8])
    with pytest.raises(Exception, match=r"slots \[2, 5\) do not fit"):
        ops.grpo_rope_kv_write(qkv, pos, table, table, cache, 0, 2, 4, 2)
    with pytest.raises(Exception, match="exceeds cache capacity"):
        ops.grpo_rope_kv_write(paddle.zeros([3, 1, 64]), paddle.zeros([3, 1], "int64"), table, table, cache, 0, 0, 4, 2)


def cache_attention_reference(q, cache, first, start, layer, group, round_bf16=False):
    """float64 softmax(q k / sqrt(D)) v over each query's slots first[b] .. start + t of the cache's layer ->
    (out (B, T, H, D), the size (P @ |v|) of each output, its slack); round_bf16: q and the normalised weights rounded
    to bf16 first, as grpo_cache_attention's round_bf16 does. A weight within 1e-5 of its size of the midpoint between
    two bf16 values may round to either in fp32, which computes it a little differently: the slack sums each such
    weight's step between the two times |v| (0 without round_bf16)."""
    B, T, H, D = q.shape
    out, size, slack = np.zeros((B, T, H, D)), np.zeros((B, T, H, D)), np.zeros((B, T, H, D))
    q = bf16_round(q) if round_bf16 else q.astype(np.float64)
    for b, tt, h in itertools.product(range(B), range(T), range(H)):
        lo, hi = first[b], start + tt
        if lo > hi:
            continue
        k = cache[layer, 0, b, lo : hi + 1, h // group].astype(np.float64)
        v = cache[layer, 1, b, lo : hi + 1, h // group].astype(np.float64)
        p = np.exp(k @ q[b, tt, h] / np.sqrt(D) - (k @ q[b, tt, h] / np.sqrt(D)).max())
        p /= p.sum()
        if round_bf16:
            step = bf16_round((p * (1 + 1e-5)).astype(np.float32)) - bf16_round((p * (1 - 1e-5)).astype(np.float32))
            slack[b, tt, h] = step @ np.abs(v)
            p = bf16_round(p.astype(np.float32))
        out[b, tt, h], size[b, tt, h] = p @ v, p @ np.abs(v)
    return out, size, slack


def cache_attention_case(rng, B, Bcap, T, start, H, KVH, D, S):
    """A cache of 2 layers, queries, and first slots: row 0 has no left padding; the others start anywhere up to past
    the last query (all padding)."""
    cache = (rng.standard_normal((2, 2, Bcap, S, KVH, D)) * 2).astype(np.float32)
    q = (rng.standard_normal((B, T, H, D)) * 2).astype(np.float32)
    first = rng.integers(0, start + T + 1, size=B)
    first[0] = 0
    return cache, q, first


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B,Bcap,T,start,H,KVH,D,S", ATTN_CASES)
def test_cache_attention(ops, rng, B, Bcap, T, start, H, KVH, D, S, cache_dtype):
    """Against float64 on the values the cache holds (a bf16 cache's keys and values are its rounded ones), to fp32's
    precision of each output's size (P @ |v|): a long prefill's blocks sum over D in sgemm's order (up to 7.4e-6 of the
    size over 1,800 draws of such cases), one query at a time in a tree of partial sums (2e-6)."""
    cache, q, first = cache_attention_case(rng, B, Bcap, T, start, H, KVH, D, S)
    out = ops.grpo_cache_attention(t(q), as_cache(cache, cache_dtype), t(first, "int64"), None, None, 1, start).numpy()
    held = bf16_round(cache) if cache_dtype == "bfloat16" else cache
    ref, size, _ = cache_attention_reference(q, held, first, start, 1, H // KVH)
    assert out.shape == (B, T, H * D)
    assert np.isfinite(out).all(), f"NaN/inf in attention output (seed {rng.seed})"
    error = np.abs(out.reshape(B, T, H, D) - ref)
    assert (error <= 2e-5 * size + 1e-6).all(), f"first_slot {first.tolist()}: {(error - 2e-5 * size).max()} (seed {rng.seed})"


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B,Bcap,T,start,H,KVH,D,S", ATTN_CASES)
def test_cache_attention_rounds_the_query_and_the_weights_with_round_bf16(ops, rng, B, Bcap, T, start, H, KVH, D, S, cache_dtype):
    """round_bf16 (the bf16 engine's) rounds each query and the normalised weights to bf16 before their products: against
    float64 with the same roundings, to fp32's precision but for the weights that lie at the midpoint of two bf16 values
    (the reference's slack). Without the roundings the outputs would be off by more."""
    cache, q, first = cache_attention_case(rng, B, Bcap, T, start, H, KVH, D, S)
    out = ops.grpo_cache_attention(t(q), as_cache(cache, cache_dtype), t(first, "int64"), None, None, 1, start, True)
    out = out.numpy().reshape(B, T, H, D)
    held = bf16_round(cache) if cache_dtype == "bfloat16" else cache
    ref, size, slack = cache_attention_reference(q, held, first, start, 1, H // KVH, round_bf16=True)
    error = np.abs(out - ref)
    assert (error <= slack + 1e-5 * size + 1e-6).all(), f"{(error - slack).max()} (seed {rng.seed})"
    if start + T - 1 - first.min() >= 1:  # some query sees two keys or more (with one, its weight is 1 either way)
        unrounded = cache_attention_reference(q, held, first, start, 1, H // KVH)[0]
        assert (np.abs(out - unrounded) > 1e-4 * size + 1e-6).any()


@pytest.mark.parametrize("shape", [(4, 96), (2, 3, 80), (1, 1, 2)])
def test_silu_mul(ops, rng, shape):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    half = shape[-1] // 2
    a, u = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    close(ops.grpo_silu_mul(t(x)).numpy(), a / (1 + np.exp(-a)) * u, rng, "silu_mul")


# --------------------------------------------------------------------------------------------- sampling


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def shape_logits(raw, presence, eos, step, min_new, rp):
    w = raw.astype(np.float64).copy()
    if rp != 1.0:
        hit = presence != 0
        w[hit] = np.where(w[hit] > 0, w[hit] / rp, w[hit] * rp)
    if step < min_new and len(eos):
        w[:, eos] = -np.inf
    return w


def kept_mask(w, temperature, top_k, top_p, min_p):
    """(B, V) bool: tokens the filters keep, in the order of the spec."""
    w = w / temperature
    B, V = w.shape
    keep = np.isfinite(w)
    if 0 < top_k < V:
        kth = -np.sort(-w, axis=-1)[:, top_k - 1 : top_k]
        keep &= w >= kth
    w = np.where(keep, w, -np.inf)
    if top_p < 1.0:
        p = np.exp(w - w.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        order = np.argsort(-w, axis=-1, kind="stable")
        ranked = np.take_along_axis(p, order, -1)
        above = np.cumsum(ranked, -1) - ranked
        drop_ranked = above >= top_p
        drop_ranked[:, 0] = False
        drop = np.zeros_like(keep)
        np.put_along_axis(drop, order, drop_ranked, -1)
        keep &= ~drop
    w = np.where(keep, w, -np.inf)
    if min_p > 0:
        p = np.exp(w - w.max(-1, keepdims=True))
        keep &= p >= min_p
    return keep


def sample(ops, logits, presence=None, eos=(), seed=0, step=0, min_new=0, temperature=1.0, top_k=0, top_p=1.0,
           min_p=0.0, rp=1.0, greedy=False, row_keys=None):
    B, V = logits.shape
    if presence is None:
        presence = np.zeros((B, V), np.uint8)
    row_keys = np.arange(B) if row_keys is None else row_keys
    tokens, logprobs = ops.grpo_sample(t(logits), t(presence), t(np.asarray(eos, np.int64), "int64"),
                                       t(np.asarray(row_keys, np.int64), "int64"), seed, step, min_new, temperature,
                                       top_k, top_p, min_p, rp, greedy)
    return tokens.numpy(), logprobs.numpy()


@pytest.mark.parametrize("rows", [0, 1, 8, 32, 77])
@pytest.mark.parametrize("K, N, transpose", [(64, 96, False), (96, 640, True), (33, 17, False)])
def test_packed_matmul(ops, rng, rows, K, N, transpose):
    if not hasattr(ops, "grpo_pack_weight"):
        pytest.skip("the operators were built without MKL (no libmklml_intel.so in paddle's libs)")
    weight = rng.standard_normal((N, K) if transpose else (K, N)).astype(np.float32)
    x = rng.standard_normal((rows, 3, K)).astype(np.float32)  # any leading shape: (rows, 3) rows of K
    packed = ops.grpo_pack_weight(t(weight), transpose)
    expected = x.astype(np.float64) @ (weight.T if transpose else weight).astype(np.float64)
    close(ops.grpo_packed_matmul(t(x), packed, N).numpy(), expected, rng, "packed matmul", rtol=1e-4, atol=1e-4)


def test_packed_matmul_refuses_a_buffer_of_another_shape(ops):
    if not hasattr(ops, "grpo_pack_weight"):
        pytest.skip("the operators were built without MKL (no libmklml_intel.so in paddle's libs)")
    packed = ops.grpo_pack_weight(paddle.ones([640, 96]), False)
    with pytest.raises(OSError, match=r"grpo_packed_matmul: packed holds \d+ floats, not a packed \(32, 96\) matrix"):
        ops.grpo_packed_matmul(paddle.ones([4, 32]), packed, 96)


@pytest.mark.parametrize("rp,step,min_new", [(1.0, 0, 0), (1.3, 0, 4), (0.8, 5, 4)])
def test_greedy_is_the_argmax_of_the_shaped_logits(ops, rng, rp, step, min_new):
    B, V = 16, 1000
    raw = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    presence = (rng.random((B + 3, V)) < 0.05).astype(np.uint8)  # Bcap > B: extra rows unread
    eos = rng.choice(V, size=2, replace=False)
    raw[:, eos[0]] += 12  # the eos would win unless blocked
    # make the presence penalty decide: a present token holds the maximum in half the rows
    for b in range(0, B, 2):
        v = int(np.argmax(raw[b]))
        presence[b, v] = 1
    tokens, logprobs = sample(ops, raw, presence, eos, step=step, min_new=min_new, rp=rp, greedy=True)
    shaped = shape_logits(raw, presence[:B], eos, step, min_new, rp)
    np.testing.assert_array_equal(tokens, shaped.argmax(-1), err_msg=f"seed {rng.seed}")
    close(logprobs, log_softmax(raw.astype(np.float64))[np.arange(B), tokens], rng, "greedy logprobs (t = 1)")
    if step < min_new:
        assert not np.isin(tokens, eos).any()


def test_greedy_takes_the_first_of_equal_maxima(ops):
    logits = np.zeros((3, 10), np.float32)
    logits[:, [7, 3, 5]] = 2.0
    tokens, _ = sample(ops, logits, greedy=True)
    assert tokens.tolist() == [3, 3, 3]


def test_sampled_logprobs_are_the_raw_tempered_log_softmax(ops, rng):
    B, V, temperature = 32, 2000, 0.7
    raw = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    presence = (rng.random((B, V)) < 0.1).astype(np.uint8)
    tokens, logprobs = sample(ops, raw, presence, seed=int(rng.integers(1 << 62)), temperature=temperature, top_k=50,
                              top_p=0.9, min_p=0.02, rp=1.2)
    ref = log_softmax(raw.astype(np.float64) / temperature)[np.arange(B), tokens]
    close(logprobs, ref, rng, "logprobs of the unshaped distribution")


@pytest.mark.parametrize(
    "top_k,top_p,min_p,rp",
    [(20, 1.0, 0.0, 1.0), (0, 0.7, 0.0, 1.0), (0, 1.0, 0.1, 1.0), (40, 0.8, 0.05, 1.3), (0, 0.95, 0.0, 0.7)],
)
def test_filters_never_pick_a_removed_token(ops, rng, top_k, top_p, min_p, rp):
    B, V, temperature = 512, 600, 0.8
    raw = (rng.standard_normal((B, V)) * 2.5).astype(np.float32)
    presence = (rng.random((B, V)) < 0.1).astype(np.uint8)
    eos = [3, 17]
    tokens, _ = sample(ops, raw, presence, eos, seed=int(rng.integers(1 << 62)), step=1, min_new=2,
                       temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, rp=rp)
    keep = kept_mask(shape_logits(raw, presence, eos, 1, 2, rp), temperature, top_k, top_p, min_p)
    picked = keep[np.arange(B), tokens]
    assert picked.all(), f"rows {np.flatnonzero(~picked)[:10].tolist()} picked removed tokens (seed {rng.seed})"
    assert not np.isin(tokens, eos).any()
    # The filters leave a real choice: not every row collapsed onto its top token.
    assert (tokens != raw.argmax(-1)).any()


def test_eos_is_blocked_until_min_new_tokens(ops, rng):
    B, V = 64, 300
    raw = rng.standard_normal((B, V)).astype(np.float32)
    eos = [0, 299]
    raw[:, eos] = 30.0  # overwhelming unless blocked: another token wins with odds below 1e-9 a row (15 left 1 in 200 runs failing)
    seed = int(rng.integers(1 << 62))
    early, _ = sample(ops, raw, eos=eos, seed=seed, step=2, min_new=3)
    late, _ = sample(ops, raw, eos=eos, seed=seed, step=3, min_new=3)
    assert not np.isin(early, eos).any()
    assert np.isin(late, eos).all()


def test_repetition_penalty_matches_the_reference(ops, rng):
    B, V, rp = 8, 50, 1.5
    raw = (rng.standard_normal((B, V)) * 0.4).astype(np.float32)  # below 2.5 but for 6-sigma draws
    raw[:, 10], raw[:, 11] = 3.0, 2.5  # 10 wins unless penalised: 3/1.5 = 2 < 2.5
    raw[:, 20] = -0.4  # a present negative logit is pushed further down
    presence = np.zeros((B, V), np.uint8)
    presence[::2, 10] = 1
    presence[:, 20] = 1
    tokens, _ = sample(ops, raw, presence, rp=rp, greedy=True)
    assert tokens.tolist() == [11, 10] * (B // 2)
    shaped = shape_logits(raw, presence, [], 0, 0, rp)
    np.testing.assert_allclose(shaped[0, 20], -0.6)
    np.testing.assert_array_equal(tokens, shaped.argmax(-1))


def test_same_seed_same_tokens_other_seed_other_tokens(ops, rng):
    B, V = 64, 1000
    raw = (rng.standard_normal((B, V)) * 0.5).astype(np.float32)
    seed = int(rng.integers(1 << 62))
    first, _ = sample(ops, raw, seed=seed, step=4, top_p=0.95)
    again, _ = sample(ops, raw, seed=seed, step=4, top_p=0.95)
    other, _ = sample(ops, raw, seed=seed + 1, step=4, top_p=0.95)
    next_step, _ = sample(ops, raw, seed=seed, step=5, top_p=0.95)
    np.testing.assert_array_equal(first, again)
    assert (first != other).sum() > B // 2
    assert (first != next_step).sum() > B // 2
    # Rows are keyed by their row key, so one row's draw does not depend on the batch around it.
    alone, _ = sample(ops, raw[:5], seed=seed, step=4, top_p=0.95)
    np.testing.assert_array_equal(alone, first[:5])
    tail, _ = sample(ops, raw[40:], seed=seed, step=4, top_p=0.95, row_keys=np.arange(40, B))
    np.testing.assert_array_equal(tail, first[40:])
    shuffled = rng.permutation(B)
    moved, _ = sample(ops, raw[shuffled], seed=seed, step=4, top_p=0.95, row_keys=shuffled)
    np.testing.assert_array_equal(moved, first[shuffled])


def test_sampling_frequencies_match_the_filtered_distribution(ops, rng):
    N, V, temperature, top_k, top_p = 20000, 40, 0.7, 12, 0.9
    row = (rng.standard_normal(V) * 1.5).astype(np.float32)
    tokens, _ = sample(ops, np.tile(row, (N, 1)), seed=int(rng.integers(1 << 62)), temperature=temperature,
                       top_k=top_k, top_p=top_p)
    keep = kept_mask(row[None].astype(np.float64), temperature, top_k, top_p, 0.0)[0]
    p = np.where(keep, np.exp(row / temperature - (row / temperature).max()), 0.0)
    p /= p.sum()
    freq = np.bincount(tokens, minlength=V) / N
    assert freq[~keep].sum() == 0
    se = np.sqrt(p * (1 - p) / N)
    worst = np.max(np.abs(freq - p) / np.maximum(se, 1e-12))
    assert worst < 5, f"frequency off by {worst:.1f} standard errors (seed {rng.seed})"


def test_sample_checks_its_inputs(ops):
    with pytest.raises(Exception, match="presence must be"):
        ops.grpo_sample(paddle.zeros([4, 10]), paddle.zeros([2, 10], "uint8"), paddle.zeros([0], "int64"),
                        paddle.arange(4), 0, 0, 0, 1.0, 0, 1.0, 0.0, 1.0, False)
    with pytest.raises(Exception, match="row_keys must be"):
        ops.grpo_sample(paddle.zeros([4, 10]), paddle.zeros([4, 10], "uint8"), paddle.zeros([0], "int64"),
                        paddle.arange(3), 0, 0, 0, 1.0, 0, 1.0, 0.0, 1.0, False)


# --------------------------------------------------------------------------------------------- bookkeeping


def test_stop_update(ops, rng):
    Bcap, B, V = 9, 6, 40
    presence0 = (rng.random((Bcap, V)) < 0.2).astype(np.uint8)
    tokens = rng.integers(0, V, size=B)
    eos = np.array([tokens[1], tokens[4], V - 1])
    presence = t(presence0)
    done, presence_out = ops.grpo_stop_update(t(tokens, "int64"), presence, t(eos, "int64"))
    expected = presence0.copy()
    expected[np.arange(B), tokens] = 1
    np.testing.assert_array_equal(done.numpy(), np.isin(tokens, eos), err_msg=f"seed {rng.seed}")
    np.testing.assert_array_equal(presence.numpy(), expected)
    np.testing.assert_array_equal(presence_out.numpy(), expected)
    no_eos, _ = ops.grpo_stop_update(t(tokens, "int64"), presence, paddle.zeros([0], "int64"))
    assert not no_eos.numpy().any()


def random_keep(rng, rows):
    n = int(rng.integers(0, rows + 1))
    return np.sort(rng.choice(rows, size=n, replace=False))


@pytest.mark.parametrize("prefix", [-1, 0, 3, 7])
def test_compact_rows_of_the_cache(ops, rng, prefix):
    L, Bcap, S, KVH, D = 2, 6, 7, 2, 8
    cache0 = rng.standard_normal((L, 2, Bcap, S, KVH, D)).astype(np.float32)
    keep = random_keep(rng, Bcap)
    cache = t(cache0)
    ops.grpo_compact_rows(cache, t(keep, "int64"), 2, prefix)
    expected = cache0.copy()
    used = S if prefix < 0 else prefix
    expected[:, :, : len(keep), :used] = cache0[:, :, keep, :used]
    np.testing.assert_array_equal(cache.numpy(), expected, err_msg=f"keep {keep.tolist()} (seed {rng.seed})")


@pytest.mark.parametrize("round_bf16", [False, True])
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("D", [8, 64])
def test_cache_attention_over_shared_prompts_equals_it_over_each_rows_copy(ops, rng, cache_dtype, round_bf16, D):
    """A decode step whose rows read their prompt's slots (before prompt_cache's end) from the prompt cache gives, to the
    bit, what it gives over a cache holding a copy of its prompt in every row: the same values in the same order. The
    rows' prompts in any order, as compaction leaves them; head size 64 takes the vector kernels, 8 the plain loops."""
    L, U, B, W, S, H, KVH = 2, 3, 7, 5, 12, 6, 2
    prompts = (rng.standard_normal((L, 2, U, W, KVH, D)) * 2).astype(np.float32)
    of_row = rng.integers(0, U, size=B)
    own = (rng.standard_normal((L, 2, B, S, KVH, D)) * 2).astype(np.float32)
    copied = own.copy()
    copied[:, :, :, :W] = prompts[:, :, of_row]
    own[:, :, :, :W] = np.nan  # never read
    q = (rng.standard_normal((B, 1, H, D)) * 2).astype(np.float32)
    first = rng.integers(0, W + 1, size=B)  # left padding, or a whole prompt of it
    start = W + 4

    def attend(cache, prompt_cache=None, rows=None):
        return ops.grpo_cache_attention(
            t(q), as_cache(cache, cache_dtype), t(first, "int64"), prompt_cache, rows, 1, start, round_bf16
        ).numpy()

    expected = attend(copied)
    shared = attend(own, as_cache(prompts, cache_dtype), t(of_row, "int64"))
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(shared, expected, err_msg=f"prompt_of_row {of_row.tolist()} (seed {rng.seed})")
    with pytest.raises(Exception, match="prompt_cache and prompt_of_row come together"):
        attend(own, as_cache(prompts, cache_dtype))
    with pytest.raises(Exception, match=r"prompt_of_row\[0\] = 3 is not one of the 3 prompts"):
        attend(own, as_cache(prompts, cache_dtype), t(np.full(B, U), "int64"))
    with pytest.raises(Exception, match="its slots come before the queries'"):
        ops.grpo_cache_attention(t(q), as_cache(own, cache_dtype), t(first, "int64"), as_cache(prompts, cache_dtype),
                                 t(of_row, "int64"), 1, W - 1, round_bf16)


def test_compact_rows_of_presence(ops, rng):
    Bcap, V = 11, 33
    presence0 = (rng.random((Bcap, V)) < 0.3).astype(np.uint8)
    keep = random_keep(rng, Bcap)
    presence = t(presence0)
    out = ops.grpo_compact_rows(presence, t(keep, "int64"), 0, -1)
    expected = presence0.copy()
    expected[: len(keep)] = presence0[keep]
    np.testing.assert_array_equal(presence.numpy(), expected, err_msg=f"keep {keep.tolist()} (seed {rng.seed})")
    np.testing.assert_array_equal(out.numpy(), expected)


def test_compact_rows_rejects_unordered_keep(ops):
    with pytest.raises(Exception, match="strictly ascending"):
        ops.grpo_compact_rows(paddle.zeros([4, 3]), t(np.array([2, 1]), "int64"), 0, -1)


# --------------------------------------------------------------------------------------------- OpenMP runtime


def test_the_build_finds_openmp_entry_points_paddles_runtime_lacks(ops, tmp_path):
    """schedule(dynamic) compiles to GOMP_loop_nonmonotonic_dynamic_*, which paddle's libiomp5 lacks: the libgomp
    paddle also loads served them and every thread ran every iteration. csrc/build.py refuses such a library."""
    build, _ = build_flags()
    runtime = Path(paddle.__file__).parent / "libs" / "libiomp5.so"
    if not runtime.is_file():
        pytest.skip(f"paddle ships no {runtime}: the operators link GCC's libgomp, which has every entry point")
    found = {}
    for schedule in ("dynamic, 1", "static"):
        source = tmp_path / "loop.cc"
        source.write_text(
            f'extern "C" void add_one(int* out, int n) {{\n#pragma omp parallel for schedule({schedule})\n'
            "  for (int i = 0; i < n; ++i) out[i] += 1;\n}\n"
        )
        library = tmp_path / f"loop_{schedule[0]}.so"
        subprocess.run(["g++", "-O2", "-fopenmp", "-shared", "-fPIC", str(source), "-o", str(library)], check=True, timeout=120)
        found[schedule] = build.missing_openmp_entry_points(library, runtime)
    assert found == {"dynamic, 1": ["GOMP_loop_nonmonotonic_dynamic_next", "GOMP_loop_nonmonotonic_dynamic_start"], "static": []}
    assert build.missing_openmp_entry_points(ops_module.LIBRARY, runtime) == []


# --------------------------------------------------------------------------------------------- CUDA sources


CU_SOURCES = sorted((REPO / "csrc").glob("*.cu"))


def nvcc_or_skip() -> str:
    nvcc = shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if Path(p).exists()), None)
    if nvcc is None:
        pytest.skip("nvcc not found (no CUDA toolkit): the CUDA sources cannot be compiled here")
    return nvcc


def build_flags():
    spec = importlib.util.spec_from_file_location("grpo_build", REPO / "csrc" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    from paddle.utils.cpp_extension.extension_utils import find_paddle_includes

    includes = [f"-I{p}" for p in find_paddle_includes(use_cuda=False)] + [f"-I{REPO / 'csrc'}"]
    return build, includes


@pytest.mark.parametrize("source", CU_SOURCES, ids=lambda p: p.name)
def test_cuda_sources_compile(source, tmp_path):
    """nvcc -c of each .cu against the CPU wheel's headers, with the flags csrc/build.py uses."""
    nvcc = nvcc_or_skip()
    build, includes = build_flags()
    cmd = [nvcc, "-c", str(source), "-o", str(tmp_path / "out.o"), "-std=c++17", "-Xcompiler", "-fPIC",
           "-DPADDLE_WITH_CUDA", "-w", *build.CUDA_FLAGS, *includes]
    cmd[cmd.index("-O3")] = "-O1"  # checking that it compiles, not producing the library
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"nvcc failed:\n{' '.join(cmd)}\n{result.stderr[-4000:]}"


def test_gpu_dispatch_of_the_cpp_source_compiles():
    """grpo_ops.cc with GRPO_WITH_CUDA: the branches that call the CUDA launchers (syntax and types only)."""
    nvcc_or_skip()
    build, includes = build_flags()
    from paddle.utils.cpp_extension.extension_utils import find_cuda_home

    homes = [os.environ.get("CUDA_HOME"), find_cuda_home(), "/usr/local/cuda"]
    cuda_include = next((Path(h) / "include" for h in homes if h and (Path(h) / "include/cuda_runtime.h").exists()), None)
    if cuda_include is None:
        pytest.skip(f"cuda_runtime.h not found under any of {homes}")
    cmd = ["g++", "-fsyntax-only", "-std=c++17", "-fopenmp", "-w", "-DGRPO_WITH_CUDA", "-DPADDLE_WITH_CUDA",
           "-DPADDLE_NO_PYTHON", f"-I{cuda_include}", f"-I{cuda_include / 'cccl'}", *includes,
           str(REPO / "csrc" / "grpo_ops.cc")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"g++ failed:\n{' '.join(cmd)}\n{result.stderr[-4000:]}"


# --------------------------------------------------------------------------------------------- one sampling definition


def test_sampling_draws_the_recorded_tokens(ops):
    """The CPU kernel against tests/data/sampling_tokens.json, which the CUDA kernel must also draw row for row
    (tests/kernels/test_cuda_kernels.py on a GPU machine): a change of the sampling definition shows here first. The cases at
    SmolLM2's vocabulary; the GPU test checks the CPU kernel on all of them."""
    import json

    from helpers.sampling_cases import EOS, RECORD, VOCABS, all_cases, inputs

    record = json.loads(RECORD.read_text())
    for key, V, kind, s in all_cases():
        if V != VOCABS[0]:
            continue
        logits, presence, row_keys = inputs(kind, V, key)
        tokens, _ = sample(ops, logits, presence, EOS, s["seed"], s["step"], s["min_new_tokens"], s["temperature"],
                           s["top_k"], s["top_p"], s["min_p"], s["repetition_penalty"], s["greedy"], row_keys)
        differ = np.flatnonzero(tokens != np.asarray(record[key]))
        assert differ.size == 0, f"{key}: rows {differ[:8].tolist()} drew other tokens than the record"


def test_top_p_keeps_ties_at_the_cut_in_index_order(ops):
    # Four tokens of equal logit hold 1/4 of the mass each: top_p 0.5 keeps the first two by index (mass above the
    # third is exactly 0.5), whatever their positions.
    logits = np.full((4000, 9), -np.inf, np.float32)
    logits[:, [6, 1, 8, 3]] = 0.5
    tokens, _ = sample(ops, logits, seed=3, top_p=0.5, row_keys=np.arange(4000))
    assert set(tokens.tolist()) == {1, 3}


def test_top_k_takes_minus_zero_as_plus_zero(ops):
    # -0.0 and +0.0 are one value: with top_k = 2 both zeros tie with the second largest and stay.
    logits = np.array([[1.0, -0.0, -1.0, 0.0, -2.0] * 1], np.float32).repeat(3000, 0)
    tokens, _ = sample(ops, logits, seed=5, top_k=2, row_keys=np.arange(3000))
    assert set(tokens.tolist()) == {0, 1, 3}


@pytest.mark.parametrize("min_p,eos,match", [(1.5, [1], "min_p must be <= 1"), (0.0, [12], r"eos_ids\[0\] = 12 is outside")])
def test_sample_refuses_what_the_gpu_refuses(ops, min_p, eos, match):
    with pytest.raises(Exception, match=match):
        sample(ops, np.zeros((2, 10), np.float32), eos=eos, min_p=min_p)
