"""The checks of a config that look outside it: files and folders, the model's config.json, plugins (and the reward
functions, tools and environments they register), /proc/cpuinfo, CUDA, bubblewrap, the dashboards' packages.

validate() in alignment/config/validation.py calls these after every value check has run and passed (those refuse a config
with all its mistakes in one message), in a fixed order, the first failure reported; check_precision_hardware, which
reads no file, runs among the value checks.
"""

from pathlib import Path
from typing import Optional

from alignment.config.checks import check, names_gguf, show
from alignment.config.schema import GRPOConfig
from alignment.basics.errors import ConfigError, GGUFImportError, ModelLoadError


def check_model_files(c: GRPOConfig) -> None:
    for key in ("actor_model_name_or_path", "tokenizer_name_or_path"):
        folder = getattr(c, key)
        check(not names_gguf(folder) or _exists(Path.is_file, folder), f"{key}: no such file '{folder}'")
        check(
            folder is None or names_gguf(folder) or _exists(Path.is_file, Path(folder) / "config.json")
            or (key == "tokenizer_name_or_path" and _exists(Path.is_dir, folder)),
            f"{key}: '{folder}' is not a local model folder (no config.json there); download the model first, "
            f"e.g. huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir models/Qwen2.5-0.5B-Instruct",
        )
    actor, tokenizer = c.actor_model_name_or_path, c.tokenizer_name_or_path
    check(
        not (names_gguf(actor) and names_gguf(tokenizer) and Path(actor).stem == Path(tokenizer).stem
             and Path(actor).resolve() != Path(tokenizer).resolve()),
        f"actor_model_name_or_path '{actor}' and tokenizer_name_or_path '{tokenizer}' are two .gguf files of one name, which "
        f"would be imported into one folder (<output_dir>/imported/{Path(actor).stem}); rename one",
    )


def check_dataset_files(c: GRPOConfig, key: str) -> None:
    for path in (getattr(c, key) or "").split(","):
        check(not path or _exists(Path.exists, path.strip()), f"{key}: no such file or folder '{path.strip()}'")


def check_lengths_fit_model(c: GRPOConfig) -> None:
    """max_seq_len defaults to the model's max_position_embeddings, so the model's config is read even where it is given."""
    model_limit = _model_max_positions(c.actor_model_name_or_path)
    check(
        model_limit is None or type(model_limit) is int,
        f"{Path(c.actor_model_name_or_path) / 'config.json'}: max_position_embeddings = {show(model_limit)}: must be an integer",
    )
    max_seq_len = model_limit if c.max_seq_len is None else c.max_seq_len
    if max_seq_len is not None:
        model_file = c.actor_model_name_or_path if names_gguf(c.actor_model_name_or_path) else f"{c.actor_model_name_or_path}/config.json"
        source = "max_seq_len" if c.max_seq_len is not None else f"the model's max_position_embeddings ({model_file})"
        check(
            c.max_prompt_len + c.max_dec_len <= max_seq_len,
            f"max_prompt_len ({c.max_prompt_len}) + max_dec_len ({c.max_dec_len}) = {c.max_prompt_len + c.max_dec_len} "
            f"exceeds {source} = {max_seq_len}",
        )


def load_reward_functions(c: GRPOConfig) -> None:
    """Loads external_plugins first: they may register the reward functions named."""
    from alignment.rewards import REWARD_MODEL, get_reward
    from alignment.basics.plugins import load_plugins

    try:
        load_plugins(c.external_plugins)
    except (OSError, ImportError, ValueError) as e:  # ValueError: a path with a NUL byte
        raise ConfigError(f"external_plugins: {e}") from None
    for name in c.reward_functions + [c.accuracy_function]:
        if name == REWARD_MODEL and name != c.accuracy_function:
            continue
        try:
            get_reward(name)
        except ValueError as e:
            raise ConfigError(f"reward_functions / accuracy_function: {e}") from None


def check_reward_model_folder(c: GRPOConfig) -> None:
    check(
        c.reward_model_name_or_path is None or _exists(Path.is_file, Path(c.reward_model_name_or_path) / "config.json"),
        f"reward_model_name_or_path: '{c.reward_model_name_or_path}' is not a local model folder (no config.json there)",
    )


def check_tools_registered(c: GRPOConfig) -> None:
    """After external_plugins are loaded: they may register tools and environments."""
    from alignment.tools import get_environment, get_tool

    for name in c.tools:
        try:
            get_tool(name).schema  # made here, so a tool without type hints or argument descriptions fails now
        except ValueError as e:
            raise ConfigError(f"tools: {e}") from None
    if c.environment is not None:
        try:
            get_environment(c.environment)
        except ValueError as e:
            raise ConfigError(f"environment: {e}") from None


def check_tool_isolation(c: GRPOConfig) -> None:
    from alignment.tools import get_tool

    isolated = [name for name in c.tools if get_tool(name).sandboxed]
    if isolated and c.tool_isolation == "bwrap":
        from alignment.tools.sandbox import isolation_missing

        missing = isolation_missing()
        check(
            missing is None,
            f"tools: {', '.join(isolated)} run(s) code in a child process that must be isolated from this machine, and here "
            f"{missing}; or set tool_isolation none to run it without isolation (only for code you trust)",
        )


def check_precision_hardware(c: GRPOConfig) -> None:
    if c.cpu_bf16_matmul == "on":
        from alignment.models.cpu_bf16 import cpu_bf16_flags

        check(
            cpu_bf16_flags(),
            "cpu_bf16_matmul is on but this CPU lists neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo "
            "(oneDNN would emulate bf16, slower than float32); use auto or off",
        )
    if c.bf16 or c.fp16:
        import paddle

        check(
            paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0,
            f"{'bf16' if c.bf16 else 'fp16'} needs a GPU (paddlepaddle-gpu and a visible device); this run has none",
        )


def check_resume(c: GRPOConfig) -> None:
    from alignment.storage.resume import is_complete_checkpoint

    resume = c.resume_from_checkpoint
    check(
        resume in (None, "auto") or _exists(is_complete_checkpoint, resume),
        f"resume_from_checkpoint: '{resume}' is not a complete checkpoint folder (one holding trainer_state.json, "
        f"written by save_steps); give such a folder or auto",
    )
    if resume not in (None, "auto"):
        holds_adapter = (Path(resume) / "adapter_config.json").is_file()
        check(
            holds_adapter == c.lora,
            f"resume_from_checkpoint: '{resume}' holds {'a LoRA adapter' if holds_adapter else 'a whole model'} but lora is "
            f"{'false' if holds_adapter else 'true'}; resume with the setting the run was started with",
        )


def check_output_folders(c: GRPOConfig) -> None:
    for key in ("output_dir", "logging_dir"):
        folder = getattr(c, key)
        blocker = _file_in_the_way(folder) if folder else None
        if blocker:
            in_the_way = "is a file, not a folder" if blocker == Path(folder) else f"cannot be made: '{blocker}' is a file"
            raise ConfigError(f"{key}: '{folder}' {in_the_way}")


def check_dashboards_installed(c: GRPOConfig) -> None:
    from alignment.storage.dashboards import NONE, missing_package

    for name in c.report_to:
        install = None if name == NONE else missing_package(name)
        check(install is None, f"report_to {name}: its package is not installed in this environment: {install}")


def read_prompts(c: GRPOConfig) -> tuple:
    """-> (system_prompt, chat_template) as text: a file's text, so a resume from another folder reads the same template."""
    system_prompt = _text_or_file(c.system_prompt)
    chat_template = _text_or_file(c.chat_template)
    check(
        not chat_template or "{{" in chat_template or "{%" in chat_template,
        f"chat_template = {show(c.chat_template)}: no such file, and not a Jinja template (no {{{{ or {{% in it)",
    )
    return system_prompt, chat_template


def _text_or_file(value: Optional[str]) -> Optional[str]:
    """A key that takes text or a file's name -> the text (a long value is text: no path is that long)."""
    if value and len(value) < 4096 and _exists(Path.is_file, value):
        return Path(value).read_text()
    return value


def _file_in_the_way(folder: str) -> Optional[Path]:
    """The folder itself or the nearest of its parents that exists, where that is not a folder (mkdir would fail)."""
    for path in (Path(folder), *Path(folder).parents):
        if _exists(Path.exists, path):
            return None if _exists(Path.is_dir, path) else path
    return None


def _exists(test, path) -> bool:
    """test(Path(path)) (Path.is_file, Path.is_dir, ...), False for a name the system refuses (too long, a NUL byte)."""
    try:
        return test(Path(path))
    except (OSError, ValueError):
        return False


def _model_max_positions(path: str):
    """max_position_embeddings of the model folder's config.json, or of the config a .gguf's header gives (ConfigError
    naming the file where it is not JSON, or not a GGUF the importer reads: a damaged file is refused here)."""
    from alignment.models.modeling import read_json_object

    if names_gguf(path):
        from alignment.models.gguf_import import read_config  # transformers and tokenizers: only where needed

        try:
            return read_config(path)["max_position_embeddings"]
        except GGUFImportError as e:
            raise ConfigError(f"actor_model_name_or_path: {e}") from None
    try:
        return read_json_object(Path(path) / "config.json").get("max_position_embeddings")
    except ModelLoadError as e:
        raise ConfigError(f"actor_model_name_or_path: {e}") from None
