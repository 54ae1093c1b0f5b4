"""mkdocs hooks (mkdocs.yml `hooks:`): the configuration page's option tables, generated at build time from
the same source as `run_grpo.py --help` (alignment/config/help.py: the groups of `groups()`, each key's type,
default, aliases and help), so the page cannot drift from the code; and bench/, which stays where it is,
served with the site (RESULTS.md as a page, the curves as images)."""

import dataclasses
import json
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- the option tables are generated here by docs/hooks.py -->"
PADDLENLP_MARKER = "<!-- PaddleNLP's keys are generated here by docs/hooks.py -->"
SERVED = ["bench/RESULTS.md", *(f"bench/{p.name}" for p in sorted((ROOT / "bench").glob("*.png")))]


def _help_module():
    """alignment.config.help of this checkout (not of wherever .venv's editable install points), imported
    as run_grpo.py imports it: the CPU runtime set and paddle's notices quieted first."""
    sys.path.insert(0, str(ROOT))
    from alignment.basics.runtime import configure_cpu_runtime, import_paddle

    configure_cpu_runtime()
    import_paddle()
    from alignment.config import help

    return help


def options_markdown() -> str:
    """Every key, one table per group of --help: key, type, default (as JSON, as the file writes it), aliases, meaning."""
    config_help = _help_module()
    from alignment.config.aliases import ALIASES
    from alignment.config.schema import GRPOConfig

    aliases = {}
    for alias, key in ALIASES.items():
        aliases.setdefault(key, []).append(f"`{alias}`")
    out = []
    for title, keys in config_help.groups():
        out += [f"## {title}", "", "| key | type | default | aliases | meaning |", "|---|---|---|---|---|"]
        for key in keys:
            field = GRPOConfig.__dataclass_fields__[key]
            default = field.default_factory() if field.default is dataclasses.MISSING else field.default
            meaning = field.metadata["help"].replace("|", "\\|")  # a bare pipe would end the cell (one in a code span does not)
            cells = [f"`{key}`", f"`{config_help.type_name(key)}`", f"`{json.dumps(default)}`", ", ".join(aliases.get(key, [])), meaning]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def paddlenlp_markdown() -> str:
    """PaddleNLP's keys this trainer spells otherwise or does not have (alignment/config/paddlenlp_keys.py): key, what it does here, why."""
    _help_module()
    from alignment.config.paddlenlp_keys import PADDLENLP_KEYS, SAME

    out = ["| PaddleNLP's key | here | what it does here |", "|---|---|---|"]
    for key, record in sorted(PADDLENLP_KEYS.items()):
        meaning = f"`{record.why}`" if record.kind == SAME else record.why.replace("|", "\\|")
        out.append(f"| `{key}` | {record.kind} | {meaning} |")
    return "\n".join(out + [""])


def on_files(files, config):
    for path in SERVED:
        files.append(File(path, src_dir=str(ROOT), dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "configuration.md":
        return markdown
    for marker in (MARKER, PADDLENLP_MARKER):
        if marker not in markdown:
            raise ValueError(f"docs/configuration.md has lost its marker line {marker!r}: its generated table has no place")
    return markdown.replace(MARKER, options_markdown()).replace(PADDLENLP_MARKER, paddlenlp_markdown())
