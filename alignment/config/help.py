"""run_grpo.py --help: the usage and each group's key names, or the keys of the groups asked for in full (type,
default, aliases, meaning); the groups are the config's sections, under their titles. docs/hooks.py builds the
configuration page's tables from the same groups."""

import dataclasses
import difflib
import json
import re
import shutil
import textwrap
import typing
from typing import Optional

from alignment.config.aliases import ALIASES
from alignment.config.schema import KEYS, SECTIONS, GRPOConfig, value_type
from alignment.basics.errors import ConfigError

HELP_FLAGS = ("-h", "--help")


def wants_help(argv: list) -> bool:
    """-h or --help anywhere asks for the option list, as with argparse (a value "-h" is given as --key=-h)."""
    return any(arg in HELP_FLAGS for arg in argv)


def help_topic(argv: list) -> Optional[str]:
    """The group asked for: the word after -h / --help (`--help rollout`, `--help all`); None: the overview."""
    after = next((argv[i + 1 : i + 2] for i, arg in enumerate(argv) if arg in HELP_FLAGS), [])
    return after[0] if after and not after[0].startswith("-") and not after[0].endswith(".json") else None


def help_text(width: Optional[int] = None, group: Optional[str] = None) -> str:
    """--help: the usage and each group's key names. group (a word of a group's title, a key, part of one, or "all";
    see _help_groups) -> those keys in full, each with its type, default, aliases and meaning, under their groups' titles
    as the config's sections group them. A word that finds nothing raises ConfigError naming the words that work."""
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 120)
    lines = ["usage: run_grpo.py CONFIG.json [--key value ...]", "       run_grpo.py --help [GROUP | all]", ""] + _wrap(
        "CONFIG.json is one JSON object of the keys below. On the command line, --key value (or --key=value) "
        "overrides the file's value; a list key takes the values up to the next --key; a true/false key alone "
        "means true, --no_KEY false. An alias (another trainer's name: TRL, ms-swift, verl) works in place of its key, "
        "not beside it. docs/configuration.md explains the keys at more length.", width
    )
    every = groups()
    if group is None:
        for title, keys in every:
            lines += ["", f"{title} ({len(keys)} keys):"] + _wrap(" ".join(keys), width, "  ", "  ")
        return "\n".join(lines + [""] + _wrap(
            "run_grpo.py --help GROUP prints a group's keys in full: each with its type, default, aliases and meaning. "
            "GROUP is a word of a group's title or its start, in any case (model, rollout, algorithm, tools, optim, eval, ...), "
            "a key's name or part of one (learning_rate, lr, clip), or all for every group.", width
        ))
    chosen = _help_groups(group.lower(), every)
    if not chosen:
        words = sorted({word for title, _ in every for word in _title_words(title)})
        raise ConfigError(
            f"--help {group}: no group's title and no key has that word; give a word of a title ({', '.join(words)}), "
            f"a key's name or part of one, or all"
        )
    whole = dict(every)
    aliases = {}
    for alias, key in ALIASES.items():
        aliases.setdefault(key, []).append(f"--{alias}")
    for title, keys in chosen:
        lines += ["", f"{title}:" if keys == whole[title] else f"{title} ({len(keys)} of {len(whole[title])} keys):"]
        for key in keys:
            f = GRPOConfig.__dataclass_fields__[key]
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            also = f"; {'aliases' if len(aliases.get(key, [])) > 1 else 'alias'}: {', '.join(aliases[key])}" if key in aliases else ""
            lines += _wrap(f"--{key} {type_name(key)}  (default: {json.dumps(default)}{also})", width, "  ", " " * 4)
            lines += _wrap(f.metadata["help"], width, " " * 6, " " * 6)
    return "\n".join(lines)


def _help_groups(word: str, groups: list) -> list:
    """--help WORD (lower case) -> [(title, keys)] to print: every group for all; the groups with WORD as a word of
    their title (rollout: Rollout alone), else those with a title word that starts with it (optim: Optimisation); else
    the key WORD names (a key or an alias: lr) or the keys whose name or alias holds it (clip), each under its group's
    title; else what WORD is a letter or two from (optimization, learning_rte)."""
    if word == "all":
        return groups
    for matches in (word.__eq__, lambda title_word: title_word.startswith(word)):
        if titled := [(title, keys) for title, keys in groups if any(map(matches, _title_words(title)))]:
            return titled
    named = ALIASES.get(word, word)
    holders = {key for key in KEYS if word in key} | {key for alias, key in ALIASES.items() if word in alias}
    picked = [(title, [k for k in keys if (k == named if named in KEYS else k in holders)]) for title, keys in groups]
    if any(keys for _, keys in picked):
        return [(title, keys) for title, keys in picked if keys]
    words = {w for title, _ in groups for w in _title_words(title)} | KEYS | set(ALIASES)
    close = difflib.get_close_matches(word, sorted(words), n=1, cutoff=0.8)
    return _help_groups(close[0], groups) if close else []


def _title_words(title: str) -> set:
    """"Multi-turn rollouts with tools" -> {"multi-turn", "multi", "turn", "rollouts", "tools"}: "with" and "and" name
    no group."""
    return (set(re.findall(r"\w+(?:-\w+)*", title.lower())) | set(re.findall(r"\w+", title.lower()))) - {"and", "with"}


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def type_name(key: str) -> str:
    kind, _ = value_type(key)
    choices = GRPOConfig.__dataclass_fields__[key].metadata.get("choices")
    one = "{" + ",".join(c or '""' for c in choices) + "}" if choices else None
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0].__name__.upper()
        return f"{one} [...]" if one else f"{item} [{item} ...]"
    if one:
        return one
    return "[true|false]" if kind is bool else kind.__name__.upper()


def groups() -> list:
    """-> [(title, [key, ...])]: each section's title and keys, in the config's order."""
    return [(section.TITLE, [f.name for f in dataclasses.fields(section)]) for section in SECTIONS]
