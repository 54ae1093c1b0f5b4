"""sharding: stage1 (ZeRO-1): each process keeps the AdamW state of its share of the parameters only.

paddle's DygraphShardingOptimizer assigns every parameter to one process (largest first, to the process
with the fewest elements so far), reduces each gradient to that owner, updates the owned parameters and
broadcasts them back. The moments (2x the weights in fp32) are split over the processes; weights and
gradients stay whole on every process. The update is plain data parallel's:

- the loss is already divided by the global token count, so the gradient wanted is the sum over processes;
  paddle averages, so the owned gradients are scaled back by the number of processes;
- the global norm is summed from every process's owned gradients, and NaN steps are skipped on every
  process alike;
- clipping scales the owned gradients by max_grad_norm / norm, as ClipGradByGlobalNorm does over all of them.

Checkpoints hold the whole state, gathered onto the main process: the same optimizer.safetensors as a run
without sharding, so a run resumes with any number of processes and any sharding degree.
"""

import math

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import DygraphShardingOptimizer

from alignment.parallel.distributed import World, squared_grad_norm


class ShardedOptimizer:
    """The trainer's optimizer under sharding: reduce_gradients() -> global norm, then step() and
    clear_grad(); state_dict() is a collective (every process calls it) that returns the whole state on
    the main process."""

    def __init__(self, optimizer: paddle.optimizer.AdamW, parameters: list, world: World, max_grad_norm: float):
        self.parameters, self.world, self.max_grad_norm = parameters, world, max_grad_norm  # all trainable ones
        self.hcg = fleet.get_hybrid_communicate_group()
        self.sharded = DygraphShardingOptimizer(optimizer, self.hcg)
        self.owned = self.sharded.filter_parameters(self.parameters, self.hcg)
        self.norm = 0.0

    @paddle.no_grad()
    def reduce_gradients(self) -> float:
        with self.world.collective("the gradients' reduction"):
            self.sharded.reduce_gradients(self.parameters, self.hcg)  # each owner: the mean over the processes
        for parameter in self.owned:
            parameter.grad.scale_(float(self.world.size))  # mean -> sum
        self.norm = math.sqrt(self.world.sum(np.array([squared_grad_norm(self.owned)]))[0])
        return self.norm

    @paddle.no_grad()
    def step(self) -> None:
        if 0 < self.max_grad_norm < self.norm:
            for parameter in self.owned:
                parameter.grad.scale_(self.max_grad_norm / self.norm)
        with self.world.collective("the updated parameters' broadcast"):
            self.sharded.step()  # AdamW on the owned parameters, then each owner broadcasts them

    def clear_grad(self) -> None:
        self.sharded.clear_grad()

    def set_state_dict(self, state: dict) -> None:
        self.sharded.set_state_dict(dict(state))  # keeps the owned parameters' entries (it pops keys: a copy)

    def state_dict(self) -> dict:
        """Every process sends its owned entries, tensor by tensor, so none holds more than its shard and
        one tensor; the main process collects them on the host."""
        local = self.sharded.state_dict()
        tensors = {key: value for key, value in local.items() if isinstance(value, paddle.Tensor)}
        tensors |= {("master_weights", key): value for key, value in local.get("master_weights", {}).items()}
        listings = []
        with self.world.collective("an all-gather"):
            dist.all_gather_object(listings, [(key, value.shape, value.dtype) for key, value in tensors.items()])
        # the learning-rate schedule, the same on every process
        whole = {key: value for key, value in local.items() if key != "master_weights" and not isinstance(value, paddle.Tensor)}
        for source, listing in enumerate(listings):
            for key, shape, dtype in listing:
                tensor = tensors[key] if self.world.rank == source else paddle.empty(shape, dtype)
                self.world.broadcast(tensor, source)
                if self.world.is_main:
                    if isinstance(key, tuple):
                        whole.setdefault(key[0], {})[key[1]] = tensor.cpu()
                    else:
                        whole[key] = tensor.cpu()
        return whole if self.world.is_main else local
