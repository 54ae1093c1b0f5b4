"""The reward server as users run it (`python reward_server/reward_server.py` in a subprocess on a free
loopback port), driven over HTTP, and the trainer's client (score_remote) against it."""

import dataclasses
import json
import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate as validate_openapi
from helpers.reward_servers import API_KEY_ENV, REPO, foreign_server, free_port, reward_server, server_command
from schemathesis import GenerationMode

from alignment.basics.errors import RewardServerError
from alignment.rewards import RewardSettings, score_completions
from alignment.rewards.remote import RewardServer, score_remote
from alignment.basics.plugins import load_plugins

PLUGIN = REPO / "tests" / "plugins" / "server_rewards.py"
KEY = "s3cret-key-for-tests"
ITEM_TIMEOUT_S = 1
MAX_ITEMS = 100
MAX_BODY_BYTES = 200_000
SCORING_PATHS = ("/", "/v1/score")

pytestmark = pytest.mark.timeout(120)  # a hung server or client fails its test instead of the suite

# Constructed items with known values: right and wrong answers, the R1 format or not, a LaTeX answer
# that only math-verify can match, and a row without a reference (an accuracy error, never a 0).
ITEMS = [
    {
        "prompt": "Mia has 12 apples. She buys 7 more, then gives away 5. How many now?",
        "answer": "14",
        "completion": "<think>12 + 7 = 19, 19 - 5 = 14</think><answer>14</answer>",
    },
    {
        "prompt": "Mia has 12 apples. She buys 7 more, then gives away 5. How many now?",
        "answer": "14",
        "completion": "<think>12 + 7 = 19</think><answer>19</answer>",
    },
    {
        "prompt": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "#### 72",
        "completion": "In May she sold 48 / 2 = 24, so 48 + 24 = 72 in all.\n#### 72",
    },
    {
        "prompt": "What is two quarters?",
        "answer": "\\frac{1}{2}",
        "completion": "<think>2/4</think><answer>\\frac{2}{4}</answer>",
    },
    {"prompt": "A question without a reference", "answer": None, "completion": "<think>?</think><answer>3</answer>"},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    flags = ["--workers", "2", "--plugins", str(PLUGIN), "--item_timeout", str(ITEM_TIMEOUT_S)]
    flags += ["--max_items", str(MAX_ITEMS), "--max_body_bytes", str(MAX_BODY_BYTES)]
    with reward_server(tmp_path_factory.mktemp("server"), *flags) as running:
        yield running


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    with reward_server(tmp_path_factory.mktemp("keyed"), "--workers", "1", env={API_KEY_ENV: KEY}) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


@pytest.fixture(scope="module", autouse=True)
def plugin_in_process():
    load_plugins([str(PLUGIN)])  # the same functions in this process, to compare with the server


def in_process(items, names, weights=None, settings=RewardSettings()):
    samples = [{k: v for k, v in item.items() if k != "completion"} for item in items]
    completions = [item["completion"] for item in items]
    table = score_completions(completions, samples, names, weights or [1.0] * len(names), settings=settings)
    return {"scores": table.totals, "components": table.columns, "errors": table.errors}


def post_v1(client, items, names, weights=None):
    body = {"items": items, "reward_funcs": names}
    if weights is not None:
        body["reward_weights"] = weights
    return client.post("/v1/score", json=body)


# --- the endpoints --------------------------------------------------------------------------------


def test_health_and_reward_funcs_list_the_built_ins_and_the_plugins(client):
    assert client.get("/health").json() == {"status": "ok", "workers": 2}
    listed = client.get("/v1/reward_funcs").json()
    names = {f["name"]: f["description"] for f in listed["reward_funcs"]}
    assert {"accuracy", "format", "within_max_chars", "hang_on_marker"} <= set(names)
    assert names["within_max_chars"] == "1.0 if the completion fits the item's max_chars column, else 0.0"
    assert listed["default"] == ["accuracy", "format"]


def test_openapi_schema_is_valid_and_describes_every_endpoint(client):
    schema = client.get("/openapi.json").json()
    validate_openapi(schema)
    assert {"/", "/v1/score", "/v1/reward_funcs", "/health"} <= set(schema["paths"])


def test_v1_scores_equal_in_process_scoring(client):
    names, weights = ["accuracy", "format"], [1.0, 0.5]
    answer = post_v1(client, ITEMS, names, weights)
    assert answer.status_code == 200
    assert answer.json() == in_process(ITEMS, names, weights)
    assert answer.json()["scores"] == [1.5, 0.5, 1.0, 1.5, None]
    assert answer.json()["errors"][4] == "accuracy: ValueError: sample has no 'answer'"


def test_v1_defaults_to_the_servers_reward_functions_and_takes_an_empty_batch(client):
    assert client.post("/v1/score", json={"items": ITEMS[:2]}).json() == in_process(ITEMS[:2], ["accuracy", "format"])
    assert client.post("/v1/score", json={"items": []}).json() == {
        "scores": [],
        "components": {"accuracy": [], "format": []},
        "errors": [],
    }


def test_paddlenlp_protocol_answers_as_paddlenlp_does(client):
    rows = ITEMS[:4]
    body = {
        "src": [r["prompt"] for r in rows],
        "tgt": [r["answer"] for r in rows],
        "response": [r["completion"] for r in rows],
    }
    expected = in_process([{**r, "src": r["prompt"], "tgt": r["answer"]} for r in rows], ["accuracy", "format"])
    assert client.post("/", json=body).json() == {"error_code": 0, "error_msg": "Success", "score": expected["scores"]}


def test_paddlenlp_protocol_marks_items_it_could_not_score_null_with_a_nonzero_error_code(client):
    body = {"src": ["q", "q"], "tgt": ["5", ""], "response": ["<answer>5</answer>", "<answer>5</answer>"]}
    answer = client.post("/", json=body).json()
    assert answer["score"] == [1.0, None]
    assert answer["error_code"] != 0
    assert "1 of 2 items could not be scored" in answer["error_msg"] and "item 1: accuracy" in answer["error_msg"]


def test_unequal_lengths_are_422_naming_the_fields(client):
    answer = client.post("/", json={"src": ["a", "b"], "tgt": ["1"], "response": ["x", "y"]})
    assert answer.status_code == 422
    assert "src=2, tgt=1, response=2" in answer.json()["error_msg"]
    assert answer.json()["error_code"] != 0  # PaddleNLP clients read error_code, not the HTTP status


def test_unknown_reward_function_is_422_with_the_closest_names(client):
    answer = post_v1(client, ITEMS[:1], ["acuracy"])
    assert answer.status_code == 422
    assert "unknown reward function 'acuracy'. Did you mean 'accuracy'?" in answer.json()["detail"]


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            {"items": ITEMS[:1], "reward_funcs": ["accuracy"], "reward_weights": [1.0, 2.0]},
            "1 reward functions but 2 weights",
        ),
        ({"items": ITEMS[:1], "reward_funcs": ["format", "format"]}, "reward functions named twice"),
        ({"items": ITEMS[:1], "reward_funcs": []}, "no reward functions"),
    ],
)
def test_inconsistent_reward_functions_are_422(client, body, expected):
    answer = client.post("/v1/score", json=body)
    assert answer.status_code == 422 and expected in answer.json()["detail"]


# One failing request per route and cause: the handler's own refusal, the schema's, a too-large body, a wrong method and path.
ERRORS = [
    ("POST", "/", {"src": ["a", "b"], "tgt": ["1"], "response": ["x", "y"]}, 422, "src=2, tgt=1, response=2"),
    ("POST", "/", {"src": "a"}, 422, "invalid request: body.src: Input should be a valid list"),
    ("POST", "/", {"src": ["q"], "tgt": ["1"], "response": ["x" * MAX_BODY_BYTES]}, 413, f"limit of {MAX_BODY_BYTES} bytes"),
    ("POST", "/v1/score", {"items": ITEMS[:1], "reward_funcs": ["acuracy"]}, 422, "Did you mean 'accuracy'?"),
    ("POST", "/v1/score", {"items": [{"completion": 5}]}, 422, "invalid request: body.items.0.completion: Input should be a valid string"),
    ("POST", "/v1/score", {"items": [{"completion": "x" * MAX_BODY_BYTES}]}, 413, f"limit of {MAX_BODY_BYTES} bytes"),
    ("POST", "/v1/reward_funcs", None, 405, "Method Not Allowed"),
    ("POST", "/health", None, 405, "Method Not Allowed"),
    ("GET", "/v2/score", None, 404, "Not Found"),
]


@pytest.mark.parametrize("method, path, body, status, message", ERRORS, ids=[f"{m} {p} {s}" for m, p, _, s, _ in ERRORS])
def test_every_routes_error_carries_detail_error_code_and_error_msg(client, method, path, body, status, message):
    answer = client.request(method, path, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert set(error) == {"detail", "error_code", "error_msg"}, error
    assert error["error_code"] == status  # PaddleNLP's clients read error_code, FastAPI's read the status and detail
    assert message in error["error_msg"] and "\n" not in error["error_msg"]
    if isinstance(error["detail"], str):  # validation's detail is FastAPI's list of errors; error_msg is its one line
        assert error["detail"] == error["error_msg"]


# Non-default settings and the token counts the trainer adds to each item.
LENGTH_SETTINGS = RewardSettings(
    cosine_min_len_value_wrong=-1.0,
    cosine_max_len_value_correct=0.25,
    cosine_max_len=40,
    repetition_n_grams=2,
    repetition_max_penalty=-0.5,
    soft_max_length=40,
    soft_cache_length=10,
)
LENGTH_ITEMS = [{**item, "completion_tokens": tokens} for item, tokens in zip(ITEMS[:4], [12, 33, 40, 7])]
LENGTH_NAMES = ["cosine", "repetition", "soft_overlong"]


def test_length_rewards_score_over_http_as_in_process_with_the_requests_settings(client):
    body = {"items": LENGTH_ITEMS, "reward_funcs": LENGTH_NAMES, "reward_settings": dataclasses.asdict(LENGTH_SETTINGS)}
    answer = client.post("/v1/score", json=body).json()
    assert answer == in_process(LENGTH_ITEMS, LENGTH_NAMES, settings=LENGTH_SETTINGS)
    assert answer["components"]["soft_overlong"] == [0.0, -0.3, -1.0, 0.0]  # punished from 31 tokens
    assert answer["components"]["cosine"][2] == 0.25  # right at cosine_max_len (40)
    # Without reward_settings, the defaults: cosine_max_len is unset, and each item says so.
    defaults = post_v1(client, LENGTH_ITEMS[:1], ["cosine"]).json()
    assert defaults == in_process(LENGTH_ITEMS[:1], ["cosine"])
    assert defaults["errors"][0].startswith("cosine: ValueError: cosine_max_len is not set")
    # Without completion_tokens the item fails alone, naming the missing column.
    body |= {"items": [ITEMS[0], LENGTH_ITEMS[1]], "reward_funcs": ["soft_overlong"]}
    missing = client.post("/v1/score", json=body).json()
    assert missing["errors"][0].startswith("soft_overlong: ValueError: item has no 'completion_tokens'")
    assert missing["errors"][1] is None


@pytest.mark.parametrize(
    "reward_settings, loc, message",
    [
        ({"cosine_max_lenn": 40}, ["body", "reward_settings", "cosine_max_lenn"], "Extra inputs are not permitted"),
        ({"repetition_n_grams": 0}, ["body", "reward_settings"], "repetition_n_grams must be >= 1, got 0"),
        (
            {"soft_max_length": 40, "soft_cache_length": 40},
            ["body", "reward_settings"],
            "soft_cache_length (40) must be less than soft_max_length (40)",
        ),
        ({"cosine_max_len": "long"}, ["body", "reward_settings", "cosine_max_len"], "valid integer"),
    ],
)
def test_bad_reward_settings_are_422_naming_the_field(client, reward_settings, loc, message):
    answer = client.post("/v1/score", json={"items": LENGTH_ITEMS[:1], "reward_settings": reward_settings})
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert error["loc"] == loc and message in error["msg"]


def test_too_many_items_is_422(client):
    answer = post_v1(client, [{"completion": "x"}] * (MAX_ITEMS + 1), ["format"])
    assert answer.status_code == 422
    assert f"{MAX_ITEMS + 1} items; this server takes at most {MAX_ITEMS}" in answer.json()["detail"]


@pytest.mark.parametrize("path", SCORING_PATHS)
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_413(client, path, chunked):
    body = json.dumps({"src": ["q"], "tgt": ["1"], "response": ["x" * MAX_BODY_BYTES]}).encode()
    content = iter([body[:1000], body[1000:]]) if chunked else body  # no Content-Length when streamed
    answer = client.post(path, content=content, headers={"content-type": "application/json"})
    assert answer.status_code == 413
    assert f"limit of {MAX_BODY_BYTES} bytes" in answer.json()["detail"]
    assert answer.json()["error_code"] == 413


MALFORMED = [
    b"",
    b"{",
    b'{"src": ["a"], "tgt": ["b"], "response": ["c"]',
    b"[" * 100_000,  # deeper than json.loads can recurse
    b'{"src": [NaN], "tgt": [Infinity], "response": [-Infinity]}',
    b'{"items": [{"completion": "x"}], "reward_weights": [1e999]}',
    b'{"items": [{"completion": 5}], "reward_funcs": "accuracy"}',
    b'{"items": {"completion": "x"}}',
    b'{"src": "abc", "tgt": "abc", "response": "abc"}',
    b"null",
    b"\xff\xfe\x00garbage",
    b'{"items": [{"completion": "\\ud800"}], "reward_funcs": ["\\udfff"]}',
]


@pytest.mark.parametrize("path", SCORING_PATHS)
@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_bodies_are_4xx(client, path, body):
    answer = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= answer.status_code < 500, answer.text


@pytest.mark.parametrize("path", SCORING_PATHS)
@pytest.mark.parametrize("depth", [120, 3000])
def test_an_extra_column_nested_too_deep_is_422_naming_it(client, path, depth):
    # 120 levels were parsed and scored; 3,000 were a RecursionError, answered with FastAPI's "There was an error parsing
    # the body". Neither is parsed now; the trainer's own rows and tool-call arguments nest at most 64 levels.
    column = "[" * depth + "]" * depth
    body = '{"items": [{"completion": "x", "answer": "1", "trace": %s}], "src": [], "tgt": [], "response": []}' % column
    answer = client.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == f"invalid request: items.0.trace{'.0' * 97}: nested deeper than 100 levels (--max_json_depth)"


ITEM = b'{"items": [{"completion": "x", "answer": "1", "e": ['


@pytest.mark.parametrize(
    "body, refusal",
    [
        (ITEM + b"{}," * 2000 + b"{}]}]}", r"items\.0\.e\.(\d+): the request holds more than 1000 JSON values \(--max_json_values\)"),
        (ITEM + b'"a",' * 2000 + b'"a"]}]}', r"items\.0\.e\.(\d+): the request holds more than 1000 JSON values \(--max_json_values\)"),
        (ITEM + b"0," * 2000 + b"0]}]}", r"items\.0\.e\.(\d+): the request holds more than 1000 JSON values \(--max_json_values\)"),
        (ITEM + b'""' * 2000 + b"]}]}", r"items\.0\.e\.0: the request holds more than 2002 strings, so more than 1000 JSON values .*"),
        (b'{"items": [{"completion": "x", "we\\"ird": ' + b"[" * 20 + b"]" * 20 + b"}]}",
         r'items\.0\.we"ird(\.0){7}: nested deeper than 10 levels \(--max_json_depth\)'),
        # brackets, commas and escaped quotes inside strings are text, not structure
        (b'{"items": [{"completion": "' + b'{[,\\"\\\\' * 3000 + b'", "answer": "[[[["}]}', None),
    ],
    ids=["empty objects", "short strings", "zeros", "adjacent strings", "deep", "structure inside strings"],
)
def test_a_body_is_measured_before_it_is_parsed(body, refusal):
    from reward_server.body import check_shape

    found = check_shape(body, 1000, 10)
    assert found is None if refusal is None else re.fullmatch(refusal, found), found


def test_a_column_as_deep_as_the_trainer_reads_is_scored(server):
    # a data row nests up to 64 levels in the trainer (alignment/basics/data.py), and so may a tool call's arguments
    nested = json.loads("[" * 63 + "{}" + "]" * 63)
    sample = {"prompt": "q", "answer": "1", "tool_calls": [{"name": "f", "arguments": {"x": nested}}], "row": nested}
    table = score_remote(["<answer>1</answer>"], [sample], ["accuracy"], [1.0], RewardServer(server.url, "v1", 30, 0))
    assert table.errors == [None] and table.totals == [1.0]


def test_a_body_of_millions_of_values_is_refused_unparsed_and_health_is_not_held(tmp_path):
    """Six 16 MB bodies of 5.5 million empty objects each, in an extra column, at once: each was parsed on the event
    loop (2.1 GB; /health unanswered for 5.7 s, 15.6 s on a busy machine) and scored. Now each is measured before it
    is parsed and refused naming the column; a legal 15 MB body of 1,024 items (150,000 values) is parsed in a worker
    thread. Order-of-magnitude bounds only: timings are measured in bench/."""
    hostile = b'{"items": [{"completion": "x", "answer": "1", "e": [' + b"{}," * 5_500_000 + b"{}]}]}"
    tests = [{"in": str(i), "out": "2"} for i in range(48)]
    legal = json.dumps({"items": [{"completion": "c" * 12_000, "answer": "42", "tests": tests} for _ in range(1024)]}).encode()
    with reward_server(tmp_path, "--workers", "1") as running:
        slowest, answers = [], []
        watching = threading.Event()

        def watch_health():
            with httpx.Client(base_url=running.url, timeout=60) as http:
                while not watching.is_set():
                    started = time.perf_counter()
                    assert http.get("/health").status_code == 200
                    slowest.append(time.perf_counter() - started)
                    time.sleep(0.02)

        def post(body):
            answers.append(httpx.post(f"{running.url}/v1/score", content=body, headers={"content-type": "application/json"}, timeout=300))

        watcher = threading.Thread(target=watch_health)
        watcher.start()
        with ThreadPoolExecutor(7) as pool:
            list(pool.map(post, [legal] + [hostile] * 6))
        watching.set()
        watcher.join()
        peak = next(int(line.split()[1]) for line in Path(f"/proc/{running.process.pid}/status").read_text().splitlines()
                    if line.startswith("VmHWM"))
    assert sorted(answer.status_code for answer in answers) == [200] + [422] * 6, [answer.text[:200] for answer in answers]
    for answer in answers:
        if answer.status_code == 200:
            assert len(answer.json()["scores"]) == 1024
        else:
            assert re.fullmatch(r"invalid request: items\.0\.e\.\d+: the request holds more than 262144 JSON values "
                                r"\(--max_json_values\)", answer.json()["detail"]), answer.text
    print(f"/health at most {max(slowest):.2f} s over {len(slowest)} calls; the server's peak {peak / 1024:.0f} MB")
    assert max(slowest) < 3.0, f"/health took {max(slowest):.1f} s while the bodies were read"
    assert peak < 1 << 20, f"the server peaked at {peak / 1024:.0f} MB"  # VmHWM in kB: under 1 GB


def test_a_form_post_is_not_taken_for_json(client):
    # A browser page can send a form to localhost without asking; only application/json is read.
    answer = client.post("/", content=b'{"src": [], "tgt": [], "response": []}', headers={"content-type": "text/plain"})
    assert answer.status_code == 422


@pytest.mark.parametrize("answer", ["true", "false", "NaN", "Infinity", "-Infinity", "1e999"])
def test_an_answer_that_is_boolean_or_not_finite_is_422_naming_the_field(client, answer):
    # As in the trainer's data files: true would score as 1, and NaN equals nothing.
    body = '{"items": [{"completion": "<answer>1</answer>", "answer": %s}], "reward_funcs": ["accuracy"]}' % answer
    response = client.post("/v1/score", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "items", 0, "answer"]
    assert "must be a string, an integer or a finite number" in error["msg"]


def test_no_api_pages_that_need_the_internet_but_the_schema_is_served(client):
    # FastAPI's /docs and /redoc load their JavaScript from a CDN: blank pages offline, so left out.
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").json()["info"]["title"] == "GRPO reward server"


# --- failures of single items ---------------------------------------------------------------------


def test_a_hanging_item_times_out_alone_and_the_server_goes_on(client):
    items = [{"completion": c} for c in ("fine", "HANG", "fine", "fine", "fine", "HANG")]
    started = time.monotonic()
    answer = post_v1(client, items, ["hang_on_marker"]).json()
    assert time.monotonic() - started < 10 * ITEM_TIMEOUT_S
    assert answer["scores"] == [1.0, None, 1.0, 1.0, 1.0, None]
    assert answer["errors"][1] == answer["errors"][5] == f"timed out after {ITEM_TIMEOUT_S} s"
    assert answer["components"]["hang_on_marker"] == answer["scores"]
    # the hung workers were replaced: both score again
    assert post_v1(client, [{"completion": "fine"}] * 4, ["hang_on_marker"]).json()["scores"] == [1.0] * 4


def test_a_raising_item_is_an_error_for_itself_alone(client):
    items = [{"completion": "RAISE"}, {"completion": "<think>a</think><answer>1</answer>"}]
    answer = post_v1(client, items, ["raise_on_marker", "format"]).json()
    assert answer == in_process(items, ["raise_on_marker", "format"])
    assert answer["errors"] == ["raise_on_marker: ValueError: asked to raise", None]
    assert answer["scores"] == [None, 2.0] and answer["components"]["format"] == [0.0, 1.0]


def test_a_worker_that_dies_is_replaced(client):
    answer = post_v1(client, [{"completion": "EXIT"}, {"completion": "fine"}], ["exit_on_marker"]).json()
    assert answer["errors"][0] == "reward worker died (exit code 3)"
    assert answer["scores"] == [None, 1.0]
    assert post_v1(client, [{"completion": "fine"}] * 4, ["exit_on_marker"]).json()["scores"] == [1.0] * 4


# --- plugins --------------------------------------------------------------------------------------


def test_a_plugin_reward_scores_the_same_in_the_server_and_in_process(client):
    # max_chars is a dataset column: it reaches the function as it does in process.
    items = [
        {"completion": "short", "max_chars": 10},
        {"completion": "much too long", "max_chars": 10},
        {"completion": "x"},
    ]
    answer = post_v1(client, items, ["within_max_chars"]).json()
    assert answer == in_process(items, ["within_max_chars"])
    assert answer["scores"] == [1.0, 0.0, None] and answer["errors"][2] == "within_max_chars: KeyError: 'max_chars'"


def test_a_plugin_that_cannot_be_loaded_stops_the_server_naming_the_file(tmp_path):
    broken = tmp_path / "broken_rewards.py"
    broken.write_text("import no_such_module_here\n")
    run = subprocess.run(
        server_command(free_port(), "--plugins", str(broken)), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    assert f"plugin {broken} failed to import: ModuleNotFoundError" in run.stderr
    with pytest.raises(FileNotFoundError, match="plugin missing.py: no such file"):
        load_plugins(["missing.py"])


VERSIONED_PLUGIN = """
import os, time
from alignment.rewards import register_reward

@register_reward("versioned", "the plugin's version; EXIT ends its worker, HANG hangs it")
def versioned(completion, sample):
    if "EXIT" in completion:
        os._exit(3)
    if "HANG" in completion:
        time.sleep(3600)
    return VERSION
"""


def test_a_plugin_edited_or_deleted_while_the_server_runs_changes_no_score(tmp_path):
    plugin = tmp_path / "versioned_rewards.py"
    plugin.write_text("VERSION = 1.0\n" + VERSIONED_PLUGIN)
    with reward_server(tmp_path, "--workers", "1", "--item_timeout", "1", "--plugins", str(plugin)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert post_v1(http, [{"completion": "a"}], ["versioned"]).json()["scores"] == [1.0]
            plugin.write_text("VERSION = 2.0\n" + VERSIONED_PLUGIN)
            # Each batch replaces the worker (its death, its timeout); the replacement runs the text read at start.
            died = post_v1(http, [{"completion": "EXIT"}, {"completion": "a"}], ["versioned"]).json()
            assert died["scores"] == [None, 1.0] and died["errors"][0] == "reward worker died (exit code 3)"
            hung = post_v1(http, [{"completion": "HANG"}, {"completion": "a"}], ["versioned"]).json()
            assert hung["scores"] == [None, 1.0] and hung["errors"][0] == "timed out after 1 s"
            plugin.unlink()
            gone = post_v1(http, [{"completion": "EXIT"}, {"completion": "a"}], ["versioned"])
            assert gone.status_code == 200 and gone.json()["scores"] == [None, 1.0]
            assert http.get("/health").json()["status"] == "ok"


def test_an_unknown_reward_function_flag_stops_the_server():
    run = subprocess.run(
        server_command(free_port(), "--reward_funcs", "acuracy"), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0 and "Did you mean 'accuracy'?" in run.stderr


# --- concurrency, real data, the log -------------------------------------------------------------


def test_sixteen_concurrent_clients_each_get_their_own_scores(server):
    # 16 distinct batches: a reply that went to the wrong client, or items shuffled between
    # requests, would not match its batch's in-process scores.
    batches = [
        [{**item, "completion": item["completion"].replace("14", str(14 + k % 3))} for item in ITEMS * 8]
        for k in range(16)
    ]

    def post(batch):
        with httpx.Client(base_url=server.url, timeout=60) as http:
            return post_v1(http, batch, ["accuracy", "format"]).json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, batches))
    assert answers == [in_process(batch, ["accuracy", "format"]) for batch in batches]


def test_gsm8k_model_solutions_score_as_in_process_through_both_protocols(server, gsm8k_dir):
    with open(gsm8k_dir / "example_model_solutions.jsonl") as f:
        rows = [json.loads(line) for line, _ in zip(f, range(MAX_ITEMS // 2), strict=False)]
    items = [
        {"prompt": r["question"], "answer": r["ground_truth"], "completion": r[solver]["solution"]}
        for r in rows
        for solver in ("6b_finetuning", "175b_verification")
    ]
    samples = [{"prompt": i["prompt"], "answer": i["answer"]} for i in items]
    completions = [i["completion"] for i in items]
    names, weights = ["accuracy", "format"], [1.0, 1.0]
    local = score_completions(completions, samples, names, weights)
    for protocol in ("v1", "paddlenlp"):
        remote = score_remote(
            completions, samples, names, weights, RewardServer(url=server.url, protocol=protocol, timeout=60, retries=0)
        )
        assert remote.totals == local.totals
        assert remote.columns == (local.columns if protocol == "v1" else {})
    assert sum(local.columns["accuracy"]) > 10  # real solutions, some of them right


def test_an_ifeval_row_scores_as_in_process_and_by_hand(server):
    # IFEval's columns travel as the item's extra columns; the preamble's comma fails strictly and is forgiven loosely.
    # The shared server's items have 1 s each: a worker imports the verifiers (nltk: seconds) before its first
    # instruction item, outside that limit (pool.py's PREPARED), so the items score.
    item = {"prompt": "Write a title and a line without commas.", "completion": "Sure, here it is:\n<<Spring>>\nbuds open slowly",
            "instruction_id_list": ["punctuation:no_comma", "detectable_format:title"], "kwargs": [{}, {}]}
    names = ["ifeval", "ifeval_loose", "ifeval_all", "ifeval_all_loose"]
    unknown = {**item, "instruction_id_list": ["punctuation:no_semicolon", "detectable_format:title"]}
    answer = httpx.post(server.url + "/v1/score", json={"items": [item, unknown], "reward_funcs": names}, timeout=90).json()
    assert answer["components"] == {"ifeval": [0.5, None], "ifeval_loose": [1.0, None], "ifeval_all": [0.0, None],
                                    "ifeval_all_loose": [1.0, None]}
    assert answer == in_process([item, unknown], names)
    assert answer["errors"][1].startswith("ifeval: ValueError: unknown instruction id 'punctuation:no_semicolon'")


def test_the_log_has_one_line_per_request(client, server):
    client.post(
        "/v1/score", json={"items": ITEMS * 3 + [{"completion": "x"} for _ in range(2)], "reward_funcs": ["accuracy"]}
    )
    pattern = re.compile(r"POST /v1/score items=17 bytes=\d+ ms=[\d.]+ item_errors=5 status=200$")
    deadline = time.monotonic() + 5  # the line is written just after the answer is sent
    while not any(pattern.search(line) for line in server.log.read_text().splitlines()):
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.05)


# --- sharing the workers; stalled and vanished clients --------------------------------------------

BUSY_REQUEST_TIMEOUT_S = 3
STALL_TIMEOUT_S = 1
BUSY_ITEM_TIMEOUT_S = 60  # an item waiting at a closed gate is killed only this late: every ceiling below is shorter
CEILING_S = 30  # how long a test waits for what takes a fraction of a second when the server works


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory):
    flags = ["--workers", "2", "--plugins", str(PLUGIN), "--item_timeout", str(BUSY_ITEM_TIMEOUT_S)]
    flags += ["--request_timeout", str(BUSY_REQUEST_TIMEOUT_S)]
    flags += ["--header_timeout", str(STALL_TIMEOUT_S), "--body_timeout", str(STALL_TIMEOUT_S)]
    with reward_server(tmp_path_factory.mktemp("busy"), *flags) as running:
        yield running


def gated(trace, gate, count: int, name: str = "item", first: int = 0) -> list:
    """Items of traced_gate: each writes "<name> I <pid>" to `trace` when it starts, then waits until `gate` exists."""
    return [{"completion": f"{name} {i}", "trace": str(trace), "gate": str(gate)} for i in range(first, first + count)]


def post_gated(server, items) -> dict:
    with httpx.Client(base_url=server.url, timeout=2 * BUSY_ITEM_TIMEOUT_S) as http:
        return post_v1(http, items, ["traced_gate"]).json()


def started_items(trace) -> list:
    """[(completion, pid)] in the order the items began."""
    return [(line.rsplit(" ", 1)[0], int(line.rsplit(" ", 1)[1])) for line in trace.read_text().splitlines()] if trace.exists() else []


def ended(pid: int) -> bool:
    try:  # gone (also between a check and the read), or killed and not yet reaped
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or between the open and the read (ESRCH)
        return True


def wait_until(condition, timeout: float = CEILING_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def logged_line(server, pattern: str, timeout: float = CEILING_S) -> str:
    """The access log line matching `pattern` (written just after each request ends)."""
    deadline = time.monotonic() + timeout
    while not (lines := [line for line in server.log.read_text().splitlines() if re.search(pattern, line)]):
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.02)
    return lines[0]


def test_one_request_cannot_hold_every_worker(busy_server, tmp_path):
    trace, gate, opened = tmp_path / "trace", tmp_path / "gate", tmp_path / "open"
    opened.touch()
    with ThreadPoolExecutor(1) as background:
        slow = background.submit(post_gated, busy_server, gated(trace, gate, 2))  # its items wait until the gate opens
        wait_until(trace.exists)  # the slow request's first item is being scored
        quick = post_gated(busy_server, gated(trace, opened, 1, "quick"))
        assert not slow.done()  # answered while the slow one waits: behind it, it would have waited for the gate too
        gate.touch()
        assert slow.result()["scores"] == [1.0, 1.0]
    assert quick["scores"] == [1.0]


def test_a_request_is_scored_within_its_time_budget_and_its_other_items_get_an_error(busy_server, tmp_path):
    trace, opened, closed = tmp_path / "trace", tmp_path / "open", tmp_path / "never"
    opened.touch()
    items = gated(trace, opened, 2) + gated(trace, closed, 2, first=2)
    started = time.monotonic()
    answer = post_gated(busy_server, items)  # item 2 waits for a gate that never opens
    elapsed = time.monotonic() - started
    assert answer["scores"] == [1.0, 1.0, None, None]
    assert answer["errors"][2:] == [f"not scored within the request's time budget of {BUSY_REQUEST_TIMEOUT_S} s"] * 2
    assert BUSY_REQUEST_TIMEOUT_S <= elapsed < CEILING_S  # at the budget, not when item 2's worker meets item_timeout
    (_, waiting_worker), = [(name, pid) for name, pid in started_items(trace) if name == "item 2"]
    wait_until(lambda: ended(waiting_worker))  # item 2 was stopped: its worker killed
    assert post_gated(busy_server, gated(trace, opened, 2, "after"))["scores"] == [1.0, 1.0]
    # item 3 never began: queued, it would have begun before the next request's items
    assert sorted(name for name, _ in started_items(trace)) == ["after 0", "after 1", "item 0", "item 1", "item 2"]


def send_head(sock: socket.socket, body_length: int) -> None:
    sock.sendall(
        b"POST /v1/score HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {body_length}\r\n\r\n".encode()
    )


def read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(CEILING_S)  # uvicorn alone waits for ever for a head or body: a server that never closes fails here
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_client_that_goes_away_stops_its_scoring_and_is_logged_as_gone_not_as_500(busy_server, tmp_path):
    trace, closed, opened = tmp_path / "trace", tmp_path / "never", tmp_path / "open"
    opened.touch()
    body = json.dumps({"items": gated(trace, closed, 3), "reward_funcs": ["traced_gate"]}).encode()
    with socket.create_connection(("127.0.0.1", busy_server.port)) as sock:
        send_head(sock, len(body))
        sock.sendall(body)
        wait_until(trace.exists)
    (_, worker), = started_items(trace)
    wait_until(lambda: ended(worker))  # item 0 was stopped once its client had gone: its worker killed
    assert "status=499" in logged_line(busy_server, r"POST /v1/score items=3 .*status=")
    assert post_gated(busy_server, gated(trace, opened, 1, "after"))["scores"] == [1.0]
    assert [name for name, _ in started_items(trace)] == ["item 0", "after 0"]  # items 1 and 2 never began
    # A client gone halfway through its body: logged 499 too, with the bytes that came.
    with socket.create_connection(("127.0.0.1", busy_server.port)) as sock:
        send_head(sock, 1000)
        sock.sendall(b'{"items": [')
        time.sleep(0.2)
    assert "status=499" in logged_line(busy_server, r"POST /v1/score items=0 bytes=11 .*status=")
    output = busy_server.output.read_text()
    assert "Exception" not in output and "status=500" not in busy_server.log.read_text(), output[-3000:]


def test_a_connection_that_stalls_in_its_headers_is_closed(busy_server):
    # Silent from the start; a head that stops halfway; the same after a whole request on the connection.
    whole = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
    for first, then in ((b"", b""), (b"", b"POST /v1/score HTTP/1.1\r\nHost: te"), (whole, b"GET /hea")):
        with socket.create_connection(("127.0.0.1", busy_server.port)) as sock:
            if first:
                sock.sendall(first)
                response = b""
                while not response.endswith(b"}"):  # the whole answer, headers and JSON body
                    response += sock.recv(65536)
                assert response.startswith(b"HTTP/1.1 200")
            sock.sendall(then)
            assert read_until_closed(sock) == b"", then


def test_a_body_that_stalls_is_408_and_its_connection_closed(busy_server):
    with socket.create_connection(("127.0.0.1", busy_server.port)) as sock:
        send_head(sock, 100)
        sock.sendall(b'{"items": [')  # the rest never comes
        received = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 408") and b"connection: close" in received.lower()
    assert f"request body not received within {STALL_TIMEOUT_S} s (--body_timeout)".encode() in received


# --- the API key ----------------------------------------------------------------------------------

KEYED_REQUESTS = [
    ("POST", "/", {"src": ["q"], "tgt": ["1"], "response": ["<answer>1</answer>"]}),
    ("POST", "/v1/score", {"items": [{"completion": "<answer>1</answer>", "answer": "1"}]}),
    ("GET", "/v1/reward_funcs", None),
]


@pytest.mark.parametrize("method, path, body", KEYED_REQUESTS, ids=[p for _, p, _ in KEYED_REQUESTS])
def test_scoring_endpoints_need_the_key(keyed_server, method, path, body):
    def call(headers):
        return httpx.request(method, keyed_server.url + path, json=body, headers=headers, timeout=30)

    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}):
        answer = call(headers)
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
        assert answer.json()["error_code"] == 401 and answer.json()["error_msg"].startswith("missing or wrong API key")
    assert call({"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_the_server_binds_loopback_and_reads_the_key_from_the_environment(monkeypatch):
    from reward_server.reward_server import parse_args

    monkeypatch.setenv(API_KEY_ENV, KEY)
    args = parse_args([])
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 8731, KEY)
    assert parse_args(["--api-key", "flag-key"]).api_key == "flag-key"


def key_file(folder: Path, mode: int = 0o600) -> Path:
    path = folder / "server.key"
    path.write_text(KEY + "\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize("how", ["--api-key-file", "GRPO_REWARD_SERVER_API_KEY_FILE"])
def test_the_server_reads_its_key_from_a_file_so_ps_never_shows_it(tmp_path, how):
    """The real server over loopback, its key in a 0600 file named by the flag or the environment: scoring needs the
    key, and neither the server's command line nor its environment holds it."""
    path = key_file(tmp_path)
    flags, env = (["--api-key-file", str(path)], None) if how == "--api-key-file" else ([], {f"{API_KEY_ENV}_FILE": str(path)})
    with reward_server(tmp_path, "--workers", "1", *flags, env=env) as running:
        body = {"items": [{"prompt": "p", "completion": "<think>a</think><answer>1</answer>"}], "reward_funcs": ["format"]}
        assert httpx.post(running.url + "/v1/score", json=body, timeout=30).status_code == 401
        answer = httpx.post(running.url + "/v1/score", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert answer.status_code == 200
        seen = Path(f"/proc/{running.process.pid}/cmdline").read_bytes() + Path(f"/proc/{running.process.pid}/environ").read_bytes()
        assert str(path).encode() in seen and KEY.encode() not in seen
    assert "warning" not in running.output.read_text()


def test_a_key_file_others_may_read_is_refused_and_a_key_on_the_command_line_warned(tmp_path, capsys):
    open_file = key_file(tmp_path, 0o644)
    done = subprocess.run(server_command(free_port(), "--api-key-file", str(open_file)), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    (line,) = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and f"--api-key-file = {open_file}: the key file must be this user's and readable by nobody else" in line
    assert "mode 644): chmod 600" in line
    from reward_server.reward_server import parse_args

    assert parse_args(["--api-key", "flag-key"]).api_key == "flag-key"
    assert "--api-key puts the key in the command line, which `ps` shows to every user: use --api-key-file" in capsys.readouterr().err


def test_without_the_key_a_malformed_body_is_401_not_parsed(keyed_server):
    answer = httpx.post(keyed_server.url + "/v1/score", content=b"{", headers={"content-type": "application/json"})
    assert answer.status_code == 401


def test_health_and_the_schema_stay_open_with_a_key(keyed_server):
    assert httpx.get(keyed_server.url + "/health").status_code == 200
    schema = httpx.get(keyed_server.url + "/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


# --- the trainer's client -------------------------------------------------------------------------


def remote(items, names, url, **options):
    settings = options.pop("settings", None)
    server = RewardServer(**({"url": url, "protocol": "v1", "timeout": 30, "retries": 0} | options))
    samples = [{k: v for k, v in item.items() if k != "completion"} for item in items]
    return score_remote([i["completion"] for i in items], samples, names, [1.0] * len(names), server, settings)


def test_score_remote_equals_in_process_through_v1(server):
    table = remote(ITEMS, ["accuracy", "format"], server.url)
    as_served = {"scores": table.totals, "components": table.columns, "errors": table.errors}
    assert as_served == in_process(ITEMS, ["accuracy", "format"])


def test_score_remote_sends_the_reward_settings(server):
    table = remote(LENGTH_ITEMS, LENGTH_NAMES, server.url, settings=LENGTH_SETTINGS)
    as_served = {"scores": table.totals, "components": table.columns, "errors": table.errors}
    assert as_served == in_process(LENGTH_ITEMS, LENGTH_NAMES, settings=LENGTH_SETTINGS)
    assert all(error is None for error in table.errors)


def test_score_remote_through_paddlenlp_has_totals_only_and_null_marked_errors(server):
    table = remote(ITEMS, ["accuracy", "format"], server.url, protocol="paddlenlp")
    assert table.totals == in_process(ITEMS, ["accuracy", "format"])["scores"]
    assert table.columns == {}
    assert table.errors[:4] == [None] * 4 and "item 4: accuracy: ValueError" in table.errors[4]


def test_score_remote_sends_the_key(keyed_server):
    assert remote(ITEMS[:1], ["format"], keyed_server.url, api_key=KEY).totals == [1.0]
    started = time.monotonic()
    with pytest.raises(RewardServerError, match="HTTP 401: missing or wrong API key"):
        remote(ITEMS[:1], ["format"], keyed_server.url, retries=5, backoff_s=10)
    assert time.monotonic() - started < 5  # a 4xx is not retried


def test_score_remote_raises_a_4xx_at_once_with_the_servers_message(server):
    started = time.monotonic()
    with pytest.raises(
        RewardServerError,
        match=r"/v1/score refused the batch: HTTP 422: unknown reward function 'acuracy'\. Did you mean",
    ):
        remote(ITEMS[:1], ["acuracy"], server.url, retries=5, backoff_s=10)
    assert time.monotonic() - started < 5


def test_score_remote_names_the_server_when_retries_are_exhausted():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(
        RewardServerError, match=rf"reward server {url}/v1/score failed 3 attempt\(s\); last: ConnectError"
    ):
        remote(ITEMS[:1], ["format"], url, retries=2, backoff_s=0.01)


def test_score_remote_retries_a_request_that_timed_out(server):
    with pytest.raises(RewardServerError, match=r"failed 2 attempt\(s\); last: no complete answer within reward_server_timeout = 0.3 s"):
        remote([{"completion": "HANG"}], ["hang_on_marker"], server.url, timeout=0.3, retries=1, backoff_s=0.01)


def test_score_remote_waits_for_a_server_that_is_starting(tmp_path):
    port = free_port()
    scored = {}

    def score():
        scored["table"] = remote(ITEMS[:2], ["format"], f"http://127.0.0.1:{port}", retries=8, backoff_s=0.25)

    caller = threading.Thread(target=score)
    caller.start()
    time.sleep(1.0)  # its first attempts are refused: nothing listens on the port yet
    with reward_server(tmp_path, "--workers", "1", port=port):
        caller.join(timeout=60)
    assert scored["table"].totals == [1.0, 1.0]


# PaddleNLP's reward_server.py answers an exception with HTTP 200, error_code 500 and a score of 0 per item.
PADDLENLP_FAILURE = {"error_code": 500, "error_msg": "boom", "score": [0, 0]}


def test_score_remote_retries_paddlenlps_failed_batch_and_stops_with_its_message_never_its_zeros():
    received = []
    with foreign_server(PADDLENLP_FAILURE, received=received) as url:
        with pytest.raises(RewardServerError, match=r"/ failed 3 attempt\(s\); last: error_code 500: boom$"):
            remote(ITEMS[:2], ["accuracy"], url, protocol="paddlenlp", retries=2, backoff_s=0.01)
    assert len(received) == 3  # retried like a 5xx


def test_score_remote_takes_the_scores_once_a_failed_paddlenlp_batch_succeeds_on_retry():
    answers = [PADDLENLP_FAILURE, {"error_code": 0, "error_msg": "Success", "score": [1.0, 0.5]}]
    with foreign_server(answers) as url:
        table = remote(ITEMS[:2], ["accuracy"], url, protocol="paddlenlp", retries=1, backoff_s=0.01)
    assert table.totals == [1.0, 0.5] and table.errors == [None, None]


def test_score_remote_refuses_an_answer_of_the_wrong_length():
    with foreign_server({"scores": [1.0], "components": {"format": [1.0]}, "errors": [None]}) as url:
        with pytest.raises(RewardServerError, match="different number of items than the 2 sent"):
            remote(ITEMS[:2], ["format"], url)


# --- fuzzing --------------------------------------------------------------------------------------


def test_fuzz_every_endpoint_from_its_openapi_schema(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 4
    # Per endpoint, bodies that break the schema (wrong types, missing fields) and bodies that fit it;
    # the GET endpoints take no input, so nothing they are sent can break their schema.
    cases = [(op, GenerationMode.POSITIVE) for op in operations]
    cases += [(op, GenerationMode.NEGATIVE) for op in operations if op.method.upper() == "POST"]
    for operation, mode in cases:

        @settings(
            max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case):
            answer = case.call(timeout=30)
            assert answer.status_code < 500, (
                f"{case.method} {case.path} {case.body!r} -> {answer.status_code} {answer.text}"
            )

        fuzz()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(path=st.sampled_from(SCORING_PATHS), body=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_fuzz_arbitrary_bytes_and_json_never_5xx(client, path, body):
    answer = client.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code < 500, f"{path} {body!r} -> {answer.status_code} {answer.text}"
