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
    needs_reference: bool = False  # fn reads sample["answer"]: a dataset row without one is refused at load time
    # sample -> None, raising ValueError for a row fn cannot score (run on every row at load time, before any model loads)
    check_sample: Callable[[Mapping[str, Any]], None] | None = None
    # () -> None: one-time work before the first item (imports that take seconds), which a reward worker does outside
    # any item's time limit
    prepare: Callable[[], None] | None = None


_REGISTRY: dict[str, RewardSpec] = {}


def register_reward(
    name: str, description: str, uses_settings: bool = False, needs_reference: bool = False,
    check_sample: Callable[[Mapping[str, Any]], None] | None = None, prepare: Callable[[], None] | None = None,
) -> Callable[[RewardFn], RewardFn]:
    description = description.strip()
    if not description or "\n" in description:
        raise ValueError(f"reward {name!r} needs a one-line description, got {description!r}")

    def decorator(fn: RewardFn) -> RewardFn:
        existing = _REGISTRY.get(name)
        # The same function again is harmless and keeps its first registration (its description and flags);
        # a different one would silently change what a config means.
        if existing is not None and existing.fn is not fn:
            where = f"{existing.fn.__module__}.{existing.fn.__qualname__}"
            raise ValueError(f"reward {name!r} is already registered to {where}")
        if existing is not None:
            return fn
        _REGISTRY[name] = RewardSpec(
            name=name, fn=fn, description=description, uses_settings=uses_settings, needs_reference=needs_reference,
            check_sample=check_sample, prepare=prepare,
        )
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


def reference_readers(names: list[str]) -> list[str]:
    """The registered functions among names that read the reference answer (names not registered: none)."""
    return [name for name in names if name in _REGISTRY and _REGISTRY[name].needs_reference]


def sample_checks(names: list[str]) -> dict:
    """"reward function NAME" -> its load-time row check, for the registered functions among names that have one; a
    check that several share (the four instruction rewards') runs once, under the first name."""
    checks = {}
    for name in names:
        check = _REGISTRY[name].check_sample if name in _REGISTRY else None
        if check is not None and check not in checks.values():
            checks[f"reward function {name}"] = check
    return checks


def prepare_rewards(names: list[str]) -> None:
    """Runs the one-time preparation of the registered functions among names. A preparation that fails is left to fail
    again in the function's first call, where the scoring reports it item by item."""
    for name in names:
        spec = _REGISTRY.get(name)
        if spec is not None and spec.prepare is not None:
            try:
                spec.prepare()
            except Exception:  # noqa: BLE001  (reported by the items, see above)
                pass
