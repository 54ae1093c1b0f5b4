"""What the export commands share (python -m alignment.export, python -m alignment.merge_lora): the tokenizer
files a model folder carries, and writing an output folder whole, refusing to overwrite what was not asked for."""

import os
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "chat_template.*", "vocab.*", "merges.txt")


class ExportError(Exception):
    pass


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
