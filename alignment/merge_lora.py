"""Merge a LoRA checkpoint's adapter into its base model and write the result as a Hugging Face model folder.

    python -m alignment.merge_lora output/tiny-lora/checkpoint-40 exported/tiny-grpo
    python -m alignment.merge_lora CKPT OUT --base Qwen/Qwen2.5-0.5B-Instruct --dtype bfloat16 --overwrite

The base model is --base, else the actor_model_name_or_path of the checkpoint's grpo_config.json (the model
the run trained the adapter on), else adapter_config.json's base_model_name_or_path. Each adapted weight
becomes W + A @ B * (lora_alpha / r), computed in float32 and stored in --dtype (default: the dtype the run
trained in, bf16 / fp16 / float32). The folder holds what `python -m alignment.export` writes for a full
fine-tuning checkpoint (config.json, model.safetensors, generation_config.json when the base has one, the
tokenizer of the checkpoint, else of the base) and loads with transformers' AutoModelForCausalLM. It is
written into a hidden folder beside OUTPUT_DIR and renamed into place once complete. As with the export, the run's
system_prompt becomes the chat template's default system message unless --no_system_prompt is given.
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

from alignment.basics.runtime import configure_cpu_runtime, import_paddle

configure_cpu_runtime()  # before paddle and paddleformers load: the command prints none of their import notices
import_paddle()

from alignment.basics.errors import ExportError  # noqa: E402
from alignment.models.lora import ADAPTER_CONFIG, merge_adapter  # noqa: E402
from alignment.models.modeling import load_causal_lm, save_model  # noqa: E402
from alignment.run.model_source import base_model_of  # noqa: E402
from alignment.basics.output_folders import (  # noqa: E402
    TOKENIZER_FILES,
    add_system_prompt_argument,
    bake_system_prompt,
    baked_notice,
    check_output,
    chosen_system_prompt,
    replace_folder,
    run_settings,
)


def run_dtype(checkpoint: Path) -> str:
    settings = run_settings(checkpoint)
    return "bfloat16" if settings.get("bf16") else "float16" if settings.get("fp16") else "float32"


def merge_lora(checkpoint: Path, output: Path, base: str | None = None, dtype: str | None = None, overwrite: bool = False,
               system_prompt: str | None = None) -> list:
    """Writes base + checkpoint's adapter to output, system_prompt (if any) baked into the chat template as its default
    system message -> the names of the merged layers."""
    checkpoint, output = checkpoint.resolve(), output.resolve()
    if not (checkpoint / ADAPTER_CONFIG).is_file():
        raise ExportError(f"{checkpoint}: no {ADAPTER_CONFIG}, so not a LoRA checkpoint (python -m alignment.export copies a full one)")
    check_output(checkpoint, output, overwrite)
    base = base or base_model_of(checkpoint)
    model = load_causal_lm(base, dtype or run_dtype(checkpoint))
    merged = merge_adapter(model, checkpoint)
    tokenizer_source = checkpoint if any(checkpoint.glob("tokenizer*")) else Path(base)
    staging = output.parent / f".{output.name}.tmp-{os.getpid()}"
    staging.mkdir(parents=True)
    try:
        save_model(model, str(staging))
        for file in {f for pattern in TOKENIZER_FILES for f in tokenizer_source.glob(pattern) if f.is_file()}:
            shutil.copyfile(file, staging / file.name)
        if system_prompt:
            bake_system_prompt(tokenizer_source, staging, system_prompt)
        replace_folder(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
    return merged


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignment.merge_lora", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a LoRA checkpoint (output_dir/checkpoint-N) or any peft adapter folder")
    parser.add_argument("output", type=Path, help="the folder to write (must not exist or be empty, unless --overwrite)")
    parser.add_argument("--base", help="the base model folder (default: actor_model_name_or_path of the checkpoint's grpo_config.json)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="dtype of the merged weights (default: the run's)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists and is not empty")
    add_system_prompt_argument(parser)
    args = parser.parse_args(argv)
    try:
        system_prompt = chosen_system_prompt(args)
        merged = merge_lora(args.checkpoint, args.output, args.base, args.dtype, args.overwrite, system_prompt)
    except (ExportError, ValueError, OSError) as error:
        print(f"merge_lora: error: {error}", file=sys.stderr)
        return 2
    print(f"{args.output}: merged the adapters of {len(merged)} layers")
    if system_prompt:
        print(baked_notice(args.output, system_prompt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
