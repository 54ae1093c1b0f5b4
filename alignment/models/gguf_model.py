"""A GGUF's model, read: the file opened (its header walked first: alignment/models/gguf_header.py), the Hugging Face
config.json from its metadata, its tensors checked against that config and turned into Hugging Face weights.

What a GGUF stores differently from the Hugging Face checkpoint it was converted from (llama.cpp's
convert_hf_to_gguf.py), and what is undone here:
- every tensor may be quantized (Q8_0, Q4_K, ...): dequantized to fp32 with the `gguf` package's numpy code;
  a quantized model stays as lossy as its file (importing does not bring back the original weights);
- for the llama architecture the rows of q_proj and k_proj are permuted, each head's two rotary halves
  interleaved (llama.cpp rotates adjacent pairs, transformers rotates halves); qwen2 / qwen3 are not;
- the names (blk.N.attn_q.weight, ...), and a tied model has no `output` tensor;
- Llama 3.1+'s rotary scaling (config.json's rope_scaling, rope_type llama3) is a tensor, rope_freqs.weight: the
  number llama.cpp divides each inverse frequency by; config.json gets the llama3 parameters that reproduce it.
"""

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from alignment.basics.errors import GGUFImportError
from alignment.models.gguf_header import check_header

# general.architecture -> (Hugging Face class, model_type, q/k rows permuted by llama.cpp's converter)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False),
}

# GGUF tensor name -> Hugging Face name; blk.N.X -> model.layers.N.Y
TOP_LEVEL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3: RMSNorm over each head's q
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def open_reader(source: Path):
    if not source.is_file():
        raise GGUFImportError(f"{source}: no such file")
    with open(source, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFImportError(f"{source}: not a GGUF file (it does not start with the bytes GGUF)")
    check_header(source)
    try:
        return GGUFReader(source)
    except (ValueError, IndexError, KeyError, OSError) as e:  # a file cut short reads past its end
        raise GGUFImportError(f"{source}: not a readable GGUF file ({type(e).__name__}: {' '.join(str(e).split())})") from None


def read_metadata(source: Path, reader, wanted=lambda name: True) -> dict:
    """The metadata's values, those of the wanted keys; text that is not UTF-8 is refused naming its key."""
    metadata = {}
    for name, field in reader.fields.items():
        if wanted(name):
            try:
                metadata[name] = field.contents()
            except UnicodeDecodeError as e:
                raise GGUFImportError(f"{source}: metadata {name} holds text that is not UTF-8 ({e.reason} at byte {e.start})") from None
    return metadata


def architecture(source: Path, metadata: dict) -> str:
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"{source}: general.architecture is {arch!r}; the importer reads {', '.join(ARCHITECTURES)}")
    return arch


def metadata_value(source: Path, metadata: dict, key: str, default=None):
    if key in metadata:
        return metadata[key]
    if default is None:
        raise GGUFImportError(f"{source}: the metadata lacks {key}")
    return default


def model_config(source: Path, metadata: dict, arch: str, reader) -> dict:
    """The Hugging Face config.json of the model the GGUF holds, from its {arch}.* metadata."""
    hf_class, model_type, _ = ARCHITECTURES[arch]
    tensors = {t.name: t for t in reader.tensors}

    def key(name, default=None):
        return metadata_value(source, metadata, f"{arch}.{name}", default)

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise GGUFImportError(f"{source}: {arch}.attention.value_length differs from the key length {head_dim}: not supported")
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise GGUFImportError(f"{source}: {arch}.rope.dimension_count is not the head size {head_dim} (partial rotary): not supported")
    theta = float(key("rope.freq_base", 10000.0))
    if "token_embd.weight" not in tensors:
        raise GGUFImportError(f"{source}: no token_embd.weight tensor")
    vocab_size = int(tensors["token_embd.weight"].shape[1])  # ggml order: (hidden, vocab)
    bos, eos = metadata.get("tokenizer.ggml.bos_token_id"), metadata.get("tokenizer.ggml.eos_token_id")
    config = {
        "architectures": [hf_class],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": rope_scaling(source, metadata, arch, tensors, theta, head_dim),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": None if eos is None else int(eos),
        "torch_dtype": "float32",
        "use_cache": True,
    }
    if arch == "qwen2":  # Qwen2's config keys beside Llama's (the GGUF holds no sliding-window setting)
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=config["num_hidden_layers"])
    return config


def rope_scaling(source: Path, metadata: dict, arch: str, tensors: dict, theta: float, head_dim: int) -> dict | None:
    """config.json's rope_scaling: None, or for a llama file with rope_freqs.weight the llama3 scaling that gives its
    values. Only the factor (the largest value) is read off the tensor; the other parameters are Llama 3.1 and 3.2's
    (low_freq_factor 1, high_freq_factor 4) and the original context {arch}.rope.scaling.original_context_length, else
    the 8192 convert_hf_to_gguf.py assumes. A file these do not reproduce is refused rather than imported with
    rotary positions llama.cpp would not use. Linear and YaRN scaling ({arch}.rope.scaling.type / factor) are refused."""
    kind, linear = metadata.get(f"{arch}.rope.scaling.type", "none"), float(metadata.get(f"{arch}.rope.scaling.factor", 1.0))
    if kind not in ("none", "") or linear not in (0.0, 1.0) or (arch != "llama" and "rope_freqs.weight" in tensors):
        raise GGUFImportError(
            f"{source}: scaled rotary positions ({arch}.rope.scaling.type {kind!r}, factor {linear:g}"
            f"{', rope_freqs.weight' if 'rope_freqs.weight' in tensors else ''}): not supported; the importer reads "
            "llama3 scaling (rope_freqs.weight, Llama 3.1+) in llama files"
        )
    if "rope_freqs.weight" not in tensors:
        return None
    tensor = tensors["rope_freqs.weight"]
    found = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float64).reshape(-1)  # (head_dim/2,)
    if found.shape != (head_dim // 2,):
        raise GGUFImportError(f"{source}: rope_freqs.weight holds {found.size} values; head size {head_dim} needs {head_dim // 2}")
    original = int(metadata.get(f"{arch}.rope.scaling.original_context_length", 8192))
    scaling = {"rope_type": "llama3", "factor": float(found.max()), "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": original}
    expected = llama3_rope_factors(theta, head_dim, scaling).astype(np.float64)
    error = np.abs(found - expected) / expected
    error[np.isnan(error)] = np.inf
    if error.max() > 1e-5:
        worst = int(error.argmax())
        raise GGUFImportError(
            f"{source}: rope_freqs.weight is not llama3 rotary scaling with factor {scaling['factor']:g}, low_freq_factor 1, "
            f"high_freq_factor 4 and original context {original}: value {worst} is {found[worst]:.6g} where that scaling "
            f"gives {expected[worst]:.6g}; not supported"
        )
    return scaling


def llama3_rope_factors(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """config.json's llama3 rope_scaling -> rope_freqs.weight (head_dim/2,) float32, as convert_hf_to_gguf.py computes it:
    what llama.cpp divides each inverse frequency theta^(-2i/head_dim) (float32) by. 1 where the wavelength 2 pi / freq is
    under original / high_freq_factor, factor over original / low_freq_factor, in between 1 / ((1 - s) / factor + s)
    with s = (original / wavelength - low) / (high - low), which is 0 and 1 at those two ends."""
    inv_freq = np.float32(1.0) / np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))
    wavelength = 2 * np.pi / inv_freq.astype(np.float64)
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    smooth = np.clip((scaling["original_max_position_embeddings"] / wavelength - low) / (high - low), 0.0, 1.0)
    return (1.0 / ((1.0 - smooth) / scaling["factor"] + smooth)).astype(np.float32)


# What every layer holds (GGUF names): a file with a layer that lacks one is refused
LAYER_TENSORS = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight",
                 "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def expected_shape(name: str, config: dict) -> tuple | None:
    """The shape (torch's layout) that config.json gives tensor `name` (a GGUF name), or None for a name with no place."""
    hidden, inner, head = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    top = {
        "token_embd.weight": (config["vocab_size"], hidden),
        "output.weight": (config["vocab_size"], hidden),
        "output_norm.weight": (hidden,),
    }
    if name in top:
        return top[name]
    layer = {"attn_norm.weight": (hidden,), "ffn_norm.weight": (hidden,), "attn_q.weight": (q, hidden), "attn_q.bias": (q,),
             "attn_k.weight": (kv, hidden), "attn_k.bias": (kv,), "attn_v.weight": (kv, hidden), "attn_v.bias": (kv,),
             "attn_output.weight": (hidden, q), "ffn_gate.weight": (inner, hidden), "ffn_up.weight": (inner, hidden),
             "ffn_down.weight": (hidden, inner), "attn_q_norm.weight": (head,), "attn_k_norm.weight": (head,)}
    found = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    return layer.get(found[2]) if found and int(found[1]) < config["num_hidden_layers"] else None


def check_tensors(source: Path, reader, config: dict) -> None:
    """Refuses a file whose metadata and tensors disagree, before any tensor is read: layers other than block_count's,
    a layer that lacks a tensor, a shape other than the metadata's, tensors that share bytes or reach past the file."""
    tensors = {t.name: t for t in reader.tensors if t.name != "rope_freqs.weight"}
    layers = sorted({int(found[1]) for name in tensors if (found := re.match(r"blk\.(\d+)\.", name))})
    arch = config["model_type"]
    if len(layers) != config["num_hidden_layers"] or layers != list(range(len(layers))):
        held = f"layers {layers[0]}-{layers[-1]}" if layers else "no layer"
        raise GGUFImportError(
            f"{source}: {arch}.block_count is {config['num_hidden_layers']}, but the file holds {held} ({len(layers)} layers)"
        )
    for layer in layers:
        lacking = [f"blk.{layer}.{name}" for name in LAYER_TENSORS if f"blk.{layer}.{name}" not in tensors]
        if lacking:
            raise GGUFImportError(f"{source}: layer {layer} lacks {', '.join(lacking)}")
    for name, tensor in tensors.items():
        shape, expected = tuple(int(n) for n in reversed(tensor.shape)), expected_shape(name, config)
        if expected is None:
            raise GGUFImportError(f"{source}: tensor {name} has no place in the model (a tensor of another architecture?)")
        if shape != expected:
            raise GGUFImportError(f"{source}: tensor {name} is {shape}, where the metadata ({arch}.*) make it {expected}")
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes), t.name) for t in reader.tensors)
    for (start, end, name), (next_start, _, following) in zip(spans, spans[1:]):
        if next_start < end:
            raise GGUFImportError(
                f"{source}: tensor {name}'s bytes {start}-{end} overlap tensor {following}'s: each tensor needs bytes of its own"
            )
    if spans and spans[-1][1] > source.stat().st_size:
        raise GGUFImportError(f"{source}: tensor {spans[-1][2]}'s bytes reach past the end of the file (cut short?)")


def hf_weights(source: Path, reader, config: dict) -> dict:
    """-> {Hugging Face name: fp32 array in torch's layout (linear weights (out, in))}."""
    permuted = ARCHITECTURES[config["model_type"]][2]
    weights = {}
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":  # config.json's rope_scaling (model_config)
            continue
        name = hf_name(source, tensor.name)
        try:
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise GGUFImportError(
                f"{source}: tensor {tensor.name} is {tensor.tensor_type.name}, which the gguf package cannot dequantize"
            ) from None
        array = array.reshape([int(n) for n in reversed(tensor.shape)])  # ggml lists dimensions innermost first
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            array = unpermute_rows(array, config["num_attention_heads"])
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            array = unpermute_rows(array, config["num_key_value_heads"])
        weights[name] = np.ascontiguousarray(array)
    return weights


def hf_name(source: Path, name: str) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight."""
    stem, _, kind = name.rpartition(".")
    if stem in TOP_LEVEL_NAMES:
        return f"{TOP_LEVEL_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{kind}"
    raise GGUFImportError(f"{source}: tensor {name} has no place in the model (a tensor of another architecture?)")


def unpermute_rows(array: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's permute(): there each head's rows (r0 .. r{d/2-1} | r{d/2} .. r{d-1}) were
    interleaved to (r0, r{d/2}, r1, r{d/2+1}, ...); rows (n_head*d, ...) -> the same shape, halves restored."""
    rows = array.shape[0]
    return array.reshape(n_head, rows // n_head // 2, 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)
