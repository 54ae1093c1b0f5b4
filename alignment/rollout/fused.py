"""The fused engine (`use_fusemt: true`): Qwen2 / Qwen3 / Llama decoding with the compiled csrc/ operators.

What it changes against the eager engine (PaddleNLP's FusedMT idea):
- one preallocated KV cache for all layers, (L, 2, B, S, KVH, D), written in place by the rotary
  operator, instead of a cache that grows by concatenation every step; float32, or on the CPU bfloat16
  (kv_cache_dtype; auto picks it with bf16 matmuls): keys and values rounded when written, half the memory
  a decode step reads; with bf16 matmuls the attention rounds each query and its weights too, as the
  actor's bf16 attention does;
- about ten calls per layer per token: RMSNorm fused with the residual add, one q|k|v matmul,
  rotary + cache write, attention over the cache with grouped KV heads, one gate|up matmul,
  SiLU x up, and the two output matmuls (Qwen3 adds its per-head q and k RMSNorms before the rotary);
- sampling, stop handling and compaction in C++: finished rows leave the active batch, so a batch
  whose completions end early stops paying for them;
- a group's prompt prefilled once: generate's rows are group_size copies of each prompt, so the prompt runs
  once, into a cache of its own (`SharedPrompts`) that its rows' decode steps read on the CPU (a decode step then
  reads each prompt's keys and values from memory once, not once per row); on a GPU its slots are copied to the rows.

Weights: the o / down projections, norms and embedding are the actor's own tensors; q|k|v and gate|up
are concatenated copies (one matmul instead of three and two), and lm_head is held packed for MKL's
packed GEMM where the operators have it (csrc/grpo_gemm.cc: plain sgemm re-packs the whole (V, Hd)
weight on every call, which at a few rows per decode step costs as much as the multiplication). `sync()`
rebuilds these copies after every optimizer step and then checks the engine against the actor on a fixed
probe: the log-probs the engine computes must equal the actor's forward ones within `tolerance`, or the
run stops (WeightSyncError). With bf16 matmuls (cpu_bf16_matmul) the engine holds the four matrices of each layer
and lm_head as bf16 copies packed for oneDNN's matmul primitive instead (`PackedBf16`, csrc/grpo_dnnl_matmul.cc),
made at sync(): reordered once into the primitive's blocked layout, where oneDNN's gemm would copy each weight into it
on every call (decode's products 1.2-1.8x faster at 2-64 rows, bench/RESULTS.md); the two forwards differ by rounding (bf16
rounding of inputs that differ in their last fp32 bits), so the tolerance is wider (BF16_TOLERANCE), and
check_weight_sync() first compares every packed copy with a fresh one from the actor's weight, byte for byte: a stale
copy fails however small the change (sync(), which has just made the copies, checks the probe only).
Multi-turn rollouts (alignment/rollout/multi_turn.py) call generate_turn: each row's context starts from the keys and
values its last turn left, copied into the new cache, and only the tokens after them are prefilled.
A projection with a LoRA adapter (alignment/models/lora.py) enters as its merged weight W + A @ B * scale, a copy
that `sync()` rebuilds too: decoding then costs what it costs without adapters.
"""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import paddle
import paddle.nn.functional as F

from alignment.algo.logprobs import token_logprobs
from alignment.basics.errors import ConfigError, WeightSyncError
from alignment.models.lora import effective_weight
from alignment.models.modeling import layout_unsupported
from alignment.rollout.base import Rollout, SamplingParams, TokenStream
from alignment.rollout.eager import left_pad
from alignment.basics.runtime import contiguous_kernels

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
PROBE_LENGTHS = (24, 17)  # two probe rows of different lengths, so the check covers left padding
COMPACT_FRACTION = 8  # compact once at least 1/8 of the active rows have finished
FP32_TOLERANCE = 1e-4  # the default weight_sync_tolerance with float32 matmuls and cache
# ... and with bf16 matmuls or cache: bf16 rounding moves a freshly synced engine's probe log-probs far less than this
# (tests/models/test_cpu_bf16.py checks it), a wrong operator or layout by whole nats.
BF16_TOLERANCE = 0.25


def unsupported_reason(model) -> Optional[str]:
    """Why the fused engine cannot run this model (None: it can). The training operators (alignment/models/fused_train.py)
    share the layout checks but keep their own model types. Both apply Qwen3's per-head q/k RMSNorms."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {config.model_type!r} (the fused engine runs {', '.join(SUPPORTED_MODEL_TYPES)})"
    return layout_unsupported(model)


PACKED_ROWS = 64  # the rows oneDNN's layout is picked for: decode's at the SmolLM2 workload (8 prompts x 8); prefill's
# more rows are multiplied 64 at a time, so each weight shape needs at most 64 primitives (csrc/grpo_dnnl_matmul.cc)


@dataclass(frozen=True)
class PackedBf16:
    """A (K, N) weight as a bf16 copy in the layout of oneDNN's matmul primitive: self(x (..., K)) -> fp32 (..., N)."""

    packed: paddle.Tensor  # uint8 (64-byte header + the layout's bytes,)
    k: int
    n: int
    ops: object

    @classmethod
    def of(cls, weight: paddle.Tensor, ops, transpose: bool = False) -> "PackedBf16":
        """weight (K, N), or (N, K) with transpose (lm_head's)."""
        k, n = (weight.shape[1], weight.shape[0]) if transpose else weight.shape
        return cls(ops.grpo_prepack_bf16(weight, transpose, PACKED_ROWS), k, n, ops)

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.ops.grpo_prepacked_matmul(x, self.packed, self.k, self.n, PACKED_ROWS)


class Projection:
    """x (..., K) -> x @ W (..., N) for a (K, N) weight (or W^T of a (N, K) one, as lm_head's): in bf16 on a packed
    copy (cpu_bf16_matmul), through the copy packed for MKL's GEMM the csrc operators make on the CPU, or paddle.matmul
    on a GPU or where they were built without MKL."""

    def __init__(self, weight: paddle.Tensor, ops, transpose: bool = False, bf16: bool = False):
        self.n = weight.shape[0] if transpose else weight.shape[1]
        packable = hasattr(ops, "grpo_pack_weight") and weight.place.is_cpu_place() and not bf16
        self.packed = ops.grpo_pack_weight(weight, transpose) if packable else None
        self.bf16 = PackedBf16.of(weight, ops, transpose) if bf16 else None
        self.weight = weight if self.packed is None and self.bf16 is None else None
        self.transpose, self.ops = transpose, ops

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.bf16 is not None:
            return self.bf16(x)
        if self.packed is not None:
            return self.ops.grpo_packed_matmul(x, self.packed, self.n)
        return paddle.matmul(x, self.weight, transpose_y=self.transpose)


@dataclass(frozen=True)
class SharedPrompts:
    """The prompts a batch's groups share, prefilled once: grpo_cache_attention reads a row's slots before `cache`'s end
    from its prompt's."""

    cache: paddle.Tensor  # (L, 2, U, W, KVH, D) the distinct prompts' keys and values
    of_row: paddle.Tensor  # (B,) int64: each active row's prompt

    def rows(self, keep: paddle.Tensor) -> "SharedPrompts":
        return SharedPrompts(self.cache, paddle.gather(self.of_row, keep))


@dataclass
class LayerWeights:
    """The four matrices are PackedBf16 copies when the engine multiplies in bf16 (cpu_bf16_matmul)."""

    input_norm: paddle.Tensor  # (Hd,) the actor's
    qkv: paddle.Tensor | PackedBf16  # (Hd, (H + 2 KVH) D) concatenated copy
    qkv_bias: Optional[paddle.Tensor]  # ((H + 2 KVH) D,) concatenated copy, None without biases
    q_norm: Optional[paddle.Tensor]  # (D,) the actor's per-head q RMSNorm weight (Qwen3), None without
    k_norm: Optional[paddle.Tensor]  # (D,) the same for k
    o_proj: paddle.Tensor | PackedBf16  # (H D, Hd) the actor's (a merged copy with a LoRA adapter)
    post_norm: paddle.Tensor  # (Hd,) the actor's
    gate_up: paddle.Tensor | PackedBf16  # (Hd, 2 I) concatenated copy
    down_proj: paddle.Tensor | PackedBf16  # (I, Hd) the actor's (a merged copy with a LoRA adapter)


def _fuse_layer(layer, matrix) -> LayerWeights:
    """matrix: what each (K, N) weight matrix is held as (the fp32 tensor itself, or its PackedBf16 copy)."""
    attention, mlp = layer.self_attn, layer.mlp
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    biases = [p.bias for p in projections]
    q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    return LayerWeights(
        input_norm=layer.input_layernorm.weight,
        qkv=matrix(paddle.concat([effective_weight(p) for p in projections], axis=1)),
        qkv_bias=paddle.concat(biases) if all(b is not None for b in biases) else None,
        q_norm=q_norm.weight if q_norm is not None else None,
        k_norm=k_norm.weight if k_norm is not None else None,
        o_proj=matrix(effective_weight(attention.o_proj)),
        post_norm=layer.post_attention_layernorm.weight,
        gate_up=matrix(paddle.concat([effective_weight(mlp.gate_proj), effective_weight(mlp.up_proj)], axis=1)),
        down_proj=matrix(effective_weight(mlp.down_proj)),
    )


class FusedEngine:
    def __init__(
        self, model, eos_token_ids: list, pad_token_id: int, ops, tolerance: Optional[float] = None, bf16: bool = False,
        cache_dtype: str = "float32",
    ):
        config = model.config
        self.model, self.ops, self.bf16, self.cache_dtype = model, ops, bf16, cache_dtype
        if cache_dtype == "bfloat16" and not model.lm_head.weight.place.is_cpu_place():
            raise ConfigError("kv_cache_dtype is bfloat16 but the model is on a GPU: the fused engine's CUDA kernels hold a float32 cache")
        rounded = bf16 or cache_dtype == "bfloat16"  # the engine's forward rounds what the actor's does not
        self.tolerance = tolerance if tolerance is not None else BF16_TOLERANCE if rounded else FP32_TOLERANCE
        self.eos_token_ids, self.pad_token_id = list(eos_token_ids), pad_token_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.eos = paddle.to_tensor(self.eos_token_ids, dtype="int64")
        self.cos = self.sin = None  # (P, D) rotary tables from the model's own rotary embedding
        # A fixed probe: token ids spread over the vocabulary, rows of different lengths.
        vocab = config.vocab_size
        self.probe = [[(7 + 31 * i * (row + 1)) % vocab for i in range(n)] for row, n in enumerate(PROBE_LENGTHS)]
        self.sync()

    # --- weights -------------------------------------------------------------------------------------

    @paddle.no_grad()
    def sync(self) -> float:
        """Rebuild the concatenated and packed weights from the actor, then check the engine against it on the
        probe (the bf16 copies were made from the actor's weights a moment ago: no bit-for-bit comparison).
        -> the probe's max |log-prob difference|."""
        self.layers = self._layer_weights()
        # Only lm_head is packed: the layers' matrices are a few MB each, and packed copies of them (3x
        # larger in MKL's layout) measured no faster (bench/RESULTS.md).
        self.lm_head = Projection(self.model.lm_head.weight, self.ops, transpose=True, bf16=self.bf16)  # (V, Hd) weight
        return self._check_probe()

    def _layer_weights(self) -> list:
        matrix = (lambda weight: PackedBf16.of(weight, self.ops)) if self.bf16 else (lambda weight: weight)
        return [_fuse_layer(layer, matrix) for layer in self.model.model.layers]

    def _stale_bf16_copies(self) -> list:
        """Names of the packed bf16 copies that differ from a fresh packing of the actor's weights."""
        fresh = self._layer_weights() + [PackedBf16.of(self.model.lm_head.weight, self.ops, transpose=True)]
        held = self.layers + [self.lm_head.bf16]
        stale = []
        for index, (mine, theirs) in enumerate(zip(held, fresh)):
            if isinstance(mine, LayerWeights):
                names = ("qkv", "o_proj", "gate_up", "down_proj")
                pairs = [(f"layer {index} {name}", getattr(mine, name), getattr(theirs, name)) for name in names]
            else:
                pairs = [("lm_head", mine, theirs)]
            stale += [name for name, a, b in pairs if not np.array_equal(a.packed.numpy(), b.packed.numpy())]
        return stale

    @paddle.no_grad()
    def check_weight_sync(self) -> float:
        """Max |log-prob difference| between this engine and the actor's forward on the probe; raises
        WeightSyncError beyond tolerance, or with bf16 copies, where a copy is not the actor's weight."""
        stale = self._stale_bf16_copies() if self.bf16 else []
        if stale:
            raise WeightSyncError(
                f"the fused rollout engine's bf16 weight copies are stale: {', '.join(stale[:4])}"
                f"{f' and {len(stale) - 4} more' if len(stale) > 4 else ''} differ from the actor's weights; "
                "rollouts from it would not be the policy being trained."
            )
        return self._check_probe()

    def _check_probe(self) -> float:
        input_ids, attention_mask, position_ids, first_slot = self._left_padded(self.probe)
        targets = input_ids[:, 1:]  # (B, L-1): each position predicts the next token
        hidden = self._forward(self.model.model.embed_tokens(input_ids), position_ids, first_slot,
                               self._empty_cache(*input_ids.shape), start=0)
        mine = token_logprobs(self._logits(hidden[:, :-1]), targets).numpy()
        was_training = self.model.training
        self.model.eval()
        with contiguous_kernels():
            if self.bf16:  # the actor's head in bf16 too: the engine's copy, which is the actor's weight (checked or just made)
                actor_hidden = self.model.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True)
                logits = self._logits(actor_hidden.last_hidden_state)
            else:
                logits = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True).logits
        if was_training:
            self.model.train()
        actor = token_logprobs(logits[:, :-1].astype("float32"), targets).numpy()
        valid = attention_mask[:, :-1].numpy().astype(bool)
        difference = float(np.abs(mine - actor)[valid].max())
        if not difference <= self.tolerance:  # also catches NaN
            raise WeightSyncError(
                f"the fused rollout engine disagrees with the actor: max |log-prob difference| on the probe is "
                f"{difference:.3g}, over the tolerance {self.tolerance:g} (weight_sync_tolerance). Its weights are "
                "stale or its operators are wrong; rollouts from it would not be the policy being trained."
            )
        return difference

    def _left_padded(self, rows: list):
        """left_pad's (input_ids, attention_mask, position_ids), each (B, L), and first_slot (B,): the cache
        slot of each row's first real token."""
        input_ids, attention_mask, position_ids = left_pad(rows, self.pad_token_id)
        first_slot = input_ids.shape[1] - attention_mask.sum(axis=1)
        return input_ids, attention_mask, position_ids, first_slot

    # --- the model -----------------------------------------------------------------------------------

    def _rotary_tables(self, length: int):
        if self.cos is None or self.cos.shape[0] < length:
            positions = paddle.arange(length, dtype="int64").unsqueeze(0)
            cos, sin = self.model.model.rotary_emb(self.model.lm_head.weight, positions)  # (1, length, D)
            self.cos, self.sin = cos[0].astype("float32"), sin[0].astype("float32")
        return self.cos, self.sin

    def _empty_cache(self, batch: int, slots: int) -> paddle.Tensor:
        # Slots before a row's first_slot are never read, so the cache needs no zeroing. A bfloat16 cache holds keys and
        # values computed in fp32 and rounded when written (csrc/grpo_ops.cc): half of what a decode step reads.
        shape = [len(self.layers), 2, batch, slots, self.num_kv_heads, self.head_dim]
        return paddle.empty(shape, dtype=self.cache_dtype)

    def _forward(self, x, positions, first_slot, cache, start: int, shared: Optional[SharedPrompts] = None):
        """x (B, T, Hd) embeddings of the tokens at cache slots start .. start+T-1 -> (B, T, Hd) final hidden
        states; writes their keys and values into cache (and reads the slots of shared prompts from theirs)."""
        prompts, of_row = (None, None) if shared is None else (shared.cache, shared.of_row)
        ops = self.ops
        cos, sin = self._rotary_tables(cache.shape[3])
        residual = None
        for index, layer in enumerate(self.layers):
            hidden, residual = ops.grpo_add_rms_norm(x, residual, layer.input_norm, self.eps)
            qkv = self._linear(hidden, layer.qkv, layer.qkv_bias)  # (B, T, (H + 2 KVH) D)
            if layer.q_norm is not None:
                qkv = self._norm_qk_heads(qkv, layer)
            q, _ = ops.grpo_rope_kv_write(qkv, positions, cos, sin, cache, index, start, self.num_heads, self.num_kv_heads)
            # (B, T, H D); in bf16, q and the weights rounded as the actor's bf16 attention rounds them
            attention = ops.grpo_cache_attention(q, cache, first_slot, prompts, of_row, index, start, self.bf16)
            hidden, residual = ops.grpo_add_rms_norm(self._linear(attention, layer.o_proj), residual, layer.post_norm, self.eps)
            x = self._linear(ops.grpo_silu_mul(self._linear(hidden, layer.gate_up)), layer.down_proj)
        hidden, _ = ops.grpo_add_rms_norm(x, residual, self.model.model.norm.weight, self.eps)
        return hidden

    def _prefill_groups(self, input_ids, position_ids, first_slot, cache, group_size: int) -> tuple:
        """Prefill of rows that come in groups of group_size copies of one prompt: each prompt runs once, into a cache
        of its own, which the rows' decode steps read on the CPU (on a GPU its slots are copied to every row of its
        group). (B, W) inputs -> (the logits (B, V) of each row's first new token, equal within a group (each row
        samples its own); the SharedPrompts, None on a GPU)."""
        width = input_ids.shape[1]
        distinct = paddle.arange(0, input_ids.shape[0], group_size)  # (B / G,) each group's first row
        prompt_cache = self._empty_cache(len(distinct), width)
        embedded = self.model.model.embed_tokens(paddle.gather(input_ids, distinct))
        hidden = self._forward(embedded, paddle.gather(position_ids, distinct), paddle.gather(first_slot, distinct), prompt_cache, start=0)
        logits = paddle.repeat_interleave(self._logits(hidden[:, -1]), group_size, axis=0)
        if cache.place.is_cpu_place():
            return logits, SharedPrompts(prompt_cache, paddle.arange(input_ids.shape[0], dtype="int64") // group_size)
        cache[:, :, :, :width] = paddle.repeat_interleave(prompt_cache, group_size, axis=2)  # (L, 2, B, W, KVH, D)
        return logits, None

    def _linear(self, x, weight, bias=None):
        """x (..., K) @ weight (K, N) + bias, in bf16 with fp32 sums where weight is a PackedBf16."""
        if isinstance(weight, PackedBf16):
            out = weight(x)
            return out if bias is None else out + bias
        return F.linear(x, weight, bias)

    def _norm_qk_heads(self, qkv, layer: LayerWeights):
        """Qwen3's RMSNorm over each q and k head: (B, T, (H + 2 KVH) D) -> the same layout, v untouched."""
        batch, length = qkv.shape[:2]
        heads = qkv.reshape([batch, length, -1, self.head_dim])  # (B, T, H + 2 KVH, D)
        q, k, v = paddle.split(heads, [self.num_heads, self.num_kv_heads, self.num_kv_heads], axis=2)
        q, _ = self.ops.grpo_add_rms_norm(q, None, layer.q_norm, self.eps)
        k, _ = self.ops.grpo_add_rms_norm(k, None, layer.k_norm, self.eps)
        return paddle.concat([q, k, v], axis=2).reshape([batch, length, -1])

    def _logits(self, hidden):
        """(..., Hd) -> (..., V) float32; lm_head's weight is (V, Hd), tied to the embedding or not."""
        logits = self.lm_head(hidden)
        bias = getattr(self.model.lm_head, "bias", None)
        return logits + bias if bias is not None else logits

    # --- generation ----------------------------------------------------------------------------------

    def generate(
        self, prompts: list, group_size: int, params: SamplingParams, samples: Optional[list] = None, on_tokens: TokenStream = None
    ) -> Rollout:
        rows = [list(p) for p in prompts for _ in range(group_size)]
        return self._generate(rows, group_size, params, on_tokens)[0]

    def generate_turn(self, contexts: list, known: list, params: SamplingParams) -> tuple:
        """A multi-turn rollout's turn (alignment/rollout/multi_turn.py): contexts are B token lists, known[r] the keys
        and values (L, 2, k, KVH, D) of the first k tokens of contexts[r] (None: none), as this method returned them
        for the row's last turn, so only the tokens after them are prefilled. -> (Rollout of group size 1, for each
        row that ended on eos the keys and values of its context and completion but the eos, else None)."""
        return self._generate(contexts, 1, params, None, known)

    @paddle.no_grad()
    def _generate(self, rows: list, group_size: int, params: SamplingParams, on_tokens: TokenStream, known: Optional[list] = None) -> tuple:
        ops = self.ops
        batch, width, new_tokens = len(rows), max(len(r) for r in rows), params.max_new_tokens
        input_ids, _, position_ids, first_slot = self._left_padded(rows)
        cache = self._empty_cache(batch, width + new_tokens)
        window = width  # the last `window` slots are prefilled: all of them, or those after each row's known tokens
        if known is not None:
            window = max(len(row) - (0 if kv is None else kv.shape[2]) for row, kv in zip(rows, known))
            for row, kv in enumerate(known):
                if kv is not None:
                    begin = width - len(rows[row])
                    cache[:, :, row, begin : begin + kv.shape[2]] = kv
        saved = [None] * batch  # with known: each eos row's keys and values, for its next turn
        presence = np.zeros([batch, self.model.config.vocab_size], dtype=np.uint8)  # tokens seen, for the penalty
        for row, prompt in enumerate(rows):
            presence[row, prompt] = 1
        presence = paddle.to_tensor(presence)
        # Greedy decoding draws nothing, so it leaves paddle's random stream as it is.
        base_seed = 0 if params.greedy else params.seed if params.seed is not None else int(paddle.randint(0, 2**31 - 1, [1]))
        temperature = 1.0 if params.greedy else params.temperature

        completion_ids = np.full((batch, new_tokens), self.pad_token_id, dtype=np.int64)
        completion_mask = np.zeros((batch, new_tokens), dtype=np.float32)
        logprobs = np.zeros((batch, new_tokens), dtype=np.float32)
        finished_by_eos = np.zeros(batch, dtype=bool)
        row_ids = np.arange(batch)  # active position -> original row
        alive = np.ones(batch, dtype=bool)  # per active position: not finished yet

        shared = None
        if known is None and group_size > 1:  # each prompt once: its group_size rows are consecutive copies
            logits, shared = self._prefill_groups(input_ids, position_ids, first_slot, cache, group_size)
        else:
            embedded = self.model.model.embed_tokens(input_ids[:, width - window :])
            hidden = self._forward(embedded, position_ids[:, width - window :], first_slot, cache, start=width - window)
            logits = self._logits(hidden[:, -1])  # (B, V)
        positions = position_ids[:, -1:] + 1  # (B, 1) rotary position of the next token
        keys = np.asarray(params.row_keys, dtype=np.int64) if params.row_keys is not None else params.first_row + row_ids
        for step in range(new_tokens):
            row_keys = paddle.to_tensor(keys[row_ids], dtype="int64")
            tokens, chosen_logprobs = ops.grpo_sample(
                logits, presence, self.eos, row_keys, base_seed * 1_000_003 + step, step, params.min_new_tokens,
                temperature, params.top_k, params.top_p, params.min_p, params.repetition_penalty, params.greedy,
            )
            done, _ = ops.grpo_stop_update(tokens, presence, self.eos)
            tokens_np, done_np = tokens.numpy(), done.numpy()
            live_rows = row_ids[alive]
            completion_ids[live_rows, step] = tokens_np[alive]
            completion_mask[live_rows, step] = 1.0
            logprobs[live_rows, step] = chosen_logprobs.numpy()[alive]
            finished_by_eos[live_rows] = done_np[alive]
            if known is not None:  # slots up to this step's (the eos is not in the cache: the next turn prefills it)
                begins = first_slot.numpy()
                for position in np.flatnonzero(alive & done_np):
                    saved[row_ids[position]] = cache[:, :, int(position), int(begins[position]) : width + step].clone()
            if on_tokens is not None:
                on_tokens(completion_ids[:, step])
            alive &= ~done_np
            if not alive.any() or step == new_tokens - 1:
                break
            if (~alive).sum() * COMPACT_FRACTION >= len(alive):
                keep = paddle.to_tensor(np.flatnonzero(alive), dtype="int64")
                ops.grpo_compact_rows(cache, keep, 2, width + step)  # slots written so far
                ops.grpo_compact_rows(presence, keep, 0, -1)
                tokens, first_slot, positions = (paddle.gather(t, keep) for t in (tokens, first_slot, positions))
                shared = None if shared is None else shared.rows(keep)
                row_ids, alive = row_ids[alive], alive[alive]
            embedded = self.model.model.embed_tokens(tokens.unsqueeze(-1))  # (b, 1, Hd)
            hidden = self._forward(embedded, positions, first_slot, cache, start=width + step, shared=shared)
            logits = self._logits(hidden[:, 0])
            positions = positions + 1
        rollout = Rollout(
            prompt_ids=rows,
            completion_ids=completion_ids[:, : step + 1],
            completion_mask=completion_mask[:, : step + 1],
            logprobs=logprobs[:, : step + 1],
            finish_reasons=["eos" if done else "length" for done in finished_by_eos],
            group_size=group_size,
        )
        return rollout, saved
