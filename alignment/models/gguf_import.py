"""GGUF (llama.cpp, Ollama) -> a Hugging Face-layout model folder the trainer, alignment.chat and transformers load
(the command: python -m alignment.gguf import MODEL.gguf OUT_DIR, alignment/gguf.py).

run_grpo.py also takes the .gguf itself as actor_model_name_or_path: import_if_changed imports it into
<output_dir>/imported/<name> and reuses that folder while the file is unchanged.

The folder holds config.json, generation_config.json, model.safetensors (fp32), and the tokenizer
(tokenizer.json, tokenizer_config.json with the chat template) built from the GGUF's own metadata.
Architectures: llama (SmolLM, Llama 2, 3.0, 3.1, 3.2, Mistral 7B, TinyLlama), qwen2 (Qwen2, Qwen2.5) and qwen3.

What is read, and how it differs from the Hugging Face checkpoint the GGUF was converted from:
alignment/models/gguf_model.py (the config and the weights) and alignment/models/gguf_tokenizer.py (the tokenizer).
"""

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from alignment.basics.runtime import configure_cpu_runtime

configure_cpu_runtime()  # before transformers is imported (alignment.models.gguf_tokenizer): it quiets transformers' notice that torch is absent

from safetensors.numpy import save_file  # noqa: E402

from alignment.basics.errors import GGUFImportError  # noqa: E402
from alignment.models.gguf_model import architecture, check_tensors, hf_weights, model_config, open_reader, read_metadata  # noqa: E402
from alignment.models.gguf_tokenizer import build_tokenizer, check_chat_template, check_token_ids, generation_config  # noqa: E402


def import_gguf(source: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """MODEL.gguf -> OUT_DIR (a model folder); written beside OUT_DIR and renamed into place at the end, so an
    interrupted import leaves no half folder. An OUT_DIR that exists and is not empty is refused unless overwrite."""
    source, out_dir = Path(source), Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise GGUFImportError(f"{out_dir}: exists and is not empty; choose another folder or pass --overwrite")
    reader = open_reader(source)
    metadata = read_metadata(source, reader)
    arch = architecture(source, metadata)
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
    reader = open_reader(source)
    metadata = read_metadata(source, reader, lambda name: not name.startswith("tokenizer.ggml.") or name.endswith("_token_id"))
    config = model_config(source, metadata, architecture(source, metadata), reader)
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


def _provenance(source: Path) -> dict:
    stat = source.stat()
    return {"file": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(source)}


def _sha256(source: Path) -> str:
    digest = hashlib.sha256()
    with open(source, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()
