"""Loader of the compiled operators (csrc/, built by `make ops` = `python csrc/build.py`): the rollout
engine's and the actor's training ones (alignment/models/fused_train.py).

load_ops() -> (ops, reason): `ops` has the functions below, or is None with a one-line reason (not
built, stale, failed to load); the engine then warns once and falls back. Nothing is compiled here.
Inputs come first and attributes after them, positionally or by keyword:

    out, residual_out = ops.grpo_add_rms_norm(x, residual, weight, eps)        # residual may be None
    q, cache = ops.grpo_rope_kv_write(qkv, positions, cos, sin, cache, layer, start, num_heads, num_kv_heads)
    out = ops.grpo_cache_attention(q, cache, first_slot, prompt_cache, prompt_of_row, layer, start, round_bf16)
                                    # round_bf16: q and the weights too; prompt_cache, prompt_of_row: None, or (CPU) the
                                    # slots before prompt_cache's end read from each row's shared prompt
    out = ops.grpo_silu_mul(x)
    tokens, logprobs = ops.grpo_sample(logits, presence, eos_ids, row_keys, seed, step, min_new_tokens,
                                       temperature, top_k, top_p, min_p, repetition_penalty, greedy)
    done, presence = ops.grpo_stop_update(tokens, presence, eos_ids)
    x = ops.grpo_compact_rows(x, keep, batch_axis, prefix)

    out = ops.grpo_rms_norm(x, weight, eps)                  # training operators, with backward kernels
    q, k, v = ops.grpo_rope_qkv(qkv, bias, cos, sin, num_heads, num_kv_heads)  # bias may be None
    probs = ops.grpo_masked_softmax(scores, mask, scale)
    out = ops.grpo_heads_to_tokens(x, num_heads)             # (B, H, T, D) -> (B, T, H D)
    keys = ops.grpo_prompt_keys(prompt, own, prompt_of_row)   # [prompt[prompt_of_row[b]] | own[b]] along axis 2
    logprob, entropy, normaliser = ops.grpo_logprob_rows(logits, targets, temperature)  # the log-prob head's rows
    grad = ops.grpo_logprob_rows_grad(logits, targets, normaliser, entropy, scale, entropy_scale, temperature)
    packed = ops.grpo_pack_weight(weight, transpose)          # where paddle ships MKL: x @ weight (or weight^T)
    out = ops.grpo_packed_matmul(x, packed, n)                # through the packed copy, n output columns
    weight_bf16 = ops.grpo_to_bf16(weight)                    # where paddle ships oneDNN: bf16 products, fp32 sums
    out = ops.grpo_bf16_matmul(x, y, transpose_x, transpose_y)  # x, y float32 or bfloat16; no gradient
    out, x_saved = ops.grpo_bf16_linear(x, weights, weight_bf16, weight_grad)  # x @ [W_1 | W_2 | ...] from their
                                                              # bf16 copy side by side; backward to x and each W_i
    out, x_saved, gate_up_out, h_saved = ops.grpo_bf16_mlp(x, (gate, up), down, gate_up_bf16, down_bf16, weight_grad)
                                                              # down(silu(x @ gate) * (x @ up)), SwiGLU in between
                                                              # writing bf16 both ways; backward to x and the weights
    out, row_max, row_inv_sum = ops.grpo_attention(q, k, v, mask, scale, bf16)  # softmax(scale q k^T + mask) v, with
                                                              # backward; bf16: products in bf16 where built for AVX512-BF16
    packed = ops.grpo_prepack_bf16(weight, transpose_w, rows_hint)  # weight (K, N) or (N, K) in oneDNN matmul's layout
    out = ops.grpo_prepacked_matmul(x, packed, k, n, rows_hint)  # x (..., K) @ the packed weight, fp32; no gradient

grpo_silu_mul has a backward kernel too. grpo_rope_kv_write, grpo_stop_update and grpo_compact_rows
write their cache / presence / x argument in place and also return it, as grpo_logprob_rows_grad writes the
gradient in place of its logits. Shapes and semantics:
csrc/grpo_ops.cc.
"""

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
LIBRARY = CSRC / "build" / "grpo_ops" / "grpo_ops.so"
SOURCE_PATTERNS = ("*.cc", "*.cu", "*.cuh", "*.h")


def _run(name: str, *args):
    from paddle import _C_ops

    outs = _C_ops._run_custom_op(name, *args)
    return outs[0] if len(outs) == 1 else tuple(outs)


def grpo_add_rms_norm(x, residual, weight, eps: float):
    return _run("grpo_add_rms_norm", x, residual, weight, float(eps))


def grpo_rope_kv_write(qkv, positions, cos, sin, cache, layer: int, start: int, num_heads: int, num_kv_heads: int):
    return _run("grpo_rope_kv_write", qkv, positions, cos, sin, cache, int(layer), int(start), int(num_heads),
                int(num_kv_heads))


def grpo_cache_attention(q, cache, first_slot, prompt_cache, prompt_of_row, layer: int, start: int, round_bf16: bool = False):
    return _run("grpo_cache_attention", q, cache, first_slot, prompt_cache, prompt_of_row, int(layer), int(start), bool(round_bf16))


def grpo_silu_mul(x):
    return _run("grpo_silu_mul", x)


def grpo_sample(logits, presence, eos_ids, row_keys, seed: int, step: int, min_new_tokens: int, temperature: float,
                top_k: int, top_p: float, min_p: float, repetition_penalty: float, greedy: bool):
    return _run("grpo_sample", logits, presence, eos_ids, row_keys, int(seed), int(step), int(min_new_tokens),
                float(temperature), int(top_k), float(top_p), float(min_p), float(repetition_penalty), bool(greedy))


def grpo_stop_update(tokens, presence, eos_ids):
    return _run("grpo_stop_update", tokens, presence, eos_ids)


def grpo_compact_rows(x, keep, batch_axis: int, prefix: int):
    return _run("grpo_compact_rows", x, keep, int(batch_axis), int(prefix))


def grpo_rms_norm(x, weight, eps: float):
    return _run("grpo_rms_norm", x, weight, float(eps))


def grpo_rope_qkv(qkv, bias, cos, sin, num_heads: int, num_kv_heads: int):
    return _run("grpo_rope_qkv", qkv, bias, cos, sin, int(num_heads), int(num_kv_heads))


def grpo_masked_softmax(scores, mask, scale: float):
    return _run("grpo_masked_softmax", scores, mask, float(scale))


def grpo_heads_to_tokens(x, num_heads: int):
    return _run("grpo_heads_to_tokens", x, int(num_heads))


def grpo_prompt_keys(prompt, own, prompt_of_row):
    return _run("grpo_prompt_keys", prompt, own, prompt_of_row)


def grpo_logprob_rows(logits, targets, temperature: float):
    return _run("grpo_logprob_rows", logits, targets, float(temperature))


def grpo_logprob_rows_grad(logits, targets, normaliser, entropy, scale, entropy_scale, temperature: float):
    return _run("grpo_logprob_rows_grad", logits, targets, normaliser, entropy, scale, entropy_scale, float(temperature))


def grpo_pack_weight(weight, transpose: bool):
    return _run("grpo_pack_weight", weight, bool(transpose))


def grpo_packed_matmul(x, packed, n: int):
    return _run("grpo_packed_matmul", x, packed, int(n))


def grpo_to_bf16(x):
    return _run("grpo_to_bf16", x)


def grpo_bf16_matmul(x, y, transpose_x: bool = False, transpose_y: bool = False):
    return _run("grpo_bf16_matmul", x, y, bool(transpose_x), bool(transpose_y))


def grpo_bf16_linear(x, weights, weight_bf16, weight_grad: bool):
    return _run("grpo_bf16_linear", x, list(weights), weight_bf16, bool(weight_grad))


def grpo_bf16_mlp(x, gate_up, down, gate_up_bf16, down_bf16, weight_grad: bool):
    return _run("grpo_bf16_mlp", x, list(gate_up), down, gate_up_bf16, down_bf16, bool(weight_grad))


def grpo_attention(q, k, v, mask, scale: float, bf16: bool = False):
    return _run("grpo_attention", q, k, v, mask, float(scale), bool(bf16))


def grpo_prepack_bf16(weight, transpose_w: bool, rows_hint: int):
    return _run("grpo_prepack_bf16", weight, bool(transpose_w), int(rows_hint))


def grpo_prepacked_matmul(x, packed, k: int, n: int, rows_hint: int):
    return _run("grpo_prepacked_matmul", x, packed, int(k), int(n), int(rows_hint))


OPS = (grpo_add_rms_norm, grpo_rope_kv_write, grpo_cache_attention, grpo_silu_mul, grpo_sample, grpo_stop_update,
       grpo_compact_rows, grpo_rms_norm, grpo_rope_qkv, grpo_masked_softmax, grpo_heads_to_tokens, grpo_prompt_keys,
       grpo_logprob_rows, grpo_logprob_rows_grad)
MKL_OPS = (grpo_pack_weight, grpo_packed_matmul)  # csrc/grpo_gemm.cc: built only where paddle ships MKL
# csrc/grpo_bf16.cc, grpo_attention.cc and grpo_dnnl_matmul.cc: only where paddle ships oneDNN
DNNL_OPS = (grpo_to_bf16, grpo_bf16_matmul, grpo_bf16_linear, grpo_bf16_mlp, grpo_attention, grpo_prepack_bf16, grpo_prepacked_matmul)


def _stale() -> bool:
    built = LIBRARY.stat().st_mtime
    return any(p.stat().st_mtime > built for pattern in SOURCE_PATTERNS for p in CSRC.glob(pattern))


@functools.cache
def load_ops():
    """(namespace of the ops, "") or (None, reason). Cached: the library registers once per process."""
    if not LIBRARY.is_file():
        return None, f"the fused ops are not built ({LIBRARY} missing): run make ops (python csrc/build.py)"
    if _stale():
        return None, "the fused ops are stale (csrc/ changed after the build), rerun make ops"
    try:
        from paddle.utils.cpp_extension import load_op_meta_info_and_register_op

        registered = set(load_op_meta_info_and_register_op(str(LIBRARY)))
    except Exception as exc:  # a library built against another paddle, a missing symbol, ...
        return None, f"the fused ops failed to load from {LIBRARY}: {type(exc).__name__}: {exc}".splitlines()[0]
    missing = [op.__name__ for op in OPS if op.__name__ not in registered]
    if missing:
        return None, f"the fused ops library lacks {', '.join(missing)}: rerun make ops"
    return SimpleNamespace(**{op.__name__: op for op in OPS + MKL_OPS + DNNL_OPS if op.__name__ in registered}), ""


@functools.cache
def bf16_primitive_missing() -> Optional[str]:
    """Why oneDNN's bf16 matmul primitive, which the fused engine's bf16 copies are packed for, cannot run here (None:
    it can). It runs where oneDNN finds AVX-512 or AMX; on an AVX2-only CPU (or with ONEDNN_MAX_CPU_ISA below AVX-512)
    oneDNN has none."""
    ops, reason = load_ops()
    if ops is None or not hasattr(ops, "grpo_prepack_bf16"):
        return reason or "the operators were built without oneDNN (paddle/libs has no libdnnl.so.3)"
    import paddle

    try:
        ops.grpo_prepack_bf16(paddle.ones([32, 32]), False, 1)
    except Exception as error:  # grpo_prepack_bf16: oneDNN has no bf16 matmul for (1, 32) x (32, 32) -> fp32
        return f"oneDNN has no bf16 matmul primitive on this CPU ({str(error).splitlines()[0]})"
    return None
