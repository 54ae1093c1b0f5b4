import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from alignment.basics.errors import ConfigError
from alignment.models.modeling import load_tokenizer
from alignment.config.schema import KEYS, GRPOConfig
from alignment.config.aliases import ALIASES
from alignment.config.cli import load_config
from alignment.run.build import step_settings

TINY = "config/tiny/grpo_argument.json"


def write(tmp_path, text, name="grpo_argument.json"):
    path = tmp_path / name
    path.write_text(text if isinstance(text, str) else json.dumps(text, indent=2))
    return str(path)


def test_bundled_tiny_config_loads_and_derives_accumulation():
    config = load_config([TINY])
    assert config.per_device_prompt_batch_size * config.rollout_n == config.gradient_accumulation_steps * config.per_device_train_batch_size
    assert config.system_prompt.startswith("Solve the problem.")  # read from data/arith/system_prompt.txt
    assert dataclasses.is_dataclass(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rollout_n = 3


def test_each_phase_of_a_step_reads_its_keys_values_from_the_config():
    """run/build.py's step_settings: every field of a phase's record named as a key holds that key's value."""
    config = load_config([TINY, "--clip_range_ratio_high", "0.28", "--overlong_filter", "true", "--eval_steps", "3"])
    settings = step_settings(config)
    records = [settings.loop, settings.rollout, settings.rollout.scoring, settings.evaluation, settings.advantages,
               settings.update, settings.update.loss]
    named = [(record, field.name) for record in records for field in dataclasses.fields(record) if field.name in KEYS]
    assert len(named) > 50
    assert all(getattr(record, key) == getattr(config, key) for record, key in named)
    assert settings.update.loss.clip_range_ratio_high == 0.28 and settings.advantages.overlong_filter
    assert settings.evaluation.eval_steps == 3 and settings.loop.config_json == config.to_json()


@pytest.mark.parametrize(
    "alias, value, key",
    [
        ("num_generations", 4, "rollout_n"),
        ("max_completion_length", 32, "max_dec_len"),
        ("max_prompt_length", 100, "max_prompt_len"),
        ("epsilon", 0.28, "clip_range_ratio"),
        ("beta", 0.04, "kl_loss_coeff"),
        ("reward_funcs", ["format"], "reward_functions"),
        ("system", "Think first.", "system_prompt"),
        ("min_lr", 1e-7, "min_learning_rate"),
        ("lr", 1e-5, "learning_rate"),
        ("vllm_importance_sampling_mode", "sequence_mask", "importance_sampling_mode"),
        ("rollout_importance_sampling_mode", "token_mask", "importance_sampling_mode"),
        ("vllm_importance_sampling_clip_min", 0.5, "importance_sampling_min"),
        ("rollout_is_threshold", 3.0, "importance_sampling_cap"),
        ("adv_estimator", "rloo", "advantage_estimator"),
        ("entropy_coef", 0.01, "entropy_coeff"),
    ],
)
def test_aliases_from_trl_and_ms_swift(tmp_path, alias, value, key):
    assert ALIASES[alias] == key
    path = write(tmp_path, {alias: value, "max_steps": 1})
    assert getattr(load_config([path]), key) == value


def test_alias_and_canonical_key_together_is_an_error(tmp_path):
    path = write(tmp_path, {"rollout_n": 4, "num_generations": 8})
    with pytest.raises(ConfigError, match="rollout_n"):
        load_config([path])


@pytest.mark.parametrize(
    "bad, suggestion",
    [
        ("rollout_m", "rollout_n"),
        ("learnig_rate", "learning_rate"),
        ("num_generation", "num_generations"),
        ("lr_sheduler_type", "lr_scheduler_type"),
    ],
)
def test_unknown_key_names_the_closest(tmp_path, bad, suggestion):
    path = write(tmp_path, {bad: 1})
    with pytest.raises(ConfigError, match=f"unknown key '{bad}'; did you mean '{suggestion}'"):
        load_config([path])


def test_unknown_key_on_the_command_line(tmp_path):
    with pytest.raises(ConfigError, match="command line: unknown key 'max_step'; did you mean 'max_steps'"):
        load_config([TINY, "--max_step", "3"])


def test_leftover_command_line_values_are_an_error():
    with pytest.raises(ConfigError, match=r"command line: .*\['4'\]"):
        load_config([TINY, "--max_steps", "3", "4"])


def test_command_line_overrides_the_file_and_accepts_aliases():
    config = load_config([TINY, "--max_steps", "3", "--num_generations", "4", "--learning_rate=1e-5", "--eval_on_start", "false"])
    assert (config.max_steps, config.rollout_n, config.learning_rate, config.eval_on_start) == (3, 4, 1e-5, False)
    assert load_config([TINY, "--lr", "3e-5"]).learning_rate == 3e-5


@pytest.mark.parametrize(
    "args, first, second, key",
    [
        (["--num_generations", "4", "--rollout_n", "8"], "num_generations", "rollout_n", "rollout_n"),
        (["--learning_rate", "1e-5", "--lr=2e-5"], "learning_rate", "lr", "learning_rate"),
        (["--epsilon_high", "0.28", "--clip_ratio_high", "0.3"], "epsilon_high", "clip_ratio_high", "clip_range_ratio_high"),
        (["--no_use_peft", "--lora"], "use_peft", "lora", "lora"),
    ],
)
def test_an_alias_beside_its_key_on_the_command_line_is_refused(args, first, second, key):
    with pytest.raises(ConfigError, match=f"^command line: '--{first}' and '--{second}' both set '{key}'; keep one$"):
        load_config([TINY, *args])


def test_a_key_given_twice_on_the_command_line_keeps_the_last_value():
    assert load_config([TINY, "--num_generations", "2", "--num_generations", "4"]).rollout_n == 4
    assert load_config([TINY, "--lora", "--no_lora"]).lora is False


def test_broken_json_reports_file_line_and_column(tmp_path):
    path = write(tmp_path, '{\n  "rollout_n": 8,\n  "max_steps": 3,,\n}')
    with pytest.raises(ConfigError, match=r"grpo_argument.json:3:\d+: not valid JSON"):
        load_config([path])


@pytest.mark.parametrize(
    "values, message",
    [
        ({"rollout_n": "eight"}, "key 'rollout_n' must be an integer, got \"eight\""),
        ({"temperature": [1, 2]}, "key 'temperature' takes one value, not a list"),
        ({"lr_scheduler_type": "exponential"}, "key 'lr_scheduler_type': invalid choice \"exponential\""),
        ({"bf16": "perhaps"}, "key 'bf16' must be true or false"),
        ({"rollout_n": None}, "key 'rollout_n' cannot be null"),
        ({"rollout_n": {"value": 8}}, "key 'rollout_n' must not be an object"),
    ],
)
def test_wrong_types_name_the_key(tmp_path, values, message):
    with pytest.raises(ConfigError, match=message):
        load_config([write(tmp_path, values)])


@pytest.mark.parametrize(
    "values, keys",
    [
        ({"rollout_n": 1}, ["rollout_n"]),
        (
            {"rollout_n": 8, "per_device_prompt_batch_size": 3, "per_device_train_batch_size": 16},
            ["per_device_prompt_batch_size", "rollout_n", "per_device_train_batch_size"],
        ),
        (
            {"rollout_n": 8, "per_device_prompt_batch_size": 4, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2},
            ["gradient_accumulation_steps", "per_device_prompt_batch_size"],
        ),
        (
            {"rollout_n": 8, "per_device_train_batch_size": 6, "gradient_accumulation_steps": 3},
            ["per_device_train_batch_size", "gradient_accumulation_steps", "rollout_n"],
        ),
        ({"max_prompt_len": 800, "max_dec_len": 300}, ["max_prompt_len", "max_dec_len", "max_position_embeddings"]),
        ({"max_prompt_len": 100, "max_dec_len": 100, "max_seq_len": 150}, ["max_prompt_len", "max_dec_len", "max_seq_len"]),
        ({"min_dec_len": 10, "max_dec_len": 5}, ["min_dec_len", "max_dec_len"]),
        ({"warmup_ratio": 0.1, "warmup_steps": 3}, ["warmup_ratio", "warmup_steps"]),
        ({"learning_rate": 1e-6, "min_learning_rate": 1e-5}, ["min_learning_rate", "learning_rate"]),
        ({"reward_functions": ["accuracy", "format"], "reward_function_weights": [1.0]}, ["reward_function_weights", "reward_functions"]),
        ({"reward_functions": ["acuracy"]}, ["reward_functions", "accuracy"]),
        ({"bf16": True, "fp16": True}, ["bf16", "fp16"]),
        ({"bf16": True}, ["bf16", "GPU"]),
        ({"sharding": "stage2"}, ["sharding", "stage2", "GPU", "stage1"]),
        ({"sharding_parallel_degree": 2}, ["sharding_parallel_degree", "sharding", "stage1"]),
        ({"tensor_parallel_degree": 2}, ["tensor_parallel_degree", "GPU"]),
        ({"eval_rollout_n": -1}, ["eval_rollout_n"]),
        ({"max_evaluate_steps": 0}, ["max_evaluate_steps"]),
        ({"logprob_chunk_tokens": 0}, ["logprob_chunk_tokens"]),
        ({"resume_from_checkpoint": "output/none-such"}, ["resume_from_checkpoint", "output/none-such", "not a complete checkpoint"]),
        ({"train_datasets": "data/nope.jsonl"}, ["train_datasets", "data/nope.jsonl"]),
        ({"calculation_steps": "one-two"}, ["calculation_steps = 'one-two'", "a count (2) or a range (1-2)"]),
        ({"calculation_steps": "2-1"}, ["calculation_steps = '2-1'", "runs backwards"]),
        ({"actor_model_name_or_path": "models/nope"}, ["actor_model_name_or_path", "models/nope", "not a local model folder"]),
        ({"top_p": 0}, ["top_p"]),
        ({"max_steps": -1, "num_train_epochs": 0}, ["max_steps", "num_train_epochs"]),
        ({"loss_type": "cispo"}, ["loss_type = cispo is TRL's spelling", "surrogate: cispo", "clip_range_ratio_high 4.0"]),
        ({"advantage_estimator": "rloo", "scale_rewards": "batch"}, ["scale_rewards = batch", "advantage_estimator grpo (and none to"]),
        (
            {"multi_objective_aggregation": "normalize_then_sum", "advantage_estimator": "reinforce_plus_plus"},
            ["normalize_then_sum", "not reinforce_plus_plus"],
        ),
        (
            {"multi_objective_aggregation": "normalize_then_sum", "use_rm_server": True, "reward_server_protocol": "paddlenlp"},
            ["normalize_then_sum", "PaddleNLP-protocol", "reward_server_protocol v1"],
        ),
        ({"top_entropy_quantile": 1.5}, ["top_entropy_quantile = 1.5", "[0, 1]"]),
        ({"entropy_coeff": -0.1}, ["entropy_coeff = -0.1"]),
        ({"bypass_mode": True, "rejection_sampling": "token_k1"}, ["use_rollout_logprobs", "rejection_sampling needs"]),
        ({"use_rollout_logprobs": True, "top_entropy_quantile": 0.2}, ["use_rollout_logprobs", "top_entropy_quantile < 1 needs"]),
        ({"importance_sampling_min": 1.0}, ["importance_sampling_min = 1.0", "[0, 1)"]),
        ({"clip_range_ratio_low": 1.0}, ["clip_range_ratio_low = 1.0", "(0, 1)"]),
    ],
)
def test_inconsistent_values_fail_naming_the_keys(tmp_path, values, keys):
    with pytest.raises(ConfigError) as error:
        load_config([write(tmp_path, {"actor_model_name_or_path": "data/tiny-qwen2", **values})])
    for key in keys:
        assert key in str(error.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"architectures": ["Qwen2ForCausalLM"],', "config.json:1:40: not valid JSON: Expecting property name"),
        ("[1, 2]", "config.json: not a JSON object"),
        ('{"max_position_embeddings": "1024"}', "config.json: max_position_embeddings = \"1024\": must be an integer"),
    ],
)
def test_a_model_config_json_that_cannot_be_read_is_named_before_loading(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path}/{message}")):
        load_config([write(tmp_path, {"actor_model_name_or_path": str(tmp_path)})])


def test_trl_style_batch_derives_prompts_per_step(tmp_path):
    # TRL: per_device_train_batch_size x gradient_accumulation_steps completions per step, in groups of num_generations
    path = write(tmp_path, {"num_generations": 8, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4})
    config = load_config([path])
    assert (config.per_device_prompt_batch_size, config.gradient_accumulation_steps) == (4, 4)


def test_system_prompt_is_text_or_a_file(tmp_path):
    prompt_file = tmp_path / "system.txt"
    prompt_file.write_text("From a file.")
    assert load_config([write(tmp_path, {"system_prompt": str(prompt_file)})]).system_prompt == "From a file."
    assert load_config([write(tmp_path, {"system": "Inline text."})]).system_prompt == "Inline text."


def test_first_argument_must_be_a_json_file():
    with pytest.raises(ConfigError, match="first argument must be a .json file"):
        load_config(["--max_steps", "3"])
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(["missing.json"])


def test_every_key_has_help_and_every_alias_targets_a_key():
    for f in dataclasses.fields(GRPOConfig):
        assert f.metadata.get("help"), f.name
    assert set(ALIASES.values()) <= {f.name for f in dataclasses.fields(GRPOConfig)}


def test_the_configuration_page_lists_every_key_and_alias():
    """docs/configuration.md's option tables, as docs/hooks.py generates them when mkdocs builds the site: a row per key,
    every alias named, and the marker line they replace still in the page."""
    spec = importlib.util.spec_from_file_location("docs_hooks", Path(__file__).parents[2] / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.MARKER in (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    page = hooks.options_markdown()
    for f in dataclasses.fields(GRPOConfig):
        assert f"| `{f.name}` |" in page, f"the configuration page lacks {f.name}"
    for alias in ALIASES:
        assert f"`{alias}`" in page, f"the configuration page lacks alias {alias}"


@pytest.mark.parametrize("path", ["config/qwen/grpo_argument.json", "config/llama/grpo_argument.json"])
def test_real_model_configs_use_only_known_keys(path):
    # Their models and GSM8K files are not in the repository: validation gets as far as looking for them (bf16 off: the
    # value checks, which run first, would refuse it on a machine without a GPU).
    with pytest.raises(ConfigError, match="actor_model_name_or_path: 'models/.*' is not a local model folder"):
        load_config([path, "--bf16", "false"])


def test_a_chat_template_path_that_does_not_exist_is_refused_and_a_file_is_read(tmp_path):
    with pytest.raises(ConfigError, match=r"chat_template = \"config/kk/chat_templat.jinja\": no such file, and not a Jinja template"):
        load_config(["config/tiny/grpo_argument.json", "--chat_template", "config/kk/chat_templat.jinja"])
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert load_config(["config/tiny/grpo_argument.json", "--chat_template", str(template)]).chat_template == template.read_text()


def test_a_long_inline_chat_template_reaches_the_tokenizer():
    # Longer than a file name may be (255 bytes), with no "/": once taken for a path ("File name too long").
    template = (
        "{% for m in messages %}" + "{{ m['role'] }}: {{ m['content'] }}" * 10 + "{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    config = load_config(["config/tiny/grpo_argument.json", "--chat_template", template])
    tokenizer = load_tokenizer("data/tiny-qwen2", config.chat_template)
    assert len(template) > 255 and tokenizer.chat_template == template
    assert tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    ).endswith("user: hiA:")


def test_verl_rollout_is_levels_mean_truncation_and_cispo_may_drop_the_lower_bound(tmp_path):
    assert load_config([write(tmp_path, {"rollout_is": "sequence"})]).importance_sampling_mode == "sequence_truncate"
    assert load_config([write(tmp_path, {"rollout_is": "token"})]).importance_sampling_mode == "token_truncate"
    config = load_config([write(tmp_path, {"surrogate": "cispo", "clip_range_ratio_low": 1.0, "clip_range_ratio_high": 4.0})])
    assert (config.clip_range_ratio_low, config.clip_range_ratio_high) == (1.0, 4.0)


def test_the_help_is_the_one_users_know():
    """`run_grpo.py --help all` at 100 columns, as tests/config/run_grpo_help.txt keeps it: every key, alias, default, choice and
    help line. A change to any of them is a change users see; it updates that file in the same commit, on purpose
    (.venv/bin/python -c 'from alignment.config.help import help_text; print(help_text(100, "all"))' > tests/config/run_grpo_help.txt)."""
    from alignment.config.help import help_text

    assert help_text(100, "all") + "\n" == (Path(__file__).parent / "run_grpo_help.txt").read_text()
