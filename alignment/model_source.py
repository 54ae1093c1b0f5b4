"""A model as python -m alignment.chat and python -m alignment.evaluate are given one: a run's checkpoint folder (its
grpo_config.json holds the run's settings), a Hugging Face-layout folder, a LoRA checkpoint (its adapter merged into
the run's base model), or a .gguf file (imported once into a cache folder and reused while the file is unchanged,
as the trainer does with <output_dir>/imported)."""

import time
from pathlib import Path
from typing import Optional

from alignment.errors import ConfigError, GGUFImportError, ModelLoadError
from alignment.gguf import import_if_changed
from alignment.merge_lora import base_model_of
from alignment.models.lora import ADAPTER_CONFIG, merge_adapter
from alignment.models.modeling import load_causal_lm
from alignment.run.checks import names_gguf
from alignment.run.config import KEYS, read_json_config
from alignment.run.output_folders import run_settings


def is_lora(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file()


def model_folder(path: str, gguf_cache: Optional[Path] = None) -> Path:
    """-> the folder to load: path itself, or with a gguf_cache, a .gguf's import in gguf_cache/<file name without
    .gguf>. ModelLoadError names a path that is neither a model folder nor a LoRA checkpoint."""
    if gguf_cache is not None and names_gguf(path):
        folder = gguf_cache / Path(path).stem
        started = time.perf_counter()
        try:
            fresh = import_if_changed(path, folder)
        except (GGUFImportError, OSError) as e:  # OSError: a full disk while writing the folder
            raise ModelLoadError(str(e)) from None
        print(f"imported {path} into {folder} in {time.perf_counter() - started:.1f} s" if fresh else
              f"{path} is unchanged since its import: loading {folder}", flush=True)
        return folder
    folder = Path(path)
    if not (folder / "config.json").is_file() and not is_lora(folder):
        what = "no such folder" if not folder.exists() else "no config.json there"
        raise ModelLoadError(f"{folder} is not a model folder ({what}) nor a LoRA checkpoint")
    return folder


def saved_settings(folder: Path, config_file: Optional[str] = None) -> tuple:
    """-> (the settings of the run behind folder, where they come from): its grpo_config.json (a run's checkpoint), else
    config_file's (a grpo_argument.json), else none (the trainer's defaults). Keys this version does not know (a run
    of another version) are left out."""
    trained = run_settings(folder)
    if trained:
        return {key: value for key, value in trained.items() if key in KEYS}, str(folder / "grpo_config.json")
    if config_file:
        try:
            return read_json_config(config_file), config_file
        except ConfigError as e:
            raise ConfigError(f"--config: {e}") from None
    return {}, "the trainer's defaults (no grpo_config.json in the folder)"


def load_model(folder: Path):
    """The model in evaluation mode; a LoRA checkpoint's adapter merged into its run's base model
    (actor_model_name_or_path, or adapter_config.json's base_model_name_or_path)."""
    model = load_causal_lm(base_model_of(folder) if is_lora(folder) else str(folder))
    if is_lora(folder):
        merge_adapter(model, folder)
    model.eval()
    return model
