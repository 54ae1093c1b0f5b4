"""The actor's forward and backward with the compiled training operators (csrc/, `make ops`).

On a CPU, paddle runs Qwen2 / Llama's RMSNorm, rotary embedding, SwiGLU and attention masking as
chains of broadcast elementwise kernels, and their backward passes (MultiplyGrad, PowGrad, TileGrad)
took more of a policy update than the matmuls did (bench/RESULTS.md). use_training_ops swaps, in every
decoder layer, the two norms, the attention and the MLP, and the final norm, for modules that call
grpo_rms_norm, grpo_rope_qkv, grpo_attention (or, built without oneDNN, grpo_masked_softmax between two matmuls),
grpo_heads_to_tokens and grpo_silu_mul, which have backward kernels; Qwen3's per-head q/k RMSNorms go through
grpo_rms_norm too.

The swapped modules hold the model's own Parameter objects (and Linear layers) under the same names:
the state_dict, checkpoints, the optimizer's state and the fused rollout engine's in-place weight
references stay valid. Only float32 rounding differs from paddleformers' forward. Projections with LoRA
adapters (alignment/models/lora.py) keep them: each adds its dropout(x) @ A @ B * scale beside the one matmul.
With bf16 (cpu_bf16_matmul, alignment/models/cpu_bf16.py), every projection's matmul runs in bf16 on a copy of its
weights that weights_changed() discards after each optimizer step; the adapters' terms stay fp32. An MLP without bias
or adapter is then one operator (grpo_bf16_mlp: SwiGLU between its products, in bf16 both ways). The attention's
products (q k^T, P v and their gradients) run in bf16 too where the operators were built for AVX512-BF16; its
softmax stays fp32.
"""

from typing import Optional

import paddle
import paddle.nn.functional as F
from paddle import nn

from alignment.algo.logprobs import HeadKernels
from alignment.models.cpu_bf16 import Bf16Matmuls
from alignment.models.lora import is_lora, lora_update
from alignment.models.modeling import layout_unsupported
from alignment.kernels.ops import bf16_primitive_missing, load_ops


# The models whose decoder layers the training modules replace: their own list, not the rollout engine's, so that a
# model type the fused engine learns to run does not switch these on untested (tests/models/test_train_ops.py checks it). The
# message keeps the words users have seen since both shared one list.
TRAINING_MODEL_TYPES = ("qwen2", "qwen3", "llama")


def unsupported_reason(model) -> Optional[str]:
    """Why the training modules cannot replace this model's (None: they can): float32 Qwen2 / Llama / Qwen3 with
    separate q/k/v and gate/up projections, no sliding window, no bias on o_proj; Qwen3's per-head q/k RMSNorms apply."""
    config = model.config
    if config.model_type not in TRAINING_MODEL_TYPES:
        return f"model_type {config.model_type!r} (the fused engine runs {', '.join(TRAINING_MODEL_TYPES)})"
    reason = layout_unsupported(model)
    if reason:
        return reason
    if not model.lm_head.weight.place.is_cpu_place():
        return "weights on a GPU (the training operators have CPU kernels only)"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r} (the MLP operator is SwiGLU)"
    if config.attention_dropout:
        return f"attention_dropout {config.attention_dropout} (the attention modules have no dropout)"
    if config.tensor_model_parallel_size > 1 or config.sequence_parallel:
        return "tensor or sequence parallelism"
    return None


def training_ops_unavailable(model) -> Optional[str]:
    """Why use_training_ops would change nothing (None: it would swap the modules)."""
    return load_ops()[1] or unsupported_reason(model)


def bf16_unavailable(model, training_ops_on: bool) -> Optional[str]:
    """Why the bf16 matmuls cannot run in this model, whatever the CPU (None: they can)."""
    if not training_ops_on:
        return "they run in the training operators and use_fused_train_ops is false"
    reason = training_ops_unavailable(model)
    return reason or bf16_primitive_missing()


def use_training_ops(model, bf16: bool = False) -> Optional[str]:
    """Swap the training modules into `model` in place; -> None, or why not (nothing is changed then). With bf16,
    the projections and the log-prob head (head_kernels) multiply in bf16 (alignment/models/cpu_bf16.py); after every
    change of the weights, weights_changed(model) must be called."""
    reason = training_ops_unavailable(model)
    if reason:
        return reason
    ops, config = load_ops()[0], model.config
    matmuls = Bf16Matmuls(ops) if bf16 else None
    for layer in model.model.layers:
        layer.input_layernorm = TrainingRMSNorm(layer.input_layernorm, ops)
        layer.post_attention_layernorm = TrainingRMSNorm(layer.post_attention_layernorm, ops)
        layer.self_attn = TrainingAttention(layer.self_attn, config, ops, matmuls)
        layer.mlp = TrainingMLP(layer.mlp, ops, matmuls)
    model.model.norm = TrainingRMSNorm(model.model.norm, ops)
    model.bf16_matmuls = matmuls  # a plain attribute: not a sublayer, not in the state_dict
    return None


def groups_prompts(model, recompute: bool) -> bool:
    """Whether a forward may run each shared prompt once (alignment/models/prefix_grouper.py): where the training attention
    runs, which concatenates the keys and values the grouper's cache gives it, and layers are not recomputed (a
    recomputed layer would keep the prompt's keys and values of its first, gradient-free, pass)."""
    return not recompute and all(isinstance(layer.self_attn, TrainingAttention) for layer in model.model.layers)


def head_kernels(model) -> HeadKernels:
    """What the log-prob head (algo.chunked_token_logprobs) computes this model's with: where use_training_ops
    swapped the modules, the compiled row kernels (grpo_logprob_rows and its gradient) and, with bf16, the bf16
    products; else paddle's kernels throughout."""
    if not isinstance(model.model.norm, TrainingRMSNorm):
        return HeadKernels()
    ops, matmuls = load_ops()[0], getattr(model, "bf16_matmuls", None)
    if matmuls is None:
        return HeadKernels(paddle.matmul, ops.grpo_logprob_rows, ops.grpo_logprob_rows_grad)
    return HeadKernels(matmuls.matmul, ops.grpo_logprob_rows, ops.grpo_logprob_rows_grad, ops.grpo_to_bf16)


def weights_changed(model) -> None:
    """After the optimizer (or anything else) wrote the weights: the next bf16 product remakes its weight copy."""
    matmuls = getattr(model, "bf16_matmuls", None)
    if matmuls is not None:
        matmuls.weights.clear()


def _project(x, layers, bias=None, bf16=None):
    """x @ [W_1 | W_2 | ...] + bias (..., sum of outs), plus each LoRA adapter's term where a layer has one
    (a merged weight would lose the adapter's dropout). In float32 the weights are concatenated on every call (a copy
    of a few MB at most), so gradients reach each layer's own Parameter; with bf16 (a Bf16Matmuls), the product runs
    in bf16 on the weights' cached bf16 copy side by side, and the operator gives each weight its own gradient."""
    weights = [layer.weight for layer in layers]
    if bf16 is None:
        out = F.linear(x, weights[0] if len(weights) == 1 else paddle.concat(weights, axis=1), bias)
    else:
        out = bf16.linear(x, tuple(weights))
        out = out if bias is None else out + bias
    updates = [lora_update(layer, x) for layer in layers]
    if all(update is None for update in updates):
        return out
    widths = [layer.weight.shape[1] for layer in layers]
    updates = [paddle.zeros([*x.shape[:-1], w], x.dtype) if u is None else u for u, w in zip(updates, widths)]
    return out + paddle.concat(updates, axis=-1)


def _concat_biases(layers):
    biases = [layer.bias for layer in layers]
    if len({b is None for b in biases}) > 1:
        raise ValueError("layers fused into one matmul must all have biases or none")
    return None if biases[0] is None else paddle.concat(biases)


class TrainingRMSNorm(nn.Layer):
    def __init__(self, norm, ops):
        super().__init__()
        self.weight = norm.weight  # (Hd,) the model's Parameter
        self.variance_epsilon = norm.variance_epsilon
        self.ops = ops

    def forward(self, hidden_states):
        return self.ops.grpo_rms_norm(hidden_states, self.weight, self.variance_epsilon)


class TrainingMLP(nn.Layer):
    """down(silu(gate(x)) * up(x)), gate and up in one matmul; with bf16 and no bias or adapter, the whole in one
    operator (Bf16Matmuls.mlp)."""

    def __init__(self, mlp, ops, bf16=None):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.ops, self.bf16 = ops, bf16

    def forward(self, x):
        projections = [self.gate_proj, self.up_proj]
        if self.bf16 is not None and not any(layer.bias is not None or is_lora(layer) for layer in (*projections, self.down_proj)):
            return self.bf16.mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)
        gate_up = _project(x, projections, _concat_biases(projections), self.bf16)  # (..., 2I)
        return _project(self.ops.grpo_silu_mul(gate_up), [self.down_proj], self.down_proj.bias, self.bf16)


class TrainingAttention(nn.Layer):
    """paddleformers' eager attention: q, k and v in one matmul; their bias, the rotary embedding and the
    head-major layout in one operator (Qwen3: its q_norm / k_norm over each head come first); softmax(q k^T *
    scaling + mask) per KV head: the G = H / KVH query heads sharing a KV head are adjacent, so q (B, H, T, D)
    is (B, KVH, G T, D), and one matmul serves the group without repeating the keys and values G times."""

    def __init__(self, attention, config, ops, bf16=None):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = attention.q_proj, attention.k_proj, attention.v_proj
        self.o_proj = attention.o_proj
        self.layer_idx = attention.layer_idx
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        self.ops, self.bf16 = ops, bf16
        self.per_head_qk_norms = hasattr(attention, "q_norm")  # Qwen3; the attribute only where the model has it
        if self.per_head_qk_norms:
            self.q_norm, self.k_norm = TrainingRMSNorm(attention.q_norm, ops), TrainingRMSNorm(attention.k_norm, ops)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
        if attention_mask is None:
            raise ValueError("the training attention needs paddleformers' 4-D additive mask (eager attention), got none")
        batch, length, _ = hidden_states.shape
        projections = [self.q_proj, self.k_proj, self.v_proj]
        qkv = _project(hidden_states, projections, bf16=self.bf16)  # (B, T, (H + 2 KVH) D), the bias added below
        bias = _concat_biases(projections)
        if self.per_head_qk_norms:  # as paddleformers' Qwen3: projection (with bias), per-head norms, rotary
            qkv, bias = self._norm_qk_heads(qkv if bias is None else qkv + bias), None
        cos, sin = position_embeddings  # (B, T, D) each
        q, k, v = self.ops.grpo_rope_qkv(qkv, bias, cos, sin, self.num_heads, self.num_kv_heads)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)  # (B, KVH, S, D) with the cached tokens
        grouped = q.reshape([batch, self.num_kv_heads, -1, self.head_dim])  # (B, KVH, G T, D)
        out = self._attend(grouped, k, v, attention_mask).reshape([batch, self.num_heads, length, self.head_dim])  # (B, H, T, D)
        out = self.ops.grpo_heads_to_tokens(out, self.num_heads)  # (B, T, H D)
        return _project(out, [self.o_proj], self.o_proj.bias, self.bf16), None

    def _attend(self, grouped, k, v, attention_mask):
        """softmax(q k^T * scaling + mask) v: (B, KVH, G T, D) queries, (B, KVH, S, D) keys and values, mask (B, 1, T, S).
        grpo_attention never stores the (B, KVH, G T, S) weights (where paddle ships oneDNN); else two matmuls around
        the masked softmax."""
        if hasattr(self.ops, "grpo_attention"):
            return self.ops.grpo_attention(grouped, k, v, attention_mask, self.scaling, self.bf16)[0]
        scores = paddle.matmul(grouped, k, transpose_y=True)  # (B, KVH, G T, S)
        probs = self.ops.grpo_masked_softmax(scores, attention_mask, self.scaling)
        return paddle.matmul(probs, v)

    def _norm_qk_heads(self, qkv):
        """RMSNorm over each q head with q_norm and each k head with k_norm (weights (D,)): (B, T, (H + 2 KVH) D)
        -> the same layout, v untouched."""
        batch, length = qkv.shape[:2]
        heads = qkv.reshape([batch, length, -1, self.head_dim])  # (B, T, H + 2 KVH, D)
        q, k, v = paddle.split(heads, [self.num_heads, self.num_kv_heads, self.num_kv_heads], axis=2)
        return paddle.concat([self.q_norm(q), self.k_norm(k), v], axis=2).reshape([batch, length, -1])
