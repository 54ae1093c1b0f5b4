"""GRPOConfig: every key of grpo_argument.json as one flat, frozen dataclass made of the sections' dataclasses, so
that a key is an attribute of the config (config.learning_rate) and the keys keep the sections' order (--help's and
grpo_config.json's); and what reading a key needs of it: the key names, each key's type and choices, the canonical
name of a key or an alias."""

import dataclasses
import difflib
import json
import typing
from dataclasses import dataclass

from alignment.config.aliases import ALIASES
from alignment.config.checks import show
from alignment.config.sections.algorithm import Algorithm
from alignment.config.sections.evaluation import Evaluation
from alignment.config.sections.model_and_data import ModelAndData
from alignment.config.sections.optimisation import Optimisation
from alignment.config.sections.rollout import Rollout
from alignment.config.sections.tools import MultiTurn
from alignment.basics.errors import ConfigError
from alignment.storage.dashboards import NONE, DashboardSettings

SECTIONS = (ModelAndData, Rollout, Algorithm, MultiTurn, Optimisation, Evaluation)  # --help's groups, in its order

# Keys whose values are secrets: never written where the config is (GRPOConfig.to_json); "set" and "unset" in their
# place (a grpo_config.json read back as a config) are no secret: alignment/run/scorer.py reads the key again
SECRET_KEYS = ("reward_server_api_key",)


@dataclass(frozen=True)
class GRPOConfig(*reversed(SECTIONS)):  # a dataclass collects its bases' fields from the last base to the first
    def dashboard_settings(self) -> DashboardSettings:
        boards = tuple(name for name in self.report_to if name != NONE)
        return DashboardSettings(boards, self.resolved_logging_dir, self.output_dir, json.loads(self.to_json()))

    @property
    def loads_reference_model(self) -> bool:
        """Whether a frozen reference model is loaded: for a KL term (kl_loss_coeff > 0 or use_kl_in_reward), but not with
        LoRA, whose reference is the actor with its adapters off."""
        return (self.kl_loss_coeff > 0 or self.use_kl_in_reward) and not self.lora

    def reward_settings(self):
        from alignment.rewards import RewardSettings

        return RewardSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RewardSettings)})

    def to_json(self) -> str:
        """The config as grpo_config.json (in output_dir and every checkpoint) and W&B's run config hold it: a secret
        as "set" or "unset", never its value (a resume reads it again from the user's config or environment)."""
        settings = dataclasses.asdict(self)
        return json.dumps(settings | {key: "set" if settings[key] not in (None, "", "unset") else "unset" for key in SECRET_KEYS}, indent=2)


KEYS = {f.name for f in dataclasses.fields(GRPOConfig)}
_HINTS = typing.get_type_hints(GRPOConfig)  # the annotations as written: PdArgumentParser rewrites the fields' .type


def value_type(key: str) -> tuple:
    """-> (type, whether null is allowed): Optional[int] -> (int, True), list[str] -> (list[str], False)."""
    args = typing.get_args(_HINTS[key])
    if type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return _HINTS[key], False


def check_choice(key: str, value, where: str) -> None:
    choices = GRPOConfig.__dataclass_fields__[key].metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}: invalid choice {show(value)} (choose from {', '.join(map(json.dumps, choices))})")


def canonical_key(key: str, where: str) -> str:
    """A key or an alias, as the file or the command line (where) writes it -> the key; an unknown name is an error
    naming the closest known one. Here, not in aliases.py: the sections list the value synonyms of aliases.py among
    their choices, so aliases.py cannot import the config back for its keys."""
    if key in KEYS:
        return key
    if key in ALIASES:
        return ALIASES[key]
    close = difflib.get_close_matches(key, sorted(KEYS | set(ALIASES)), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "; see run_grpo.py --help or docs/configuration.md"
    raise ConfigError(f"{where}: unknown key '{key}'{hint}")
