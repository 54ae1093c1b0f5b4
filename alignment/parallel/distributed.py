"""The process group as the trainer sees it: rank, world size, and sums across ranks.

paddle.distributed.launch starts one process per device and sets PADDLE_TRAINER_ID and
PADDLE_TRAINERS_NUM; a plain `python run_grpo.py` is a world of one. With sharding, fleet.init makes
all processes one sharding group (alignment/parallel/sharding.py).
"""

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

from alignment.basics.errors import ConfigError, DistributedError


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    sharding_degree: int = 1  # processes sharing one copy of the optimizer state (sharding: stage1); 1: none

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum of a float64 array over all ranks (identity for one process)."""
        return self._all_reduce(values, dist.ReduceOp.SUM)

    def max(self, values: np.ndarray) -> np.ndarray:
        return self._all_reduce(values, dist.ReduceOp.MAX)

    def sum_named(self, values: dict) -> dict:
        """{name: this process's number} -> {name: the sum over all processes}, in one all-reduce."""
        names = list(values)
        return dict(zip(names, self.sum(np.array([values[name] for name in names], dtype=np.float64))))

    def gather(self, values: np.ndarray) -> np.ndarray:
        """A 1-D float64 array of any length on each rank -> their concatenation in rank order, on every rank:
        each rank writes its values at its offset into zeros and the all-reduce sums them (x + 0 is exact)."""
        if self.size == 1:
            return values
        lengths = self.sum(np.eye(self.size)[self.rank] * len(values)).astype(np.int64)  # (size,)
        placed = np.zeros(lengths.sum())
        offset = lengths[: self.rank].sum()
        placed[offset : offset + len(values)] = values
        return self.sum(placed)

    def first_failure(self, failure: Exception | None, elsewhere: Exception) -> Exception | None:
        """Whether any process failed (every process calls this at the same point) -> this process's own error,
        `elsewhere` (pointing at the others' logs) where only another's failed, or None: all stop together."""
        if not self.max(np.array([float(failure is not None)]))[0]:
            return None
        return failure or elsewhere

    def _all_reduce(self, values: np.ndarray, op) -> np.ndarray:
        if self.size == 1:
            return values
        tensor = paddle.to_tensor(values.astype(np.float64))
        with self.collective("an all-reduce"):
            dist.all_reduce(tensor, op=op)
        return tensor.numpy()

    def broadcast(self, tensor, source: int) -> None:
        with self.collective("a broadcast"):
            dist.broadcast(tensor, src=source)

    @contextmanager
    def collective(self, what: str):
        """Names this process when a collective in the block fails (gloo's timeout or a reset connection,
        raised as paddle's own error types): the other process's log says why it stopped."""
        try:
            yield
        except Exception as e:
            cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise DistributedError(
                f"process {self.rank} of {self.size}: {what} with the other processes failed ({cause}); another "
                f"process has stopped (it died, or fell more than gloo's 30 s timeout behind): its own log "
                f"(<log_dir>/workerlog.<rank>) says why"
            ) from None

    def sum_gradients(self, parameters: list) -> None:
        """Each rank's gradient is its share of a loss already normalised by the global token count,
        so the global gradient is the plain sum over ranks."""
        if self.size == 1:
            return
        for parameter in parameters:
            if parameter.grad is not None:
                with self.collective("an all-reduce"):
                    dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)


def init_world(sharding: str = "", sharding_parallel_degree: int = -1, rollout_workers: int = 0) -> World:
    """rollout_workers > 0: this is the one training process beside them (alignment/rollout/link.py); the launch's
    collective carries the weights to them, and the training world is this process alone."""
    if rollout_workers:
        dist.init_parallel_env()
        return World(rank=0, size=1)
    size = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    degree = (size if sharding_parallel_degree == -1 else sharding_parallel_degree) if sharding else 1
    if degree not in (1, size):
        raise ConfigError(
            f"sharding_parallel_degree = {degree} with {size} processes (the launcher's --nproc_per_node times --nnodes): "
            f"the optimizer state is sharded over all processes or none (-1: all); groups of processes sharing a copy, "
            f"data parallel with one another, need paddle sub-groups that fail to connect over gloo (CPU) and have not "
            f"been run on GPUs"
        )
    if degree > 1:
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": degree}
        strategy.hybrid_configs["sharding_configs"].use_reduce_avg = paddle.is_compiled_with_cuda()  # gloo has no AVG reduce
        fleet.init(is_collective=True, strategy=strategy)
    elif size > 1:
        dist.init_parallel_env()
    return World(rank=int(os.environ.get("PADDLE_TRAINER_ID", "0")), size=size, sharding_degree=degree)


@paddle.no_grad()
def squared_grad_norm(parameters: list) -> float:
    # paddle.square, not ** 2: paddle's CPU pow kernel took 86 ms over the tiny model's 50 gradients, square 2 ms
    squares = [paddle.square(p.grad.astype("float32")).sum() for p in parameters if p.grad is not None]
    return float(paddle.add_n(squares)) if squares else 0.0
