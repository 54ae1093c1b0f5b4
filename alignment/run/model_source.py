"""A model as python -m alignment.chat and python -m alignment.evaluate are given one: a run's checkpoint folder (its
grpo_config.json holds the run's settings), a Hugging Face-layout folder, a LoRA checkpoint (its adapter merged into
the run's base model), or a .gguf file (imported once into a cache folder and reused while the file is unchanged,
as the trainer does with <output_dir>/imported).

A model folder is data, not settings to trust (docs/security.md): one downloaded from someone else may hold any
grpo_config.json. Its settings never import code, name a server, or loosen the tools' isolation or limits: those keys
come only from the user's own --config file (or a flag), and a folder that sets them is used with the rest of its
settings and one line naming what was ignored."""

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional

from alignment.basics.errors import ConfigError, ExportError, GGUFImportError, ModelLoadError
from alignment.models.gguf_import import import_if_changed
from alignment.models.lora import ADAPTER_CONFIG, merge_adapter
from alignment.models.modeling import load_causal_lm
from alignment.config.checks import names_gguf
from alignment.config.schema import KEYS, GRPOConfig
from alignment.config.files import read_json_config
from alignment.basics.output_folders import run_settings
from alignment.basics.plugins import load_plugins

# Keys a model folder's grpo_config.json may not set: they import code (external_plugins; reward_model_name_or_path, a
# folder the writer names, whose weights paddleformers reads as pickle where it holds no safetensors), send the
# evaluation's data and the user's key elsewhere (the reward server's), turn the tools' sandbox off, or matter only to a
# training run and reach the network or trust pickle there (report_to, trust_pickled_checkpoint).
USERS_ONLY = (
    "external_plugins", "reward_model_name_or_path", "use_rm_server", "reward_server", "reward_server_protocol",
    "reward_server_timeout", "reward_server_retries", "reward_server_api_key", "tool_isolation", "report_to",
    "trust_pickled_checkpoint",
)
# Limits a model folder may tighten, never loosen: its value is kept where it is at most the default
LIMITS = (
    "tool_timeout", "tool_memory_mb", "tool_output_bytes", "tool_disk_mb", "tool_processes", "tool_workers", "max_tool_calls_per_turn",
    "reward_item_timeout",
)
SECRET_PLACEHOLDERS = ("set", "unset")  # what grpo_config.json holds for a secret (GRPOConfig.to_json)


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


def base_model_of(checkpoint: Path) -> str:
    """The model a LoRA checkpoint's adapter was trained on (python -m alignment.merge_lora's default --base)."""
    if base := run_settings(checkpoint).get("actor_model_name_or_path"):
        # a .gguf base: the folder the run imported it into, beside its checkpoints (alignment/run/start.py)
        return str(checkpoint.parent / "imported" / Path(base).stem) if names_gguf(base) else base
    adapter_base = json.loads((checkpoint / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if adapter_base:
        return adapter_base
    raise ExportError(f"{checkpoint}: neither grpo_config.json nor {ADAPTER_CONFIG} names the base model; pass --base")


def saved_settings(folder: Path, config_file: Optional[str] = None) -> tuple:
    """-> (the settings of the run behind folder, where they come from): its grpo_config.json (a run's checkpoint)
    without what a model folder may not set, with config_file's values of those keys; else config_file's (a
    grpo_argument.json); else none (the trainer's defaults). Keys this version does not know (a run of another
    version) are left out."""
    try:
        users = read_json_config(config_file) if config_file else {}
    except ConfigError as e:
        raise ConfigError(f"--config: {e}") from None
    trained = run_settings(folder)
    if not trained:
        return users, config_file or "the trainer's defaults (no grpo_config.json in the folder)"
    source = str(folder / "grpo_config.json")
    settings, ignored = harmless_settings({key: value for key, value in trained.items() if key in KEYS})
    settings |= {key: value for key, value in users.items() if key in USERS_ONLY + LIMITS}
    ignored = [f"{key} = {json.dumps(value)[:80]}" for key, value in ignored.items() if key not in users] + unregistered_names(settings)
    if ignored:
        print(f"{source}: ignored {'; '.join(ignored)}: a model folder's settings may not import code, name a server, or loosen "
              "the tools' isolation or limits; to use them, put them in your own grpo_argument.json and pass it with --config",
              file=sys.stderr, flush=True)
    return settings, source


def harmless_settings(settings: dict) -> tuple:
    """A model folder's settings -> (those without USERS_ONLY keys, LIMITS above their defaults, and a system prompt or
    chat template that names a file rather than holding its text; {key: value} of those left out that mattered})."""
    defaults, kept, ignored = dataclasses.asdict(GRPOConfig()), {}, {}
    for key, value in settings.items():
        looser = key in LIMITS and isinstance(value, (int, float)) and value > defaults[key]
        names_file = key in ("system_prompt", "chat_template") and isinstance(value, str) and len(value) < 4096 and is_file(value)
        if key in USERS_ONLY or looser or names_file:
            if value != defaults[key] and not (key == "reward_server_api_key" and value in SECRET_PLACEHOLDERS):
                ignored[key] = value
        else:
            kept[key] = value
    return kept, ignored


def unregistered_names(settings: dict) -> list:
    """Leaves out of settings (in place) the tools, environment and reward functions that neither this package nor the
    user's external_plugins register (a model folder's run may have had plugins of its own), and reward_model without
    the user's reward_model_name_or_path -> ["key = value" for each]."""
    from alignment.rewards import REWARD_MODEL, get_reward
    from alignment.tools import get_environment, get_tool

    try:
        load_plugins(settings.get("external_plugins", []))
    except (OSError, ImportError, ValueError) as e:  # ValueError: a path with a NUL byte
        raise ConfigError(f"external_plugins: {e}") from None
    ignored = []
    for key, lookup in (("tools", get_tool), ("environment", get_environment), ("reward_functions", get_reward),
                        ("accuracy_function", get_reward)):
        names = settings.get(key)
        listed = names if isinstance(names, list) else [names] if isinstance(names, str) else []
        model_reward = key == "reward_functions" and REWARD_MODEL  # known where the user names its model
        unknown = [name for name in listed
                   if not (settings.get("reward_model_name_or_path") if name == model_reward else registered(lookup, name))]
        if not unknown:
            continue
        ignored.append(f"{key} {json.dumps(unknown)[:80]} (not registered here)")
        if key == "reward_functions":
            weights = settings.pop("reward_function_weights", None) or [1.0] * len(names)
            kept = [(name, weight) for name, weight in zip(names, weights) if name not in unknown]
            settings |= {"reward_functions": [name for name, _ in kept], "reward_function_weights": [weight for _, weight in kept]}
            if not kept:  # none left: the trainer's defaults
                del settings["reward_functions"], settings["reward_function_weights"]
        elif key == "tools":
            settings[key] = [name for name in names if name not in unknown]
        else:
            del settings[key]
    return ignored


def registered(lookup, name: str) -> bool:
    try:
        lookup(name)
    except ValueError:
        return False
    return True


def is_file(value: str) -> bool:
    try:
        return Path(value).is_file()
    except (OSError, ValueError):  # a name the system refuses (too long, a NUL byte)
        return False


def load_model(folder: Path):
    """The model in evaluation mode; a LoRA checkpoint's adapter merged into its run's base model
    (actor_model_name_or_path, or adapter_config.json's base_model_name_or_path)."""
    model = load_causal_lm(base_model_of(folder) if is_lora(folder) else str(folder))
    if is_lora(folder):
        merge_adapter(model, folder)
    model.eval()
    return model
