"""Rule-reward HTTP server, a drop-in for PaddleNLP's reward_server.py.

    python reward_server/reward_server.py --port 8731 [--host 127.0.0.1] [--workers N] [--api-key-file FILE]
        [--plugins FILE.py ...] [--reward_funcs accuracy format] [--log_file rm_server.log]

Endpoints: POST / (PaddleNLP: src/tgt/response -> score), POST /v1/score, GET /v1/reward_funcs,
GET /health, GET /openapi.json (no /docs page: it would load JavaScript from a CDN). With an API key
(--api-key-file FILE, $GRPO_REWARD_SERVER_API_KEY_FILE or $GRPO_REWARD_SERVER_API_KEY: a file only its user can read, or
the environment, so that the key is not in `ps`; --api-key KEY too, with a warning) every endpoint but /health and the
schema needs `Authorization: Bearer KEY`. Stalled connections are closed (--header_timeout, --body_timeout), each
request gets --request_timeout seconds of scoring, and a request whose client went away stops.
"""

import argparse
import functools
import logging
import os
import sys
from pathlib import Path

if not __package__:
    # Run as a file from a checkout: its folder would shadow the reward_server package, so put the
    # repository root first instead (worker processes inherit this path).
    _here = Path(__file__).resolve().parent
    sys.path[:] = [str(_here.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _here]

import h11  # noqa: E402
import uvicorn  # noqa: E402
from uvicorn.protocols.http.h11_impl import H11Protocol  # noqa: E402

from alignment.basics.errors import ConfigError  # noqa: E402
from alignment.basics.key_files import key_from_environment, read_key_file  # noqa: E402
from alignment.rewards import get_reward  # noqa: E402
from alignment.rewards.pool import ScoringPool  # noqa: E402
from alignment.basics.plugins import plugin_sources  # noqa: E402
from reward_server.app import Settings, create_app  # noqa: E402
from reward_server.body import MAX_JSON_DEPTH, MAX_JSON_VALUES  # noqa: E402
from reward_server.middleware import access_log  # noqa: E402

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
    add(
        "--api-key-file",
        "--api_key_file",
        dest="api_key_file",
        help=f"a file only this user can read (chmod 600) holding the bearer token (default: ${API_KEY_ENV}_FILE's, "
        f"else ${API_KEY_ENV}; none: no key)",
    )
    add("--api-key", "--api_key", dest="api_key", help="the bearer token itself, which `ps` shows: prefer --api-key-file")
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
    add(
        "--request_timeout",
        type=float,
        default=30.0,
        help="seconds of scoring per request; items not scored by then get an error (keep it under the "
        "trainer's reward_server_timeout)",
    )
    add("--max_items", type=int, default=4096, help="most items per request (more: 422)")
    add("--max_body_bytes", type=int, default=16 * 2**20, help="largest request body (larger: 413)")
    add("--max_json_values", type=int, default=MAX_JSON_VALUES,
        help=f"most JSON values in a request body, counted before it is parsed (more: 422; default {MAX_JSON_VALUES})")
    add("--max_json_depth", type=int, default=MAX_JSON_DEPTH,
        help=f"deepest nesting of a request body's JSON, measured before it is parsed (deeper: 422; default {MAX_JSON_DEPTH})")
    add("--header_timeout", type=float, default=10.0, help="seconds to receive a request's headers (else closed)")
    add("--body_timeout", type=float, default=60.0, help="seconds to receive a request's body (else 408)")
    add("--log_file", default=None, help="one line per request (default: stderr)")
    args = parser.parse_args(argv)
    args.plugins = [str(Path(p).resolve()) for p in args.plugins]  # workers may not share our working directory
    try:
        args.api_key = server_key(args)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.reward_weights is None:
        args.reward_weights = [1.0] * len(args.reward_funcs)
    if len(args.reward_weights) != len(args.reward_funcs):
        parser.error(
            f"--reward_weights has {len(args.reward_weights)} values for {len(args.reward_funcs)} --reward_funcs"
        )
    positive = ["workers", "item_timeout", "request_timeout", "max_items", "max_body_bytes", "max_json_values", "max_json_depth"]
    positive += ["header_timeout", "body_timeout"]
    if not all(getattr(args, name) > 0 for name in positive):
        parser.error(f"{', '.join('--' + name for name in positive)} must be positive")
    return args


def server_key(args: argparse.Namespace) -> str | None:
    """--api-key-file's key, else --api-key (with a warning: any user sees it in `ps`), else the environment's
    ($GRPO_REWARD_SERVER_API_KEY_FILE's file, else $GRPO_REWARD_SERVER_API_KEY); an empty key is none (it would match
    an empty header)."""
    if args.api_key_file and args.api_key:
        raise ConfigError("give --api-key-file or --api-key, not both")
    if args.api_key_file:
        return read_key_file(args.api_key_file, "--api-key-file")
    if args.api_key:
        print("reward_server: warning: --api-key puts the key in the command line, which `ps` shows to every user: "
              f"use --api-key-file FILE (chmod 600) or ${API_KEY_ENV}", file=sys.stderr)
        return args.api_key
    return key_from_environment(API_KEY_ENV)


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers take more than head_timeout
    seconds to arrive (uvicorn itself waits for them for ever: a stalled client would hold the connection).
    It reads H11Protocol's own state (conn, loop, transport, timeout_keep_alive_task: uvicorn 0.54)."""

    def __init__(self, *args, head_timeout: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self.head_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def connection_lost(self, exc) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        # IDLE: no complete request head yet. Between requests an idle connection is uvicorn's keep-alive
        # timeout's (it ends when a byte arrives); from the first byte of a head, this timer runs.
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting:
            self._stop_timer()
        elif self.head_timer is None and self.timeout_keep_alive_task is None:
            self.head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _stop_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        plugins = plugin_sources(args.plugins)  # read once: the workers execute this text
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
        body_timeout=args.body_timeout,
        request_timeout=args.request_timeout,
        max_json_values=args.max_json_values,
        max_json_depth=args.max_json_depth,
    )
    # One request holds at most all workers but one, so a request that comes while it runs starts at once.
    pool = ScoringPool(args.workers, args.item_timeout, plugins, job_workers=args.workers - 1)
    protocol = functools.partial(HeadTimeoutProtocol, head_timeout=args.header_timeout)
    # Our access log replaces uvicorn's, which lacks item counts and errors.
    uvicorn.run(create_app(settings, pool), host=args.host, port=args.port, access_log=False, http=protocol)


if __name__ == "__main__":
    main()
