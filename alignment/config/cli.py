"""The command line: run_grpo.py CONFIG.json [--key value ...] -> the validated config. The file's values are read
first (files.py), then `--key value` pairs override them: they are parsed by paddleformers' PdArgumentParser
(argparse over the config's fields), so `--key value` works exactly as in PaddleNLP's launchers (a list key takes the
values up to the next --key). Every number must be finite and fit in int64."""

import os
import typing

from alignment.config.aliases import ALIASES
from alignment.config.files import problems_message, read_config_file
from alignment.config.paddlenlp_keys import PADDLENLP_ALIASES, PADDLENLP_KEYS, Refusal, from_text
from alignment.config.schema import KEYS, GRPOConfig, canonical_key, check_choice, value_type
from alignment.config.validation import validate
from alignment.basics.errors import ConfigError


def _parser():
    """paddleformers' PdArgumentParser over GRPOConfig, raising ConfigError where argparse would exit. Imported here, not
    at the top: paddleformers loads paddle and transformers (seconds), which help_text does without."""
    from paddleformers.trainer import PdArgumentParser

    class Parser(PdArgumentParser):
        def error(self, message):  # argparse would print usage and exit; we raise with its message instead
            raise ConfigError("command line: " + message.replace("argument --", "key "))

    return Parser(GRPOConfig, add_help=False)  # run_grpo.py answers -h with help_text(), which names the aliases too



def _canonical_cli(args: list) -> tuple:
    """`--key value` overrides -> (argparse's tokens, {list key: values}). The tokens have canonical names,
    `--key=value` for one-value keys (so a value may start with '-') and `--key=false` for `--no_<bool key>`.
    A list key takes the values up to the next --key, converted here: argparse would take a value starting
    with '-' for an option. A value that follows no key, a key without its value or with one too many, is
    an error naming them. A key given twice keeps its last value, as in argparse; a key and its alias (or two
    aliases of one key) given together are refused, as in the file."""
    out, lists, spelled, i = [], {}, {}, 0
    while i < len(args):
        if not args[i].startswith("--"):
            raise ConfigError(
                f"command line: {args[i]!r} follows no --key (overrides are --key value; see run_grpo.py --help or docs/configuration.md)"
            )
        written, eq, attached = args[i][2:].partition("=")
        i += 1
        values = [attached] if eq else []
        while i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        negated = written.startswith("no_") and written[3:] in KEYS | set(ALIASES)
        name = canonical_key(written[3:] if negated else written, "command line")
        spelling = written[3:] if negated else written
        if spelled.setdefault(name, spelling) != spelling:
            raise ConfigError(f"command line: '--{spelled[name]}' and '--{spelling}' both set '{name}'; keep one")
        kind, _ = value_type(name)
        shown = f"--{written}" + (f" ({name})" if written not in (name, f"no_{name}") else "")
        if negated and kind is not bool:
            raise ConfigError(f"command line: {shown}: only a true/false key can be negated with --no_")
        if negated or kind is bool:
            if len(values) > (0 if negated else 1):
                raise ConfigError(f"command line: {shown} takes {'no value' if negated else 'true or false at most'}; left over: {values}")
            out.append(f"--{name}=false" if negated else f"--{name}" + "".join(f"={v}" for v in values))
        elif typing.get_origin(kind) is list:
            if not values:
                raise ConfigError(f"command line: {shown} takes one or more values, got none")
            (item,) = typing.get_args(kind)
            lists[name] = [_from_text(item, v, f"command line: {shown}") for v in values]
            for value in lists[name]:  # argparse checks the choices of the keys it parses, not of these
                check_choice(name, value, f"command line: {shown}")
        else:
            if len(values) != 1:
                raise ConfigError(f"command line: {shown} takes one value" + (f"; left over: {values[1:]}" if values else ", got none"))
            out.append(f"--{name}={values[0]}")
    return out, lists


def _paddlenlp_arguments(args: list) -> tuple:
    """The command line -> (its arguments but PaddleNLP's keys this trainer does not have, {such key: its value as a file
    would hold it}): `--use_flash_attention 1`, `--rl_algorithm grpo` work as in PaddleNLP's launchers."""
    rest, found, i = [], {}, 0
    while i < len(args):
        written, eq, attached = args[i][2:].partition("=") if args[i].startswith("--") else ("", "", "")
        end = next((j for j in range(i + 1, len(args)) if args[j].startswith("--")), len(args))
        if written in PADDLENLP_KEYS and written not in PADDLENLP_ALIASES:
            try:
                found[written] = from_text(written, [attached] * bool(eq) + args[i + 1 : end])
            except Refusal as e:
                raise Refusal(f"--{written}: {e}") from None
        else:
            rest += args[i:end]
        i = end
    return rest, found


def _from_text(kind: type, text: str, where: str):
    if kind is str:
        return text
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{where}: invalid {kind.__name__} value: {text!r}") from None


def load_config(argv: list) -> GRPOConfig:
    """argv = [CONFIG.json, --key, value, ...] -> validated, frozen config (no model is loaded). Mistakes raise one
    ConfigError naming each key and where it was given (the file, or the command line): every unknown key, value of the
    wrong type and failed value check at once. PaddleNLP's keys with no effect here are printed, one line each."""
    if not argv or not argv[0].endswith(".json"):
        raise ConfigError(
            "usage: run_grpo.py CONFIG.json [--key value ...] (the first argument must be a .json file; --help lists the keys)"
        )
    try:
        arguments, paddlenlp_values = _paddlenlp_arguments(argv[1:])
    except Refusal as e:
        raise ConfigError(f"command line: {e}") from None
    reading = read_config_file(argv[0], paddlenlp_values)
    try:
        overrides, lists = _canonical_cli(arguments)
        parser = _parser()
        parser.set_defaults(**{**reading.values, **lists})  # the file's values replace the defaults, the command line's replace those
        (config,) = parser.parse_args_into_dataclasses(args=overrides, look_for_args_file=False)
    except ConfigError as e:  # the file's problems too, in one message
        raise ConfigError(problems_message(argv[0], [*reading.problems, str(e)])) from None
    config = validate(config, reading, argv[0])
    if os.environ.get("PADDLE_TRAINER_ID", "0") == "0":  # the first process says it once
        for note in reading.notes:
            print(f"note: {note}", flush=True)
    return config

