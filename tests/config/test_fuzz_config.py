"""Property-based tests of load_config on malformed config files and command lines (hypothesis).

The property: load_config([CONFIG.json, *overrides]) returns a GRPOConfig or raises ConfigError, never any
other exception, and the error names what was wrong. "Names" is defined as:
- a key: the message contains the key's canonical name or one of its aliases as a whole word
  (`rollout_n`, `num_generations`), or, for an unknown key, the key as written in quotes;
- the file: the message starts with "PATH:"; for text that is not JSON or not UTF-8 it starts with
  "PATH:LINE:COLUMN: " and LINE is the line holding the fault;
- the command line: the message starts with "command line: ", or names a key given there.
A base config that loads (the defaults, or config/tiny) is perturbed, so every error comes from the
perturbation, and when the config loads every perturbed value must be in it: nothing is silently dropped.
"""

import json
import math
import re
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from alignment.basics.errors import ConfigError
from alignment.algo.kl import KL_ESTIMATOR_SYNONYMS
from alignment.config.paddlenlp_keys import PADDLENLP_KEYS
from alignment.config.schema import KEYS, GRPOConfig
from alignment.config.aliases import ALIASES, IMPORTANCE_SAMPLING_SYNONYMS, SURROGATE_SYNONYMS, TRL_LOSS_TYPES
from alignment.config.cli import load_config

REPO = Path(__file__).resolve().parents[2]
BASES = [{}, json.loads((REPO / "config/tiny/grpo_argument.json").read_text())]
HINTS = typing.get_type_hints(GRPOConfig)
CHOICES = {name: f.metadata["choices"] for name, f in GRPOConfig.__dataclass_fields__.items() if "choices" in f.metadata}
SPELLINGS = {name: {name} | {alias for alias, key in ALIASES.items() if key == name} for name in KEYS}
# validate() fills these in (or reads the file system_prompt names): the loaded value may differ from the given one
# Values stored as the name they are a synonym of (verl's names for the same thing).
STORED_AS = {
    "importance_sampling_mode": IMPORTANCE_SAMPLING_SYNONYMS, "kl_estimator": KL_ESTIMATOR_SYNONYMS,
    "kl_in_reward_estimator": KL_ESTIMATOR_SYNONYMS, "surrogate": SURROGATE_SYNONYMS,
    "loss_type": {name: stored[1] for name, stored in TRL_LOSS_TYPES.items() if stored},  # TRL's sapo: loss_type grpo
    "reward_model_name_or_path": {"": None},  # PaddleNLP's files write "" for no reward model
}
DERIVED = {"per_device_prompt_batch_size", "gradient_accumulation_steps", "mini_batch_size", "clip_range_ratio_low",
           "clip_range_ratio_high", "cosine_max_len", "soft_max_length", "system_prompt"}
# The documented ranges ("must be at least 1", "> 0", ...) as a table: a value below its key's bound must be refused.
AT_LEAST = {
    "rollout_n": 2, "per_device_train_batch_size": 1, "per_device_prompt_batch_size": 1, "gradient_accumulation_steps": 1,
    "mini_batch_size": 1, "max_prompt_len": 1, "max_dec_len": 1, "max_seq_len": 1, "min_dec_len": 0, "top_k": 0,
    "num_iterations": 1, "max_resample_times": 0, "cosine_max_len": 1, "repetition_n_grams": 1, "soft_max_length": 1,
    "soft_cache_length": 1, "reward_server_retries": 0, "warmup_steps": 0, "max_consecutive_skips": 1, "seed": 0,
    "logprob_chunk_tokens": 1, "lora_rank": 1, "sharding_parallel_degree": -1, "tensor_parallel_degree": 1, "eval_steps": 0,
    "per_device_eval_batch_size": 1, "eval_rollout_n": 0, "logging_steps": 1, "log_completions_per_step": 0, "save_steps": 0,
    "save_total_limit": 1, "max_evaluate_steps": -1, "max_steps": -1,
    "min_p": 0.0, "kl_loss_coeff": 0.0, "dynamic_sampling_min_std": 0.0, "learning_rate": 0.0, "min_learning_rate": 0.0,
    "warmup_ratio": 0.0, "weight_decay": 0.0, "adam_beta1": 0.0, "adam_beta2": 0.0, "max_grad_norm": 0.0, "lora_dropout": 0.0,
    "importance_sampling_cap": 1.0,
}
ABOVE = {key: 0.0 for key in ("temperature", "top_p", "repetition_penalty", "weight_sync_tolerance", "clip_range_ratio",
                              "clip_range_ratio_high", "reward_server_timeout", "adam_epsilon", "lora_alpha")} | {"dual_clip_ratio": 1.0}


def out_of_range(name: str, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return True
    return name in AT_LEAST and value < AT_LEAST[name] or name in ABOVE and value <= ABOVE[name]


# hypothesis: fixed examples so CI is deterministic; no deadline (the first bf16 example imports paddle)
FUZZ = settings(derandomize=True, deadline=None, max_examples=250, suppress_health_check=[HealthCheck.too_slow])


def kind_of(name: str) -> tuple:
    """-> (type, nullable) from the dataclass annotation: Optional[int] -> (int, True)."""
    args = typing.get_args(HINTS[name])
    if type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return HINTS[name], False


def names_key(message: str, names) -> bool:
    spellings = {s for name in names for s in SPELLINGS.get(name, ())}
    return any(re.search(rf"(?<![\w]){re.escape(s)}(?![\w])", message) for s in spellings)


def has_declared_types(config: GRPOConfig) -> bool:
    """Every value of its annotation's type: an int is not a bool, a float key holds a float, not an int."""
    def fits(kind, value):
        if typing.get_origin(kind) is list:
            return isinstance(value, list) and all(fits(typing.get_args(kind)[0], v) for v in value)
        return type(value) is kind
    return all(fits(kind_of(name)[0], getattr(config, name)) or (kind_of(name)[1] and getattr(config, name) is None) for name in KEYS)


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "grpo_argument.json"


def load(path: Path, text, args=()):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        outcome = load_config([str(path), *args])
    except ConfigError as e:  # any other exception fails the test with its traceback
        outcome = e
    if currently_in_test_context():  # pytest --hypothesis-show-statistics: how the examples ended
        event(
            "loaded"
            if isinstance(outcome, GRPOConfig)
            else re.sub(r"'[^']*'|\"[^\"]*\"|[\d.e+-]+", "_", str(outcome).replace(str(path), "PATH"))[:50]
        )
    return outcome


# ---- values for one key, tagged: ("type", v) a JSON type the key refuses; ("range", v) the key's type, any value,
# or ("out", v) where that value is past int64 or the key's bound

odd_text = st.one_of(
    st.text(max_size=12), st.sampled_from(["", "4", "1e-6", "true", "null", "NaN", "-1", "a" * 300, "x\x00y", "../", "auto"])
)
huge_ints = st.sampled_from([0, -1, 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**30, -(10**30), 10**400])
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
specials = non_finite | st.just(10**400)  # 10**400 is past float's range
nested = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=5,
)


def wrong_type(name: str):
    kind, nullable = kind_of(name)
    objects = st.dictionaries(st.text(max_size=5), nested, max_size=2)
    common = [objects] + ([] if nullable else [st.none()])
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        bad_item = (
            st.one_of(st.integers(), st.booleans(), st.none(), objects)
            if item is str
            else st.one_of(odd_text, st.booleans(), st.none(), specials)
        )
        options = [
            odd_text.filter(lambda text: text not in CHOICES.get(name, ())),  # report_to "visualdl" is PaddleNLP's list of one
            st.integers(),
            st.booleans(),
            st.lists(bad_item, min_size=1, max_size=3).flatmap(lambda xs: st.permutations(xs + ["format"])),
        ]
    else:
        scalar_lists = st.lists(st.integers() | st.text(max_size=3), max_size=3)
        options = {
            int: [odd_text, st.booleans(), st.floats(allow_nan=True), non_finite, scalar_lists],
            float: [odd_text, st.booleans(), specials, scalar_lists],
            bool: [st.integers().filter(lambda v: v not in (0, 1)), odd_text, scalar_lists],  # 0 and 1 are PaddleNLP's booleans
            str: [st.integers(), st.floats(allow_nan=True), st.booleans(), scalar_lists],
        }[kind]
    return st.one_of(*options, *common).map(lambda v: ("type", v))


def right_type(name: str):
    kind, nullable = kind_of(name)
    default = GRPOConfig.__dataclass_fields__[name].default
    plausible = [st.just(default)] if isinstance(default, (int, float, str)) else []  # often loads: the round trip is checked
    if name in CHOICES:  # a list key with choices (report_to) takes a list of them
        choice = st.sampled_from(CHOICES[name])
        options = [st.lists(choice, min_size=1, max_size=3, unique=True) if typing.get_origin(kind) is list else choice]
    elif typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        element = (
            st.sampled_from(["accuracy", "format", "q_proj"]) | st.text(max_size=6)
            if item is str
            else st.floats(-1e6, 1e6) | st.integers(-3, 3)
        )
        options = [st.lists(element, max_size=4)]
    else:
        options = {
            int: [st.integers(-3, 300), huge_ints, *plausible],
            float: [
                st.floats(allow_nan=False, allow_infinity=False),
                st.floats(0, 1),
                st.sampled_from([0.0, -0.0, 1.0, 1e-8, 2.0, -1.0, 1e308]),
                st.integers(-5, 5),
                *plausible,
            ],
            bool: [st.booleans()],
            str: [odd_text, *plausible],
        }[kind]
    return st.one_of(*options, *([st.none()] if nullable else [])).map(lambda v: ("out" if out_of_range(name, v) else "range", v))


unknown_keys = st.one_of(
    st.text(max_size=15),
    st.sampled_from(sorted(KEYS)).map(lambda k: k[:-1] + ("x" if k[-1] != "x" else "y")),  # one letter off
    st.sampled_from(sorted(KEYS)).map(lambda k: k.replace("_", "-")),
).filter(lambda k: k not in KEYS and k not in ALIASES and k not in PADDLENLP_KEYS)


@st.composite
def perturbed_configs(draw):
    """-> (config dict, {key as written: tag}). Tags "type", "unknown" and "clash" (an alias and its key both
    given) are refused while reading the file, "out" by validate(); "range" may load."""
    base = dict(draw(st.sampled_from(BASES)))
    tags = {}
    wrong_types = draw(st.booleans())  # else every value has its key's type, and validate() judges them
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(sorted(KEYS)))
        if any(ALIASES.get(k, k) == name for k in tags):
            continue
        written = draw(st.sampled_from(sorted(SPELLINGS[name])))
        tag, value = draw(wrong_type(name) if wrong_types and draw(st.integers(0, 2)) == 0 else right_type(name))
        base.pop(name, None)
        base[written] = value
        tags[written] = tag
    if draw(st.integers(0, 4)) == 0:
        key = draw(unknown_keys)
        base[key], tags[key] = draw(nested), "unknown"
    if draw(st.integers(0, 5)) == 0:  # an alias and its key both given
        alias = draw(st.sampled_from(sorted(ALIASES)))
        base.pop(ALIASES[alias], None)
        base[alias] = base[ALIASES[alias]] = draw(right_type(ALIASES[alias]))[1]
        tags[alias] = tags[ALIASES[alias]] = "clash"
    return base, tags


@FUZZ
@given(perturbed_configs())
@example(({"rollout_n": True}, {"rollout_n": "type"}))
@example(({"temperature": math.nan}, {"temperature": "type"}))
@example(({"learning_rate": math.inf}, {"learning_rate": "type"}))
@example(({"max_steps": 10**400}, {"max_steps": "range"}))
@example(({"reward_functions": "format"}, {"reward_functions": "type"}))
@example(({"system_prompt": "a" * 300}, {"system_prompt": "range"}))  # one path component over NAME_MAX
@example(({"external_plugins": ["x\x00y"]}, {"external_plugins": "range"}))
@example(({"gradient_accumulation_steps": 0}, {"gradient_accumulation_steps": "range"}))
def test_config_file_values(config_path, case):
    config, tags = case
    result = load(config_path, json.dumps(config))
    in_file = {k for k, tag in tags.items() if tag in ("type", "unknown", "clash")}
    must_fail = {k for k, tag in tags.items() if tag != "range"}
    if isinstance(result, GRPOConfig):
        assert not must_fail, f"loaded although {must_fail} are wrong"
        assert has_declared_types(result)
        # the resolved config a run writes loads back as itself (a secret as "set" or "unset" in both)
        assert load(config_path, result.to_json()).to_json() == result.to_json()
        for written, tag in tags.items():
            name = ALIASES.get(written, written)
            given_value = config[written]
            if isinstance(given_value, str):
                given_value = STORED_AS.get(name, {}).get(given_value, given_value)
            if given_value is not None and name not in DERIVED:
                assert getattr(result, name) == given_value, name
        return
    message = str(result)
    if in_file:  # found while reading the file, before validate(): the file and the key are named
        assert message.startswith(f"{config_path}: "), message
        unknown = [k for k in in_file if tags[k] == "unknown"]
        assert names_key(message, [ALIASES.get(k, k) for k in in_file]) or any(f"'{k}'" in message for k in unknown), message
    else:
        assert names_key(message, [ALIASES.get(k, k) for k in tags]), message


# ---- text that is not a JSON object


@st.composite
def broken_json(draw):
    """-> (file bytes, what must happen, (line, column) of the fault or None). What must happen: "at" (an error
    starting PATH:LINE:COLUMN), "fails" (an error starting PATH:) or "any" (loads, or an error starting PATH:)."""
    config, _ = draw(perturbed_configs())
    text = json.dumps(config, indent=draw(st.sampled_from([None, 2])))  # ASCII: a byte offset is a column
    how = draw(st.sampled_from(["truncate", "trailing_comma", "bad_byte", "top_level", "random_bytes", "bad_literal"]))
    if how == "truncate":  # a proper prefix of an object's text is never JSON
        return text[: draw(st.integers(0, len(text) - 1))].encode(), "at", None
    if how == "trailing_comma":  # before the closing brace: one inside a string value would stay valid JSON
        return (text[:-1] + "," + text[-1]).encode(), "at", None
    if how == "bad_byte":  # not UTF-8 at a known place
        at = draw(st.integers(0, len(text)))
        byte = draw(st.sampled_from([b"\x80", b"\xbf", b"\xc0", b"\xc3", b"\xf5", b"\xff"]))
        return text[:at].encode() + byte + text[at:].encode(), "at", (text[:at].count("\n") + 1, at - text.rfind("\n", 0, at))
    if how == "top_level":
        value = draw(st.one_of(st.lists(nested), st.text(), st.integers(), st.floats(), st.booleans(), st.none()))
        return json.dumps(value).encode(), "fails", None
    if how == "bad_literal":  # JavaScript's literals and single quotes
        return (
            draw(
                st.sampled_from(["{'rollout_n': 4}", '{"rollout_n": undefined}', '{"bf16": True}', "{rollout_n: 4}", '{"a": 1} {"b": 2}'])
            ).encode(),
            "at",
            None,
        )
    return draw(st.binary(max_size=200)), "any", None


@FUZZ
@given(broken_json())
@example((b"[" * 100_000 + b"]" * 100_000, "fails", None))  # deeper than Python's recursion limit
@example((b'{"rollout_n": ' + b"1" * 5000 + b"}", "fails", None))  # past int()'s 4300 digits
@example((b'{\n  "rollout_n": 4,\n  "rollout_n": 8\n}', "fails", None))  # a key twice: json.loads would keep the last
@example((b"\xef\xbb\xbf{}", "any", None))  # a byte-order mark is allowed
@example((b'\xef\xbb\xbf{"a\xff": 1}', "at", (1, 7)))  # the column counts the mark's 3 bytes
def test_broken_json_names_file_line_and_column(config_path, case):
    data, must, where = case
    result = load(config_path, data)
    if isinstance(result, GRPOConfig):
        assert must == "any"
        return
    message = str(result)
    assert message.startswith(f"{config_path}:"), message
    if must == "at":
        match = re.match(rf"{re.escape(str(config_path))}:(\d+):(\d+): ", message)
        assert match, message
        lines = data.split(b"\n")
        assert 1 <= int(match[1]) <= len(lines) and 1 <= int(match[2]) <= len(lines[int(match[1]) - 1]) + 1, message
        assert where is None or (int(match[1]), int(match[2])) == where, message


# ---- command-line overrides


def expected_from_text(name: str, texts: list):
    """What the command line's text means for key name (argparse's conversions), or INVALID where it has none."""
    kind, _ = kind_of(name)
    item = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
    converted = []
    for text in texts:
        try:
            if item is bool:
                value = {
                    "yes": True, "true": True, "t": True, "y": True, "1": True,
                    "no": False, "false": False, "f": False, "n": False, "0": False,
                }[text.lower()]
            else:
                value = item(text)
        except (KeyError, ValueError):
            return INVALID
        if name in CHOICES and value not in CHOICES[name]:
            return INVALID
        converted.append(value)
    return converted if typing.get_origin(kind) is list else converted[0]


INVALID = object()
any_text = st.one_of(
    st.text(max_size=8),
    st.integers(-(10**20), 10**20).map(str),
    st.floats().map(str),
    st.sampled_from(
        ["true", "false", "yes", "no", "maybe", "", "nan", "inf", "1e999", "-5", "-x", "4.0", "1e3", "accuracy", "format", " 7 "]
    ),
).filter(lambda t: not t.startswith("--"))


def cli_text(name: str):
    """Text for key name: mostly what its type reads (so that configs load and the last-value rule is checked)."""
    kind, _ = kind_of(name)
    item = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
    if name in CHOICES:
        typed = st.sampled_from(CHOICES[name])
    else:
        default = GRPOConfig.__dataclass_fields__[name].default
        plausible = [st.just(str(default))] if isinstance(default, (int, float, str)) and not isinstance(default, bool) else []
        typed = st.one_of(*plausible, {int: st.integers(-2, 100).map(str), float: st.floats(-1, 2).map(str),
                                       bool: st.sampled_from(["true", "false", "yes", "0", "T"]),
                                       str: st.sampled_from(["accuracy", "format", "q_proj", "auto", "-x", ""])}[item])
    return st.one_of(typed, typed, any_text)


def word(thing: str) -> str:
    return rf"(?<![\w]){re.escape(thing)}(?![\w])"


@st.composite
def overrides(draw):
    """-> (argv after the file, {canonical key: expected last value or INVALID}, patterns an error may name)."""
    args, expected, named, spelled = [], {}, [], {}

    def expect(name, value):  # a key given twice keeps its last value; text that reads as no value is refused wherever it is
        expected[name] = INVALID if expected.get(name) is INVALID else value

    for _ in range(draw(st.integers(1, 3))):
        shape = draw(st.sampled_from(["pair"] * 6 + ["eq", "eq", "no", "unknown", "stray"]))
        name = draw(st.sampled_from(sorted(KEYS)))
        written = draw(st.sampled_from(sorted(SPELLINGS[name])))
        kind, _ = kind_of(name)
        count = draw(st.sampled_from([1, 1, 1, 1, 0, 2, 3]) if shape == "pair" else st.integers(1, 2))
        values = draw(st.lists(cli_text(name), min_size=count, max_size=count))
        if shape in ("pair", "eq", "no") and spelled.setdefault(name, written) != written:
            expected[name] = INVALID  # a key and its alias (or two of its aliases) together: refused, as in the file
        if shape in ("pair", "eq"):
            args += [f"--{written}", *values] if shape == "pair" else [f"--{written}={values[0]}", *values[1:]]
            named += [word(written), word(name)]
            if kind is bool and not values:
                expect(name, True)
            elif len(values) == 1 or (typing.get_origin(kind) is list and values):
                expect(name, expected_from_text(name, values))
            else:
                expect(name, INVALID)
        elif shape == "no":
            args.append(f"--no_{written}")
            named += [word(f"no_{written}"), word(name)]
            expect(name, False if kind is bool else INVALID)
        elif shape == "unknown":
            key = draw(unknown_keys.filter(lambda k: "=" not in k))  # "--a=b" is key a with value b
            args += [f"--{key}", *values]
            named.append(re.escape(f"'{key}'"))
            expected[key] = INVALID
        else:  # values before the first key
            args[:0] = values
            named.append(re.escape(repr(values[0])))
            expected[None] = INVALID
    for name, value in expected.items():  # the value kept is judged: one given before it and replaced is not
        if any(
            isinstance(v, float) and not math.isfinite(v) or out_of_range(name, v) for v in (value if isinstance(value, list) else [value])
        ):
            expected[name] = INVALID
    return args, expected, named


@FUZZ
@given(st.sampled_from(BASES), overrides())
@example({}, (["-x"], {None: INVALID}, [re.escape("'-x'")]))
@example({}, (["--=3"], {None: INVALID}, [re.escape("''")]))
@example({}, (["--max_steps", "3", "4"], {"max_steps": INVALID}, [word("max_steps")]))
@example({}, (["--system_prompt", "-x"], {"system_prompt": "-x"}, [word("system_prompt")]))
@example({}, (["--reward_function_weights", "1", "-1e-3"], {"reward_function_weights": [1.0, -1e-3]}, [word("reward_function_weights")]))
@example({}, (["--temperature", "inf"], {"temperature": INVALID}, [word("temperature")]))
@example({}, (["--seed", str(2**64)], {"seed": INVALID}, [word("seed")]))
@example({}, (["--no_use_peft"], {"lora": False}, [word("lora")]))
@example({}, (["--rollout_n", "4", "--num_generations", "6"], {"rollout_n": INVALID}, [word("rollout_n")]))
@example({}, (["--rollout_n", "4", "--rollout_n", "6"], {"rollout_n": 6}, [word("rollout_n")]))
@example({}, (["--lr", "1e-5"], {"learning_rate": 1e-5}, [word("lr")]))
def test_command_line_overrides(config_path, base, case):
    args, expected, named = case
    result = load(config_path, json.dumps(base), args)
    if isinstance(result, GRPOConfig):
        assert INVALID not in expected.values(), f"loaded although {args} holds a mistake"
        assert has_declared_types(result)
        for name, value in expected.items():
            if name not in DERIVED:
                assert getattr(result, name) == value, name  # the last value given wins
        return
    message = str(result)  # from the command line, or validate() naming a key given there
    assert any(re.search(pattern, message) for pattern in named), message


# ---- every key, not a sample: each bound and each float's finiteness, from the file and from the command line

FLOAT_KEYS = sorted(name for name in KEYS if float in (kind_of(name)[0], *typing.get_args(kind_of(name)[0])))


@pytest.mark.parametrize("name", sorted(AT_LEAST.keys() | ABOVE.keys()))
def test_a_value_past_its_bound_is_refused_naming_the_key(config_path, name):
    value = ABOVE[name] if name in ABOVE else AT_LEAST[name] - (1 if isinstance(AT_LEAST[name], int) else 0.5)
    for result in (load(config_path, json.dumps({name: value})), load(config_path, "{}", [f"--{name}", str(value)])):
        assert isinstance(result, ConfigError) and names_key(str(result), [name]), (name, value, result)


@pytest.mark.parametrize("name", FLOAT_KEYS)
@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_every_float_key_refuses_nan_and_infinity(config_path, name, text):
    is_list = typing.get_origin(kind_of(name)[0]) is list
    in_file = load(config_path, f'{{"{name}": {f"[{text}]" if is_list else text}}}')
    assert (
        isinstance(in_file, ConfigError) and str(in_file).startswith(f"{config_path}: key '{name}'") and "finite" in str(in_file)
    ), in_file
    on_command_line = load(config_path, "{}", [f"--{name}", text.lower().replace("infinity", "inf")])
    assert (
        isinstance(on_command_line, ConfigError) and names_key(str(on_command_line), [name]) and "finite" in str(on_command_line)
    ), on_command_line


WRONG_JSON = {  # per type, values of another JSON type
    int: ['"4"', "4.5", "4.0", "true", "[4]", '{"value": 4}'],
    float: ['"0.5"', "true", "[0.5]", "{}"],
    bool: ["2", "-1", "1.0", '"true"', "[true]", "{}"],  # 0 and 1 are booleans, as PaddleNLP's files write them
    str: ["5", "0.5", "true", '["a"]', "{}"],
    list[str]: ['"accuracy"', "5", "[1]", '["a", null]', '[["a"]]', "{}"],
    list[float]: ["1.0", '"1"', '["1"]', "[true]", "[null]", "{}"],
}


@pytest.mark.parametrize("name", sorted(KEYS))
def test_every_key_refuses_every_other_json_type(config_path, name):
    kind, nullable = kind_of(name)
    for text in WRONG_JSON[kind] + ([] if nullable else ["null"]):
        for written in SPELLINGS[name]:
            result = load(config_path, f'{{"{written}": {text}}}')
            assert isinstance(result, ConfigError) and str(result).startswith(f"{config_path}: key '{written}'"), (written, text, result)
