"""The process group as the trainer sees it: rank, world size, and sums across ranks.

paddle.distributed.launch starts one process per device and sets PADDLE_TRAINER_ID and
PADDLE_TRAINERS_NUM; a plain `python run_grpo.py` is a world of one.
"""

import os
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.distributed as dist


class DistributedError(RuntimeError):
    """A collective operation failed because another process stopped; the message names this process."""


@dataclass(frozen=True)
class World:
    rank: int
    size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum of a float64 array over all ranks (identity for one process)."""
        return self._all_reduce(values, dist.ReduceOp.SUM)

    def max(self, values: np.ndarray) -> np.ndarray:
        return self._all_reduce(values, dist.ReduceOp.MAX)

    def _all_reduce(self, values: np.ndarray, op) -> np.ndarray:
        if self.size == 1:
            return values
        tensor = paddle.to_tensor(values.astype(np.float64))
        self._collective(dist.all_reduce, tensor, op=op)
        return tensor.numpy()

    def _collective(self, operation, tensor, **kwargs) -> None:
        try:
            operation(tensor, **kwargs)
        except Exception as e:  # gloo's timeout or a reset connection, raised as paddle's own error types
            cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise DistributedError(
                f"process {self.rank} of {self.size}: an all-reduce with the other processes failed ({cause}); another "
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
                self._collective(dist.all_reduce, parameter.grad, op=dist.ReduceOp.SUM)


def init_world() -> World:
    size = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if size > 1:
        dist.init_parallel_env()
    return World(rank=int(os.environ.get("PADDLE_TRAINER_ID", "0")), size=size)
