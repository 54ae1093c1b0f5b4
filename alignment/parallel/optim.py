"""AdamW with warmup and a constant, linear or cosine schedule, and gradient-norm clipping."""

import math
from dataclasses import dataclass

import paddle

from alignment.algo.schedule import learning_rate_factor
from alignment.parallel.distributed import World, squared_grad_norm


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer section of a run's settings (alignment/run/build.py makes it from the config)."""

    learning_rate: float
    min_learning_rate: float  # the schedule's floor
    lr_scheduler_type: str  # a name in alignment/algo/schedule.py's SCHEDULES
    warmup_steps: int
    warmup_ratio: float  # of the run's steps, where warmup_steps is 0
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    weight_decay: float
    max_grad_norm: float  # 0: no clipping
    multi_precision: bool  # fp32 master weights and moments for half-precision weights (bf16, fp16)


def build_optimizer(model, config: OptimizerSettings, total_steps: int, world: World = World(0, 1)):
    """-> (optimizer, scheduler) over the model's trainable parameters (with LoRA, the adapters only: no
    moments for frozen weights). Weight decay skips biases and norm weights (the usual convention).
    With sharding, a ShardedOptimizer that keeps this process's share of the moments."""
    warmup = config.warmup_steps or int(config.warmup_ratio * total_steps)
    floor = config.min_learning_rate / config.learning_rate if config.learning_rate > 0 else 0.0
    scheduler = paddle.optimizer.lr.LambdaDecay(
        config.learning_rate,
        lambda step: learning_rate_factor(step, total_steps, warmup, config.lr_scheduler_type, floor),
    )
    no_decay = {p.name for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n}
    parameters = [p for p in model.parameters() if not p.stop_gradient]
    optimizer = paddle.optimizer.AdamW(
        learning_rate=scheduler,
        parameters=parameters,
        beta1=config.adam_beta1,
        beta2=config.adam_beta2,
        epsilon=config.adam_epsilon,
        weight_decay=config.weight_decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
        # sharded: ShardedOptimizer clips with the norm over every process's share
        grad_clip=paddle.nn.ClipGradByGlobalNorm(config.max_grad_norm) if config.max_grad_norm > 0 and world.sharding_degree == 1 else None,
        multi_precision=config.multi_precision,
    )
    if world.sharding_degree > 1:
        from alignment.parallel.sharding import ShardedOptimizer

        return ShardedOptimizer(optimizer, parameters, world, config.max_grad_norm), scheduler
    return optimizer, scheduler


def sum_gradients(optimizer, parameters: list, world: World) -> float:
    """Sums each gradient over the processes (each holds its share of a loss already divided by the
    global token count) -> the global gradient norm, the same on every process."""
    if world.sharding_degree > 1:
        return optimizer.reduce_gradients()  # to the processes that own each parameter
    world.sum_gradients(parameters)
    return global_grad_norm(parameters)


def global_grad_norm(parameters: list) -> float:
    return math.sqrt(squared_grad_norm(parameters))
