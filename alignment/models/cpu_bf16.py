"""bf16 matrix products with fp32 accumulation on CPUs that compute bf16 faster than fp32 (cpu_bf16_matmul).

paddle 3.3 has no CPU bf16 matmul; csrc/grpo_bf16.cc calls the oneDNN paddle ships. Master weights, their
gradients and AdamW stay fp32: each projection multiplies a bf16 copy of its weight, remade when the weight
changes (`Bf16Weights`), so once per optimizer step. What runs in bf16: the decoder layers' projections
(through the training operators, alignment/models/fused_train.py), the log-prob head (algo.chunked_token_logprobs) and
the attention's products (grpo_attention, where the operators were built for AVX512-BF16); the softmax, norms and the
optimizer stay fp32. Measured gains and errors: bench/RESULTS.md.

`auto` turns it on where /proc/cpuinfo lists amx_bf16 or avx512_bf16: elsewhere oneDNN emulates bf16, slower
than fp32. GRPO_CPU_BF16=0 in the environment hides those flags (the tests use it to force the fallback).
"""

import os
from dataclasses import dataclass

import paddle

from alignment.basics.errors import ConfigError

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # in the order the sentence names them: AMX tiles, then AVX-512 dot products


def cpu_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list:
    """The bf16 instruction sets of this CPU that cpuinfo lists (none where GRPO_CPU_BF16=0, or not Linux)."""
    if os.environ.get("GRPO_CPU_BF16", "1") == "0":
        return []
    try:
        with open(cpuinfo) as lines:
            flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in BF16_FLAGS if flag in flags]


@dataclass(frozen=True)
class ComputeChoice:
    bf16: bool
    reason: str  # the sentence the run's first line shows


def choose_compute(setting: str, on_gpu: bool, blocker: str | None) -> ComputeChoice:
    """setting: the cpu_bf16_matmul key (auto, on, off); blocker: why the bf16 matmuls cannot run in this model
    whatever the CPU (fused_train.bf16_unavailable; None: they can). -> whether the CPU matmuls run in bf16,
    and why. `on` where they cannot run is an error."""
    if on_gpu:
        if setting == "on":
            raise ConfigError("cpu_bf16_matmul is on but the model is on a GPU: set bf16 true there (paddle's own AMP)")
        return ComputeChoice(False, "float32 matmuls on the GPU (bf16 there is the bf16 key: paddle's AMP)")
    if setting == "off":
        return ComputeChoice(False, "float32 matmuls (cpu_bf16_matmul off)")
    flags = cpu_bf16_flags()
    why_not = None
    if not flags:
        why_not = "this CPU lists neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo (oneDNN would emulate bf16, slower than fp32)"
    elif blocker:
        why_not = f"the bf16 matmuls cannot run: {blocker}"
    if why_not and setting == "on":
        raise ConfigError(f"cpu_bf16_matmul is on but {why_not}")
    if why_not:
        return ComputeChoice(False, f"float32 matmuls (cpu_bf16_matmul {setting}: {why_not})")
    return ComputeChoice(
        True, f"bf16 matmuls with fp32 accumulation and fp32 master weights (cpu_bf16_matmul {setting}: this CPU has {' and '.join(flags)})"
    )


class Bf16Weights:
    """bf16 copies of fp32 weights, made at first use and kept until clear(), which the trainer calls after every
    optimizer step (fused_train.weights_changed). paddle's in-place version counter does not move when AdamW or
    set_value writes a Parameter (paddle 3.3.1), so the copies cannot tell by themselves."""

    def __init__(self, ops):
        self.ops = ops
        self._copies = {}  # tuple of weight ids -> (the weights, held so the ids stay theirs; their bf16 copy)

    def of(self, weights: tuple) -> paddle.Tensor:
        """weights: (K, N_i) tensors sharing K -> bf16 [W_1 | W_2 | ...] (K, sum N_i)."""
        key = tuple(id(w) for w in weights)
        if key not in self._copies:
            with paddle.no_grad():
                fp32 = weights[0] if len(weights) == 1 else paddle.concat(list(weights), axis=1)
                self._copies[key] = (weights, self.ops.grpo_to_bf16(fp32))
        return self._copies[key][1]

    def clear(self) -> None:
        self._copies.clear()


class Bf16Matmuls:
    """The products the model's training modules and the log-prob head run in bf16."""

    def __init__(self, ops):
        self.ops = ops
        self.weights = Bf16Weights(ops)

    def linear(self, x: paddle.Tensor, weights: tuple) -> paddle.Tensor:
        """x (..., K) @ [W_1 | W_2 | ...] (K, sum N_i) -> fp32 (..., sum N_i), gradients to x and to each W_i."""
        weight_grad = any(not w.stop_gradient for w in weights)
        return self.ops.grpo_bf16_linear(x, weights, self.weights.of(weights), weight_grad)[0]

    def mlp(self, x: paddle.Tensor, gate: paddle.Tensor, up: paddle.Tensor, down: paddle.Tensor) -> paddle.Tensor:
        """down(silu(x @ gate) * (x @ up)) for weights gate, up (K, I) and down (I, N): the products of three linear()
        calls, with SwiGLU's output and gradient written as the bf16 values the next product reads."""
        weight_grad = any(not w.stop_gradient for w in (gate, up, down))
        gate_up_bf16, down_bf16 = self.weights.of((gate, up)), self.weights.of((down,))
        return self.ops.grpo_bf16_mlp(x, (gate, up), down, gate_up_bf16, down_bf16, weight_grad)[0]

    def matmul(self, x: paddle.Tensor, y: paddle.Tensor, transpose_x: bool = False, transpose_y: bool = False) -> paddle.Tensor:
        """op(x) @ op(y) in bf16, fp32 out, no gradient (the log-prob head's PyLayer writes its own); a y that is a
        Parameter multiplies its cached bf16 copy."""
        if isinstance(y, paddle.base.framework.EagerParamBase):
            y = self.weights.of((y,))
        return self.ops.grpo_bf16_matmul(x, y, transpose_x, transpose_y)
