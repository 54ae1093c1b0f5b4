"""AdamW with warmup and a constant, linear or cosine schedule, and gradient-norm clipping."""

import paddle

from alignment.algo import learning_rate_factor


class NonFiniteError(RuntimeError):
    """The loss or the gradients stayed NaN or infinite for max_consecutive_skips steps in a row."""


def build_optimizer(model, config, total_steps: int):
    """-> (optimizer, scheduler) over the model's trainable parameters (with LoRA, the adapters only: no
    moments for frozen weights). Weight decay skips biases and norm weights (the usual convention)."""
    warmup = config.warmup_steps or int(config.warmup_ratio * total_steps)
    floor = config.min_learning_rate / config.learning_rate if config.learning_rate > 0 else 0.0
    scheduler = paddle.optimizer.lr.LambdaDecay(
        config.learning_rate,
        lambda step: learning_rate_factor(step, total_steps, warmup, config.lr_scheduler_type, floor),
    )
    no_decay = {p.name for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=scheduler,
        parameters=[p for p in model.parameters() if not p.stop_gradient],
        beta1=config.adam_beta1,
        beta2=config.adam_beta2,
        epsilon=config.adam_epsilon,
        weight_decay=config.weight_decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(config.max_grad_norm) if config.max_grad_norm > 0 else None,
        multi_precision=config.bf16 or config.fp16,  # fp32 master weights and moments for half-precision weights
    )
    return optimizer, scheduler


@paddle.no_grad()
def global_grad_norm(parameters: list) -> float:
    # paddle.square, not ** 2: paddle's CPU pow kernel took 86 ms over the tiny model's 50 gradients, square 2 ms
    squares = [paddle.square(p.grad.astype("float32")).sum() for p in parameters if p.grad is not None]
    return float(paddle.sqrt(paddle.add_n(squares))) if squares else 0.0
