import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .settings import RewardSettings

# (completion, sample) -> float, or (completion, sample, settings) -> float for a function registered
# with uses_settings=True; raises when the value cannot be computed (never a silent 0)
RewardFn = Callable[[str, Mapping[str, Any]], float] | Callable[[str, Mapping[str, Any], RewardSettings], float]


@dataclass(frozen=True)
class RewardSpec:
    name: str
    fn: RewardFn
    description: str  # one line, served by GET /v1/reward_funcs
    uses_settings: bool = False  # fn takes the RewardSettings as a third argument


_REGISTRY: dict[str, RewardSpec] = {}


def register_reward(name: str, description: str, uses_settings: bool = False) -> Callable[[RewardFn], RewardFn]:
    description = description.strip()
    if not description or "\n" in description:
        raise ValueError(f"reward {name!r} needs a one-line description, got {description!r}")

    def decorator(fn: RewardFn) -> RewardFn:
        existing = _REGISTRY.get(name)
        # The same function again is harmless; a different one would silently change what a config means.
        if existing is not None and existing.fn is not fn:
            where = f"{existing.fn.__module__}.{existing.fn.__qualname__}"
            raise ValueError(f"reward {name!r} is already registered to {where}")
        _REGISTRY[name] = RewardSpec(name=name, fn=fn, description=description, uses_settings=uses_settings)
        return fn

    return decorator


def get_reward(name: str) -> RewardSpec:
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"unknown reward function {name!r}.{hint} Registered: {', '.join(sorted(_REGISTRY))}")


def available_rewards() -> list[RewardSpec]:
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]
