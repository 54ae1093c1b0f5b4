"""PaddleNLP's own RL argument files (tests/data/paddlenlp, from PaddlePaddle/PaddleNLP) read as they are: every key
known, 0 and 1 as booleans, and every problem of a config in one message before anything loads."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.reward_servers import reward_server

from alignment.basics.errors import ConfigError
from alignment.parallel.distributed import World
from alignment.config.schema import KEYS, GRPOConfig
from alignment.config.aliases import ALIASES
from alignment.config.cli import load_config
from alignment.config.paddlenlp_keys import NO_EFFECT, PADDLENLP_KEYS, REFUSED, SAME, SETS
from alignment.run.build import advantage_settings
from alignment.step.advantages import step_advantages
from alignment.storage.dashboards import DashboardSettings
from alignment.step.logger import RunLogger
from alignment.step.records import ScoredBatch

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data" / "paddlenlp"
FILES = sorted(path.name for path in DATA.glob("*_argument.json"))
GRPO_FILES = ["qwen_grpo_argument.json", "llama_grpo_argument.json"]
# Only the paths changed: the bundled tiny model and data (config/tiny/grpo_argument.json's), the run folders in tmp_path
LOCAL = {"actor_model_name_or_path": "data/tiny-qwen2", "train_datasets": "data/arith/train.jsonl",
         "eval_datasets": "data/arith/test.jsonl"}
# What a one-process CPU run changes besides: the parallel degrees, bf16 (GPU only), short lengths, two steps
ON_THIS_CPU = {"tensor_parallel_degree": 1, "sharding_parallel_degree": 1, "bf16": 0, "max_prompt_len": 96, "max_dec_len": 32,
               "max_length": 128, "max_steps": 2}


def paddlenlp_file(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def write(tmp_path: Path, values: dict, name: str = "grpo_argument.json") -> str:
    local = {"output_dir": str(tmp_path / "out"), "logging_dir": str(tmp_path / "vdl_log")}
    path = tmp_path / name
    path.write_text(json.dumps({**values, **{k: v for k, v in local.items() if k in values}}, indent=2))
    return str(path)


def problems(error: pytest.ExceptionInfo) -> list:
    """A refusal's problems: the lines of a message listing several, or the one message."""
    lines = str(error.value).splitlines()
    return [line.removeprefix("  - ") for line in lines[1:]] if len(lines) > 1 else lines


@pytest.mark.parametrize("name", [*FILES, "rl_config_fields.json"])
def test_every_key_of_paddlenlps_rl_files_and_dataclasses_is_known(name):
    found = paddlenlp_file(name)
    keys = [key for fields in found.values() for key in fields] if name == "rl_config_fields.json" else list(found)
    assert [key for key in keys if key not in KEYS | set(ALIASES) | set(PADDLENLP_KEYS)] == []


@pytest.mark.parametrize("name", GRPO_FILES)
def test_paddlenlps_grpo_file_is_refused_in_one_message_naming_what_this_machine_cannot_honour(tmp_path, name):
    with pytest.raises(ConfigError) as refused:
        load_config([write(tmp_path, paddlenlp_file(name) | LOCAL)])
    found = problems(refused)
    assert len(found) == 2, found
    assert re.match(r"tensor_parallel_degree = [48]: not supported; paddle's tensor-parallel layers run only in its GPU builds", found[0])
    assert found[1].startswith("bf16 needs a GPU")


@pytest.mark.parametrize("name", GRPO_FILES)
def test_paddlenlps_grpo_file_loads_with_paddlenlps_meanings(tmp_path, capsys, name):
    config = load_config([write(tmp_path, paddlenlp_file(name) | LOCAL | ON_THIS_CPU)])
    assert (config.rollout_n, config.advantage_estimator, config.max_seq_len, config.clip_range_score) == (8, "grpo", 128, 10.0)
    assert (config.use_fusemt, config.recompute, config.disable_tqdm, config.bf16) == (True, True, True, False)
    assert (config.per_device_prompt_batch_size, config.gradient_accumulation_steps, config.num_iterations) == (32, 32, 1)
    assert config.eval_datasets == LOCAL["eval_datasets"] and config.reward_model_name_or_path is None
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    noted = [line.split()[1] for line in notes]
    assert noted == ["fp16_opt_level", "dataloader_drop_last", "ignore_save_lr_and_optim", "normalize_advantage", "normalize_reward",
                     "fused_linear", "recompute_use_reentrant", "use_flash_attention", "offload_level", "release_grads",
                     "clip_range_value", "ptx_coeff", "pipeline_parallel_config"]
    assert all(" has no effect here: " in line for line in notes)


@pytest.mark.slow  # about 5 minutes each on 2 busy cores: two steps of 32 prompts x 8, two evaluations of 200 problems
@pytest.mark.parametrize("name", GRPO_FILES)
def test_paddlenlps_grpo_file_trains_two_steps_on_a_cpu_scored_by_the_reward_server(tmp_path, name):
    with reward_server(tmp_path, "--workers", "1") as server:  # the file's use_rm_server: true, at a free port here
        path = write(tmp_path, paddlenlp_file(name) | LOCAL | ON_THIS_CPU | {"reward_server": server.url})
        command = [sys.executable, "-m", "alignment.launch", "--nproc_per_node", "1", "--log_dir", str(tmp_path / "launch"),
                   "run_grpo.py", path]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=REPO)
        scored = server.log.read_text().splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "note: use_flash_attention = 1 has no effect here: a GPU kernel" in done.stdout
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps if "reward_mean" in step] == [1, 2]
    assert len(scored) >= 2 and (tmp_path / "out" / "checkpoint-2" / "model.safetensors").is_file()


def test_paddlenlps_reinforce_plus_plus_file_is_refused_only_for_what_this_run_cannot_do_then_loads(tmp_path):
    given = paddlenlp_file("qwen_reinforce_plus_plus_argument.json") | LOCAL
    with pytest.raises(ConfigError) as refused:
        load_config([write(tmp_path, given)])
    found = problems(refused)
    assert [line.split()[0 if line.startswith(("tensor", "bf16")) else 1] for line in found] == [
        "'dataloader_shuffle'", "tensor_parallel_degree", "bf16"], found
    config = load_config([write(tmp_path, given | ON_THIS_CPU | {"dataloader_shuffle": True})])
    assert (config.advantage_estimator, config.use_kl_in_reward, config.kl_in_reward_coeff) == ("reinforce_plus_plus", True, 0.001)
    assert (config.per_device_prompt_batch_size, config.max_resample_times, config.report_to) == (8, 1, ["visualdl"])


@pytest.mark.parametrize("name", ["llama_ppo_argument.json", "qwen_ppo_argument.json"])
def test_paddlenlps_ppo_files_are_refused_for_the_critic_naming_every_key(tmp_path, name):
    given = paddlenlp_file(name) | LOCAL
    with pytest.raises(ConfigError) as refused:
        load_config([write(tmp_path, given)])
    message = str(refused.value)
    critic_keys = [key for key in given if key.startswith("critic_")]
    assert len(critic_keys) >= 6 and all(f"key '{key}'" in message for key in critic_keys)
    assert message.count("PPO's critic (value model)") == len(critic_keys)
    assert "rollout_n = 1: a group needs at least 2 completions" in message
    assert ("key 'rl_algorithm' = \"ppo\": PPO trains a critic" in message) == ("rl_algorithm" in given)
    assert "unknown key" not in message


# ---- one record of each kind, through load_config: what the file gives -> what the config holds, or the refusal

# config/tiny's, less the keys the cases below give in PaddleNLP's spelling (rollout_n: num_return_sequences, ...)
BASE = {key: value for key, value in json.loads((REPO / "config/tiny/grpo_argument.json").read_text()).items()
        if key not in ("rollout_n", "max_prompt_len", "per_device_prompt_batch_size")}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"num_return_sequences": 4}, {"rollout_n": 4}),  # same
        ({"max_length": 600}, {"max_seq_len": 600}),
        ({"max_src_len": 100}, {"max_prompt_len": 100}),
        ({"rl_algorithm": "grpo"}, {"advantage_estimator": "grpo"}),  # sets
        ({"rl_algorithm": "reinforce_plus_plus", "kl_coeff": 0.02}, {"advantage_estimator": "reinforce_plus_plus",
                                                                     "use_kl_in_reward": True, "kl_in_reward_coeff": 0.02}),
        ({"rl_algorithm": "grpo", "kl_coeff": 0.02}, {"use_kl_in_reward": False}),
        ({"evaluation_strategy": "no"}, {"eval_datasets": None}),
        ({"do_eval": 0}, {"eval_datasets": None}),
        ({"do_eval": 1, "evaluation_strategy": "steps"}, {"eval_datasets": "data/arith/test.jsonl"}),
        ({"global_batch_size": 4}, {"per_device_prompt_batch_size": 4}),
        ({"max_gen_batches": 3, "dynamic_sampling": True}, {"max_resample_times": 2}),
        ({"save_strategy": "steps", "do_train": 1, "global_mini_batch_size": -1}, {"save_steps": 20}),
        ({"use_flash_attention": 1, "offload_level": "freeze_model"}, {}),  # no effect
        ({"pipeline_parallel_degree": 1, "ptx_datasets": "", "critic_learning_rate": None}, {}),  # refused, but their off values
        ({"report_to": "none", "reward_model_name_or_path": ""}, {"report_to": ["none"], "reward_model_name_or_path": None}),
    ],
)
def test_each_kind_of_paddlenlp_key_means_what_paddlenlp_means(tmp_path, given, expected):
    config = load_config([write(tmp_path, BASE | given)])
    assert {key: getattr(config, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        ({"rl_algorithm": "ppo"}, "key 'rl_algorithm' = \"ppo\": PPO trains a critic (a value model)"),
        ({"rl_algorithm": "dpo"}, "PaddleNLP's choices are ppo, grpo and reinforce_plus_plus"),
        ({"rl_algorithm": "grpo", "advantage_estimator": "rloo"}, "'rl_algorithm' sets advantage_estimator to \"grpo\" but "
                                                                  "'advantage_estimator' is \"rloo\"; keep one"),
        ({"rl_algorithm": "reinforce_plus_plus", "normalize_reward": 1}, "key 'normalize_reward' = 1: rewards normalised"),
        ({"evaluation_strategy": "epoch"}, "key 'evaluation_strategy' = \"epoch\": \"epoch\": this trainer evaluates every"),
        ({"save_strategy": "no"}, "this trainer saves every save_steps steps and at the end"),
        ({"do_train": 0}, "python -m alignment.evaluate evaluates a model without training"),
        ({"global_batch_size": 3, "per_device_train_batch_size": 16}, "does not divide into micro-batches"),
        ({"pipeline_parallel_degree": 2}, "key 'pipeline_parallel_degree' = 2: model parallelism across GPUs"),
        ({"ptx_datasets": "alpaca"}, "a pretraining (ptx) loss on a second dataset"),
        ({"pg_loss_coeff": 0.5}, "the policy loss has weight 1 here"),
        ({"use_flash_attention": "yes"}, "key 'use_flash_attention' = \"yes\": must be true, false, 0 or 1"),
        ({"use_flash_attention": 2}, "must be true, false, 0 or 1, got 2"),
        ({"offload_level": 3}, "key 'offload_level' = 3: must be a string"),
    ],
)
def test_each_kind_of_paddlenlp_key_refuses_what_this_run_cannot_do(tmp_path, given, refusal):
    with pytest.raises(ConfigError) as refused:
        load_config([write(tmp_path, BASE | given)])
    assert refusal in str(refused.value)


def asks_for_something(key: str):
    """A value of the key's type that is not its off value (None: every value is its off value)."""
    record = PADDLENLP_KEYS[key]
    candidates = {bool: [True, False], int: [2, 0], float: [0.5, 0.0], str: ["x", ""], list: [["x"]]}[record.type]
    return next((value for value in candidates if not record.off(value)), None)


@pytest.mark.parametrize("key", sorted(key for key, record in PADDLENLP_KEYS.items() if record.kind in (NO_EFFECT, REFUSED)))
def test_every_no_effect_key_says_so_at_start_and_every_refused_one_is_refused_with_its_reason(tmp_path, capsys, key):
    record, value = PADDLENLP_KEYS[key], asks_for_something(key)
    if value is None:  # read only beside a switch that is refused when on (early_stopping_patience): never a note
        load_config([write(tmp_path, BASE | {key: {bool: True, int: 3, float: 3.0, str: "x", list: ["x"]}[record.type]})])
        assert key not in capsys.readouterr().out
        return
    if record.kind == REFUSED:
        with pytest.raises(ConfigError, match=re.escape(f"key '{key}' = {json.dumps(value)}: {record.why}")):
            load_config([write(tmp_path, BASE | {key: value})])
        return
    load_config([write(tmp_path, BASE | {key: value})])
    assert f"note: {key} = {json.dumps(value)} has no effect here: {record.why}\n" in capsys.readouterr().out


def test_the_table_has_one_kind_per_key_and_the_same_kind_names_a_key_here():
    assert {record.kind for record in PADDLENLP_KEYS.values()} == {SAME, SETS, NO_EFFECT, REFUSED}
    assert all(record.why in KEYS for record in PADDLENLP_KEYS.values() if record.kind == SAME)
    assert all(record.sets is not None for record in PADDLENLP_KEYS.values() if record.kind == SETS)
    assert not set(PADDLENLP_KEYS) & KEYS  # a key of the same name here is config.py's own


# ---- booleans as PaddleNLP writes them


@pytest.mark.parametrize(("value", "loads_as"), [(1, True), (0, False), (True, True), (False, False)])
def test_a_boolean_may_be_written_0_or_1(tmp_path, value, loads_as):
    assert load_config([write(tmp_path, BASE | {"recompute": value})]).recompute is loads_as


@pytest.mark.parametrize("value", [2, -1, 0.0, 1.0, "yes", "1", [1], None])
def test_nothing_else_that_is_not_a_boolean_is_one(tmp_path, value):
    with pytest.raises(ConfigError, match=r"key 'recompute' (must be true or false|cannot be null|takes one value)"):
        load_config([write(tmp_path, BASE | {"recompute": value})])


# ---- every problem of a config in one message


def test_every_problem_of_a_config_is_reported_at_once_before_anything_loads(tmp_path):
    given = BASE | {
        "actor_model_name_or_path": "no/such/model",  # looked for only once the values pass: not in this message
        "rollout_m": 8, "learning_rat": 1e-6,  # unknown, each with its nearest key
        "use_fusemt": "yes",  # wrong type
        "rl_algorithm": "ppo",  # a PaddleNLP key this trainer cannot honour
        "temperature": 0, "top_p": 2.0,  # two bad values of one check
        "min_learning_rate": 1.0,  # a contradiction (above learning_rate)
        "tensor_parallel_degree": 2,  # this machine cannot
    }
    path = write(tmp_path, given)
    with pytest.raises(ConfigError) as refused:
        load_config([path])
    assert str(refused.value).splitlines()[0] == f"{path}: 8 problems, each to fix before the run can start:"
    assert problems(refused) == [
        "key 'use_fusemt' must be true or false (or 0 or 1, PaddleNLP's), got \"yes\"",  # config/tiny's key, in its place
        "unknown key 'rollout_m'; did you mean 'rollout_n'?",
        "unknown key 'learning_rat'; did you mean 'learning_rate'?",
        "key 'rl_algorithm' = \"ppo\": PPO trains a critic (a value model) beside the actor and this trainer has none; use grpo "
        "or reinforce_plus_plus",
        "temperature = 0.0: must be > 0",
        "top_p = 2.0: must lie in (0, 1]",
        "min_learning_rate (1.0) must lie in [0, learning_rate (4e-05)]",
        "tensor_parallel_degree = 2: not supported; paddle's tensor-parallel layers run only in its GPU builds and this trainer "
        "has not been run on a GPU; scale out with data parallel (and sharding: stage1)",
    ]


def test_a_check_of_a_key_whose_value_was_refused_is_left_out(tmp_path):
    # rollout_n "4" is refused for its type; the batch check would judge the default 8 against gradient_accumulation_steps 3
    with pytest.raises(ConfigError) as refused:
        load_config([write(tmp_path, BASE | {"rollout_n": "4", "gradient_accumulation_steps": 3})])
    assert str(refused.value) == f"{tmp_path / 'grpo_argument.json'}: key 'rollout_n' must be an integer, got \"4\""


# ---- PaddleNLP's clip_range_score and disable_tqdm, done here


def test_clip_range_score_clips_each_reward_before_the_advantages():
    rewards = np.array([30.0, 0.0, -30.0, np.nan])
    rollout = type("Rollout", (), {"loss_mask": np.ones((4, 2), dtype=np.float32), "finish_reasons": ["stop"] * 4})
    scored = ScoredBatch([], rollout, [""] * 4, rewards, {}, [None] * 4, np.zeros(4, bool))
    clipped = GRPOConfig(rollout_n=4, clip_range_score=10.0, scale_rewards="none")
    advantages, _ = step_advantages(scored, advantage_settings(clipped), World(0, 1))
    np.testing.assert_allclose(advantages, [10.0, 0.0, -10.0, 0.0])  # mean 0 of the three finite ones; the failed one 0
    unclipped, _ = step_advantages(scored, advantage_settings(GRPOConfig(rollout_n=4, scale_rewards="none")), World(0, 1))
    np.testing.assert_allclose(unclipped, [30.0, 0.0, -30.0, 0.0])


@pytest.mark.parametrize("disable", [True, False])
def test_disable_tqdm_leaves_the_progress_bar_out(tmp_path, disable, monkeypatch):
    monkeypatch.setenv("GRPO_CONSOLE_IS_TERMINAL", "1")  # a console that is a terminal: only disable_tqdm leaves the bar out
    settings = DashboardSettings((), str(tmp_path / "vdl"), str(tmp_path), {"disable_tqdm": disable})
    with RunLogger(str(tmp_path), settings, 1, 2, 0, True) as logger:
        assert logger.bar.disable is disable


def test_paddlenlps_keys_work_on_the_command_line_as_in_its_launchers(tmp_path, capsys):
    path = write(tmp_path, BASE)
    config = load_config([path, "--rl_algorithm", "reinforce_plus_plus", "--kl_coeff", "0.01", "--num_return_sequences", "4",
                          "--use_flash_attention", "--do_eval=0"])
    assert (config.advantage_estimator, config.kl_in_reward_coeff, config.rollout_n, config.eval_datasets) == (
        "reinforce_plus_plus", 0.01, 4, None)
    assert "note: use_flash_attention = true has no effect here" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"^command line: --use_flash_attention: must be true, false, 0 or 1, got 'yes'$"):
        load_config([path, "--use_flash_attention", "yes"])
    with pytest.raises(ConfigError, match=r"key 'pipeline_parallel_degree' = 2: model parallelism across GPUs"):
        load_config([path, "--pipeline_parallel_degree", "2"])
