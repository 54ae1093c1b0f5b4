"""Chat with a model folder or a checkpoint, the way training prompted it:

    python -m alignment.chat output/tiny/checkpoint-40                 # type prompts; answers stream back
    python -m alignment.chat output/tiny/checkpoint-40 --prompts questions.txt --greedy

Each prompt is answered on its own (a single user turn, as in training): a line typed on standard
input, a line of a text file, or a row of a .jsonl dataset (any layout the trainer reads), whose reference
answer follows the model's. Prompts that are not typed are shown above their answers. The chat
template is the folder's tokenizer's; the system prompt, the sampling settings, the tools and the engine are
those of the run that wrote the checkpoint (its grpo_config.json), or of --config's file (a grpo_argument.json:
for a model folder that no run wrote, such as data/tiny-qwen2-tools), each overridable by a flag. A folder's
grpo_config.json never imports code, names a server or loosens the tools' isolation or limits: those come from
--config's file, and one line names what a folder set and was ignored. A LoRA
checkpoint answers with its adapter merged into the run's base model (actor_model_name_or_path). With tools (or
an environment) it answers as a run trains: the template lists the tools, each call is run in its sandbox and
answered, and the model goes on, up to max_turns; the turns are printed once the episode ends, each call with
its answer below it.

    python -m alignment.chat data/tiny-qwen2-tools --config config/tiny_tools/grpo_argument.json
    python -m alignment.chat data/tiny-qwen2-tools --tools calculator --max_turns 3 --system_prompt data/tiny_tools/system_prompt.txt
"""

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from alignment.basics.runtime import configure_cpu_runtime, import_paddle

configure_cpu_runtime()
import_paddle()

import paddle  # noqa: E402

from alignment.basics.errors import DataError, ExportError, ModelLoadError  # noqa: E402
from alignment.run.model_source import load_model, model_folder, saved_settings  # noqa: E402
from alignment.models.modeling import load_tokenizer, stop_token_ids  # noqa: E402
from alignment.rollout import SamplingParams, build_engine  # noqa: E402
from alignment.rollout.multi_turn import check_template, tool_schemas, with_environment  # noqa: E402
from alignment.config import preflight  # noqa: E402
from alignment.run.build import engine_settings, turn_settings  # noqa: E402
from alignment.config.schema import GRPOConfig  # noqa: E402
from alignment.basics.data import encode_messages, read_prompt_records  # noqa: E402
from alignment.tools.calls import parse_tool_calls  # noqa: E402
from alignment.tools.environment import Episode  # noqa: E402

OVERRIDES = {  # flag -> type; each defaults to the training run's value
    "system_prompt": str,
    "environment": str,
    "max_turns": int,
    "max_dec_len": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
    "seed": int,
}


# What chat prints is text from a model, its tools and a prompt file, none of it the terminal's to obey: C0 controls but
# tab and newline, DEL and C1 controls are left out. ESC (or C1's CSI and OSC) starts every sequence that sets the
# window's title, writes the clipboard (OSC 52) or clears the screen; without it the rest prints as plain text.
TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    return TERMINAL_CONTROLS.sub("", text)


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alignment.chat", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a checkpoint folder (output_dir/checkpoint-N) or any Hugging Face-layout model folder")
    parser.add_argument("--prompts", help="a text file (one prompt per line) or a .jsonl dataset; default: standard input")
    parser.add_argument("--greedy", action="store_true", help="take the most likely token (evaluation's decoding) instead of sampling")
    parser.add_argument("--use_fusemt", type=json.loads, choices=[True, False], help="true / false: the fused or the eager engine")
    parser.add_argument("--config", help="a grpo_argument.json whose settings apply to a folder no run wrote (no grpo_config.json); "
                        "its plugins and tool limits apply to any folder (a model folder may not set those)")
    parser.add_argument("--tools", nargs="*", help="the tools the model may call (--tools alone: none); default: the training run's")
    for name, kind in OVERRIDES.items():
        parser.add_argument(f"--{name}", type=kind, help=f"default: the training run's {name}")
    return parser.parse_args(argv)


def chat_settings(folder: Path, config_file: str | None = None, overrides: dict | None = None) -> GRPOConfig:
    """The settings a model answers with: those of the run that wrote folder (its grpo_config.json), else config_file's
    (a grpo_argument.json: aliases taken, mistakes named as run_grpo.py names them), else the trainer's defaults; then
    overrides ({key: value}, None: not given). system_prompt and chat_template come back as text (a file named in
    either is read). Raises ConfigError."""
    settings, _ = saved_settings(folder, config_file)
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    config = dataclasses.replace(GRPOConfig(**settings), **given)
    system_prompt, chat_template = preflight.read_prompts(config)
    return dataclasses.replace(config, system_prompt=system_prompt, chat_template=chat_template)


def read_prompts(path: str | None, interactive: bool):
    """-> an iterator of (chat turns, the reference answer or None): one per line of a text file or standard
    input, or per dataset row."""
    if path and path.endswith(".jsonl"):
        yield from ((record.messages, record.answer) for record in read_prompt_records(path))
        return
    stream = open(path) if path else sys.stdin
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = stream.readline()
        if not line:
            if interactive:  # Ctrl-D: the shell's prompt on a line of its own
                print(file=sys.stderr)
            return
        if line.strip():
            yield ({"role": "user", "content": line.strip()},), None


class Printer:
    """Streams one answer: decodes all its tokens so far and prints what is new (a token can end inside
    a multi-byte character, which decodes to U+FFFD until the next token completes it)."""

    def __init__(self, tokenizer, pad_token_id: int):
        self.tokenizer, self.pad_token_id = tokenizer, pad_token_id
        self.ids, self.shown = [], ""

    def __call__(self, tokens) -> None:  # (1,) this step's token, pad once the answer has ended
        if tokens[0] == self.pad_token_id:
            return
        self.ids.append(int(tokens[0]))
        text = printable(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        if not text.endswith("\ufffd"):
            print(text[len(self.shown) :], end="", flush=True)
            self.shown = text


def print_episode(episode: Episode) -> None:
    """The model's turns, each followed by the answers to the calls it made: `[tool NAME] ANSWER`."""
    calls = iter(episode.calls)
    for turn in episode.turns:
        print(printable(turn), flush=True)
        for _ in parse_tool_calls(turn):
            call = next(calls, None)
            if call is not None:
                print(printable(f"[tool {call.name or '?'}] {call.answer}"), flush=True)


def main(argv: list | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        folder = model_folder(args.model)
        config = chat_settings(folder, args.config, {name: getattr(args, name) for name in [*OVERRIDES, "use_fusemt", "tools"]})
        tokenizer = load_tokenizer(str(folder), config.chat_template)
        if config.tools:
            check_template(tokenizer, tool_schemas(config.tools))  # unknown tools named; a template that hides them warned
        model = load_model(folder)
    except (ValueError, ModelLoadError, ExportError) as e:  # a mistaken setting or an unknown tool; a damaged folder: one line
        print(f"chat: error: {e}", file=sys.stderr)
        return 2
    engine = build_engine(engine_settings(config), model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
    multi_turn = with_environment(engine, tokenizer, turn_settings(config))  # the engine itself without tools
    sampling = SamplingParams(
        max_new_tokens=config.max_dec_len, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
        min_p=config.min_p, repetition_penalty=config.repetition_penalty, greedy=args.greedy,
    )
    paddle.seed(config.seed)
    interactive = args.prompts is None and sys.stdin.isatty()
    if interactive:
        print("Type a prompt and press Enter; Ctrl-D or Ctrl-C quits.", file=sys.stderr)
    try:
        for turns, reference in read_prompts(args.prompts, interactive):
            if not interactive:  # a prompt from a file or a pipe: shown above its answer
                print(printable(f"> {turns[-1]['content']}"))
            ids = encode_messages(turns, tokenizer, config.system_prompt, tool_schemas(config.tools))
            if multi_turn is engine:
                engine.generate([ids], 1, sampling, on_tokens=Printer(tokenizer, tokenizer.pad_token_id))
                print()
            else:
                print_episode(multi_turn.generate([ids], 1, sampling).episodes[0])
            print("" if reference is None else printable(f"reference: {reference}\n"), flush=True)
    except (DataError, OSError) as e:
        print(f"chat: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
