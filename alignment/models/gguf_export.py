"""A model folder (a checkpoint, an export, a GGUF import) -> one GGUF file that llama.cpp and Ollama load, the reverse
of alignment/models/gguf_import.py and what llama.cpp's convert_hf_to_gguf.py writes for the same model:

- the hyperparameters as {arch}.* keys (attention.key_length always with attention.value_length: llama.cpp reads
  a key length without a value length as a model it cannot build);
- linear weights in the chosen type (F32, F16, BF16 or Q8_0; BF16 and Q8_0 through the `gguf` package's numpy
  quantizer, which rounds as ggml does), norms and biases in F32; a tied model has no `output` tensor; for the llama
  architecture the rows of q and k interleaved per head (llama.cpp rotates adjacent pairs, transformers rotates halves);
- Llama 3.1+'s rotary scaling (rope_scaling with rope_type llama3) as the rope_freqs.weight tensor (F32, head_dim/2
  divisors of the inverse frequencies), and its original context as {arch}.rope.scaling.original_context_length (which
  llama.cpp uses for YaRN only), so that the import reads the parameters back;
- the tokenizer as metadata: byte-level BPE tokens (padded with [PADn] to the embedding's rows, as the converter
  does), merges, token types (special added tokens CONTROL, others USER_DEFINED), bos / eos / pad (and an
  end-of-turn id where generation_config.json lists a second stop token), add_bos_token, the chat template, and
  tokenizer.ggml.pre: the llama.cpp pre-tokenizer that tokenizes like the folder's tokenizer, found by tokenizing
  probe texts both ways (as llama.cpp's converter identifies one by the hash of a probe's token ids).
"""

import json
import logging
import sys
from pathlib import Path

from alignment.basics.runtime import configure_cpu_runtime, import_paddle

configure_cpu_runtime()  # before paddle and transformers are imported: their notices that say nothing here are quieted
import_paddle()

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import quantize  # noqa: E402
from safetensors.paddle import load_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from alignment.basics.errors import GGUFExportError  # noqa: E402
from alignment.models.gguf_model import ARCHITECTURES, BLOCK_NAMES, TOP_LEVEL_NAMES, llama3_rope_factors  # noqa: E402
from alignment.models.gguf_tokenizer import CONTROL, IGNORE_MERGES, NORMAL, PRE_TOKENIZERS, UNUSED, USER_DEFINED, build_tokenizer  # noqa: E402
from alignment.basics.output_folders import baked_templates  # noqa: E402

logging.getLogger("gguf").setLevel(logging.WARNING)  # the writer logs each file it writes at INFO


# --outtype -> (the type of linear weights, general.file_type)
OUTTYPES = {
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}

GGUF_TOP_LEVEL = {hf: name for name, hf in TOP_LEVEL_NAMES.items()}
GGUF_BLOCK = {hf: name for name, hf in BLOCK_NAMES.items()}
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# Texts on which llama.cpp's pre-tokenizers differ: digit runs, contractions in both cases, whitespace runs and line
# ends, punctuation runs, unicode letters and numbers, chat markup, code.
PROBES = [
    "Hello world! 123 4567 89012 3.14159 1,000,000 -42 +7 0.5% 2^10=1024",
    "I'm sure we'LL see: don't, can't, he's, THEY'RE, I'D, you've",
    "  multiple   spaces\n\n\ttabs \n x\r\ny  \n  z\n\n\n   trailing   ",
    "Café déjà vu — naïve façade, 日本語 and 🙂 Привет мир ١٢٣ ４５６ ½ ² a\u00a0b\u2003c",
    "<|im_start|>user\nWhat is 12+34?<|im_end|>\n<|im_start|>assistant\n<answer>46</answer>",
    "def f(x):\n    return x ** 2  # square $$ <=> ^^ ~~ || ``` ...!!! ??",
]


def write_gguf_file(folder: Path, path: Path, outtype: str = "f32", system_prompt: str | None = None) -> dict:
    """folder (Hugging Face layout: config.json, safetensors, tokenizer files) -> path (.gguf), written beside it under
    a hidden name and renamed into place, so an interrupted export leaves no half file; system_prompt, given, is the
    chat template's default system message (alignment/basics/output_folders.py). -> a summary (arch, pre, ...)."""
    folder, path = Path(folder), Path(path)
    config = read_config(folder)
    weights = read_weights(folder)
    staging = path.parent / f".{path.name}.tmp"
    writer = gguf.GGUFWriter(str(staging), config["model_type"])
    try:
        writer.add_name(folder.resolve().name)
        add_hyperparameters(writer, config)
        writer.add_file_type(int(OUTTYPES[outtype][1]))
        pre = add_tokenizer(writer, folder, config, system_prompt=system_prompt)
        add_tensors(writer, config, weights, OUTTYPES[outtype][0])
        finish(writer)
        staging.replace(path)
    finally:
        staging.unlink(missing_ok=True)
    return {"arch": config["model_type"], "pre": pre, "tensors": len(weights), "outtype": outtype}


def read_config(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") not in ARCHITECTURES:
        raise GGUFExportError(
            f"{folder / 'config.json'}: model_type is {config.get('model_type')!r}; the GGUF export writes {', '.join(ARCHITECTURES)}"
        )
    scaling = rope_scaling_of(config)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default") and not (kind == "llama3" and config["model_type"] == "llama"):
        raise GGUFExportError(
            f"{folder / 'config.json'}: rope_scaling {scaling} (scaled rotary positions): "
            "not supported; the export writes llama3 scaling of llama models"
        )
    missing = [key for key in LLAMA3_KEYS if key not in scaling] if kind == "llama3" else []
    if missing:
        raise GGUFExportError(f"{folder / 'config.json'}: rope_scaling {scaling} (llama3) lacks {', '.join(missing)}")
    return config


def rope_scaling_of(config: dict) -> dict:
    """config.json's rope_scaling, else transformers 5's rope_parameters, else {}."""
    return config.get("rope_scaling") or config.get("rope_parameters") or {}


def llama3_scaling(config: dict) -> dict | None:
    scaling = rope_scaling_of(config)
    return scaling if scaling.get("rope_type", scaling.get("type")) == "llama3" else None


def rope_theta(config: dict) -> float:
    return float(config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def read_weights(folder: Path) -> dict:
    """-> {Hugging Face name: fp32 array, torch's layout}; bf16 / fp16 files widened (safetensors' paddle reader knows bf16)."""
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    weights = {}
    for file in files:
        weights.update({name: tensor.astype("float32").numpy() for name, tensor in load_file(str(folder / file)).items()})
    return weights


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def add_hyperparameters(writer, config: dict) -> None:
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads") or config["num_attention_heads"])
    writer.add_key_length(head_dim(config))
    writer.add_value_length(head_dim(config))
    writer.add_rope_dimension_count(head_dim(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(rope_theta(config))
    if scaling := llama3_scaling(config):
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
    writer.add_vocab_size(config["vocab_size"])


def gguf_name(name: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight."""
    stem, kind = name.rsplit(".", 1)
    if stem.startswith("model.layers."):
        layer, rest = stem[len("model.layers.") :].split(".", 1)
        return f"blk.{layer}.{GGUF_BLOCK[rest]}.{kind}"
    return f"{GGUF_TOP_LEVEL[stem]}.{kind}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows (r0 .. r{d/2-1} | r{d/2} .. r{d-1}) interleaved to
    (r0, r{d/2}, r1, r{d/2+1}, ...); (n_head*d, ...) -> the same shape. alignment.models.gguf_model.unpermute_rows undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encoded(weight: np.ndarray, qtype: Q) -> tuple:
    """fp32 weight -> (what the file holds, its type): matrices in qtype, vectors (norms, biases) in F32 as llama.cpp's
    converter keeps them; a matrix whose rows do not split into qtype's blocks in F16 (F32 if qtype is F32)."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    kind = qtype if weight.ndim == 2 and weight.shape[-1] % block == 0 else Q.F16 if weight.ndim == 2 and qtype != Q.F32 else Q.F32
    if kind == Q.F32:
        return weight.astype(np.float32), kind
    if kind == Q.F16:
        return weight.astype(np.float16), kind
    return quantize(weight, kind), kind


def add_tensors(writer, config: dict, weights: dict, qtype: Q) -> None:
    """weights ({Hugging Face name: fp32 array}) -> the writer's tensors; a tied model's lm_head.weight is left out; llama3
    rotary scaling as rope_freqs.weight."""
    arch = config["model_type"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    if scaling := llama3_scaling(config):
        factors = llama3_rope_factors(rope_theta(config), head_dim(config), scaling)  # (head_dim/2,)
        writer.add_tensor("rope_freqs.weight", factors, raw_dtype=Q.F32)
    for name, weight in weights.items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        if ARCHITECTURES[arch][2] and ".q_proj." in name:
            weight = permute(weight, heads)
        elif ARCHITECTURES[arch][2] and ".k_proj." in name:
            weight = permute(weight, kv_heads)
        data, kind = encoded(weight, qtype)
        writer.add_tensor(gguf_name(name), data, raw_dtype=kind)


def finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_tokenizer(writer, folder: Path, config: dict, pre: str | None = None, system_prompt: str | None = None) -> str:
    """The folder's byte-level BPE tokenizer as tokenizer.ggml.* metadata, system_prompt (if any) baked into its chat
    template; pre (the pre-tokenizer's name) found by probing unless given. -> the pre-tokenizer written."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if system_prompt and not tokenizer.chat_template:
        raise GGUFExportError(f"{folder}: the tokenizer has no chat template to hold the run's system prompt; pass --no_system_prompt")
    if system_prompt:
        tokenizer.chat_template = baked_templates(tokenizer.chat_template, system_prompt)
    metadata = tokenizer_metadata(folder, config, tokenizer)
    pre = pre or pre_tokenizer_of(folder, metadata, tokenizer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_token_merges(metadata["tokenizer.ggml.merges"])
    for key in ("bos", "eos", "eot", "padding"):
        if f"tokenizer.ggml.{key}_token_id" in metadata:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", metadata[f"tokenizer.ggml.{key}_token_id"])
    writer.add_add_bos_token(metadata["tokenizer.ggml.add_bos_token"])
    writer.add_add_eos_token(metadata["tokenizer.ggml.add_eos_token"])
    if metadata.get("tokenizer.chat_template"):
        writer.add_chat_template(metadata["tokenizer.chat_template"])
    return pre


def tokenizer_metadata(folder: Path, config: dict, tokenizer) -> dict:
    """tokenizer.json + tokenizer_config.json (+ config.json, generation_config.json for ids they leave out) -> the
    tokenizer.ggml.* values, as alignment.models.gguf_tokenizer.build_tokenizer reads them (all but tokenizer.ggml.pre)."""
    if not (folder / "tokenizer.json").is_file():
        raise GGUFExportError(f"{folder}: no tokenizer.json; the GGUF export writes the tokenizer from it")
    spec = json.loads((folder / "tokenizer.json").read_text())
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise GGUFExportError(
            f"{folder / 'tokenizer.json'}: not a byte-level BPE vocabulary (a SentencePiece-style one, as Llama 2's?); "
            "the GGUF export writes byte-level BPE (GPT-2, Qwen, Llama 3, SmolLM) tokenizers"
        )
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    vocab = {**{i: t for t, i in model["vocab"].items()}, **{i: t["content"] for i, t in added.items()}}
    rows = config["vocab_size"]
    if max(vocab) >= rows:
        raise GGUFExportError(f"{folder}: the tokenizer has token id {max(vocab)} but config.json's vocab_size is {rows}")
    tokens = [vocab.get(i, f"[PAD{i}]") for i in range(rows)]  # the embedding's spare rows, as convert_hf_to_gguf.py names them
    types = [
        UNUSED if i not in vocab else (CONTROL if added[i]["special"] else USER_DEFINED) if i in added else NORMAL
        for i in range(rows)
    ]
    metadata = {
        "general.architecture": config["model_type"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [" ".join(m) if isinstance(m, list) else m for m in model["merges"]],
        "tokenizer.chat_template": tokenizer.chat_template,
        f"{config['model_type']}.context_length": config["max_position_embeddings"],
    }
    generation = json.loads((folder / "generation_config.json").read_text()) if (folder / "generation_config.json").is_file() else {}
    ids = {
        "bos": tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.get("bos_token_id"),
        "eos": tokenizer.eos_token_id if tokenizer.eos_token_id is not None else _first(config.get("eos_token_id")),
        "padding": tokenizer.pad_token_id,
    }
    stops = [i for i in _listed(generation.get("eos_token_id")) + _listed(config.get("eos_token_id")) if i != ids["eos"]]
    ids["eot"] = stops[0] if stops else None  # Qwen2.5-Instruct: eos <|im_end|>, and <|endoftext|> ends a text too
    metadata.update({f"tokenizer.ggml.{key}_token_id": int(i) for key, i in ids.items() if i is not None})
    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    plain, framed = backend.encode("a", add_special_tokens=False).ids, backend.encode("a").ids
    start = framed.index(plain[0]) if plain[0] in framed else 0
    metadata["tokenizer.ggml.add_bos_token"] = start > 0 and framed[0] == ids["bos"]
    metadata["tokenizer.ggml.add_eos_token"] = len(framed) > start + len(plain) and framed[-1] == ids["eos"]
    return metadata


def _listed(ids) -> list:
    return [] if ids is None else list(ids) if isinstance(ids, (list, tuple)) else [ids]


def _first(ids):
    return (_listed(ids) or [None])[0]


def pre_tokenizer_of(folder: Path, metadata: dict, original) -> str:
    """The llama.cpp pre-tokenizer under which the GGUF tokenizes PROBES to the ids the folder's tokenizer gives (the
    candidate built as the import builds it: gguf_tokenizer.build_tokenizer). Where none gives them all, the one that gives the
    most, with a warning naming the first probe that differs."""
    expected = [original(text, add_special_tokens=False)["input_ids"] for text in PROBES]
    clean = bool(original.clean_up_tokenization_spaces)
    # a tie goes to the one that cleans as the folder does
    candidates = sorted(PRE_TOKENIZERS, key=lambda name: PRE_TOKENIZERS[name][1] != clean)
    best, best_score, seen = None, -1, set()
    for name in candidates:
        behaviour = (tuple(PRE_TOKENIZERS[name][0]), name in IGNORE_MERGES)  # names that tokenize alike are tried once
        if behaviour in seen:
            continue
        seen.add(behaviour)
        candidate = build_tokenizer(folder, {**metadata, "tokenizer.ggml.pre": name})
        got = [candidate(text, add_special_tokens=False)["input_ids"] for text in PROBES]
        score = sum(g == e for g, e in zip(got, expected))
        if score > best_score:
            best, best_score, differs = name, score, next((t for t, g, e in zip(PROBES, got, expected) if g != e), None)
        if score == len(PROBES):
            return name
    print(
        f"warning: {folder}: no llama.cpp pre-tokenizer tokenizes as its tokenizer does; wrote {best!r}, the closest "
        f"({best_score} of {len(PROBES)} probe texts alike; differs on {differs!r})",
        file=sys.stderr,
    )
    return best
