"""AdamW's state in a checkpoint: one safetensors file (optimizer.safetensors) that names each parameter's tensors
as the model does, written, read back, and checked against the trained parameters before the optimizer takes it."""

import json
import math
import re
from pathlib import Path

import paddle
from safetensors import safe_open
from safetensors.paddle import load_file, save_file

from alignment.basics.errors import CheckpointError
from alignment.storage.resume import STATE_FILE

OPTIMIZER_FILE = "optimizer.safetensors"


def save_optimizer_state(state: dict, path: Path) -> None:
    """AdamW's state dict -> one safetensors file: its tensors (master weights as master_weights/<name>) as they are,
    the rest (the learning-rate schedule's numbers) as JSON in the file's metadata."""
    tensors = {key: value for key, value in state.items() if isinstance(value, paddle.Tensor)}
    tensors |= {f"master_weights/{key}": value for key, value in state.get("master_weights", {}).items()}
    rest = {key: value for key, value in state.items() if key != "master_weights" and not isinstance(value, paddle.Tensor)}
    save_file({key: value.contiguous() for key, value in tensors.items()}, str(path), metadata={"grpo_optimizer": json.dumps(rest)})


def load_optimizer_state(path: Path) -> dict:
    """The inverse of save_optimizer_state."""
    with safe_open(str(path), "np") as opened:
        state = json.loads((opened.metadata() or {})["grpo_optimizer"])
    for key, value in load_file(str(path)).items():
        if key.startswith("master_weights/"):
            state.setdefault("master_weights", {})[key.removeprefix("master_weights/")] = value
        else:
            state[key] = value
    return state


def load_training_state(path: Path, optimizer, named_parameters: list, trust_pickle: bool = False) -> dict:
    """Restores the optimizer (AdamW moments and the learning-rate schedule) of `named_parameters` ((name in the
    model, parameter) of the trained ones) -> trainer_state.json. The moments are checked against the parameters
    first (CheckpointError naming the file and the tensor as the file names it), then given this process's parameter
    names (the file names them as the model does: accumulators_renamed). A checkpoint of an earlier version
    (optimizer.pdopt, pickle) is read only when trust_pickle (start_point refused it otherwise)."""
    if (path / OPTIMIZER_FILE).is_file():
        state = load_optimizer_state(path / OPTIMIZER_FILE)
        if why := optimizer_state_mismatch(state, named_parameters):
            raise CheckpointError(f"resume_from_checkpoint: {path / OPTIMIZER_FILE} {why}: it is not this model's optimizer state")
        optimizer.set_state_dict(accumulators_renamed(state, {name: parameter.name for name, parameter in named_parameters}))
    elif trust_pickle:
        optimizer.set_state_dict(paddle.load(str(path / "optimizer.pdopt")))
    else:
        raise CheckpointError(f"{path} has no {OPTIMIZER_FILE}")
    return json.loads((path / STATE_FILE).read_text())


# AdamW's tensors per parameter, named <parameter>_<kind>_<n>: the moments have the parameter's shape, the powers one value
MOMENTS, POWERS = ("moment1", "moment2", "moment2_max"), ("beta1_pow_acc", "beta2_pow_acc")
ACCUMULATOR_RE = re.compile(rf"^(.+)_({'|'.join(MOMENTS + POWERS)})_\d+$")


def accumulators_renamed(state: dict, names: dict) -> dict:
    """AdamW's state dict with each parameter's tensors (<name>_<kind>_<n>, master_weights/<name>) renamed by `names`;
    names it does not hold are kept. Paddle names parameters by process-wide counters (linear_12.w_0), which shift
    when a process builds another model first: a checkpoint names them as the model does (model.layers.0...), and a
    resume gives them this process's names back. A file of an earlier version holds paddle's names, kept as they are."""
    renamed = {}
    for key, value in state.items():
        if key == "master_weights":
            renamed[key] = {names.get(name, name): tensor for name, tensor in value.items()}
        elif isinstance(value, paddle.Tensor) and (match := ACCUMULATOR_RE.match(key)):
            renamed[names.get(match[1], match[1]) + key[match.end(1):]] = value
        else:
            renamed[key] = value
    return renamed


def optimizer_state_mismatch(state: dict, named_parameters: list) -> str | None:
    """What in a loaded optimizer state does not fit the trained parameters, (name in the model, parameter), (a moment
    of another shape or dtype, one missing, a schedule that is not numbers), else None. The state names a parameter as
    the model does, or (a file of an earlier version) by paddle's name. Moments are float32 or the parameter's dtype."""
    by_name = {p.name: (name, p) for name, p in named_parameters} | {name: (name, p) for name, p in named_parameters}
    found = set()
    tensors = [(key, value) for key, value in state.items() if isinstance(value, paddle.Tensor)]
    tensors += [(f"master_weights/{key}", value) for key, value in state.get("master_weights", {}).items()]
    for key, value in tensors:
        if key.startswith("master_weights/"):
            name, kind = key.removeprefix("master_weights/"), "master"
        elif match := ACCUMULATOR_RE.match(key):
            name, kind = match.groups()
        else:
            return f"holds {key}, which is none of AdamW's tensors"
        if name not in by_name:
            return f"holds {key}, which belongs to no trained parameter of the model"
        name, parameter = by_name[name]
        shape = [1] if kind in POWERS else list(parameter.shape)
        dtypes = {paddle.float32} if kind in POWERS + ("master",) else {paddle.float32, parameter.dtype}
        if list(value.shape) != shape or value.dtype not in dtypes:
            wanted = " or ".join(sorted(str(dtype).removeprefix("paddle.") for dtype in dtypes))
            return f"holds {key} as {str(value.dtype).removeprefix('paddle.')} {list(value.shape)}, not {wanted} {shape}"
        found.add((name, kind))
    needed = ("moment1", "moment2", *POWERS)  # each parameter's, once any is there (none: saved before the first update)
    if found and (missing := [f"{name}'s {kind}" for name, _ in named_parameters for kind in needed if (name, kind) not in found]):
        return f"lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
    schedule = state.get("LR_Scheduler", {})
    if not isinstance(schedule, dict) or not all(type(v) in (int, float) and math.isfinite(v) for v in schedule.values()):
        return f"holds a learning-rate schedule that is not finite numbers ({str(schedule)[:80]})"
    return None
