"""What a user gets wrong on the way in: a damaged model folder, an output_dir that is a file, -h, and the
commands the run prints at its end. Each run is run_grpo.py in a subprocess, as a user runs it: one line
`run_grpo: error: ...` naming the file, exit status 2, before any training; or, for help, the option list."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from alignment.config.schema import KEYS, GRPOConfig
from alignment.config.aliases import ALIASES
from alignment.config.help import groups, help_text

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "data/tiny-qwen2"
# Tiny steps: 2 prompts x 2 completions of at most 8 tokens, eager kernels, no evaluation.
RUN = [
    "run_grpo.py", "config/tiny/grpo_argument.json", "--max_steps", "1", "--max_dec_len", "8", "--rollout_n", "2",
    "--per_device_prompt_batch_size", "2", "--per_device_train_batch_size", "4", "--eval_datasets", "",
    "--use_fusemt", "false", "--use_fused_train_ops", "false",
]


def run_grpo(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def error_line(done: subprocess.CompletedProcess) -> str:
    """The run's one error line; there must be exactly one, no traceback, and exit status 2."""
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if line.startswith("run_grpo: error: ")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in output, output[-3000:]
    return lines[0]


def truncate_weights(folder: Path) -> str:
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    return f"{weights}: truncated: {size // 2} of the {size} bytes its header announces"


def misshape_a_weight(folder: Path) -> str:
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.0.mlp.up_proj.weight"] = np.zeros((700, 256), np.float32)  # config.json: intermediate_size 768
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return (
        f"{folder}/model.safetensors: model.layers.0.mlp.up_proj.weight has shape [700, 256], "
        f"but {folder}/config.json makes it [768, 256]"
    )


def config_not_json(folder: Path) -> str:
    (folder / "config.json").write_text('{\n  "hidden_size": 256,\n')  # cut short
    return f"actor_model_name_or_path: {folder}/config.json:3:1: not valid JSON"


def config_without_architectures(folder: Path) -> str:
    edit_config(folder, lambda c: c.pop("architectures"))
    return f'{folder}/config.json: names no model class (e.g. "architectures": ["Qwen2ForCausalLM"])'


def config_without_hidden_size(folder: Path) -> str:
    edit_config(folder, lambda c: c.pop("hidden_size"))  # paddleformers' Qwen2 default is 4096: no memory is taken for it
    return (f"{folder}/model.safetensors: model.embed_tokens.weight has shape [451, 256], but {folder}/config.json makes it "
            f"[451, 4096]; config.json does not set hidden_size (default 4096 used)")


def no_tokenizer(folder: Path) -> str:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink()
    return f"{folder}: no tokenizer there (none of tokenizer.json, tokenizer.model, vocab.json, vocab.txt)"


def tokenizer_cut_short(folder: Path) -> str:
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text[:500])
    return f"{folder}/tokenizer.json:"


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("damage", [
    truncate_weights, misshape_a_weight, config_not_json, config_without_architectures, config_without_hidden_size,
    no_tokenizer, tokenizer_cut_short,
])
def test_a_damaged_model_folder_stops_with_one_line_naming_the_file(tmp_path, damage):
    folder = tmp_path / "model"
    shutil.copytree(TINY_MODEL, folder)
    expected = damage(folder)
    out = tmp_path / "out"
    line = error_line(run_grpo(*RUN, "--actor_model_name_or_path", str(folder), "--output_dir", str(out)))
    assert line.startswith(f"run_grpo: error: {expected}"), line
    assert not (out / "metrics.jsonl").exists()  # stopped before the first step


def test_the_checks_pass_an_intact_folder_and_keep_the_parameter_names(tmp_path):
    # The shape check builds the model lazily under its own name scope: the real model's parameter names,
    # which key the optimizer state in checkpoints, are those it had without the check.
    from paddle.utils import unique_name
    from paddleformers.transformers import AutoModelForCausalLM

    from alignment.models.modeling import load_causal_lm

    with unique_name.guard():
        loaded = [p.name for p in load_causal_lm(str(TINY_MODEL)).parameters()]
    with unique_name.guard():
        plain = [
            p.name for p in AutoModelForCausalLM.from_pretrained(str(TINY_MODEL), load_checkpoint_format="unified_checkpoint").parameters()
        ]
    assert loaded == plain and loaded[0] == "embedding_0.w_0"


def test_a_sharded_folder_loads_and_a_missing_shard_is_named(tmp_path):
    from alignment.basics.errors import ModelLoadError
    from alignment.models.modeling import load_causal_lm

    folder = tmp_path / "sharded"
    shutil.copytree(TINY_MODEL, folder)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for file, part in shards.items():
        save_file({name: weights[name] for name in part}, folder / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {name: file for file, part in shards.items() for name in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert (
        sum(p.numel().item() for p in load_causal_lm(str(folder)).parameters())
        == sum(w.size for w in weights.values()) - weights["lm_head.weight"].size
    )
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        ModelLoadError, match=f"^{folder}/model-00002-of-00002.safetensors: no such file, though model.safetensors.index.json names it$"
    ):
        load_causal_lm(str(folder))


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_output_dir_that_is_a_file_stops_before_training(tmp_path, where):
    blocker = tmp_path / "results.txt"
    blocker.write_text("someone's notes")
    out = blocker if where == "file" else blocker / "run"
    line = error_line(run_grpo(*RUN, "--output_dir", str(out)))
    reason = f"'{out}' is a file, not a folder" if where == "file" else f"'{out}' cannot be made: '{blocker}' is a file"
    assert line == f"run_grpo: error: output_dir: {reason}"
    assert blocker.read_text() == "someone's notes"


@pytest.mark.parametrize("args", [["--help"], ["config/tiny/grpo_argument.json", "-h"]])
def test_help_lists_the_groups_and_their_keys_and_exits_0_without_loading_paddle(args):
    done = run_grpo("run_grpo.py", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: run_grpo.py CONFIG.json [--key value ...]\n       run_grpo.py --help [GROUP | all]\n")
    lines = done.stdout.splitlines()
    titles = [line for line in lines if line and not line.startswith(" ") and line.endswith(" keys):")]
    assert [title.split(" (")[0] for title in titles] == [title for title, _ in groups()]
    listed = {key for line in lines[lines.index(titles[0]):] if line.startswith("  ") for key in line.split()}
    assert listed == KEYS  # every key by name, once its group's title
    assert "run_grpo.py --help GROUP prints a group's keys in full" in done.stdout
    assert len(lines) < 70 and done.stderr == ""  # 62 lines at 80 columns (every key in full: 444); no library notice


def test_help_loads_neither_paddle_nor_paddleformers():
    """What made --help take 8 s: 0.4 s without them."""
    code = (
        "import sys; sys.argv[1:] = ['--help']; import run_grpo; run_grpo.main(); "
        "print(sorted({'paddle.base', 'paddleformers'} & set(sys.modules)))"
    )
    done = run_grpo("-c", code)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "[]", done.stderr[-3000:]


@pytest.mark.parametrize("word", ["rollout", "ROLLOUT", "tools", "multi-turn", "all"])
def test_help_with_a_word_of_a_group_title_prints_that_group_in_full(word):
    done = run_grpo("run_grpo.py", "--help", word)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("  --rollout_n INT  (default: 8; aliases: --num_generations," in done.stdout) == (word.lower() in ("rollout", "all"))
    assert ("  --max_turns INT  (default: 4; alias: --max_assistant_turns)" in done.stdout) == (word.lower() != "rollout")
    assert ("  --learning_rate FLOAT  (default: 1e-06; alias: --lr)" in done.stdout) == (word == "all")


@pytest.mark.parametrize("word", ["optimization", "optim", "OPTIMISATION"])
def test_help_with_the_start_of_a_title_word_or_a_near_spelling_prints_that_group(word):
    titles = [line for line in help_text(100, word).splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["Optimisation:"]


@pytest.mark.parametrize(
    "word, heads",
    [
        ("learning_rate", ["Optimisation (1 of 32 keys):", "  --learning_rate FLOAT  (default: 1e-06; alias: --lr)"]),
        ("lr", ["Optimisation (1 of 32 keys):", "  --learning_rate FLOAT  (default: 1e-06; alias: --lr)"]),  # an alias
        ("learning_rte", ["Optimisation (1 of 32 keys):", "  --learning_rate FLOAT  (default: 1e-06; alias: --lr)"]),  # a letter off
        ("min_learning", ["Optimisation (1 of 32 keys):", "  --min_learning_rate FLOAT  (default: 0.0; alias: --min_lr)"]),
        ("num_generation", [
            "Rollout (1 of 16 keys):", "  --rollout_n INT  (default: 8; aliases: --num_generations, --num_return_sequences)",
        ]),
    ],
)
def test_help_with_a_key_or_part_of_one_prints_those_keys_under_their_group(word, heads):
    lines = help_text(10_000, word).splitlines()
    assert [line for line in lines if not line.startswith(" " * 6)][-len(heads):] == heads
    assert lines[-1].strip() == GRPOConfig.__dataclass_fields__[heads[1].split()[0][2:]].metadata["help"]


def test_help_with_a_part_of_several_keys_prints_each_under_its_group():
    text = help_text(10_000, "clip")
    heads = {line.split()[0][2:] for line in text.splitlines() if line.startswith("  --")}
    aliased = {"importance_sampling_cap", "importance_sampling_min"}  # TRL's vllm_importance_sampling_clip_max / _min
    assert heads == {key for key in KEYS if "clip" in key} | aliased and len(heads) > 5
    assert "Algorithm (" in text


def test_help_with_a_word_of_no_group_and_no_key_names_the_words_that_work():
    done = run_grpo("run_grpo.py", "--help", "xyzzy")
    assert done.returncode == 2 and done.stdout == ""
    words = "algorithm, checkpoints, data, evaluation, logging, model, multi, multi-turn, optimisation, rollout, rollouts, tools, turn"
    assert done.stderr == (
        f"run_grpo: error: --help xyzzy: no group's title and no key has that word; give a word of a title ({words}), "
        f"a key's name or part of one, or all\n"
    )
    assert run_grpo("run_grpo.py", "--help", "and").returncode == 2  # "and" and "with" name no group


def test_help_read_by_a_reader_that_stops_early_ends_quietly():
    """run_grpo.py --help all | head -3: the help (33 kB) outgrows a 4 kB pipe, the reader closes it after one line, and the
    writer gets EPIPE; it exits 0 with nothing on stderr, as pip --help | head does (no BrokenPipeError traceback)."""
    import fcntl

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    help_run = subprocess.Popen([sys.executable, "run_grpo.py", "--help", "all"], cwd=REPO, stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.readline() == b"usage: run_grpo.py CONFIG.json [--key value ...]\n"
    assert help_run.wait(timeout=60) == 0
    assert help_run.stderr.read() == b""


def test_help_text_gives_each_key_its_type_default_aliases_and_meaning_in_groups():
    text = help_text(width=10_000, group="all")  # one line per key's head and one per meaning
    lines = text.splitlines()
    for name, f in GRPOConfig.__dataclass_fields__.items():
        heads = [i for i, line in enumerate(lines) if line.startswith(f"  --{name} ")]
        assert len(heads) == 1, name
        head = lines[heads[0]]
        default = f.default_factory() if callable(f.default_factory) else f.default
        assert f"(default: {json.dumps(default)}" in head, head
        for alias in (a for a, key in ALIASES.items() if key == name):
            assert f"--{alias}" in head, (alias, head)
        assert lines[heads[0] + 1].strip() == f.metadata["help"]
    assert "  --sharding {\"\",stage1,stage2,stage3}  (default: \"\")" in lines
    assert "  --reward_functions STR [STR ...]  (default: [\"accuracy\", \"format\"]; alias: --reward_funcs)" in lines
    assert "  --lora [true|false]  (default: false; alias: --use_peft)" in lines
    titles = [line for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    assert titles == [
        "Model and data:", "Rollout:", "Algorithm:", "Multi-turn rollouts with tools:", "Optimisation:", "Evaluation, logging, checkpoints:"
    ]
    assert (
        lines.index("Rollout:") < lines.index(next(line for line in lines if line.startswith("  --rollout_n "))) < lines.index("Algorithm:")
    )
    assert all(len(line) <= 80 for group in (None, "all") for line in help_text(width=80, group=group).splitlines())
    assert len(KEYS) == sum(line.startswith("  --") for line in lines)


def test_the_end_message_gives_commands_that_work_as_printed(tmp_path):
    out = tmp_path / "out"
    done = run_grpo(*RUN, "--output_dir", str(out))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    printed = dict(line.split(": ", 1) for line in done.stdout.splitlines() if line.startswith(("checkpoint:", "visualdl:", "chat:")))
    checkpoint = printed["checkpoint"].strip()
    assert (Path(checkpoint) / "trainer_state.json").is_file()

    dashboard = shlex.split(printed["visualdl"].split("#")[0])
    bin_dir = os.path.relpath(Path(sys.executable).parent, REPO)  # .venv/bin here: the interpreter's own, nothing to activate
    assert dashboard[0] == f"{bin_dir}/visualdl" and os.access(REPO / dashboard[0], os.X_OK), dashboard
    assert dashboard[1:3] == ["--logdir", f"{out}/vdl_log"] and any((out / "vdl_log").iterdir())
    assert dashboard[-2:] == ["--language", "en"]
    assert subprocess.run([*dashboard[:1], "--version"], cwd=REPO, capture_output=True, text=True).stdout.startswith("VisualDL")

    chat = shlex.split(printed["chat"])
    assert chat == [f"{bin_dir}/python", "-m", "alignment.chat", checkpoint]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Mia has 2 apples. She buys 3 more. How many apples does Mia have now?\n")
    answered = subprocess.run(
        [*chat, "--prompts", str(prompts), "--greedy", "--max_dec_len", "4"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert answered.returncode == 0 and answered.stdout.startswith("> Mia has 2 apples."), answered.stderr[-3000:]
