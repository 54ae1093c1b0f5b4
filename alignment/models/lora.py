"""LoRA adapters on the actor (paddleformers.peft), saved, loaded and merged in Hugging Face peft's layout.

apply_lora replaces the targeted Linear layers of the model in place with paddleformers' LoRALinear,
which computes x @ W + dropout(x) @ A @ B * (alpha / r) with W (in, out) the frozen base weight, A (in, r)
Kaiming-initialised and B (r, out) zero, so a fresh adapter leaves the model's output unchanged. Every base
parameter (embeddings, norms, lm_head included) gets stop_gradient; only the A and B matrices train.

The model keeps its own class and attribute layout (model.model.layers, model.lm_head, ...): paddleformers'
LoRAModel wrapper is used only to build the layers and is then dropped, since the trainer, the rollout
engines and the training operators all address the model's own attributes.

On disk an adapter is what Hugging Face peft writes and reads (and vLLM serves): adapter_config.json and
adapter_model.safetensors with names like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
and torch's (out, in) layout, A as (r, in) and B as (out, r).
"""

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import paddle
from paddle import nn
from paddleformers.peft import LoRAConfig, LoRAModel
from paddleformers.peft.lora.lora_layers import LoRALinear
from safetensors.numpy import load_file, save_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
HF_PREFIX = "base_model.model."  # peft's PeftModelForCausalLM -> LoraModel -> the transformers model


def apply_lora(model, rank: int, alpha: float, dropout: float, target_modules: list):
    """Adds LoRA adapters to the Linear layers whose names end in one of target_modules (a full dotted name
    or its last parts, as peft and ms-swift match them) and freezes everything else -> the same model."""
    if not isinstance(rank, int) or rank <= 0:
        raise ValueError(f"lora_rank must be a positive integer, got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"lora_alpha must be positive, got {alpha!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"lora_dropout must be in [0, 1), got {dropout!r}")
    if lora_layers(model):
        raise ValueError(f"{type(model).__name__} already has LoRA adapters")
    names = target_layer_names(model, target_modules)
    config = LoRAConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=[re.escape(name) for name in names],  # paddleformers matches each as a full regex
        dtype=paddle.base.data_feeder.convert_dtype(model.lm_head.weight.dtype),  # the adapters in the model's dtype
        tensor_model_parallel_size=model.config.tensor_model_parallel_size,
    )
    LoRAModel(model, config)  # swaps the layers inside `model` and sets stop_gradient on all but lora_A / lora_B
    model.get_input_embeddings().register_forward_post_hook(_embeddings_carry_gradient)
    return model


def _embeddings_carry_gradient(layer, inputs, output):
    # paddleformers recomputes a decoder layer (recompute: true) only when its input carries a gradient; with
    # the embeddings frozen the first layer's would not, and that layer would keep its activations. Marking
    # the embedding output (as transformers' enable_input_require_grads does) costs one (B, T, Hd) gradient.
    if paddle.is_grad_enabled():
        output.stop_gradient = False
    return output


def target_layer_names(model, target_modules: list) -> list:
    """The dotted names of the Linear layers target_modules selects; a ValueError names a target that
    matches nothing, or matches something that is not a Linear layer, with the Linear names there are."""
    if isinstance(target_modules, str) or not target_modules:
        raise ValueError(f"target_modules must be a non-empty list of module names, got {target_modules!r}")
    layers = dict(model.named_sublayers())
    linear_suffixes = sorted({name.rsplit(".", 1)[-1] for name, layer in layers.items() if isinstance(layer, nn.Linear)})
    chosen = set()
    for target in target_modules:
        matched = [name for name in layers if name == target or name.endswith("." + target)]
        if not matched:
            raise ValueError(
                f"target_modules: {target!r} matches no module of {type(model).__name__}; "
                f"its Linear layers are named {', '.join(linear_suffixes)}"
            )
        not_linear = [f"{name} ({type(layers[name]).__name__})" for name in matched if not isinstance(layers[name], nn.Linear)]
        if not_linear:
            raise ValueError(
                f"target_modules: {target!r} matches {', '.join(not_linear[:3])}, not a Linear layer; LoRA applies to "
                f"Linear layers: {', '.join(linear_suffixes)}"
            )
        chosen.update(matched)
    return sorted(chosen)


def lora_layers(model) -> dict:
    """Dotted name -> LoRALinear, for every adapter in the model."""
    return {name: layer for name, layer in model.named_sublayers() if isinstance(layer, LoRALinear)}


def has_lora(model) -> bool:
    return bool(lora_layers(model))


def is_lora(layer) -> bool:
    """Whether the layer is an adapter's (LoRALinear), active or not."""
    return isinstance(layer, LoRALinear)


def _active(layer) -> bool:
    return isinstance(layer, LoRALinear) and not layer.disable_lora and not layer.merged


def effective_weight(linear) -> paddle.Tensor:
    """The (in, out) weight a Linear layer applies: its own Parameter, or for a layer with an active adapter
    a new tensor W + A @ B * scale (the same arithmetic as merge_adapter's)."""
    return linear.weight + linear.get_delta_weight() if _active(linear) else linear.weight


def lora_update(linear, x: paddle.Tensor):
    """The adapter's term of linear(x), dropout(x) @ A @ B * scale (..., out) as LoRALinear's forward adds
    it, or None for a layer without an active adapter."""
    if not _active(linear):
        return None
    return (linear.lora_dropout(x) @ linear.lora_A @ linear.lora_B) * linear.scaling


@contextlib.contextmanager
def adapters_disabled(model):
    """The base model's forward inside the block (the adapters skipped, not zeroed): with LoRA, the
    reference policy of the KL term is the actor itself with its adapters off, and needs no second model."""
    layers = [layer for layer in lora_layers(model).values() if not layer.disable_lora]
    for layer in layers:
        layer.disable_lora = True
    try:
        yield model
    finally:
        for layer in layers:
            layer.disable_lora = False


# --- on disk: Hugging Face peft's layout -----------------------------------------------------------------


def save_adapter(model, folder, base_model_name_or_path: str | None = None) -> None:
    """Writes adapter_config.json and adapter_model.safetensors (A and B of every adapter, nothing else)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no LoRA adapters to save")
    first = next(iter(layers.values()))
    tensors = {}
    for name, layer in layers.items():
        tensors[f"{HF_PREFIX}{name}.lora_A.weight"] = np.ascontiguousarray(layer.lora_A.numpy().T)  # (r, in)
        tensors[f"{HF_PREFIX}{name}.lora_B.weight"] = np.ascontiguousarray(layer.lora_B.numpy().T)  # (out, r)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": first.r,
        "lora_alpha": first.lora_alpha,
        "lora_dropout": first.lora_dropout.p if isinstance(first.lora_dropout, nn.Dropout) else 0.0,
        "target_modules": sorted({name.rsplit(".", 1)[-1] for name in layers}),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))


def read_adapter(folder) -> tuple:
    """-> (adapter_config.json as a dict, {layer name: (A (in, r), B (r, out))} in paddle's layout)."""
    folder = Path(folder)
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ValueError(f"{folder}: no {ADAPTER_CONFIG}, so not a LoRA adapter or LoRA checkpoint")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    unsupported = {key: config[key] for key in ("use_rslora", "use_dora", "modules_to_save") if config.get(key)}
    if config.get("peft_type", "LORA") != "LORA" or config.get("bias", "none") != "none" or unsupported:
        raise ValueError(
            f"{folder / ADAPTER_CONFIG}: only plain LoRA adapters load here (peft_type LORA, bias none), got {unsupported or config}"
        )
    pairs = {}
    for key, value in load_file(str(folder / ADAPTER_WEIGHTS)).items():
        match = re.fullmatch(re.escape(HF_PREFIX) + r"(.+)\.lora_([AB])\.weight", key)
        if not match:
            raise ValueError(f"{folder / ADAPTER_WEIGHTS}: unexpected tensor {key!r}")
        pairs.setdefault(match.group(1), {})[match.group(2)] = value.T  # torch's (out, in) -> paddle's (in, out)
    incomplete = sorted(name for name, pair in pairs.items() if len(pair) != 2)
    if incomplete:
        raise ValueError(f"{folder / ADAPTER_WEIGHTS}: {incomplete[0]} lacks lora_A or lora_B")
    return config, {name: (pair["A"], pair["B"]) for name, pair in pairs.items()}


def load_adapter(model, folder) -> None:
    """Sets the model's adapters (apply_lora first, with the checkpoint's rank, alpha and targets) from a
    saved adapter; a ValueError names what does not match."""
    config, weights = read_adapter(folder)
    layers = lora_layers(model)
    first = next(iter(layers.values()), None)
    if first is None:
        raise ValueError(f"{type(model).__name__} has no LoRA adapters to load {folder} into (apply_lora first)")
    if (config["r"], float(config["lora_alpha"])) != (first.r, float(first.lora_alpha)):
        raise ValueError(
            f"{folder}: the adapter has r {config['r']}, lora_alpha {config['lora_alpha']}; the model's adapters "
            f"have lora_rank {first.r}, lora_alpha {first.lora_alpha}"
        )
    if set(weights) != set(layers):
        missing, extra = sorted(set(layers) - set(weights)), sorted(set(weights) - set(layers))
        differences = [f"{len(names)} {where} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                       for names, where in ((missing, "only in the model"), (extra, "only in the adapter")) if names]
        raise ValueError(f"{folder}: the adapter's layers differ from the model's (target_modules): {'; '.join(differences)}")
    for name, layer in layers.items():
        for parameter, value in zip((layer.lora_A, layer.lora_B), weights[name]):
            if list(parameter.shape) != list(value.shape):
                raise ValueError(f"{folder}: {name} has shape {list(value.shape)} there, {list(parameter.shape)} in the model")
            parameter.set_value(paddle.to_tensor(value, dtype=parameter.dtype))


@paddle.no_grad()
def merge_adapter(model, folder) -> list:
    """Adds a saved adapter into a plain (adapter-free) model's weights, W <- W + A @ B * (alpha / r) in
    float32 and then the model's dtype -> the names of the merged layers."""
    config, weights = read_adapter(folder)
    scaling = float(config["lora_alpha"]) / config["r"]
    layers = dict(model.named_sublayers())
    for name, (a, b) in weights.items():
        layer = layers.get(name)
        if not isinstance(layer, nn.Linear) or isinstance(layer, LoRALinear):
            found = "nothing" if layer is None else type(layer).__name__
            raise ValueError(f"{folder}: the adapter targets {name}, which is {found} in {type(model).__name__}, not a plain Linear layer")
        if (a.shape[0], b.shape[1]) != tuple(layer.weight.shape):
            raise ValueError(f"{folder}: {name} is {a.shape[0]}x{b.shape[1]} in the adapter, {list(layer.weight.shape)} in the model")
        delta = paddle.to_tensor(a, dtype="float32") @ paddle.to_tensor(b, dtype="float32") * scaling  # (in, out)
        layer.weight.set_value((layer.weight.astype("float32") + delta).astype(layer.weight.dtype))
    return sorted(weights)
