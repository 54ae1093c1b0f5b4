"""The keys of grpo_argument.json, one frozen dataclass per section, in the order --help lists them: each section
carries its --help title (TITLE: a class attribute, not annotated, so that it is no entry of GRPOConfig's
__dataclass_fields__), its keys declared with _key(), and beside it the value checks that read its keys
alone; alignment/config/schema.py joins the sections into GRPOConfig, and alignment/config/validation.py runs the
checks, with those that read keys of several sections."""

from dataclasses import field


def _key(default, help: str, **kwargs):
    """A key's field: its default (a list default copied for each config), its --help text and, in kwargs, the
    choices argparse and the file reader enforce."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})
