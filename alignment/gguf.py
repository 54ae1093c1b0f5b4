"""GGUF (llama.cpp, Ollama) -> a Hugging Face-layout model folder the trainer, alignment.chat and transformers load:

    python -m alignment.gguf import MODEL.gguf OUT_DIR

The import itself, and what the folder holds, is alignment/models/gguf_import.py."""

import argparse
import sys

from alignment.basics.errors import GGUFImportError
from alignment.models.gguf_import import import_gguf


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
