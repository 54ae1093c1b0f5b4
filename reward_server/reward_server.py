"""Rule-reward HTTP server, a drop-in for PaddleNLP's reward_server.py.

    python reward_server/reward_server.py --port 8731 [--host 127.0.0.1] [--workers N] [--api-key KEY]
        [--plugins FILE.py ...] [--reward_funcs accuracy format] [--log_file rm_server.log]

Endpoints: POST / (PaddleNLP: src/tgt/response -> score), POST /v1/score, GET /v1/reward_funcs,
GET /health, GET /openapi.json. With an API key (--api-key or $GRPO_REWARD_SERVER_API_KEY) every
endpoint but /health and the API documentation needs `Authorization: Bearer KEY`.
"""

import argparse
import logging
import os
import sys
from pathlib import Path

if not __package__:
    # Run as a file from a checkout: its folder would shadow the reward_server package, so put the
    # repository root first instead (worker processes inherit this path).
    _here = Path(__file__).resolve().parent
    sys.path[:] = [str(_here.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _here]

import uvicorn  # noqa: E402

from alignment.rewards import get_reward  # noqa: E402
from alignment.rewards.plugins import load_plugins  # noqa: E402
from reward_server.app import Settings, create_app  # noqa: E402
from reward_server.middleware import access_log  # noqa: E402
from reward_server.pool import ScoringPool  # noqa: E402

API_KEY_ENV = "GRPO_REWARD_SERVER_API_KEY"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to bind; anything but loopback exposes the server")
    add("--port", type=int, default=8731)
    # Beyond a few workers the HTTP side, not scoring (~30 us an item), bounds throughput.
    add(
        "--workers",
        type=int,
        default=min(os.cpu_count() or 1, 8),
        help="scoring processes (default: CPU count, at most 8)",
    )
    add("--api-key", "--api_key", dest="api_key", default=None, help=f"bearer token (default: ${API_KEY_ENV})")
    add(
        "--plugins",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE.py",
        help="files of @register_reward functions",
    )
    add(
        "--reward_funcs",
        nargs="+",
        default=["accuracy", "format"],
        help="what POST / applies (and /v1/score by default)",
    )
    add("--reward_weights", nargs="+", type=float, default=None, help="one per reward function (default: all 1.0)")
    add(
        "--item_timeout",
        type=float,
        default=10.0,
        help="seconds one item may take before it fails and its worker is replaced",
    )
    add("--max_items", type=int, default=4096, help="most items per request (more: 422)")
    add("--max_body_bytes", type=int, default=16 * 2**20, help="largest request body (larger: 413)")
    add("--log_file", default=None, help="one line per request (default: stderr)")
    args = parser.parse_args(argv)
    args.plugins = [str(Path(p).resolve()) for p in args.plugins]  # workers may not share our working directory
    args.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None  # an empty key would match an empty header
    if args.reward_weights is None:
        args.reward_weights = [1.0] * len(args.reward_funcs)
    if len(args.reward_weights) != len(args.reward_funcs):
        parser.error(
            f"--reward_weights has {len(args.reward_weights)} values for {len(args.reward_funcs)} --reward_funcs"
        )
    if args.workers < 1 or args.item_timeout <= 0 or args.max_items < 1 or args.max_body_bytes < 1:
        parser.error("--workers, --item_timeout, --max_items and --max_body_bytes must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        load_plugins(args.plugins)  # here too: names are checked and listed in the server process
        for name in args.reward_funcs:
            get_reward(name)
    except (ImportError, OSError, ValueError) as exc:
        sys.exit(f"reward_server: {exc}")
    handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False
    if args.host not in LOOPBACK and not args.api_key:
        print(f"reward_server: warning: listening on {args.host} without an API key", file=sys.stderr)

    settings = Settings(
        reward_funcs=args.reward_funcs,
        reward_weights=args.reward_weights,
        api_key=args.api_key,
        max_items=args.max_items,
        max_body_bytes=args.max_body_bytes,
    )
    pool = ScoringPool(workers=args.workers, item_timeout=args.item_timeout, plugins=args.plugins)
    # Our access log replaces uvicorn's, which lacks item counts and errors.
    uvicorn.run(create_app(settings, pool), host=args.host, port=args.port, access_log=False)


if __name__ == "__main__":
    main()
