"""python -m alignment.chat: answers stream out exactly as the trainer's engines decode them."""

import dataclasses
import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.processes import stop

from alignment.chat import Printer, chat_settings, print_episode
from alignment.models.modeling import load_causal_lm, load_tokenizer, stop_token_ids
from alignment.rollout import EagerEngine, SamplingParams
from alignment.config.schema import GRPOConfig
from alignment.config.cli import load_config
from alignment.basics.data import encode_messages
from alignment.tools.calculator import calculator
from alignment.tools import Episode, ToolSettings, get_environment
from alignment.tools.calls import ParsedCall, parse_tool_calls
from alignment.tools.sandbox import SandboxLimits, isolation_missing

SYSTEM = Path("data/arith/system_prompt.txt").read_text()
# keys validation fills from others (load_config), which a config file read for answering leaves as written
DERIVED = ("gradient_accumulation_steps", "clip_range_ratio_low", "clip_range_ratio_high", "mini_batch_size", "cosine_max_len",
           "soft_max_length")
QUESTIONS = ["Mia has 12 apples. She buys 7 more. How many apples does Mia have now?", "What is 6 times 7?"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The bundled model with the grpo_config.json a training run writes beside it."""
    folder = tmp_path_factory.mktemp("chat") / "checkpoint-5"
    shutil.copytree("data/tiny-qwen2", folder)
    trained = dataclasses.replace(GRPOConfig(), system_prompt=SYSTEM, max_dec_len=24, temperature=0.7, top_k=5, use_fusemt=True)
    (folder / "grpo_config.json").write_text(trained.to_json())
    return folder


def greedy_answers(folder: Path, questions: list) -> list:
    tokenizer, model = load_tokenizer(str(folder)), load_causal_lm(str(folder))
    engine = EagerEngine(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
    prompts = [encode_messages(({"role": "user", "content": q},), tokenizer, SYSTEM) for q in questions]
    rollout = engine.generate(prompts, 1, SamplingParams(max_new_tokens=24, greedy=True))
    return [tokenizer.decode(row[:n].tolist(), skip_special_tokens=True) for row, n in zip(rollout.completion_ids, rollout.lengths)]


def chat(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alignment.chat", *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_greedy_answers_equal_the_engine_from_a_file_and_from_stdin(tmp_path, checkpoint):
    expected = greedy_answers(checkpoint, QUESTIONS)
    prompts = tmp_path / "questions.txt"
    prompts.write_text("\n".join(QUESTIONS) + "\n")
    from_file = chat(str(checkpoint), "--prompts", str(prompts), "--greedy")
    assert from_file.returncode == 0, from_file.stderr[-2000:]
    assert from_file.stdout == "".join(f"> {q}\n{a}\n\n" for q, a in zip(QUESTIONS, expected))

    piped = chat(str(checkpoint), "--greedy", "--use_fusemt", "false", stdin="\n".join(QUESTIONS) + "\n")
    assert piped.returncode == 0, piped.stderr[-2000:]
    assert piped.stdout == from_file.stdout  # piped prompts are shown above their answers too
    assert "Ctrl-D" not in piped.stderr  # no typing instructions for a pipe


def test_a_jsonl_dataset_is_read_like_training_data_with_its_references(tmp_path, checkpoint):
    expected = greedy_answers(checkpoint, QUESTIONS)
    dataset = tmp_path / "questions.jsonl"
    dataset.write_text("".join(json.dumps({"src": q, "tgt": str(19 + i)}) + "\n" for i, q in enumerate(QUESTIONS)))
    done = chat(str(checkpoint), "--prompts", str(dataset), "--greedy")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "".join(f"> {q}\n{a}\nreference: {19 + i}\n\n" for i, (q, a) in enumerate(zip(QUESTIONS, expected)))


def test_typed_prompts_are_told_how_to_quit_and_ctrl_d_quits(checkpoint):
    """Standard input a terminal (a pseudo-terminal here): a line of instructions, a "> " before each prompt
    on stderr, the answer on stdout, and end of input (Ctrl-D) ends the chat cleanly."""
    expected = greedy_answers(checkpoint, QUESTIONS[1:])[0]
    terminal, user = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "alignment.chat", str(checkpoint), "--greedy"], stdin=user,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(user)
    try:
        os.write(terminal, QUESTIONS[1].encode() + b"\n" + b"\x04")  # a line, then Ctrl-D at the start of the next
        out, err = process.communicate(timeout=300)
    finally:
        stop(process, timeout=10)  # at once when it has exited
        os.close(terminal)
    assert process.returncode == 0, err[-2000:]
    assert out == f"{expected}\n\n"  # typed prompts are not repeated
    assert "Type a prompt and press Enter; Ctrl-D or Ctrl-C quits." in err and err.endswith("> > \n")


def test_settings_come_from_the_training_run_and_flags_override_them(checkpoint):
    config = chat_settings(checkpoint)
    assert (config.system_prompt, config.max_dec_len, config.temperature, config.top_k, config.use_fusemt) == (SYSTEM, 24, 0.7, 5, True)
    config = chat_settings(checkpoint, None, {"temperature": 0.2, "use_fusemt": False, "system_prompt": "Hi.", "top_p": None})
    assert (config.temperature, config.use_fusemt, config.system_prompt, config.top_k, config.top_p) == (0.2, False, "Hi.", 5, 1.0)
    plain = chat_settings(Path("data/tiny-qwen2"))
    assert plain == GRPOConfig()  # a model folder without a training run: the trainer's defaults


def test_a_plain_folder_takes_a_config_files_settings_or_flags():
    """data/tiny-qwen2-tools was written by no run: --config takes a grpo_argument.json's settings (as run_grpo.py reads
    them, the system prompt's file read), and --tools, --max_turns, --system_prompt give them one by one."""
    folder = Path("data/tiny-qwen2-tools")
    trained = load_config(["config/tiny_tools/grpo_argument.json"])
    config = chat_settings(folder, "config/tiny_tools/grpo_argument.json")
    assert config == dataclasses.replace(trained, **{key: getattr(config, key) for key in DERIVED})  # validation's fills aside
    assert config.system_prompt == Path("data/tiny_tools/system_prompt.txt").read_text() and config.tools == ["calculator"]
    flags = {"tools": ["calculator"], "max_turns": 3, "system_prompt": "data/tiny_tools/system_prompt.txt", "environment": None}
    config = chat_settings(folder, None, flags)
    assert (config.tools, config.max_turns, config.system_prompt, config.resolved_environment) == (
        ["calculator"], 3, trained.system_prompt, "tools"
    )
    assert chat_settings(folder, "config/tiny_tools/grpo_argument.json", {"tools": []}).tools == []  # --tools alone: none


def test_a_mistaken_config_or_tool_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"max_turns": "3"}')
    for flags, expected in (
        (["--config", str(bad)], f"chat: error: --config: {bad}: key 'max_turns' must be an integer, got \"3\""),
        (["--tools", "calculater"], "chat: error: unknown tool 'calculater'. Did you mean 'calculator'?"),
    ):
        done = chat("data/tiny-qwen2-tools", *flags, stdin="hi\n")
        assert done.returncode == 2 and done.stderr.startswith(expected) and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_streamed_pieces_add_up_to_the_decoded_answer(capsys):
    tokenizer = load_tokenizer("data/tiny-qwen2")
    text = "12 + 7 = 19 ✓ — 答案是十九"  # multi-byte characters may span tokens
    ids = tokenizer.encode(text, add_special_tokens=False)  # 33 byte-level tokens; e.g. 答 ends mid-token
    printer = Printer(tokenizer, tokenizer.pad_token_id)
    for token in [*ids, tokenizer.pad_token_id]:  # pad: the answer has ended
        printer([token])
    assert capsys.readouterr().out == tokenizer.decode(ids, skip_special_tokens=True)


# A window title, the clipboard written (OSC 52), the screen cleared, red through C1's CSI, a carriage return over the line
ESCAPES = "\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b31m\r"
CONTROLS = set(map(chr, [*range(0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]))


def test_terminal_controls_from_the_model_or_a_tool_are_not_printed(capsys):
    """Streamed model text, and an episode's turn and tool answers as print_episode shows them: the python tool (in its
    sandbox) prints the sequences, and a call names a tool with them (the name is printed as written)."""
    tokenizer = load_tokenizer("data/tiny-qwen2")
    printer = Printer(tokenizer, tokenizer.pad_token_id)
    for token in [*tokenizer.encode(f"19 {ESCAPES} done", add_special_tokens=False), tokenizer.pad_token_id]:
        printer([token])
    assert capsys.readouterr().out == "19 ]0;pwned]52;c;cHduZWQ=[2J31m done"

    tools = ("calculator",) if isolation_missing() else ("calculator", "python")
    environment = get_environment("tools").factory(ToolSettings(tools=tools, limits=SandboxLimits()))
    code = json.dumps({"name": "python", "arguments": {"code": f"print({ESCAPES!r})"}})
    odd_name = json.dumps({"name": "calc\x1b]0;pwned\x07", "arguments": {}})
    episode = Episode(sample={}, turns=[f"<tool_call>{code}</tool_call><tool_call>{odd_name}</tool_call>{ESCAPES}"])
    environment.reply([episode])
    print_episode(episode)
    shown = capsys.readouterr().out
    assert not CONTROLS & set(shown), [c for c in shown if c in CONTROLS]
    assert "[tool calc]0;pwned] error: unknown tool" in shown
    assert "python" not in tools or "[tool python] ]0;pwned]52;c;cHduZWQ=[2J31m\n" in shown


def test_a_prompt_files_terminal_controls_are_not_printed(tmp_path, checkpoint):
    prompts = tmp_path / "questions.txt"
    prompts.write_text(f"What is 6 times 7?{ESCAPES.rstrip()}x\n")  # a carriage return would end the line
    done = chat(str(checkpoint), "--prompts", str(prompts), "--greedy")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("> What is 6 times 7?]0;pwned]52;c;cHduZWQ=[2J31mx\n") and not CONTROLS & set(done.stdout)


def test_a_folder_without_a_model_is_a_clear_error(tmp_path):
    done = chat(str(tmp_path))
    assert done.returncode == 2
    assert f"chat: error: {tmp_path} is not a model folder (no config.json there)" in done.stderr


def test_a_damaged_model_folder_is_one_line(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree("data/tiny-qwen2", folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    done = subprocess.run(
        [sys.executable, "-m", "alignment.chat", str(folder), "--greedy"], input="hi\n", capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("chat: error: ")]
    assert "model.safetensors" in line and "truncated" in line and "Traceback" not in done.stderr


def test_a_tools_run_chats_with_its_tools_running_each_call(tmp_path):
    """A checkpoint of a tools run: the prompts list the calculator as in training, every call the model makes is
    run and answered below it, and the model goes on from the answer (sampled: the untrained tools model calls
    in about a quarter of its answers, never greedily)."""
    folder = tmp_path / "checkpoint-1"
    shutil.copytree("data/tiny-qwen2-tools", folder)
    (folder / "grpo_config.json").write_text(load_config(["config/tiny_tools/grpo_argument.json"]).to_json())
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text("".join(open("data/arith/test.jsonl").readlines()[:8]))
    done = chat(str(folder), "--prompts", str(prompts), "--seed", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    plain = chat("data/tiny-qwen2-tools", "--config", "config/tiny_tools/grpo_argument.json", "--prompts", str(prompts), "--seed", "3")
    assert plain.returncode == 0 and plain.stdout == done.stdout, plain.stderr[-2000:]  # the model folder, with the run's settings
    lines = done.stdout.splitlines()
    answered = [(call, answer) for call, answer in zip(lines, lines[1:]) if answer.startswith("[tool ")]
    assert answered and sum(line.startswith("> ") for line in lines) == 8
    for call, answer in answered:
        (parsed,) = parse_tool_calls(call)
        expected = calculator(**parsed.arguments) if isinstance(parsed, ParsedCall) else "error: "
        assert answer.startswith(f"[tool {parsed.name if isinstance(parsed, ParsedCall) else '?'}] {expected}"), (call, answer)
