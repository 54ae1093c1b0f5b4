"""What the export commands share (python -m alignment.export, python -m alignment.merge_lora): the tokenizer
files a model folder carries, writing an output folder whole, refusing to overwrite what was not asked for, and the
run's system prompt baked into the exported chat template as its default system message."""

import argparse
import json
import os
import shutil
from pathlib import Path

from alignment.basics.errors import ExportError

TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "chat_template.*", "vocab.*", "merges.txt")


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


def run_settings(checkpoint: Path) -> dict:
    """The settings of the run that wrote checkpoint (its grpo_config.json), or {} where it has none."""
    run_config = checkpoint / "grpo_config.json"
    if not run_config.is_file():
        return {}
    try:
        settings = json.loads(run_config.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ExportError(f"{run_config}: not a JSON object ({error})") from None
    if not isinstance(settings, dict):
        raise ExportError(f"{run_config}: not a JSON object (a {type(settings).__name__})")
    return settings


def run_system_prompt(checkpoint: Path) -> str | None:
    """The system prompt of the run that wrote checkpoint: its grpo_config.json's system_prompt, which holds the text
    (config validation reads a file's name into its text), or None (no run config, or a run without one)."""
    run_config = checkpoint / "grpo_config.json"
    prompt = run_settings(checkpoint).get("system_prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ExportError(f"{run_config}: system_prompt is {json.dumps(prompt)[:60]}, not text")
    return prompt or None


def add_system_prompt_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no_system_prompt",
        action="store_true",
        help="leave the chat template as it is instead of making the run's system_prompt its default system message",
    )


def chosen_system_prompt(args: argparse.Namespace) -> str | None:
    """The system prompt an export command bakes in: none with --no_system_prompt, else the run's (run_system_prompt
    of args.checkpoint)."""
    return None if args.no_system_prompt else run_system_prompt(args.checkpoint)


def with_default_system(template: str, system_prompt: str) -> str:
    """A Jinja chat template -> one that first puts {'role': 'system', 'content': system_prompt} before the messages
    when they do not start with a system message, as the trainer's data.with_system_prompt did: the template renders
    the list the trainer gave it, so one that inserts a default system message of its own (SmolLM2's, Qwen's) does
    not. The prompt is a JSON string literal, which Jinja reads back as the same text whatever it holds (quotes,
    backslashes, newlines, {{ or {%); ensure_ascii is off because Jinja decodes a \\uXXXX escape alone, so the two
    halves of a character outside the BMP would come back as two broken ones."""
    literal = json.dumps(system_prompt, ensure_ascii=False)
    prefix = (
        "{%- if not messages or messages[0]['role'] != 'system' %}"
        "{%- set messages = [{'role': 'system', 'content': " + literal + "}] + messages %}"
        "{%- endif %}"
    )
    # Chat templates render with trim_blocks and lstrip_blocks, which act on a template's leading whitespace: for one
    # that starts with some, a newline after the prefix (trimmed) puts the template at a line's start, as in its file.
    return prefix + ("\n" if template[:1].isspace() else "") + template


def baked_templates(templates, system_prompt: str):
    """Chat templates as tokenizers hold them (text; {name: text}; tokenizer_config.json's [{"name", "template"}])
    -> the same with with_default_system applied to each."""
    if isinstance(templates, str):
        return with_default_system(templates, system_prompt)
    if isinstance(templates, dict):
        return {name: with_default_system(template, system_prompt) for name, template in templates.items()}
    return [{**entry, "template": with_default_system(entry["template"], system_prompt)} for entry in templates]


def bake_system_prompt(source: Path, folder: Path, system_prompt: str) -> None:
    """Writes source's chat templates into folder (where its tokenizer files are being copied), system_prompt their
    default system message, in the files transformers reads them from: chat_template.jinja (which wins) and
    tokenizer_config.json's chat_template."""
    settings_file = source / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text(encoding="utf-8")) if settings_file.is_file() else {}
    if not (source / "chat_template.jinja").is_file() and not settings.get("chat_template"):
        raise ExportError(
            f"{source}: no chat template (chat_template.jinja, tokenizer_config.json) to hold the run's system prompt; "
            "pass --no_system_prompt"
        )
    if (source / "chat_template.jinja").is_file():
        template = (source / "chat_template.jinja").read_text(encoding="utf-8")
        (folder / "chat_template.jinja").write_text(with_default_system(template, system_prompt), encoding="utf-8")
    if settings.get("chat_template"):
        settings["chat_template"] = baked_templates(settings["chat_template"], system_prompt)
        (folder / settings_file.name).write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def baked_notice(output: Path, system_prompt: str) -> str:
    """The line the export commands print when they baked a system prompt in."""
    shown = json.dumps(system_prompt if len(system_prompt) <= 60 else system_prompt[:57] + "...", ensure_ascii=False)
    return (
        f"{output}: the run's system prompt ({shown}, {len(system_prompt)} characters) is the chat template's default "
        "system message, used where a conversation brings none (--no_system_prompt leaves the template as it was)"
    )
