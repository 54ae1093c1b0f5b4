"""The CUDA kernels (csrc/grpo_kernels.cuh) on torch tensors, without paddle: nvcc builds csrc/gpu_harness/harness.cu
into build/gpu_harness/libgrpo_harness.so and ctypes calls it. Used by tests/kernels/test_cuda_kernels.py and
bench/bench_cuda.py on a GPU machine (PyTorch with CUDA, nvcc); `unavailable()` says why not elsewhere."""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
BUILD = REPO / "build" / "gpu_harness"
HARNESS_SOURCE = CSRC / "gpu_harness" / "harness.cu"
SANITIZE_SOURCE = CSRC / "gpu_harness" / "sanitize.cu"
HEADERS = [CSRC / "grpo_kernels.cuh", CSRC / "grpo_sampling.h"]  # what both sources include

F32, BF16 = 0, 1


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def unavailable() -> str | None:
    """None when the harness can run here, else why not (the skip reason)."""
    try:
        import torch
    except ImportError:
        return "no CUDA GPU here: PyTorch is not installed (make test-gpu runs on a GPU machine with PyTorch and nvcc)"
    if not torch.cuda.is_available():
        return "no CUDA GPU here: torch.cuda.is_available() is False"
    if nvcc() is None:
        return "no CUDA GPU here: nvcc is not on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin"
    return None


def arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}{'a' if major == 9 else ''}"


def compile_flags() -> list[str]:
    home = Path(nvcc()).resolve().parents[1]
    includes = [f"-I{CSRC}"] + [f"-I{p}" for p in (home / "include" / "cccl", home / "targets" / "x86_64-linux" /
                                                   "include" / "cccl") if p.is_dir()]
    return ["-O3", "-std=c++17", f"-arch={arch()}", "-lineinfo", *includes]


def build(source: Path, target: Path, extra: list[str]) -> Path:
    """nvcc source -> target, unless target is newer than every source."""
    inputs = [source, *HEADERS]
    if target.is_file() and target.stat().st_mtime > max(p.stat().st_mtime for p in inputs):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    command = [nvcc(), *compile_flags(), *extra, str(source), "-o", str(target)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed ({' '.join(command)}):\n{done.stderr[-4000:]}")
    return target


def sanitize_binary() -> Path:
    return build(SANITIZE_SOURCE, BUILD / "sanitize", [])


_LIB = None


def lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        path = build(HARNESS_SOURCE, BUILD / "libgrpo_harness.so", ["-shared", "-Xcompiler", "-fPIC"])
        _LIB = ctypes.CDLL(str(path))
        i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        signatures = {
            "grpo_add_rms_norm": [i32, ptr, ptr, ptr, f32, i64, i64, ptr, ptr, ptr],
            "grpo_rope_kv_write": [i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i32, i32, i32, i32, ptr],
            "grpo_attention_workspace_floats": [i64, i64, i64, i64, i64, i64, i32],
            "grpo_attention_splits": [i64, i64, i64, i64, i64, i64, i32],
            "grpo_cache_attention": [i32, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, i32, ptr],
            "grpo_silu_mul": [i32, ptr, ptr, i64, i64, ptr],
            "grpo_sample": [ptr, ptr, ptr, i64, i64, i64, ptr, ptr, i64, i32, i32, f32, i32, f32, f32, f32, i32, ptr,
                            ptr, ptr],
            "grpo_sample_cpu": [ptr, ptr, ptr, i64, i64, i64, ptr, i64, i32, i32, f32, i32, f32, f32, f32, i32, ptr,
                                ptr],
            "grpo_stop_update": [ptr, ptr, ptr, i64, i64, i64, ptr, ptr, ptr],
            "grpo_compact_rows": [ptr, ptr, i64, i64, i64, i64, i64, ptr],
        }
        for name, args in signatures.items():
            getattr(_LIB, name).argtypes = args
            getattr(_LIB, name).restype = i64 if name == "grpo_attention_workspace_floats" else i32
        _LIB.grpo_sample_cpu.restype = None
    return _LIB


def _p(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _stream():
    import torch

    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def _dtype(t) -> int:
    import torch

    return {torch.float32: F32, torch.bfloat16: BF16}[t.dtype]


def _check(code: int, name: str) -> None:
    if code != 0:
        raise RuntimeError(f"{name}: CUDA error {code}")


def add_rms_norm(x, residual, weight, eps):
    import torch

    rows, hd = x.shape
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    _check(lib().grpo_add_rms_norm(_dtype(x), _p(x), _p(residual), _p(weight), eps, rows, hd, _p(out), _p(res_out),
                                   _stream()), "add_rms_norm")
    return out, res_out


def rope_kv_write(qkv, positions, cos, sin, k_cache, v_cache, start, H, KVH):
    """qkv [B, T, (H + 2 KVH) D]; caches [Bcap, S, KVH, D], written in place; returns q [B, T, H, D]."""
    import torch

    B, T, _ = qkv.shape
    D = k_cache.shape[-1]
    q = torch.empty(B, T, H, D, dtype=qkv.dtype, device=qkv.device)
    _check(lib().grpo_rope_kv_write(_dtype(qkv), _p(qkv), _p(positions), _p(cos), _p(sin), _p(k_cache), _p(v_cache),
                                    _p(q), B, T, k_cache.shape[1], start, H, KVH, D, _stream()), "rope_kv_write")
    return q


def attention_workspace(B, T, H, KVH, D, S, start):
    import torch

    floats = lib().grpo_attention_workspace_floats(B, T, H, KVH, D, S, start)
    return torch.empty(max(floats, 1), dtype=torch.float32, device="cuda")


def cache_attention(q, k_cache, v_cache, first, start, workspace=None, out=None):
    """q [B, T, H, D], caches [Bcap, S, KVH, D], first [B] -> out [B, T, H * D]."""
    import torch

    B, T, H, D = q.shape
    S, KVH = k_cache.shape[1], k_cache.shape[2]
    if workspace is None:
        workspace = attention_workspace(B, T, H, KVH, D, S, start)
    if out is None:
        out = torch.empty(B, T, H * D, dtype=q.dtype, device=q.device)
    _check(lib().grpo_cache_attention(_dtype(q), _p(q), _p(k_cache), _p(v_cache), _p(first), _p(out), _p(workspace),
                                      B, T, H, KVH, D, S, start, _stream()), "cache_attention")
    return out


def silu_mul(x):
    import torch

    rows, two_inter = x.shape
    out = torch.empty(rows, two_inter // 2, dtype=x.dtype, device=x.device)
    _check(lib().grpo_silu_mul(_dtype(x), _p(x), _p(out), rows, two_inter // 2, _stream()), "silu_mul")
    return out


def _settings(s):
    return (s["seed"], s["step"], s["min_new_tokens"], s["temperature"], s["top_k"], s["top_p"], s["min_p"],
            s["repetition_penalty"], int(s["greedy"]))


def sample(logits, presence, eos, row_keys, settings, work=None, tokens=None, logprobs=None):
    """The CUDA kernel on GPU tensors: tokens [B] int64, logprobs [B] float32."""
    import torch

    B, V = logits.shape
    work = torch.empty(B, V, dtype=torch.float32, device=logits.device) if work is None else work
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device) if tokens is None else tokens
    logprobs = torch.empty(B, dtype=torch.float32, device=logits.device) if logprobs is None else logprobs
    _check(lib().grpo_sample(_p(logits), _p(presence), _p(eos), eos.numel(), B, V, _p(row_keys), _p(work),
                             *_settings(settings), _p(tokens), _p(logprobs), _stream()), "sample")
    return tokens, logprobs


def sample_cpu(logits, presence, eos, row_keys, settings):
    """The CPU kernel (grpo_sample's on CPU tensors) on contiguous CPU tensors."""
    import torch

    B, V = logits.shape
    tokens = torch.empty(B, dtype=torch.int64)
    logprobs = torch.empty(B, dtype=torch.float32)
    lib().grpo_sample_cpu(_p(logits), _p(presence), _p(eos), eos.numel(), B, V, _p(row_keys), *_settings(settings),
                          _p(tokens), _p(logprobs))
    return tokens, logprobs


def stop_update(tokens, presence, eos):
    """presence updated in place -> (done [B] bool, lowest bad row or None)."""
    import torch

    B, V = tokens.shape[0], presence.shape[1]
    done = torch.zeros(B, dtype=torch.bool, device=tokens.device)
    bad = torch.empty(1, dtype=torch.int64, device=tokens.device)
    _check(lib().grpo_stop_update(_p(tokens), _p(presence), _p(eos), B, eos.numel(), V, _p(done), _p(bad),
                                  _stream()), "stop_update")
    bad_row = int(bad.item())
    return done, None if bad_row == -1 else bad_row


def compact_rows(x, keep, outer, rows, row_bytes, move_bytes):
    _check(lib().grpo_compact_rows(_p(x), _p(keep), keep.numel(), outer, rows, row_bytes, move_bytes, _stream()),
           "compact_rows")
