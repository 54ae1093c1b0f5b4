"""Export a checkpoint, or any model folder, as a Hugging Face model folder or as one GGUF file (llama.cpp, Ollama).

    python -m alignment.export output/tiny/checkpoint-40 exported/tiny-grpo
    python -m alignment.export output/tiny/checkpoint-40 exported/tiny-grpo --overwrite
    python -m alignment.export output/tiny/checkpoint-40 exported/tiny-grpo.gguf --format gguf --outtype q8_0

The result loads with transformers' AutoModelForCausalLM / AutoTokenizer.from_pretrained (and with this
project's loader). Checkpoints already store the model in the layout transformers reads (see
alignment/models/modeling.py: Hugging Face tensor names, torch's (out, in) linear weights), so the export copies
the model and tokenizer files and leaves the training state (optimizer.safetensors, trainer_state.json,
grpo_config.json, ...) behind. The files are copied into a hidden folder beside OUTPUT_DIR that is
renamed into place once complete: an interrupted export leaves no half-written OUTPUT_DIR.

--format gguf writes the model, tokenizer and chat template as one .gguf file (alignment/models/gguf_export.py) in
--outtype f32, f16, bf16 or q8_0; a LoRA checkpoint is first merged into its base model (alignment/merge_lora.py, in
float32, into a hidden folder that is removed afterwards).

A checkpoint whose run had a system_prompt (its grpo_config.json) is exported with that prompt as the chat template's
default system message (alignment/basics/output_folders.py: with_default_system), so that the exported model is prompted as
it was in training without being given the prompt again; a conversation with a system message of its own keeps it.
--no_system_prompt exports the template as it is.
"""

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

# gguf_export first: importing it sets paddle's runtime up before paddle loads, so the command prints no library notices
from alignment.models.gguf_export import OUTTYPES, write_gguf_file  # isort: skip
from alignment.basics.errors import ExportError
from alignment.merge_lora import merge_lora
from alignment.basics.output_folders import (
    TOKENIZER_FILES,
    add_system_prompt_argument,
    bake_system_prompt,
    baked_notice,
    check_output,
    chosen_system_prompt,
    replace_folder,
)

# What transformers reads from a model folder; the rest of a checkpoint (optimizer, trainer state, run config) stays.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json")

def export(source: Path, output: Path, overwrite: bool = False, system_prompt: str | None = None) -> list:
    """Copies source's model and tokenizer files into output, system_prompt (if any) baked into the chat template as
    its default system message -> the names copied."""
    source, output = source.resolve(), output.resolve()  # "." has no name or parent to stage beside
    files = files_to_export(source)
    check_output(source, output, overwrite)
    staging = output.parent / f".{output.name}.tmp-{os.getpid()}"
    staging.mkdir(parents=True)
    try:
        for file in files:
            shutil.copyfile(file, staging / file.name)
        if system_prompt:
            bake_system_prompt(source, staging, system_prompt)
        replace_folder(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
    return sorted(file.name for file in files)


def export_gguf(source: Path, output: Path, outtype: str = "f32", overwrite: bool = False, system_prompt: str | None = None) -> dict:
    """source (checkpoint, LoRA checkpoint or model folder) -> output (a .gguf file), system_prompt (if any) baked into
    the chat template as its default system message -> write_gguf_file's summary."""
    source, output = source.resolve(), output.resolve()
    if output.is_dir():
        raise ExportError(f"{output}: is a folder; --format gguf writes one file (e.g. {output / 'model.gguf'})")
    if output.exists() and not overwrite:
        raise ExportError(f"{output}: exists (pass --overwrite to replace it)")
    output.parent.mkdir(parents=True, exist_ok=True)
    if not ((source / "adapter_config.json").is_file() and not (source / "config.json").is_file()):
        files_to_export(source)  # the same refusals as the folder export: no config.json, no weights, no tokenizer
        return write_gguf_file(source, output, outtype, system_prompt)
    with tempfile.TemporaryDirectory(prefix=f".{output.name}.merged-", dir=output.parent) as merged:
        merge_lora(source, Path(merged) / "model", dtype="float32")
        return write_gguf_file(Path(merged) / "model", output, outtype, system_prompt)


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


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignment.export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", type=Path, help="a checkpoint folder (output_dir/checkpoint-N) or any Hugging Face-layout model folder"
    )
    parser.add_argument(
        "output", type=Path, help="the folder to write (must not exist or be empty, unless --overwrite); with --format gguf, the .gguf file"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists and is not empty")
    parser.add_argument(
        "--format",
        choices=("hf", "gguf"),
        default="hf",
        help="hf: a Hugging Face model folder (default); gguf: one file for llama.cpp / Ollama",
    )
    parser.add_argument(
        "--outtype", choices=tuple(OUTTYPES), default="f32", help="--format gguf: the type of the linear weights (default f32)"
    )
    add_system_prompt_argument(parser)
    args = parser.parse_args(argv)
    try:
        system_prompt = chosen_system_prompt(args)
        if args.format == "gguf":
            summary = export_gguf(args.checkpoint, args.output, args.outtype, args.overwrite, system_prompt)
            print(f"{args.output}: {summary['arch']}, {summary['outtype']}, tokenizer.ggml.pre {summary['pre']}")
        else:
            print(f"{args.output}: {', '.join(export(args.checkpoint, args.output, args.overwrite, system_prompt))}")
    except (ExportError, ValueError, OSError) as error:  # GGUFExportError, and ModelLoadError from merging, are ValueErrors
        print(f"export: error: {error}", file=sys.stderr)
        return 2
    if system_prompt:
        print(baked_notice(args.output, system_prompt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
