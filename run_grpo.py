"""Train a causal LM with GRPO from one JSON file:

    python -m paddle.distributed.launch --nproc_per_node 1 run_grpo.py config/tiny/grpo_argument.json [--key value ...]
"""

import sys

from alignment.runtime import configure_cpu_runtime, import_paddle

configure_cpu_runtime()  # thread count, MKL path and paddle flags must be set before paddle loads
import_paddle()

from alignment.checkpoint import CheckpointError  # noqa: E402
from alignment.config import ConfigError, load_config  # noqa: E402
from alignment.data import DataError  # noqa: E402
from alignment.distributed import DistributedError  # noqa: E402
from alignment.logger import LogWriteError  # noqa: E402
from alignment.optim import NonFiniteError  # noqa: E402
from alignment.rewards.remote import RewardServerError  # noqa: E402
from alignment.rollout import WeightSyncError  # noqa: E402


def main(argv: list | None = None) -> int:
    try:
        config = load_config(sys.argv[1:] if argv is None else argv)
        from alignment.trainer import train

        checkpoint = train(config)
    except (ConfigError, DataError, RewardServerError, WeightSyncError, NonFiniteError, DistributedError, CheckpointError, LogWriteError) as e:
        print(f"run_grpo: error: {e}", file=sys.stderr)
        return 2
    if checkpoint is not None:
        print(
            f"\ncheckpoint: {checkpoint}\n"
            f"metrics:    {config.output_dir}/metrics.jsonl (completions: {config.output_dir}/completions.jsonl)\n"
            f"curves:     {config.output_dir}/curves.png\n"
            f"dashboard:  visualdl --logdir {config.resolved_logging_dir}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
