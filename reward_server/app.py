"""The FastAPI app: PaddleNLP's POST /, POST /v1/score, GET /v1/reward_funcs, GET /health."""

from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio.to_thread
from fastapi import FastAPI, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from alignment.rewards import RewardSettings, ScoreTable, available_rewards
from alignment.rewards.pool import ScoringPool

from .body import MAX_JSON_DEPTH, MAX_JSON_VALUES, BoundedRoute
from .middleware import AccessLog, ReadBody, RequireKey, error_response
from .schemas import (
    Health,
    PaddleNLPRequest,
    PaddleNLPResponse,
    RewardFunc,
    RewardFuncsResponse,
    ScoreRequest,
    ScoreResponse,
)

# Open even with an API key: liveness probes carry no key, and the schema is public documentation.
OPEN_PATHS = frozenset({"/health", "/openapi.json"})
PADDLENLP_PATH = "/"
ITEM_ERRORS = 1  # PaddleNLP error_code when some items could not be scored (their score is null)


@dataclass(frozen=True)
class Settings:
    reward_funcs: list[str]  # what POST / applies, and /v1/score when a request names none
    reward_weights: list[float]
    api_key: str | None
    max_items: int
    max_body_bytes: int
    body_timeout: float  # seconds to receive a request's body
    request_timeout: float  # seconds of scoring per request; items not scored by then get an error
    max_json_values: int = MAX_JSON_VALUES  # a body's JSON: most values, counted before it is parsed (more: 422)
    max_json_depth: int = MAX_JSON_DEPTH  # and deepest nesting


def create_app(settings: Settings, pool: ScoringPool) -> FastAPI:
    # No /docs or /redoc: their pages load JavaScript from a CDN, blank offline. /openapi.json is the schema.
    app = FastAPI(title="GRPO reward server", version="1", lifespan=pool_lifespan(pool), docs_url=None, redoc_url=None)
    app.router.route_class = BoundedRoute  # bodies measured before they are parsed, and parsed in a worker thread
    app.state.json_limits = (settings.max_json_values, settings.max_json_depth)
    # The key is checked by RequireKey before any body is read; this only declares it in the OpenAPI schema.
    keyed = [Security(HTTPBearer(auto_error=False))] if settings.api_key else []
    add_score_routes(app, settings, scorer(settings, pool), keyed)
    add_listing_routes(app, settings, pool, keyed)
    add_error_handlers(app)
    # Added innermost first: the log sees every answer, the key is checked before the body is read.
    app.add_middleware(ReadBody, max_bytes=settings.max_body_bytes, timeout=settings.body_timeout)
    app.add_middleware(RequireKey, api_key=settings.api_key, open_paths=OPEN_PATHS)
    app.add_middleware(AccessLog)
    return app


def pool_lifespan(pool: ScoringPool):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await anyio.to_thread.run_sync(pool.start)  # the server listens only once the workers are ready
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(pool.close)

    return lifespan


def scorer(settings: Settings, pool: ScoringPool):
    """The one scoring call behind both scoring routes: --max_items, the pool with --request_timeout, a bad request
    as 422, and the request's item counts for the access log."""

    async def score(
        request: Request,
        completions: list[str],
        samples: list[dict],
        names: list[str],
        weights: list[float],
        reward_settings: RewardSettings = RewardSettings(),
    ) -> ScoreTable:
        request.state.items = len(completions)
        if len(completions) > settings.max_items:
            raise HTTPException(
                422, f"{len(completions)} items; this server takes at most {settings.max_items} (--max_items)"
            )
        try:
            table = await pool.score(completions, samples, names, weights, reward_settings, settings.request_timeout)
        except ValueError as exc:  # unknown function (with the closest names), weights that do not match, ...
            raise HTTPException(422, str(exc)) from None
        request.state.item_errors = sum(error is not None for error in table.errors)
        return table

    return score


def add_score_routes(app: FastAPI, settings: Settings, score, keyed: list) -> None:
    @app.post(PADDLENLP_PATH, response_model=PaddleNLPResponse, dependencies=keyed)
    async def paddlenlp_score(body: PaddleNLPRequest, request: Request):
        """PaddleNLP's protocol, scored with the server's --reward_funcs and --reward_weights."""
        lengths = {"src": len(body.src), "tgt": len(body.tgt), "response": len(body.response)}
        if len(set(lengths.values())) > 1:
            got = ", ".join(f"{field}={n}" for field, n in lengths.items())
            raise HTTPException(422, f"src, tgt and response must have equal lengths, got {got}")
        samples = [{"src": s, "tgt": t, "prompt": s, "answer": t} for s, t in zip(body.src, body.tgt, strict=True)]
        table = await score(request, body.response, samples, settings.reward_funcs, settings.reward_weights)
        failed = [f"item {i}: {error}" for i, error in enumerate(table.errors) if error is not None]
        if failed:
            listed = "; ".join(failed[:5])
            message = f"{len(failed)} of {len(table.errors)} items could not be scored (score null): {listed}"
            return {"error_code": ITEM_ERRORS, "error_msg": message, "score": table.totals}
        return {"error_code": 0, "error_msg": "Success", "score": table.totals}

    @app.post("/v1/score", response_model=ScoreResponse, dependencies=keyed)
    async def v1_score(body: ScoreRequest, request: Request):
        """Per-item weighted scores, each function's values and each item's error."""
        names = settings.reward_funcs if body.reward_funcs is None else body.reward_funcs
        weights = [1.0] * len(names) if body.reward_weights is None else body.reward_weights
        completions = [item.completion for item in body.items]
        samples = [{key: value for key, value in item if key != "completion"} for item in body.items]
        reward_settings = RewardSettings() if body.reward_settings is None else body.reward_settings.to_settings()
        table = await score(request, completions, samples, names, weights, reward_settings)
        return {"scores": table.totals, "components": table.columns, "errors": table.errors}


def add_listing_routes(app: FastAPI, settings: Settings, pool: ScoringPool, keyed: list) -> None:
    @app.get("/v1/reward_funcs", response_model=RewardFuncsResponse, dependencies=keyed)
    async def reward_funcs():
        """The registered reward functions (built-in and plugins) with one-line descriptions."""
        return {
            "reward_funcs": [RewardFunc(name=spec.name, description=spec.description) for spec in available_rewards()],
            "default": settings.reward_funcs,
        }

    @app.get("/health", response_model=Health)
    async def health():
        """Liveness; needs no API key."""
        return {"status": "ok", "workers": pool.workers}


def add_error_handlers(app: FastAPI) -> None:
    """Every error body carries detail, error_code and error_msg (error_response)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, exc.detail, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        # Without the offending input: it may be megabytes, and it is the client's own.
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])
        return error_response(422, errors, f"invalid request: {message}")
