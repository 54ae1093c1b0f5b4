"""cosine, repetition, soft_overlong and substance against hand-computed values, and RewardSettings' checks."""

import json
import math
import random
import time
import tracemalloc

import pytest

from alignment.basics.errors import ConfigError
from alignment.rewards import RewardSettings, get_reward, score_completions
from alignment.rewards.length_rewards import ngram_ids
from alignment.config.cli import load_config

RIGHT, WRONG, NO_ANSWER = "<answer>14</answer>", "<answer>15</answer>", "I cannot tell."
SQRT_HALF = math.sqrt(0.5)  # cos(pi/4)


def value(name, completion, settings, **sample):
    return get_reward(name).fn(completion, {"answer": "14", "prompt": "q", **sample}, settings)


# --- cosine ---------------------------------------------------------------------------------------
# Defaults: correct 1.0 at 0 tokens down to 0.5 at cosine_max_len, wrong -0.5 up to 0.0.
# value = at_max + (at_zero - at_max) * (1 + cos(pi * len / max_len)) / 2
COSINE_100 = RewardSettings(cosine_max_len=100)
COSINE_TABLE = [
    (RIGHT, 0, 1.0),
    (RIGHT, 25, 0.5 + 0.25 * (1 + SQRT_HALF)),  # 0.9268
    (RIGHT, 50, 0.75),
    (RIGHT, 100, 0.5),
    (RIGHT, 150, 0.5),  # past cosine_max_len: held at the max-length value
    (WRONG, 0, -0.5),
    (WRONG, 50, -0.25),
    (WRONG, 75, -0.25 * (1 - SQRT_HALF)),  # -0.0732
    (WRONG, 100, 0.0),
    (WRONG, 4000, 0.0),
    (NO_ANSWER, 50, -0.25),  # no final answer is a wrong answer
]


@pytest.mark.parametrize("completion,tokens,expected", COSINE_TABLE)
def test_cosine_table(completion, tokens, expected):
    assert value("cosine", completion, COSINE_100, completion_tokens=tokens) == pytest.approx(expected, abs=1e-12)


def test_cosine_with_other_values_equals_ms_swift_formula():
    settings = RewardSettings(
        cosine_min_len_value_wrong=-2.0,
        cosine_max_len_value_wrong=-0.5,
        cosine_min_len_value_correct=0.25,
        cosine_max_len_value_correct=2.0,
        cosine_max_len=7,
    )

    def cosfn(t, T, min_value, max_value):  # ms-swift's CosineReward.cosfn, min/max swapped as it calls it
        return max_value - (max_value - min_value) * (1 - math.cos(t * math.pi / T)) / 2

    for tokens in range(8):
        right = value("cosine", RIGHT, settings, completion_tokens=tokens)
        wrong = value("cosine", WRONG, settings, completion_tokens=tokens)
        assert right == pytest.approx(cosfn(tokens, 7, 2.0, 0.25), abs=1e-12)
        assert wrong == pytest.approx(cosfn(tokens, 7, -0.5, -2.0), abs=1e-12)
    assert value("cosine", RIGHT, settings, completion_tokens=0) == 0.25
    assert value("cosine", RIGHT, settings, completion_tokens=7) == pytest.approx(2.0)


# --- soft_overlong (L_max 100, L_cache 20: punished from 81 tokens) -------------------------------
SOFT = RewardSettings(soft_max_length=100, soft_cache_length=20)


@pytest.mark.parametrize(
    "tokens,expected",
    [(0, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (99, -0.95), (100, -1.0), (101, -1.0), (900, -1.0)],
)
def test_soft_overlong_table(tokens, expected):
    assert value("soft_overlong", RIGHT, SOFT, completion_tokens=tokens) == pytest.approx(expected, abs=1e-12)


def test_soft_overlong_with_a_one_token_cache():
    settings = RewardSettings(soft_max_length=2, soft_cache_length=1)
    values = [value("soft_overlong", "", settings, completion_tokens=n) for n in range(4)]
    assert values == [0.0, 0.0, -1.0, -1.0]


# --- repetition -----------------------------------------------------------------------------------
REPETITION_TABLE = [
    ("", 3, -1.0, 0.0),
    ("a b", 3, -1.0, 0.0),  # fewer words than n: no n-gram, nothing repeats
    ("a b c", 3, -1.0, 0.0),
    ("a b c a b c", 3, -1.0, -0.25),  # abc bca cab abc: 3 unique of 4
    ("a\nb\tc   a b c\n", 3, -1.0, -0.25),  # split on any whitespace
    ("the the the the the", 3, -1.0, -2 / 3),  # 1 unique of 3
    ("The cat the CAT", 2, -1.0, -1 / 3),  # lower-cased: (the cat) (cat the) (the cat)
    ("a a b", 1, -0.5, -1 / 6),  # 2 unique of 3 words
    ("a b c a b c", 3, 0.0, 0.0),
]


@pytest.mark.parametrize("completion,n,penalty,expected", REPETITION_TABLE)
def test_repetition_table(completion, n, penalty, expected):
    settings = RewardSettings(repetition_n_grams=n, repetition_max_penalty=penalty)
    assert value("repetition", completion, settings) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_ngram_ids_are_equal_exactly_where_the_ngrams_are(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(rng.choice([1, 2, 3, 50])) for _ in range(rng.randrange(1, 120))]
    for n in range(1, len(tokens) + 1):
        ngrams = list(zip(*(tokens[i:] for i in range(n))))
        ids = ngram_ids(tokens, n)
        assert len(ids) == len(ngrams)
        assert len(set(zip(ngrams, ids))) == len(set(ngrams)) == len(set(ids))  # a bijection


# 60,000 words whatever n: tuples of n words took 480 MB at n = 1024 and grew one reward server worker to
# 6 GB at n = 30,000 (now refused: at most 1024). Ids by doubling keep a few ints per word: 16-18 MiB here.
ONE_WORD, ALL_DIFFERENT = "a " * 60000, " ".join(map(str, range(60000)))


@pytest.mark.parametrize("n", [3, 1000])  # 1000: the most doubling and odd steps below the bound
@pytest.mark.parametrize("completion", [ONE_WORD, ALL_DIFFERENT], ids=["one word", "all different"])
def test_repetition_memory_and_time_are_linear_in_the_completion_whatever_n(n, completion):
    settings = RewardSettings(repetition_n_grams=n)
    ngrams = 60000 - n + 1
    unique = 1 if completion == ONE_WORD else ngrams
    start = time.perf_counter()
    assert value("repetition", completion, settings) == pytest.approx(-(1 - unique / ngrams), abs=1e-12)
    assert time.perf_counter() - start < 2  # 0.2 s on the 2-core dev machine
    tracemalloc.start()
    try:
        value("repetition", completion, settings)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"{peak / 2**20:.0f} MiB"


@pytest.fixture(scope="module")
def model_solutions(gsm8k_dir):
    with open(gsm8k_dir / "example_model_solutions.jsonl") as f:
        return [json.loads(line) for line in f]


def test_repetition_on_real_model_solutions(model_solutions):
    settings = RewardSettings()
    # Line 6, 175b_finetuning: "For the first glass Kylar needs to pay 5 * 1/2 = $<<5*1/2=2.5>>2.5." (13 words)
    # twelve times with the ordinal changed, then "For the thirteenth glass Kylar needs to pay 5 * 1": 167 words,
    # 165 trigrams. Unique: 3 per ordinal x 13, the 10 shared by every line, and (5, *, 1): 50.
    kylar = model_solutions[5]["175b_finetuning"]["solution"]
    assert len(kylar.split()) == 167
    assert value("repetition", kylar, settings) == pytest.approx(-(1 - 50 / 165), abs=1e-12)
    # Line 1, 6b_finetuning: 46 words, 44 trigrams, one repeated ("and she sells", twice).
    janet = model_solutions[0]["6b_finetuning"]["solution"]
    assert value("repetition", janet, settings) == pytest.approx(-1 / 44, abs=1e-12)
    # Line 853, 175b_verification was cut off after one word, "25": no trigram.
    assert value("repetition", model_solutions[852]["175b_verification"]["solution"], settings) == 0.0
    # Every solution lies in [max_penalty, 0], and the value scales with max_penalty.
    half = RewardSettings(repetition_max_penalty=-0.5)
    for row in model_solutions:
        solution = row["6b_verification"]["solution"]
        full = value("repetition", solution, settings)
        assert -1.0 <= full <= 0.0
        assert value("repetition", solution, half) == pytest.approx(full / 2, abs=1e-12)


# --- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,settings", [("cosine", COSINE_100), ("soft_overlong", SOFT)])
@pytest.mark.parametrize(
    "sample,match",
    [
        ({}, "item has no 'completion_tokens'.*send it in each request item"),
        ({"completion_tokens": "12"}, "whole number >= 0, got '12'"),
        ({"completion_tokens": 12.0}, "whole number >= 0, got 12.0"),
        ({"completion_tokens": True}, "whole number >= 0, got True"),
        ({"completion_tokens": -1}, "whole number >= 0, got -1"),
    ],
)
def test_a_length_reward_without_a_valid_token_count_raises(name, settings, sample, match):
    with pytest.raises(ValueError, match=match):
        value(name, RIGHT, settings, **sample)


@pytest.mark.parametrize(
    "name,settings,unset",
    [
        ("cosine", RewardSettings(), "cosine_max_len"),
        ("soft_overlong", RewardSettings(soft_max_length=100), "soft_cache_length"),
        ("soft_overlong", RewardSettings(soft_cache_length=20), "soft_max_length"),
    ],
)
def test_a_length_reward_needs_its_settings(name, settings, unset):
    with pytest.raises(ValueError, match=f"{unset} is not set"):
        value(name, RIGHT, settings, completion_tokens=10)


def test_score_completions_passes_the_settings_and_keeps_per_item_errors():
    settings = RewardSettings(cosine_max_len=100, soft_max_length=100, soft_cache_length=20)
    samples = [
        {"answer": "14", "completion_tokens": 50},
        {"answer": "14", "completion_tokens": 90},
        {"answer": "14"},
    ]
    names, weights = ["accuracy", "cosine", "repetition", "soft_overlong"], [1.0, 1.0, 1.0, 2.0]
    table = score_completions([RIGHT, WRONG, RIGHT], samples, names, weights, settings=settings)
    assert table.columns == {
        "accuracy": [1.0, 0.0, 1.0],
        "cosine": [0.75, pytest.approx(-0.25 * (1 + math.cos(0.9 * math.pi))), None],
        "repetition": [0.0, 0.0, 0.0],
        "soft_overlong": [0.0, -0.5, None],
    }
    assert table.totals == [1.75, pytest.approx(-0.25 * (1 + math.cos(0.9 * math.pi)) - 1.0), None]
    assert table.errors[:2] == [None, None]
    assert table.errors[2].startswith("cosine: ValueError: item has no 'completion_tokens'")
    # Without settings, the defaults: cosine_max_len is unset, and the error says so.
    assert score_completions([RIGHT], samples[:1], ["cosine"], [1.0]).errors == [
        "cosine: ValueError: cosine_max_len is not set (the trainer sets it; a reward server client sends it in "
        "reward_settings)"
    ]


# --- substance ------------------------------------------------------------------------------------
# Each row: the completion, min_words, the row's own instructions, the reward. The bare answers are those issue 53's
# first ifeval run learnt ("end with the phrase X" met by X alone, a title and nothing else).
SENTENCE = "The lamp has a warm light, a steady base and an arm that bends to where you read at night."  # 20 words
FEWER_THAN_30 = {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 30, "relation": "less than"}]}
AT_LEAST_30 = {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{"num_words": 30, "relation": "at least"}]}
SUBSTANCE_TABLE = [
    (SENTENCE, 20, {}, 0.0),
    (SENTENCE, 21, {}, -1.0),  # 20 words
    ("Is there anything else I can help with?", 20, {}, -1.0),
    ("<<A Lamp for Reading>>", 20, {}, -1.0),
    ("", 0, {}, -1.0),  # no words at all is degenerate whatever the floor
    (" ".join(["lamp"] * 11 + ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]), 20, {}, -1.0),  # 11 of 21 words one word
    (" ".join(["lamp"] * 10 + ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]), 20, {}, 0.0),  # 10 of 20: not over half
    ("{" + SENTENCE + "}" + "*" * 66, 20, {}, -1.0),  # 70 symbols ({, comma, period, }, 66 stars) against 69 word characters
    ("{" + SENTENCE + "}" + "*" * 65, 20, {}, 0.0),  # 69 against 69
    ("The lamp is warm and steady, and it bends down to the page you read.", 20, FEWER_THAN_30, 0.0),  # 15 = 30 // 2
    ("The lamp is warm and steady, and it bends to the page you read.", 20, FEWER_THAN_30, -1.0),  # 14 words
    ("The lamp is warm and steady, and it bends down to the page you read.", 20, AT_LEAST_30, -1.0),  # only 'less than' lowers it
]


@pytest.mark.parametrize("completion,min_words,row,expected", SUBSTANCE_TABLE)
def test_substance_against_hand_counted_words_and_symbols(completion, min_words, row, expected):
    assert value("substance", completion, RewardSettings(substance_min_words=min_words), **row) == expected


def test_substance_beside_ifeval_ranks_a_bare_answer_below_an_answer_that_follows_half():
    row = {"prompt": "Describe a lamp. End your reply with the exact phrase 'Any other questions?'",
           "instruction_id_list": ["startend:end_checker", "punctuation:no_comma"],
           "kwargs": [{"end_phrase": "Any other questions?"}, {}]}
    bare, half = "Any other questions?", SENTENCE + " Any other questions?"  # half: the sentence has commas
    scores = score_completions([bare, half], [row, row], ["ifeval", "substance"], [1.0, 1.0])
    assert scores.totals == pytest.approx([1.0 - 1.0, 0.5 + 0.0])
    assert scores.columns == {"ifeval": [1.0, 0.5], "substance": [-1.0, 0.0]}


# --- RewardSettings -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values,match",
    [
        ({"repetition_n_grams": 0}, "repetition_n_grams must be >= 1, got 0"),
        ({"repetition_n_grams": 2.5}, "repetition_n_grams must be an integer, got 2.5"),
        ({"repetition_n_grams": True}, "repetition_n_grams must be an integer, got True"),
        ({"repetition_max_penalty": 0.5}, r"repetition_max_penalty must be <= 0 \(a penalty\), got 0.5"),
        ({"cosine_max_len": 0}, "cosine_max_len must be >= 1"),
        ({"cosine_max_len": 512.0}, "cosine_max_len must be an integer"),
        ({"soft_max_length": -3}, "soft_max_length must be >= 1"),
        ({"soft_cache_length": 0}, "soft_cache_length must be >= 1"),
        ({"soft_max_length": 100, "soft_cache_length": 100}, r"soft_cache_length \(100\) must be less than soft_max"),
        ({"cosine_min_len_value_correct": math.nan}, "cosine_min_len_value_correct must be a finite number, got nan"),
        ({"cosine_max_len_value_wrong": math.inf}, "cosine_max_len_value_wrong must be a finite number"),
        ({"cosine_min_len_value_wrong": "0"}, "cosine_min_len_value_wrong must be a finite number, got '0'"),
        ({"repetition_n_grams": 1025}, "repetition_n_grams must be <= 1024, got 1025"),
        ({"repetition_n_grams": 30000}, "repetition_n_grams must be <= 1024, got 30000"),
        ({"cosine_max_len": 2**24 + 1}, r"cosine_max_len must be <= 16777216 \(tokens\), got 16777217"),
        ({"soft_max_length": 2**63 - 1}, "soft_max_length must be <= 16777216"),
        ({"soft_cache_length": 10**400}, "soft_cache_length must be <= 16777216"),
        ({"substance_min_words": -1}, "substance_min_words must be from 0 to 1024, got -1"),
        ({"substance_min_words": 1025}, "substance_min_words must be from 0 to 1024, got 1025"),
        ({"substance_min_words": 20.0}, "substance_min_words must be an integer, got 20.0"),
    ],
)
def test_reward_settings_refuse_out_of_range_values_naming_the_field(values, match):
    with pytest.raises(ValueError, match=match):
        RewardSettings(**values)


def test_reward_settings_defaults_and_edges_are_valid():
    assert RewardSettings() == RewardSettings(
        cosine_min_len_value_wrong=-0.5,
        cosine_max_len_value_wrong=0.0,
        cosine_min_len_value_correct=1.0,
        cosine_max_len_value_correct=0.5,
        cosine_max_len=None,
        repetition_n_grams=3,
        repetition_max_penalty=-1.0,
        soft_max_length=None,
        soft_cache_length=None,
        substance_min_words=20,
    )
    RewardSettings(repetition_max_penalty=0, cosine_max_len=1, soft_max_length=2, soft_cache_length=1).validate()
    RewardSettings(repetition_n_grams=1024, cosine_max_len=2**24, soft_max_length=2**24, soft_cache_length=2**24 - 1).validate()
    RewardSettings(soft_cache_length=20).validate()  # soft_max_length is filled in later by the trainer


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--repetition_n_grams", "30000"], "repetition_n_grams must be <= 1024, got 30000"),
        (["--cosine_max_len", str(2**40)], "cosine_max_len must be <= 16777216"),
        (["--soft_cache_length", str(2**25)], "soft_cache_length must be <= 16777216"),
    ],
)
def test_a_size_setting_past_its_bound_is_a_config_error_naming_the_key(flags, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["config/tiny/grpo_argument.json", *flags])


def test_the_length_rewards_are_registered_as_taking_the_settings():
    assert all(get_reward(name).uses_settings for name in ("cosine", "repetition", "soft_overlong"))
    assert not get_reward("accuracy").uses_settings  # existing (completion, sample) rewards are unchanged
