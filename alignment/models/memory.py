"""How much memory a training process needs, from the model's shape (its config.json) and the run's settings, before any
model loads: weights, gradients, AdamW's moments, the rollout engine's KV cache and the activations that a micro-batch
of the update keeps for its backward pass. Bytes throughout; float32 weights and activations (the CPU path), the KV cache
in its own dtype.

The activations are counted tensor by tensor from what the decoder layers keep for backward (alignment/models/
fused_train.py's modules; paddleformers' own are measured to keep more, ACTIVATION_FACTOR_EAGER): per token of a row,
each layer keeps its input, the normed input, q, k, v, the attention output, the residual, the second norm, gate|up and
silu(gate)*up: 6 H + 2 KVH D + 3 I floats; and per pair of (query, key) positions each head keeps one softmax
probability, or, with grpo_attention (csrc/grpo_attention.cc), per query two floats. bench/bench_step.py prints each
run's estimate beside its measured peak (bench/RESULTS.md, "Memory")."""

import math
from dataclasses import dataclass
from typing import Optional

FLOAT = 4  # bytes of a float32
# measured on this package's runs (bench/RESULTS.md, "Memory"): what importing and running the model adds beyond
# the counted tensors (the compiled operators, oneDNN and MKL's buffers, the allocator's slack, Python objects)
RUNTIME_OVERHEAD = 100 * 2**20
ACTIVATION_FACTOR_EAGER = 2.0  # paddleformers' layers keep more per token (separate q, k, v, rotary's halves, repeated kv)
# glibc keeps what the rollout and the previous step freed in its heap, in pieces: the peaks measured from the second step on
# are above the tensors counted (bench/RESULTS.md, "Memory: micro-batches by token budget, the estimate, the peak")
ALLOCATOR_SLACK = 1.15
# The default token budget keeps a micro-batch's activations under this: larger micro-batches run no faster, their peak
# only grows (bench/RESULTS.md, "The CPU's roofline, third part": micro-batch size, now that freed memory is kept)
FAST_ACTIVATIONS = 4 * 2**30


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads from a Hugging Face config.json."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_config(cls, config: dict) -> "ModelShape":
        heads = config["num_attention_heads"]
        return cls(
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            vocab=config["vocab_size"],
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
        )

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def layer_matmul_parameters(self) -> int:  # q|k|v, o, gate|up, down
        return self.hidden * self.qkv_width + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def parameters(self) -> int:
        per_layer = self.layer_matmul_parameters + 2 * self.hidden + (self.qkv_width if self.qkv_bias else 0)
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    @property
    def kv_values_per_token(self) -> int:  # one token's keys and values in every layer
        return self.layers * 2 * self.kv_heads * self.head_dim

    @property
    def kept_floats_per_token(self) -> int:  # what one decoder layer keeps for backward, per token (module docstring)
        return 6 * self.hidden + 2 * self.kv_heads * self.head_dim + 3 * self.intermediate


@dataclass(frozen=True)
class MemorySettings:
    """The run's settings that move the estimate."""

    prompt_width: int  # the longest prompt, in tokens
    completion_width: int  # max_dec_len
    group_size: int  # rollout_n: rows that share a prompt
    generations: tuple  # (prompts, completions per prompt) of each batch the rollout engine generates: training, evaluation
    training_ops: bool  # use_fused_train_ops (else paddleformers' own layers)
    prefix_grouper: bool  # each prompt runs once per micro-batch (training ops, no recompute)
    recompute: bool
    reference_model: bool  # a second, frozen copy of the weights (a KL term without LoRA)
    lora_parameters: Optional[int]  # the adapters' parameters with LoRA; None: every weight is trained
    optimizer_share: float  # the fraction of AdamW's state this process keeps (1 / sharding degree)
    logprob_chunk_tokens: int
    # the attention's softmax weights, one float per (query, key) pair and head (the training operators built without
    # oneDNN); grpo_attention keeps two floats per query and head instead (its row max and 1 / sum)
    attention_weights_kept: bool = True
    cache_value_bytes: int = FLOAT  # the rollout's KV cache: 2 where it is bfloat16 (kv_cache_dtype)

    @property
    def row_tokens(self) -> int:  # padded tokens of one row, as the token budget counts them
        return self.prompt_width + self.completion_width


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak, part by part (bytes)."""

    parts: dict  # name -> bytes: runtime, weights, reference, gradients, optimizer, then the larger of rollout and update
    micro_batch_rows: int

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def summary(self) -> str:
        return ", ".join(f"{name} {gigabytes(size)}" for name, size in self.parts.items() if size)


def gigabytes(size: float) -> str:
    return f"{size / 2**30:.2f} GB"


def lora_parameters(shape: ModelShape, rank: int, targets: list) -> int:
    """The adapters' parameters: r (in + out) for each targeted projection of each layer."""
    sizes = {
        "q_proj": (shape.hidden, shape.heads * shape.head_dim),
        "k_proj": (shape.hidden, shape.kv_heads * shape.head_dim),
        "v_proj": (shape.hidden, shape.kv_heads * shape.head_dim),
        "o_proj": (shape.heads * shape.head_dim, shape.hidden),
        "gate_proj": (shape.hidden, shape.intermediate),
        "up_proj": (shape.hidden, shape.intermediate),
        "down_proj": (shape.intermediate, shape.hidden),
    }
    return shape.layers * sum(rank * (a + b) for name, (a, b) in sizes.items() if any(t.split(".")[-1] == name for t in targets))


def update_bytes(shape: ModelShape, settings: MemorySettings, rows: int) -> int:
    """What one micro-batch of `rows` rows adds during the update: the activations kept for backward, the softmax
    probabilities, the transient of one layer's backward, the final hidden states and the log-prob head's chunk."""
    width, length = settings.prompt_width, settings.completion_width
    keys = width + length
    groups = math.ceil(rows / settings.group_size)
    if settings.prefix_grouper:  # each prompt once, then the completions attending to [prompt | completion]
        tokens = groups * width + rows * length
        pairs = groups * width * width + rows * length * keys
    else:
        tokens, pairs = rows * keys, rows * keys * keys
    attention = pairs if settings.attention_weights_kept else 2 * tokens
    layer = tokens * shape.kept_floats_per_token + shape.heads * attention  # floats one layer keeps
    kept = shape.layers * layer if not settings.recompute else shape.layers * tokens * shape.hidden + layer
    if not settings.training_ops:
        kept *= ACTIVATION_FACTOR_EAGER
    concatenated_weights = shape.layers * (shape.hidden * shape.qkv_width + 2 * shape.hidden * shape.intermediate)
    backward = layer + rows * keys * keys  # one layer's gradients at a time (each layer's activations go as they come), the mask
    head = rows * length * shape.hidden * 2 + 3 * settings.logprob_chunk_tokens * shape.vocab
    return int(ALLOCATOR_SLACK * FLOAT * (kept + (concatenated_weights if settings.training_ops else 0) + backward + head))


def kv_cache_bytes(shape: ModelShape, settings: MemorySettings, prompts: int, copies: int) -> int:
    """The fused engine's two caches for prompts x copies rows: every row's prompt and completion slots, and each
    prompt's own, prefilled once and copied to its group's rows (alignment/rollout/fused.py)."""
    slots = prompts * copies * settings.row_tokens + prompts * settings.prompt_width
    return slots * shape.kv_values_per_token * settings.cache_value_bytes


def rollout_bytes(shape: ModelShape, settings: MemorySettings) -> int:
    """The engine's largest batch: its KV caches, the prefill's one-layer activations (each prompt runs once) and the
    logits."""
    width = settings.prompt_width
    largest = 0
    for prompts, copies in settings.generations:
        cache = kv_cache_bytes(shape, settings, prompts, copies)
        prefill = prompts * width * (shape.kept_floats_per_token + shape.heads * width) * FLOAT
        largest = max(largest, int(ALLOCATOR_SLACK * (cache + prefill + prompts * copies * shape.vocab * FLOAT * 2)))
    return largest


def estimate_memory(shape: ModelShape, settings: MemorySettings, runtime: int, rows: int) -> MemoryEstimate:
    """The peak of a process that already holds `runtime` bytes (paddle, the tokenizer, the data), with micro-batches
    of `rows` rows: the weights, gradients and AdamW's two moments stay; the rollout's cache and the update's
    activations come one after the other."""
    trained = shape.parameters if settings.lora_parameters is None else settings.lora_parameters
    weights = shape.parameters * FLOAT + (settings.lora_parameters or 0) * FLOAT
    parts = {
        "runtime": runtime + RUNTIME_OVERHEAD,
        "weights": weights,
        "reference model": shape.parameters * FLOAT if settings.reference_model else 0,
        "gradients": trained * FLOAT,
        "AdamW moments": int(2 * trained * FLOAT * settings.optimizer_share),
    }
    rollout, update = rollout_bytes(shape, settings), update_bytes(shape, settings, rows)
    parts.update({"rollout cache": rollout} if rollout > update else {f"update activations ({rows} rows)": update})
    return MemoryEstimate(parts, rows)


def rows_within(
    shape: ModelShape, settings: MemorySettings, runtime: int, limit: float, most_rows: int, activations: Optional[int] = None
) -> int:
    """The most rows (at most most_rows; whole groups where the prefix grouper runs) whose estimate stays within
    `limit` bytes, and whose update activations stay under `activations` bytes beyond the smallest micro-batch; 0 when not
    even the smallest micro-batch fits the limit."""
    step = settings.group_size if settings.prefix_grouper and most_rows >= settings.group_size else 1
    best = 0
    for rows in range(step, most_rows + 1, step):
        too_slow = activations is not None and rows > step and update_bytes(shape, settings, rows) > activations
        if too_slow or estimate_memory(shape, settings, runtime, rows).total > limit:
            break
        best = rows
    return best


@dataclass(frozen=True)
class TokenBudget:
    """How the update and the log-prob passes cut a batch into micro-batches: at most most_rows rows
    (per_device_train_batch_size) and at most `update` (or `logprobs`) padded tokens, rows x (prompt width + completion
    width), a multiple of group_size rows where the prefix grouper runs (whole groups where the rows keep their order);
    0: no token budget."""

    update: int
    logprobs: int
    most_rows: int
    group_size: int = 1

    def rows(self, rows_total: int, row_tokens: int, logprobs: bool = False) -> int:
        """The micro-batch size for rows_total rows of row_tokens padded tokens each: the batch is cut into as few
        micro-batches as the limits allow, of equal size (the last one may be shorter)."""
        budget = self.logprobs if logprobs else self.update
        cap = min(self.most_rows, budget // max(row_tokens, 1)) if budget else self.most_rows
        if self.group_size > 1 and cap >= self.group_size:
            cap -= cap % self.group_size
        cap = max(cap, 1)
        pieces = math.ceil(rows_total / cap) if rows_total else 1
        size = math.ceil(rows_total / pieces) if rows_total else cap
        if self.group_size > 1 and cap >= self.group_size:
            size = min(cap, math.ceil(size / self.group_size) * self.group_size)
        return max(size, 1)
