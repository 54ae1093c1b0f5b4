"""The CUDA rollout kernels timed with CUDA events on a GPU machine (PyTorch + nvcc, no paddle), through the harness
of tests/helpers/cuda_harness.py. Prints JSON.

    python3 bench/bench_cuda.py [--repeats 50]

- copy: a device-to-device copy of 4 GiB through torch, counting bytes read and written: the bandwidth ceiling.
- attention: decode (one query per row) over a cache of `context` slots, 64 rows; bytes = the keys and values read
  once (q and out are noise); GB/s and the share of the measured copy bandwidth. Beside it torch's
  scaled_dot_product_attention on the same cache (GQA expanded by torch), in the same run.
- sampling: one call over V = 151,936 logits, for 1 and 64 rows and each filter setting; beside it torch's usual
  sampler (softmax, top-k, top-p by sort and cumsum, multinomial), which has no seed-and-row-key determinism.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import cuda_harness as harness  # noqa: E402


def timed(fn, repeats):
    """Median milliseconds of one call over `repeats` calls (after 3 warm-ups), by CUDA events."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth(repeats):
    import torch

    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() / ms / 1e6  # GB/s, read + write


def attention(repeats, copy_gbs):
    import torch

    rows = []
    for name, (H, KVH, D) in {"SmolLM2-135M": (9, 3, 64), "Qwen2.5-0.5B": (14, 2, 64), "Qwen2.5-7B": (28, 4, 128),
                              "Llama-3-8B": (32, 8, 128)}.items():
        for dtype in (torch.float32, torch.bfloat16):
            B, context = 64, 2048
            q = torch.randn(B, 1, H, D, device="cuda").to(dtype)
            k = torch.randn(B, context, KVH, D, device="cuda").to(dtype)
            v = torch.randn(B, context, KVH, D, device="cuda").to(dtype)
            first = torch.zeros(B, dtype=torch.int64, device="cuda")
            ws = harness.attention_workspace(B, 1, H, KVH, D, context, context - 1)
            out = torch.empty(B, 1, H * D, dtype=dtype, device="cuda")
            ms = timed(lambda: harness.cache_attention(q, k, v, first, context - 1, ws, out), repeats)
            kt, vt, qt = k.transpose(1, 2), v.transpose(1, 2), q.transpose(1, 2)  # torch's [B, heads, S, D] views
            torch_ms = timed(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
                             repeats)
            moved = 2 * k.numel() * k.element_size()
            rows.append(dict(model=name, heads=f"{H}/{KVH}x{D}", dtype=str(dtype).split(".")[-1], rows=B,
                             context=context, ms=round(ms, 4), gb_per_s=round(moved / ms / 1e6, 1),
                             share_of_copy=round(moved / ms / 1e6 / copy_gbs, 3),
                             splits=harness.lib().grpo_attention_splits(B, 1, H, KVH, D, context, context - 1),
                             torch_sdpa_ms=round(torch_ms, 4)))
    return rows


def torch_sampler(logits, s):
    import torch

    x = logits / s["temperature"]
    if s["top_k"]:
        kth = torch.topk(x, s["top_k"], -1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if s["top_p"] < 1:
        sorted_x, order = torch.sort(x, -1, descending=True)
        p = torch.softmax(sorted_x, -1)
        drop = (p.cumsum(-1) - p) >= s["top_p"]
        x = x.scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return torch.multinomial(torch.softmax(x, -1), 1)


def sampling(repeats):
    import torch

    V = 151936
    settings = {
        "all filters (top_k 50, top_p 0.9, min_p 0.05, rp 1.2, t 0.8)": dict(temperature=0.8, top_k=50, top_p=0.9,
                                                                            min_p=0.05, repetition_penalty=1.2),
        "top_p 0.95": dict(temperature=1.0, top_k=0, top_p=0.95, min_p=0.0, repetition_penalty=1.0),
        "none (t 1)": dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
    }
    rows = []
    for B in (1, 64):
        logits = torch.randn(B, V, device="cuda") * 3
        presence = (torch.rand(B, V, device="cuda") < 0.01).to(torch.uint8)
        eos = torch.tensor([2], device="cuda")
        keys = torch.arange(B, device="cuda")
        work = torch.empty(B, V, device="cuda")
        tokens = torch.empty(B, dtype=torch.int64, device="cuda")
        logprobs = torch.empty(B, device="cuda")
        for label, knobs in settings.items():
            s = dict(seed=1, step=0, min_new_tokens=0, greedy=False, **knobs)
            ms = timed(lambda: harness.sample(logits, presence, eos, keys, s, work, tokens, logprobs), repeats)
            torch_ms = timed(lambda: torch_sampler(logits, s), repeats)
            rows.append(dict(settings=label, rows=B, vocab=V, ms=round(ms, 4), torch_ms=round(torch_ms, 4)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    reason = harness.unavailable()
    if reason:
        raise SystemExit(reason)
    import torch

    copy_gbs = copy_bandwidth(args.repeats)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, copy_gb_per_s=round(copy_gbs, 1),
                  attention=attention(args.repeats, copy_gbs), sampling=sampling(args.repeats))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
