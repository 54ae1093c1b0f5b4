"""The CUDA kernels (csrc/grpo_kernels.cuh) against float64 references in torch, at the real models' shapes, and the
CUDA sampler against the CPU kernel row for row; compute-sanitizer's memcheck and racecheck over every kernel.
`make test-gpu` runs this on a GPU machine with PyTorch and nvcc (no paddle needed); elsewhere it skips."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import cuda_harness as harness
from helpers import sampling_cases

REASON = harness.unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

if REASON is None:
    import torch

# (heads, kv heads, head dim): SmolLM2-135M, Qwen2.5-0.5B, Qwen2.5-7B, Llama-3-8B
HEADS = [(9, 3, 64), (14, 2, 64), (28, 4, 128), (32, 8, 128)]
DTYPES = ["float32", "bfloat16"]
TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "bfloat16": dict(rtol=2e-2, atol=2e-2)}


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def randn(*shape, dtype="float32", seed=0, scale=1.0):
    x = torch.randn(*shape, generator=gen(seed), device="cuda", dtype=torch.float32) * scale
    return x.to(getattr(torch, dtype))


def close(actual, expected, dtype, what):
    torch.testing.assert_close(actual.double(), expected.double(), **TOL[dtype], msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hd", [576, 896, 3584, 4096])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm(dtype, hd, with_residual):
    x, w = randn(64, hd, dtype=dtype, seed=1, scale=3), randn(hd, dtype=dtype, seed=2)
    r = randn(64, hd, dtype=dtype, seed=3) if with_residual else None
    out, res = harness.add_rms_norm(x, r, w, 1e-6)
    h = (x.double() + (r.double() if r is not None else 0)).to(x.dtype).double()  # the stored residual, rounded
    close(res, h, dtype, "residual out")
    close(out, w.double() * h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6), dtype, "rms norm")


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,KVH,D", HEADS)
def test_rope_kv_write(dtype, H, KVH, D):
    B, T, S, start, P = 4, 3, 16, 5, 32
    qkv = randn(B, T, (H + 2 * KVH) * D, dtype=dtype, seed=4)
    positions = torch.randint(0, P, (B, T), generator=gen(5), device="cuda")
    angle = torch.arange(P, device="cuda", dtype=torch.float64)[:, None] / 10000 ** (
        torch.arange(D // 2, device="cuda", dtype=torch.float64) / (D // 2))
    cos, sin = torch.cat([angle.cos()] * 2, -1).float(), torch.cat([angle.sin()] * 2, -1).float()
    k_cache = torch.zeros(B, S, KVH, D, dtype=qkv.dtype, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    q = harness.rope_kv_write(qkv, positions, cos, sin, k_cache, v_cache, start, H, KVH)
    parts = qkv.double().view(B, T, H + 2 * KVH, D)
    c, s = cos.double()[positions][:, :, None], sin.double()[positions][:, :, None]
    close(q, rotate(parts[:, :, :H], c, s), dtype, "rotated queries")
    close(k_cache[:, start:start + T], rotate(parts[:, :, H:H + KVH], c, s), dtype, "rotated keys in the cache")
    assert torch.equal(v_cache[:, start:start + T], qkv.view(B, T, H + 2 * KVH, D)[:, :, H + KVH:]), "values copied"
    assert not k_cache[:, :start].any() and not k_cache[:, start + T:].any(), "other slots untouched"


def attention_reference(q, k_cache, v_cache, first, start):
    B, T, H, D = q.shape
    KVH = k_cache.shape[2]
    group = H // KVH
    k = k_cache.double().repeat_interleave(group, 2).permute(0, 2, 1, 3)  # [B, H, S, D]
    v = v_cache.double().repeat_interleave(group, 2).permute(0, 2, 1, 3)
    scores = q.double().permute(0, 2, 1, 3) @ k.transpose(-1, -2) / D ** 0.5  # [B, H, T, S]
    slot = torch.arange(k.shape[2], device="cuda")
    position = start + torch.arange(T, device="cuda")
    visible = (slot[None, None, :] >= first[:, None, None]) & (slot[None, None, :] <= position[None, :, None])
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)  # a padding query sees nothing: zeros
    return (weights @ v).permute(0, 2, 1, 3).reshape(B, T, H * D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,KVH,D", HEADS)
@pytest.mark.parametrize("B,T,context", [(1, 1, 4096), (8, 1, 4096), (64, 1, 2048), (4, 16, 48)])
def test_cache_attention(dtype, H, KVH, D, B, T, context):
    start = context - T
    S = context + 3
    q = randn(B, T, H, D, dtype=dtype, seed=6, scale=2)
    k_cache, v_cache = randn(B, S, KVH, D, dtype=dtype, seed=7), randn(B, S, KVH, D, dtype=dtype, seed=8)
    # row 0 from slot 0, the others from a left-padded first slot; in a prefill one row starts after its first query
    first = torch.randint(0, max(1, start // 2), (B,), generator=gen(9), device="cuda")
    first[0] = 0
    if T > 1:
        first[-1] = start + 3
    out = harness.cache_attention(q, k_cache, v_cache, first, start)
    close(out, attention_reference(q, k_cache, v_cache, first, start), dtype,
          f"attention, {harness.lib().grpo_attention_splits(B, T, H, KVH, D, S, start)} splits")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(64, 1536), (3, 18944), (1, 7)])
def test_silu_mul(dtype, rows, inter):
    x = randn(rows, 2 * inter, dtype=dtype, seed=10, scale=4)
    a, u = x.double()[:, :inter], x.double()[:, inter:]
    close(harness.silu_mul(x), a / (1 + torch.exp(-a)) * u, dtype, "silu_mul")


def run_case(key, V, kind, s):
    logits, presence, row_keys = sampling_cases.inputs(kind, V, key)
    host = [torch.from_numpy(a) for a in (logits, presence, np.asarray(sampling_cases.EOS, np.int64), row_keys)]
    gpu_tokens, gpu_logprobs = harness.sample(*[t.cuda() for t in host], s)
    cpu_tokens, cpu_logprobs = harness.sample_cpu(*host, s)
    return gpu_tokens.cpu(), gpu_logprobs.cpu(), cpu_tokens, cpu_logprobs, logits


@pytest.mark.parametrize("case", [key for key, *_ in sampling_cases.all_cases()])
def test_sampling_matches_the_cpu_kernel_row_for_row(case):
    record = json.loads(sampling_cases.RECORD.read_text())
    key, V, kind, s = next(c for c in sampling_cases.all_cases() if c[0] == case)
    gpu_tokens, gpu_logprobs, cpu_tokens, cpu_logprobs, logits = run_case(key, V, kind, s)
    recorded = torch.tensor(record[key])
    assert torch.equal(cpu_tokens, recorded), f"{key}: the CPU kernel built here differs from paddle's record"
    differ = torch.nonzero(gpu_tokens != recorded).flatten()
    assert differ.numel() == 0, f"{key}: GPU rows {differ[:8].tolist()} drew {gpu_tokens[differ[:8]].tolist()}, " \
                                f"CPU {recorded[differ[:8]].tolist()}"
    t = 1.0 if s["greedy"] else s["temperature"]
    reference = torch.log_softmax(torch.from_numpy(logits).double() / t, -1)[torch.arange(len(gpu_tokens)), gpu_tokens]
    finite = torch.isfinite(reference)
    torch.testing.assert_close(gpu_logprobs.double()[finite], reference[finite], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gpu_logprobs, cpu_logprobs, rtol=1e-5, atol=1e-5)


def test_sampling_is_deterministic():
    # The case: 16,384 copies of one row (V = 151,936, top_p 0.95, repetition penalty 1.2) with one row key
    # draw one token; the float atomics of the old kernel kept another set in 7,454 of them.
    V, rows = 151936, 16384
    logits, presence, _ = sampling_cases.inputs("smooth", V, "determinism")
    s = dict(seed=12, step=3, min_new_tokens=0, temperature=1.0, top_k=0, top_p=0.95, min_p=0.0,
             repetition_penalty=1.2, greedy=False)
    row = torch.from_numpy(logits[:1]).cuda().expand(rows, V).contiguous()
    pres = torch.from_numpy(presence[:1]).cuda().expand(rows, V).contiguous()
    eos = torch.tensor(sampling_cases.EOS, device="cuda")
    tokens, _ = harness.sample(row, pres, eos, torch.full((rows,), 5, device="cuda"), s)
    assert tokens.unique().numel() == 1, f"one row, one key: {tokens.unique().numel()} different tokens"
    keys = torch.arange(rows, device="cuda")
    first, _ = harness.sample(row, pres, eos, keys, s)
    again, _ = harness.sample(row, pres, eos, keys, s)
    assert torch.equal(first, again)
    cpu, _ = harness.sample_cpu(row[:256].cpu(), pres[:256].cpu(), eos.cpu(), keys[:256].cpu(), s)
    assert torch.equal(first[:256].cpu(), cpu)


def test_stop_update_refuses_a_token_outside_the_vocabulary():
    V = 50
    presence = torch.zeros(4, V, dtype=torch.uint8, device="cuda")
    eos = torch.tensor([3, 9], device="cuda")
    done, bad = harness.stop_update(torch.tensor([3, 0, 9, 49], device="cuda"), presence, eos)
    assert bad is None and done.tolist() == [True, False, True, False]
    assert presence.nonzero().tolist() == [[0, 3], [1, 0], [2, 9], [3, 49]]
    _, bad = harness.stop_update(torch.tensor([1, 50, 2, -1], device="cuda"), presence, eos)
    assert bad == 1  # the lowest row, as the CPU kernel names it


def test_compact_rows():
    outer, rows, width = 3, 7, 40
    x = torch.arange(outer * rows * width, dtype=torch.int32, device="cuda").view(outer, rows, width)
    keep = torch.tensor([0, 2, 3, 6], device="cuda")
    expected = x.clone()
    expected[:, :4, :30] = x[:, keep, :30]
    harness.compact_rows(x, keep, outer, rows, width * 4, 30 * 4)
    assert torch.equal(x, expected)


def sanitizer():
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    home = Path(harness.nvcc()).resolve().parents[1]
    candidate = home / "bin" / "compute-sanitizer"
    return str(candidate) if candidate.is_file() else None


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer(tool):
    tool_path = sanitizer()
    if tool_path is None:
        pytest.skip("no CUDA GPU here: compute-sanitizer is not installed")
    binary = harness.sanitize_binary()
    done = subprocess.run([tool_path, "--tool", tool, "--error-exitcode", "7", str(binary)], capture_output=True,
                          text=True, timeout=900)
    output = done.stdout + done.stderr
    if "Device not supported" in output or "error 999" in output.lower():
        pytest.skip(f"no CUDA GPU here for compute-sanitizer: this machine's runtime refuses it ({output.strip()[-200:]})")
    assert done.returncode == 0 and "every kernel ran" in output, output[-3000:]
    assert "ERROR SUMMARY: 0 errors" in output or "RACECHECK SUMMARY: 0 hazards" in output, output[-3000:]
