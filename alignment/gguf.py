"""GGUF (llama.cpp, Ollama) -> a Hugging Face-layout model folder the trainer, alignment.chat and transformers load:

    python -m alignment.gguf import MODEL.gguf OUT_DIR

run_grpo.py also takes the .gguf itself as actor_model_name_or_path: import_if_changed imports it into
<output_dir>/imported/<name> and reuses that folder while the file is unchanged.

The folder holds config.json, generation_config.json, model.safetensors (fp32), and the tokenizer
(tokenizer.json, tokenizer_config.json with the chat template) built from the GGUF's own metadata.
Architectures: llama (SmolLM, Llama 2, 3.0, 3.1, 3.2, Mistral 7B, TinyLlama), qwen2 (Qwen2, Qwen2.5) and qwen3.

What a GGUF stores differently from the Hugging Face checkpoint it was converted from (llama.cpp's
convert_hf_to_gguf.py), and what is undone here:
- every tensor may be quantized (Q8_0, Q4_K, ...): dequantized to fp32 with the `gguf` package's numpy code;
  a quantized model stays as lossy as its file (importing does not bring back the original weights);
- for the llama architecture the rows of q_proj and k_proj are permuted, each head's two rotary halves
  interleaved (llama.cpp rotates adjacent pairs, transformers rotates halves); qwen2 / qwen3 are not;
- the names (blk.N.attn_q.weight, ...), and a tied model has no `output` tensor;
- Llama 3.1+'s rotary scaling (config.json's rope_scaling, rope_type llama3) is a tensor, rope_freqs.weight: the
  number llama.cpp divides each inverse frequency by; config.json gets the llama3 parameters that reproduce it;
- the tokenizer is metadata (token strings, merges or SentencePiece scores, token types, special ids) plus
  the name of a pre-tokenizer (tokenizer.ggml.pre) whose regular expressions live in llama.cpp's source.
"""

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from alignment.run.runtime import configure_cpu_runtime

configure_cpu_runtime()  # before transformers is imported: it quiets transformers' notice that torch is absent

import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from alignment.errors import GGUFImportError  # noqa: E402
from alignment.gguf_header import check_header  # noqa: E402

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

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The pre-tokenizers of llama.cpp (src/llama-vocab.cpp): tokenizer.ggml.pre -> (regular expressions, applied in
# turn, each splitting every piece further and keeping what it does not match; clean_up_tokenization_spaces).
# Digits matter: SmolLM splits numbers into single digits, Llama 3 into groups of up to three, GPT-2 not at all.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZERS = {
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", "[0-9][0-9][0-9]"], True),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe"], ([LLAMA3_SPLIT], True)),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen"], ([QWEN2_SPLIT], False)),
    **dict.fromkeys(["stablelm2", "megrez"], ([QWEN2_SPLIT], True)),
    **dict.fromkeys(["smollm", "command-r"], ([r"\p{N}", GPT2_SPLIT], False)),
    **dict.fromkeys(["starcoder", "refact", "codeshell", "exaone", "minerva-7b"], ([r"\p{N}", GPT2_SPLIT], True)),
    **dict.fromkeys(["gpt-2", "phi-2", "mpt", "olmo", "jais"], ([GPT2_SPLIT], True)),
}
IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe"}  # llama.cpp takes a whole piece found in the vocabulary as one token

def import_gguf(source: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """MODEL.gguf -> OUT_DIR (a model folder); written beside OUT_DIR and renamed into place at the end, so an
    interrupted import leaves no half folder. An OUT_DIR that exists and is not empty is refused unless overwrite."""
    source, out_dir = Path(source), Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise GGUFImportError(f"{out_dir}: exists and is not empty; choose another folder or pass --overwrite")
    reader = _open(source)
    metadata = _metadata(source, reader)
    arch = _architecture(source, metadata)
    config = model_config(source, metadata, arch, reader)
    check_tensors(source, reader, config)
    check_token_ids(source, metadata, config)
    weights = hf_weights(source, reader, config)
    try:
        tokenizer = build_tokenizer(source, metadata)
    except GGUFImportError:
        raise
    except Exception as e:  # the tokenizers library's refusals: a merge of tokens the vocabulary lacks, a merge not "a b"
        why = " ".join(str(e).split())
        raise GGUFImportError(f"{source}: no tokenizer can be built from tokenizer.ggml.* ({type(e).__name__}: {why})") from None
    check_chat_template(source, tokenizer)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (staging / "generation_config.json").write_text(json.dumps(generation_config(metadata), indent=2) + "\n")
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(str(staging))
        (staging / "gguf_source.json").write_text(json.dumps(_provenance(source), indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def read_config(source: str | Path) -> dict:
    """The config.json an import of MODEL.gguf writes, from the file's header (no tensor is read): the checks of an
    import's first step (a GGUF, an architecture and rotary scheme the importer reads) before any weight is."""
    source = Path(source)
    reader = _open(source)
    metadata = _metadata(source, reader, lambda name: not name.startswith("tokenizer.ggml.") or name.endswith("_token_id"))
    config = model_config(source, metadata, _architecture(source, metadata), reader)
    check_tensors(source, reader, config)
    check_token_ids(source, metadata, config)
    return config


def import_if_changed(source: str | Path, out_dir: str | Path) -> bool:
    """Imports MODEL.gguf into OUT_DIR, replacing what is there, unless OUT_DIR holds an import of the file as it is
    now (its gguf_source.json) -> whether it imported."""
    if _is_import_of(Path(out_dir), Path(source)):
        return False
    import_gguf(source, out_dir, overwrite=True)
    return True


def _is_import_of(folder: Path, source: Path) -> bool:
    """Whether folder was imported from source's present bytes. The recorded path, size and modification time
    all equal: yes, without reading the file (make's and rsync's rule). The size differs: no. Else (the file
    copied, moved or touched) its SHA-256 decides, and a match records the new path and time for next time."""
    try:
        recorded = json.loads((folder / "gguf_source.json").read_text())
    except (OSError, ValueError):  # no import there, or one cut short before this file was written
        return False
    stat = source.stat()
    now = {"file": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if all(recorded.get(key) == value for key, value in now.items()):
        return True
    if recorded.get("size") != stat.st_size or recorded.get("sha256") != _sha256(source):
        return False
    (folder / "gguf_source.json").write_text(json.dumps({**recorded, **now}, indent=2) + "\n")
    return True


def _open(source: Path):
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


def _metadata(source: Path, reader, wanted=lambda name: True) -> dict:
    """The metadata's values, those of the wanted keys; text that is not UTF-8 is refused naming its key."""
    metadata = {}
    for name, field in reader.fields.items():
        if wanted(name):
            try:
                metadata[name] = field.contents()
            except UnicodeDecodeError as e:
                raise GGUFImportError(f"{source}: metadata {name} holds text that is not UTF-8 ({e.reason} at byte {e.start})") from None
    return metadata


def _architecture(source: Path, metadata: dict) -> str:
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"{source}: general.architecture is {arch!r}; the importer reads {', '.join(ARCHITECTURES)}")
    return arch


def _key(source: Path, metadata: dict, key: str, default=None):
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
        return _key(source, metadata, f"{arch}.{name}", default)

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


def check_token_ids(source: Path, metadata: dict, config: dict) -> None:
    """The vocabulary has a row of token_embd.weight for each token and one type and score for each where it has those,
    and every special token id the metadata name lies inside it."""
    tokens = metadata.get("tokenizer.ggml.tokens", [])
    if not isinstance(tokens, list) or len(tokens) > config["vocab_size"]:
        held = f"holds {len(tokens)} tokens" if isinstance(tokens, list) else "is not an array"
        raise GGUFImportError(f"{source}: tokenizer.ggml.tokens {held}; it must be an array of at most the "
                              f"{config['vocab_size']} rows of token_embd.weight")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        values = metadata.get(key, tokens)
        if not isinstance(values, list) or len(values) != len(tokens):
            raise GGUFImportError(f"{source}: {key} must be an array of one value for each of the {len(tokens)} tokens")
    vocabulary = len(tokens) or config["vocab_size"]
    for key in sorted(k for k in metadata if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")):
        if not 0 <= int(metadata[key]) < vocabulary:
            raise GGUFImportError(f"{source}: {key} is {metadata[key]}, outside the vocabulary of {vocabulary} tokens")


def check_chat_template(source: Path, tokenizer) -> None:
    """The GGUF's chat template (someone else's code, run by jinja's sandbox) renders a short conversation within the
    limits every rendering has (alignment/models/template_limits.py), or the import is refused."""
    from alignment.errors import ChatTemplateError
    from alignment.models.template_limits import bounded_chat_template

    if tokenizer.chat_template is None:
        return
    conversation = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    try:
        bounded_chat_template(tokenizer.apply_chat_template)(conversation, add_generation_prompt=True, tokenize=False)
    except ChatTemplateError as error:
        raise GGUFImportError(f"{source}: tokenizer.chat_template {error}") from None
    except Exception as error:  # jinja's own errors, or the template's raise_exception("...")
        raise GGUFImportError(f"{source}: tokenizer.chat_template cannot render a conversation ({type(error).__name__}: {error})") from None


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


def generation_config(metadata: dict) -> dict:
    """bos / eos / pad as generate() reads them; eos lists the end-of-turn token too where the GGUF names one."""
    eos = list(
        dict.fromkeys(metadata[key] for key in (f"tokenizer.ggml.{name}_token_id" for name in ("eos", "eot", "eom")) if key in metadata)
    )
    config = {
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
    }
    return {key: value for key, value in config.items() if value is not None}


def build_tokenizer(source: Path, metadata: dict):
    """The GGUF's vocabulary as a transformers PreTrainedTokenizerFast (saved as tokenizer.json + tokenizer_config.json),
    tokenizing as llama.cpp does: byte-level BPE (tokenizer.ggml.model gpt2) or SentencePiece-style BPE (llama).
    CONTROL (and UNKNOWN) tokens become special added tokens, USER_DEFINED ones plain added tokens: both are matched
    in the text before anything else, as llama.cpp's special-token pass does."""
    kind = _key(source, metadata, "tokenizer.ggml.model")
    tokens = list(_key(source, metadata, "tokenizer.ggml.tokens"))
    types = list(metadata.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    if len(set(tokens)) != len(tokens):
        raise GGUFImportError(f"{source}: tokenizer.ggml.tokens repeats a token string; a BPE vocabulary needs each once")
    if kind == "gpt2":
        tokenizer, clean_spaces = _byte_level_bpe(source, metadata, tokens)
    elif kind == "llama":
        tokenizer, clean_spaces = _sentencepiece_bpe(source, metadata, tokens, types)
    else:
        raise GGUFImportError(
            f"{source}: tokenizer.ggml.model is {kind!r}; the importer reads gpt2 (byte-level BPE) and llama (SentencePiece) vocabularies"
        )
    added = [(t, type_) for t, type_ in zip(tokens, types) if type_ in (CONTROL, UNKNOWN, USER_DEFINED)]
    tokenizer.add_tokens([AddedToken(t, special=type_ != USER_DEFINED, normalized=False) for t, type_ in added])

    def token(key):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return None if index is None or not 0 <= int(index) < len(tokens) else tokens[int(index)]

    bos, eos = token("bos"), token("eos")
    prefix = [bos] if bos is not None and metadata.get("tokenizer.ggml.add_bos_token", False) else []
    suffix = [eos] if eos is not None and metadata.get("tokenizer.ggml.add_eos_token", False) else []
    if prefix or suffix:  # e.g. Llama 2 and 3: <s> / <|begin_of_text|> before every text
        single = [*prefix, "$A", *suffix]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join(single),
            pair=" ".join(single + [f"{t}:1" for t in [*prefix, "$B", *suffix]]),
            special_tokens=[(t, tokens.index(t)) for t in dict.fromkeys(prefix + suffix)],
        )
    context = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        unk_token=token("unknown"),
        pad_token=token("padding"),
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=clean_spaces,
        model_max_length=int(context) if context else None,
    )


def _byte_level_bpe(source: Path, metadata: dict, tokens: list) -> tuple:
    """-> (the tokenizer, clean_up_tokenization_spaces): merges as listed, pieces split by tokenizer.ggml.pre's regexes."""
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise GGUFImportError(f"{source}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer the importer does not know; it knows {known}")
    splits, clean_spaces = PRE_TOKENIZERS[pre]
    merges = [tuple(merge.split(" ", 1)) for merge in _key(source, metadata, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=pre in IGNORE_MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, clean_spaces


def _sentencepiece_bpe(source: Path, metadata: dict, tokens: list, types: list) -> tuple:
    """-> (the tokenizer, clean_up_tokenization_spaces) for llama.cpp's SPM vocabularies (Llama 2, Mistral, TinyLlama):
    spaces become ▁, and ▁ starts each text and each text after a special token (add_space_prefix, as llama.cpp does);
    adjacent pieces merge while their concatenation is a token, the highest-scoring one first, so the merges are
    every two-piece split of every token, ranked by that token's score; characters no token covers become <0xXX>."""
    scores = list(_key(source, metadata, "tokenizer.ggml.scores"))
    vocab = {t: i for i, t in enumerate(tokens)}
    splits = [(i, k) for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED) for k in range(1, len(t))]
    merges = sorted((-scores[i], i, k) for i, k in splits if tokens[i][:k] in vocab and tokens[i][k:] in vocab)
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(models.BPE(
        vocab=vocab, merges=[(tokens[i][:k], tokens[i][k:]) for _, i, k in merges],
        unk_token=None if unknown is None else tokens[int(unknown)], fuse_unk=True, byte_fallback=True,
    ))
    space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁")] * space_prefix + [normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()] + [decoders.Strip(" ", 1, 0)] * space_prefix
    )
    return tokenizer, False


def _provenance(source: Path) -> dict:
    stat = source.stat()
    return {"file": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(source)}


def _sha256(source: Path) -> str:
    digest = hashlib.sha256()
    with open(source, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m alignment.gguf", description="GGUF (llama.cpp, Ollama) -> a Hugging Face-layout model folder"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    read = commands.add_parser("import", help="write MODEL.gguf as a model folder the trainer loads")
    read.add_argument("gguf", help="the .gguf file (llama, qwen2 or qwen3 architecture)")
    read.add_argument("out_dir", help="the folder to write (config.json, model.safetensors, tokenizer files)")
    read.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists and is not empty")
    args = parser.parse_args(argv)
    try:
        folder = import_gguf(args.gguf, args.out_dir, overwrite=args.overwrite)
    except GGUFImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
