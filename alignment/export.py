"""Export a checkpoint, or any model folder, as a Hugging Face model folder: the model and its tokenizer.

    python -m alignment.export output/tiny/checkpoint-40 exported/tiny-grpo
    python -m alignment.export output/tiny/checkpoint-40 exported/tiny-grpo --overwrite

The result loads with transformers' AutoModelForCausalLM / AutoTokenizer.from_pretrained (and with this
project's loader). Checkpoints already store the model in the layout transformers reads (see
alignment/modeling.py: Hugging Face tensor names, torch's (out, in) linear weights), so the export copies
the model and tokenizer files and leaves the training state (optimizer.pdopt, trainer_state.json,
grpo_config.json, ...) behind. The files are copied into a hidden folder beside OUTPUT_DIR that is
renamed into place once complete: an interrupted export leaves no half-written OUTPUT_DIR.
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

# What transformers reads from a model folder; the rest of a checkpoint (optimizer, trainer state, run config) stays.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "chat_template.*", "vocab.*", "merges.txt")


class ExportError(Exception):
    pass


def export(source: Path, output: Path, overwrite: bool = False) -> list:
    """Copies source's model and tokenizer files into output -> the names copied."""
    source, output = source.resolve(), output.resolve()  # "." has no name or parent to stage beside
    files = files_to_export(source)
    check_output(source, output, overwrite)
    staging = output.parent / f".{output.name}.tmp-{os.getpid()}"
    staging.mkdir(parents=True)
    try:
        for file in files:
            shutil.copyfile(file, staging / file.name)
        replace_folder(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
    return sorted(file.name for file in files)


def files_to_export(source: Path) -> list:
    if not source.is_dir():
        raise ExportError(f"{source}: no such folder")
    if (source / "adapter_config.json").is_file() and not (source / "config.json").is_file():
        raise ExportError(
            f"{source}: a LoRA checkpoint, which holds the adapter and not the model; merge it into its base model "
            f"with: python -m alignment.merge_lora {source} OUTPUT"
        )
    if not (source / "config.json").is_file():
        raise ExportError(f"{source}: no config.json, so not a checkpoint or model folder")
    files = {file for pattern in MODEL_FILES + TOKENIZER_FILES for file in source.glob(pattern) if file.is_file()}
    names = {file.name for file in files}
    if "model.safetensors" not in names and "model.safetensors.index.json" not in names:
        raise ExportError(f"{source}: no model.safetensors (nor a sharded model.safetensors.index.json)")
    if "tokenizer_config.json" not in names and "tokenizer.json" not in names:
        raise ExportError(f"{source}: no tokenizer files (tokenizer_config.json, tokenizer.json)")
    return sorted(files)


def check_output(source: Path, output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise ExportError(f"{output}: exists and is not a folder")
    if output == source or output in source.parents:
        raise ExportError(f"{output}: is or contains the folder being exported")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ExportError(f"{output}: exists and is not empty (pass --overwrite to replace it)")


def replace_folder(staging: Path, output: Path) -> None:
    """Renames staging to output; an existing output is moved aside first and removed once replaced."""
    if not output.exists():
        os.replace(staging, output)
        return
    old = output.parent / f".{output.name}.old-{os.getpid()}"
    os.replace(output, old)
    os.replace(staging, output)
    shutil.rmtree(old)


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignment.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint folder (output_dir/checkpoint-N) or any Hugging Face-layout model folder")
    parser.add_argument("output", type=Path, help="the folder to write (must not exist or be empty, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists and is not empty")
    args = parser.parse_args(argv)
    try:
        copied = export(args.checkpoint, args.output, args.overwrite)
    except (ExportError, OSError) as error:
        print(f"export: error: {error}", file=sys.stderr)
        return 2
    print(f"{args.output}: {', '.join(copied)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
