"""The trainer's client for the reward server: one request per step, retried, never silently zero; each
attempt, from connecting to the last byte of the answer, ends after reward_server_timeout seconds.

protocol "v1" posts to /v1/score and gets each function's values and each item's error; "paddlenlp"
posts PaddleNLP's {"src", "tgt", "response"} to / and gets totals only (columns is then empty): that
server applies its own reward functions with its own settings, and neither the other dataset columns
(completion_tokens among them) nor the RewardSettings travel. A PaddleNLP answer of HTTP 200 with a
nonzero error_code and no null score is a failed batch (PaddleNLP's server sends zeros then): it is
retried like a 5xx, and its zeros are never taken for scores.
"""

import dataclasses
from dataclasses import dataclass
from collections.abc import Callable, Mapping

import anyio
import httpx

from alignment.basics.errors import RewardServerError

from .scoring import ScoreTable
from .settings import RewardSettings

BACKOFF_S = 0.5  # first wait between attempts; doubled after each failure
MAX_BACKOFF_S = 8.0


@dataclass(frozen=True)
class RewardServer:
    """Where and how the trainer's client reaches a reward server (the reward_server_* keys)."""

    url: str
    protocol: str  # "v1", or "paddlenlp" (PaddleNLP's POST / with src, tgt, response: totals only)
    timeout: float  # seconds a request may take in all
    retries: int
    api_key: str | None = None
    backoff_s: float = BACKOFF_S  # the first retry's wait, doubled each time


def score_remote(
    completions: list[str], samples: list[Mapping], names: list[str], weights: list[float], server: RewardServer,
    settings: RewardSettings | None = None,
) -> ScoreTable:
    url, protocol, api_key = server.url, server.protocol, server.api_key
    if len(completions) != len(samples):
        raise ValueError(f"{len(completions)} completions but {len(samples)} samples")
    if protocol == "v1":
        endpoint = url.rstrip("/") + "/v1/score"
        items = [{**sample, "completion": completion} for completion, sample in zip(completions, samples, strict=True)]
        body = {"items": items, "reward_funcs": list(names), "reward_weights": list(weights)}
        if settings is not None:  # else the server's defaults: cosine_max_len and soft_max_length unset
            body["reward_settings"] = dataclasses.asdict(settings)
    elif protocol == "paddlenlp":
        # The server applies its own --reward_funcs; names, weights and settings cannot travel in this protocol.
        endpoint = url.rstrip("/") + "/"
        body = {
            # the prompt as the model saw it (chat template included), as PaddleNLP's trainer sends it
            "src": [_text(sample.get("prompt_text", sample.get("prompt"))) for sample in samples],
            "tgt": [_text(sample.get("answer")) for sample in samples],
            "response": list(completions),
        }
    else:
        raise ValueError(f"reward server protocol must be 'v1' or 'paddlenlp', got {protocol!r}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    failed = _paddlenlp_failure if protocol == "paddlenlp" else None
    answer = _post(endpoint, body, headers, failed, timeout=server.timeout, retries=server.retries, backoff_s=server.backoff_s)
    try:
        table = _read_v1(answer, names) if protocol == "v1" else _read_paddlenlp(answer)
    except (KeyError, TypeError, ValueError) as exc:
        raise RewardServerError(
            f"reward server {endpoint} gave an unusable answer: {type(exc).__name__}: {exc}"
        ) from None
    if not all(len(column) == len(completions) for column in [table.totals, table.errors, *table.columns.values()]):
        raise RewardServerError(
            f"reward server {endpoint} answered a different number of items than the {len(completions)} sent"
        )
    return table


def _text(value) -> str:
    return "" if value is None else str(value)


def _post(
    endpoint: str, body: dict, headers: dict, failed: Callable | None, *, timeout: float, retries: int, backoff_s: float
) -> dict:
    """The server's JSON answer; failed(answer) -> the cause where an HTTP 200 answer says it failed (retried)."""
    return anyio.run(_post_retried, endpoint, body, headers, failed, timeout, retries, backoff_s)


async def _post_retried(
    endpoint: str, body: dict, headers: dict, failed: Callable | None, timeout: float, retries: int, backoff_s: float
) -> dict:
    attempts = retries + 1
    # No httpx timeout: it bounds each network operation alone, so a server that trickles its answer out
    # would hold the step for ever. The limit is on the whole exchange, connecting to the last byte.
    async with httpx.AsyncClient(timeout=None, headers=headers) as client:
        for attempt in range(1, attempts + 1):
            try:
                with anyio.fail_after(timeout):
                    response = await client.post(endpoint, json=body)
            except TimeoutError:
                cause = f"no complete answer within reward_server_timeout = {timeout:g} s"
            except httpx.TransportError as exc:  # refused, reset: the server may be restarting
                cause = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code >= 500:
                    cause = f"HTTP {response.status_code}: {_message(response)}"
                else:
                    answer = _answer(endpoint, response)
                    cause = failed(answer) if failed else None
                    if cause is None:
                        return answer
            if attempt < attempts:
                await anyio.sleep(min(backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
    raise RewardServerError(f"reward server {endpoint} failed {attempts} attempt(s); last: {cause}")


def _answer(endpoint: str, response: httpx.Response) -> dict:
    if response.status_code >= 400:  # our request is wrong: retrying would not help
        raise RewardServerError(
            f"reward server {endpoint} refused the batch: HTTP {response.status_code}: {_message(response)}"
        )
    try:
        return response.json()
    except ValueError:
        raise RewardServerError(
            f"reward server {endpoint} answered something that is not JSON: {response.text[:200]!r}"
        ) from None


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        return str(body.get("error_msg") or body.get("detail") or body)[:500]
    return str(body)[:500]


def _read_v1(answer: dict, names: list[str]) -> ScoreTable:
    return ScoreTable(
        totals=[_score(value) for value in answer["scores"]],
        columns={name: [_score(value) for value in answer["components"][name]] for name in names},
        errors=[None if error is None else str(error) for error in answer["errors"]],
    )


def _paddlenlp_failure(answer) -> str | None:
    """PaddleNLP's own server answers a failed batch with HTTP 200, error_code 500 and a 0 per item: not
    scores, but a failure to retry like a 5xx. Ours answers a nonzero error_code only with a null score for
    each item it could not score (the others are scores)."""
    if not isinstance(answer, dict) or answer.get("error_code", 0) == 0:
        return None
    scores = answer.get("score")
    if isinstance(scores, list) and None in scores:
        return None
    return f"error_code {answer['error_code']}: {str(answer.get('error_msg', ''))[:500]}"


def _read_paddlenlp(answer: dict) -> ScoreTable:
    scores = [_score(value) for value in answer["score"]]
    message = answer.get("error_msg", "")
    errors = [f"reward server: {message}" if score is None else None for score in scores]
    return ScoreTable(totals=scores, columns={}, errors=errors)


def _score(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a score must be a number or null, got {value!r}")
    return float(value)
