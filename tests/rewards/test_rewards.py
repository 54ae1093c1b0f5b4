import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor

import hypothesis
import pytest
from hypothesis import strategies as st

from alignment.rewards import (
    RewardSpec,
    ScoreTable,
    available_rewards,
    get_reward,
    register_reward,
    score_completions,
)
from alignment.rewards.answers import last_answer_tag
from alignment.rewards.logic_rewards import kk_reference_roles

SOLVERS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
BUILT_INS = (
    "accuracy", "correctness", "cosine", "format", "int_answer", "knights_knaves",
    "repetition", "soft_format", "soft_overlong", "step_results", "strict_format", "xmlcount",
)


def score(name, completion, answer):
    return get_reward(name).fn(completion, {"answer": answer, "prompt": "question"})


@pytest.fixture(scope="module")
def model_solutions(gsm8k_dir):
    with open(gsm8k_dir / "example_model_solutions.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def train_rows(gsm8k_dir):
    with open(gsm8k_dir / "train.jsonl") as f:
        return [json.loads(line) for line in f]


# --- accuracy -------------------------------------------------------------------------------------
# Real rows of example_model_solutions.jsonl (line, solver, is_correct) and GSM8K train.jsonl, verbatim,
# then constructed completions for the extraction order, units, LaTeX and edge cases.
DEER_GROUND_TRUTH = "Bucks:50(.50)=25\n8 Points:25(.20)=5 bucks\nA: 5"  # line 696
BASKETS_GROUND_TRUTH = (  # line 853
    "The 3 baskets of green food will cost $25 x 3 = $<<25*3=75>>75.\n"
    "The 3 baskets of red food will cost $18 x 3 = $<<18*3=54>>54.\n"
    "There will be $2 x 3 = $<<2*3=6>>6 off for the baskets of red food.\n"
    "So, the 3 baskets of red food will now cost $54 - $6 = $<<54-6=48>>48.\n"
    "You will have to pay $75 + $48 = $<<75+48=123>>123 for all the baskets of food.\nA: 123"
)
CHARITY_GROUND_TRUTH = (  # line 820
    "Amount raised by all students was 175,000-50,000 = <<175000-50000=125000>>125,000 dollars.\n"
    "Amount raised by each student was 125,000/20 = <<125000/20=6250>>6,250 dollars.\nA: 6,250"
)
ACCURACY_TABLE = [
    # 175b_finetuning, True
    ("Bucks:50(.50)=25\nBucks 8 points:25(.20)=5\nA: 5", DEER_GROUND_TRUTH, 1.0),
    # 175b_verification, False: the output was cut off, no "A:" line, so the last number (25) counts
    ("25", BASKETS_GROUND_TRUTH, 0.0),
    # 175b_finetuning, True: "6,250" against "6,250"
    (
        "The students raised $175,000 - $50,000 = $<<175000-50000=125000>>125,000\n"
        "The students each raised $125,000 / 20 students = $<<125000/20=6250.0>>6,250\nA: 6,250",
        CHARITY_GROUND_TRUTH,
        1.0,
    ),
    # 6b_finetuning, True: "6250" against "6,250"
    (
        "The organizations donated $50,000 so 175,000 - 50,000 = $<<175000-50000=125000>>125,000 comes "
        "from the students.\nEach student raised $125,000 / 20 = $<<125000/20=6250.0>>6,250.\nA: 6250",
        CHARITY_GROUND_TRUTH,
        1.0,
    ),
    # 6b_verification, False
    (
        "The organizations raised $50,000 so 175,000 - 50,000 = $<<175000-50000=125000>>125,000\n"
        "There are 25 students, so each student raised $125000 / 25 = $<<125000/25=5000.0>>5,000\nA: 5",
        CHARITY_GROUND_TRUTH,
        0.0,
    ),
    # train.jsonl line 340 as the reference, its arithmetic as an R1 completion
    (
        "<think>Female:44(.50)=22\nPregnant:22(.50)=11 cows</think><answer>11</answer>",
        "Female:44(.50)=22\nPregnant:22(.50)=11 cows\n#### 11",
        1.0,
    ),
    (
        "<think>Female:44(.50)=22</think><answer>22</answer>",
        "Female:44(.50)=22\nPregnant:22(.50)=11 cows\n#### 11",
        0.0,
    ),
    # dollars, commas, units, trailing period, percent, "18.00" == "18", negatives
    ("<answer>$18.00</answer>", "#### 18", 1.0),
    ("She makes 9 * 2 = $18 every day.\nThe answer is $1,200.", "1200", 1.0),
    ("<answer>18 dollars</answer>", "18", 1.0),
    ("<answer>\\$18</answer>", "18", 1.0),
    ("<answer>50%</answer>", "#### 50", 1.0),
    ("<answer>-5</answer>", "#### -5", 1.0),
    ("<answer>5</answer>", "#### -5", 0.0),
    ("<answer>18.001</answer>", "18", 0.0),  # relative error 5.6e-5 > 1e-6
    ("<answer>0.3333333</answer>", "1/3", 1.0),  # relative error 1e-7 < 1e-6
    ("<answer>" + "9" * 400 + "</answer>", "8" * 400, 0.0),  # exact, not float: both would be inf
    # LaTeX through math-verify
    ("So the probability is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
    ("<answer>\\frac{3}{4}</answer>", "0.75", 1.0),
    ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),
    ("$x = \\boxed{\\frac{\\sqrt{2}}{2}}$", "\\sqrt{2}/2", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("<answer>2\\pi</answer>", "A: 2\\pi", 1.0),
    ("<answer>10^{3}</answer>", "1000", 1.0),
    ("<answer>sqrt(2)/2</answer>", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("<answer>x = 5</answer>", "5", 1.0),
    ("<answer>(1, 2)</answer>", "(1,2)", 1.0),
    ("<answer>(1, 3)</answer>", "(1,2)", 0.0),
    # extraction order: last <answer>, then \boxed, then ####, then an "A:" / "The answer is" line,
    # then the last number
    ("<answer>3</answer> no, <answer>4</answer>", "4", 1.0),
    ("<answer>7</answer> though \\boxed{8}", "7", 1.0),
    ("\\boxed{8}\nA: 7", "8", 1.0),
    (
        "Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72\n\nQuestion: Weng earns $12 an hour",
        "#### 72",
        1.0,
    ),
    ("So the final answer is:\n14 apples", "14", 1.0),
    ("She has 16 - 3 - 4 = 9 eggs left, sold at $2 each, 18", "18", 1.0),
    # no answer at all is a wrong answer (0.0), not an error
    ("I am not sure how to solve this.", "18", 0.0),
    ("", "18", 0.0),
    ("<think>9*2=18</think><answer></answer>", "18", 0.0),
]


@pytest.mark.parametrize("completion,answer,expected", ACCURACY_TABLE)
def test_accuracy_table(completion, answer, expected):
    assert score("accuracy", completion, answer) == expected


@pytest.mark.parametrize(
    "sample,error",
    [
        ({"prompt": "How many?"}, ValueError),
        ({"answer": None}, ValueError),
        ({"answer": "  "}, ValueError),
        ({"answer": ["18"]}, TypeError),
    ],
)
def test_accuracy_raises_without_a_reference(sample, error):
    with pytest.raises(error):
        get_reward("accuracy").fn("<answer>18</answer>", sample)


# --- step_results ---------------------------------------------------------------------------------
TWO_STEPS = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"
STEP_RESULTS_TABLE = [
    ("She has 16 - 3 - 4 = 9 eggs. 9 * 2 = 18 dollars. The answer is 18.", TWO_STEPS, 1.0),
    ("16 - 3 - 4 = 9 eggs left, so she makes 9 * 3 = 27. The answer is 27.", TWO_STEPS, 0.5),  # the first step only
    ("9 * 2 = $18", TWO_STEPS, 0.5),
    ("She has 9 eggs and makes 18 dollars.", TWO_STEPS, 0.0),  # results not stated after '=' earn nothing
    ("16 - 3 = 13, 13 - 4 = 9.0, 9 x 2 = 18.00", TWO_STEPS, 1.0),  # the same values written otherwise
    ("= 9 = 9 = 9", TWO_STEPS, 0.5),  # a result stated twice counts once
    ("", TWO_STEPS, 0.0),
    ("1200 + 30 = 1,230 and 1,230 / 3 = 410", "<<1200+30=1230>>1230, <<1230/3=410>>410\n#### 410", 1.0),
    ("2 * 0.2 = .4 and 0.4 * 1000 = 400", "<<2*.2=.4>>.4 liter = <<.4*1000=400>>400 ml\n#### 400", 1.0),
    ("5 - 8 = -3", "<<5-8=-3>>-3\n#### -3", 1.0),
    ("8 - 5 = 3", "<<5-8=-3>>-3\n#### -3", 0.0),
]


@pytest.mark.parametrize("completion,answer,expected", STEP_RESULTS_TABLE)
def test_step_results_table(completion, answer, expected):
    assert score("step_results", completion, answer) == expected


def test_step_results_refuses_a_reference_without_marks():
    with pytest.raises(ValueError, match="marks no <<...>> calculation"):
        score("step_results", "2 + 2 = 4", "#### 4")


def test_step_results_gives_every_gsm8k_worked_answer_full_credit(train_rows):
    # Each train answer with its marks written out as "a+b = " before the result the text already states: every step of
    # all 7,378 marked answers is found (.5 for 0.5, 1,200 for 1200, "$18" included).
    marked = [row["answer"] for row in train_rows if "<<" in row["answer"]]
    written_out = [re.sub(r"<<([^<>]*)=[^<>=]*>>", r"\1 = ", answer) for answer in marked]
    scores = [score("step_results", text, answer) for text, answer in zip(written_out, marked)]
    assert len(marked) == 7378 and scores == [1.0] * len(marked)


def test_accuracy_agrees_with_is_correct_on_all_model_solutions(model_solutions):
    accuracy = get_reward("accuracy").fn
    total = agree = 0
    start = time.perf_counter()
    for row in model_solutions:
        sample = {"answer": row["ground_truth"], "prompt": row["question"]}
        for solver in SOLVERS:
            if solver in row:
                total += 1
                agree += (accuracy(row[solver]["solution"], sample) == 1.0) == row[solver]["is_correct"]
    figure = f"accuracy reward agrees with is_correct on {agree}/{total} = {100 * agree / total:.2f}%"
    print(f"\n{figure} ({time.perf_counter() - start:.2f} s)")
    assert total > 5000
    assert agree / total >= 0.99, figure


def test_gsm8k_train_answers_score_against_themselves(train_rows):
    # Every real GSM8K answer is right when the model writes it out ("... #### 72"), and its final
    # number is right in the R1 format the bundled task asks for.
    for row in train_rows:
        final = row["answer"].split("####")[-1].strip()
        r1 = f"<think>{row['answer'].split('####')[0].strip()}</think><answer>{final}</answer>"
        assert score("accuracy", row["answer"], row["answer"]) == 1.0, row["answer"]
        assert score("accuracy", r1, row["answer"]) == 1.0, r1
        assert score("format", r1, row["answer"]) == 1.0, r1


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "completion,answer",
    [
        ("\\boxed{" + "(" * 5000 + "}", "5"),
        ("\\boxed{10^{10^{10}}}", "5"),
        ("<answer>9^{9^{9^{9}}}</answer>", "\\frac{1}{2}"),
        ("<answer>" + "{" * 5000, "5"),
    ],
    ids=["5000 parentheses", "10^(10^10)", "9^(9^(9^9))", "5000 open braces"],
)
def test_pathological_answers_return_quickly(completion, answer):
    start = time.perf_counter()
    assert score("accuracy", completion, answer) == 0.0
    assert time.perf_counter() - start < 10


@pytest.mark.timeout(60)
def test_accuracy_off_the_main_thread():
    # math-verify's timeouts use signal.alarm, which only the main thread may set (a reward server's
    # thread pool): there the symbolic comparison runs in a worker process instead of crashing.
    cases = [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{10^{10^{10}}}", "5", 0.0),
        ("<answer>$1,200</answer>", "1200", 1.0),
    ]
    with ThreadPoolExecutor(max_workers=2) as threads:
        results = list(threads.map(lambda case: score("accuracy", case[0], case[1]), cases))
    assert results == [expected for _, _, expected in cases]


# --- format (R1) ----------------------------------------------------------------------------------
FORMAT_TABLE = [
    ("<think>12+7=19. 19-5=14.</think><answer>14</answer>", 1.0),
    ("\n<think>\nFemale:44(.50)=22\nPregnant:22(.50)=11 cows\n</think>\n\n<answer>\n11\n</answer>\n", 1.0),
    ("<think>12+7=19. 19-5=14.</think>", 0.0),  # no answer
    ("<answer>14</answer>", 0.0),  # no think
    ("<think>  </think><answer>14</answer>", 0.0),  # empty think
    ("<think>12+7=19. 19-5=14.</think><answer>\n</answer>", 0.0),  # empty answer
    ("Sure! <think>12+7=19.</think><answer>19</answer>", 0.0),  # text before
    ("<think>12+7=19.</think><answer>19</answer> Hope this helps.", 0.0),  # text after
    ("<answer>19</answer><think>12+7=19.</think>", 0.0),  # wrong order
    ("<think><think>12+7=19.</think></think><answer>19</answer>", 0.0),  # nested
    ("<think>12+7=19.</think><answer>19</answer><answer>20</answer>", 0.0),  # repeated answer
    ("<think>a</think><think>b</think><answer>19</answer>", 0.0),  # repeated think
    ("<reasoning>\n12+7=19.\n</reasoning>\n<answer>\n19\n</answer>\n", 0.0),  # the GSM8K recipe's tags
    ("Bucks:50(.50)=25\nBucks 8 points:25(.20)=5\nA: 5", 0.0),  # a real GSM8K solution
]


@pytest.mark.parametrize("completion,expected", FORMAT_TABLE)
def test_format_table(completion, expected):
    assert score("format", completion, "14") == expected


# --- the five GSM8K recipe rewards ----------------------------------------------------------------
RECIPE = (
    "<reasoning>\nJanet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18.\n</reasoning>\n"
    "<answer>\n18\n</answer>\n"
)
NO_FINAL_NEWLINE = "<reasoning>\n2+2=4\n</reasoning>\n<answer>\n4\n</answer>"  # 51 characters
ONE_LINE = "<reasoning>9 * 2 = 18</reasoning> <answer>18</answer>"
REAL_SOLUTION = "Bucks:50(.50)=25\nBucks 8 points:25(.20)=5\nA: 5"

XMLCOUNT_TABLE = [
    # 4 * 0.125; nothing after "\n</answer>\n" (0 chars) and one "\n" after "\n</answer>" (1 - 1 = 0)
    (RECIPE, 0.5),
    # "Hope this helps" is 15 chars after "\n</answer>\n" and 16 after "\n</answer>":
    # 0.5 - 15 * 0.001 - (16 - 1) * 0.001 = 0.47
    (RECIPE + "Hope this helps", 0.47),
    # no "\n</answer>\n", so the recipe's split keeps the whole 51-char text: 0.125 - 0.051;
    # nothing after "\n</answer>": 0.125 - (0 - 1) * 0.001 = 0.126; total 0.25 + 0.074 + 0.126 = 0.45
    (NO_FINAL_NEWLINE, 0.45),
    (ONE_LINE, 0.0),  # no tag has its newlines
    (REAL_SOLUTION, 0.0),
]


@pytest.mark.parametrize("completion,expected", XMLCOUNT_TABLE)
def test_xmlcount_table(completion, expected):
    assert score("xmlcount", completion, "18") == pytest.approx(expected, abs=1e-12)


FORMAT_RECIPE_TABLE = [
    # (completion, soft_format, strict_format)
    (RECIPE, 0.5, 0.5),  # multi-line reasoning: soft matches only with re.DOTALL (the common fix)
    (ONE_LINE, 0.5, 0.0),
    (NO_FINAL_NEWLINE, 0.5, 0.0),  # strict wants the final "\n"
    ("Sure! " + RECIPE, 0.0, 0.0),  # both are anchored at the start
    ("<think>12+7=19. 19-5=14.</think><answer>14</answer>", 0.0, 0.0),
    (REAL_SOLUTION, 0.0, 0.0),
]


@pytest.mark.parametrize("completion,soft,strict", FORMAT_RECIPE_TABLE)
def test_recipe_format_tables(completion, soft, strict):
    assert score("soft_format", completion, "18") == soft
    assert score("strict_format", completion, "18") == strict


# A chat template that opens the response with the tag (config/smollm2/gsm8k_chat_template.jinja, R1-distill's
# "<think>\n"): the model writes the rest, and the format rewards score the tag, its whitespace and the rest.
CHATML_CUE = "<|im_start|>user\nJanet's ducks?<|im_end|>\n<|im_start|>assistant\n"
OPENED_TABLE = [
    # (reward, prompt_text, completion, expected)
    ("xmlcount", CHATML_CUE + "<reasoning>\n", RECIPE.removeprefix("<reasoning>\n"), 0.5),
    ("soft_format", CHATML_CUE + "<reasoning>\n", RECIPE.removeprefix("<reasoning>\n"), 0.5),
    ("strict_format", CHATML_CUE + "<reasoning>\n", RECIPE.removeprefix("<reasoning>\n"), 0.5),
    ("strict_format", CHATML_CUE + "<reasoning>", RECIPE.removeprefix("<reasoning>"), 0.5),  # the model writes the "\n"
    ("xmlcount", CHATML_CUE + "<reasoning>\n", RECIPE, 0.375),  # a second "<reasoning>\n": that tag no longer counts
    ("xmlcount", CHATML_CUE, RECIPE.removeprefix("<reasoning>\n"), 0.375),  # nobody opened it
    ("format", CHATML_CUE + "<think>\n", "12+7=19.\n</think>\n<answer>19</answer>", 1.0),
    ("format", CHATML_CUE, "12+7=19.\n</think>\n<answer>19</answer>", 0.0),
    ("format", "Question: <think> means what?", "</think><answer>19</answer>", 0.0),  # a tag inside, not at the end
]


@pytest.mark.parametrize("name,prompt_text,completion,expected", OPENED_TABLE)
def test_format_rewards_score_the_response_a_chat_template_opened(name, prompt_text, completion, expected):
    sample = {"answer": "18", "prompt": "Janet's ducks?", "prompt_text": prompt_text}
    assert get_reward(name).fn(completion, sample) == pytest.approx(expected, abs=1e-12)


INT_ANSWER_TABLE = [
    (RECIPE, 0.5),
    ("<answer>\n1,080\n</answer>", 0.0),  # GSM8K train line 346's answer has a comma
    ("<answer>\n-5\n</answer>", 0.0),
    ("<answer>\n$18\n</answer>", 0.0),
    (REAL_SOLUTION, 0.0),  # no tags: the recipe's split keeps the whole text
    ("18", 0.5),  # ... which is why a bare number scores too
]


@pytest.mark.parametrize("completion,expected", INT_ANSWER_TABLE)
def test_int_answer_table(completion, expected):
    assert score("int_answer", completion, "18") == expected


# line 1 of example_model_solutions.jsonl
JANET_GROUND_TRUTH = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
    "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer\u2019s market.\nA: 18"
)
CORRECTNESS_TABLE = [
    (RECIPE, JANET_GROUND_TRUTH, 2.0),
    (RECIPE, "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72", 0.0),
    ("<reasoning>\n48/2=24, 48+24=72\n</reasoning>\n<answer>\n72\n</answer>\n", "#### 72", 2.0),
    ("<answer>\n72.0\n</answer>", "#### 72", 0.0),  # the recipe compares strings
    ("<answer>\n1080\n</answer>", "#### 1,080", 0.0),
    ("<answer>\n1,080\n</answer>", "#### 1,080", 2.0),
    ("<answer>18</answer>", "18", 2.0),
]


@pytest.mark.parametrize("completion,answer,expected", CORRECTNESS_TABLE)
def test_correctness_table(completion, answer, expected):
    assert score("correctness", completion, answer) == expected


def test_correctness_raises_without_answer():
    with pytest.raises(ValueError, match="no 'answer'"):
        get_reward("correctness").fn(RECIPE, {"prompt": "How much?"})


# --- registry -------------------------------------------------------------------------------------
def test_available_rewards_lists_the_built_ins_sorted_with_one_line_descriptions():
    specs = available_rewards()
    names = [spec.name for spec in specs]
    assert names == sorted(names)
    assert set(BUILT_INS) <= set(names)
    for spec in specs:
        assert isinstance(spec, RewardSpec)
        assert spec.description and "\n" not in spec.description


@pytest.mark.parametrize(
    "typo,suggestion", [("acuracy", "accuracy"), ("xml_count", "xmlcount"), ("strict", "strict_format")]
)
def test_unknown_reward_suggests_the_closest(typo, suggestion):
    with pytest.raises(ValueError) as info:
        get_reward(typo)
    message = str(info.value)
    assert f"Did you mean '{suggestion}'" in message
    assert all(name in message for name in BUILT_INS)


def test_reregistering_a_name_with_another_function_raises():
    spec = get_reward("accuracy")
    assert register_reward("accuracy", "same function again")(spec.fn) is spec.fn
    assert get_reward("accuracy") == spec  # its description and needs_reference stay
    with pytest.raises(ValueError, match="already registered"):
        register_reward("accuracy", "another")(lambda completion, sample: 1.0)
    with pytest.raises(ValueError, match="one-line"):
        register_reward("test_rewards_two_lines", "first\nsecond")


# --- batch scoring --------------------------------------------------------------------------------
@register_reward("test_rewards_boom", "test only: 0.25, or raises when the completion says boom")
def _boom(completion, sample):
    if "boom" in completion:
        raise RuntimeError("boom")
    return 0.25


@register_reward("test_rewards_nan", "test only: returns nan")
def _nan(completion, sample):
    return math.nan


def test_score_completions_weighted_totals_and_per_item_errors():
    completions = [
        "<think>12+7=19. 19-5=14.</think><answer>14</answer>",
        "<think>12+7=19. 19-5=15.</think><answer>15</answer>",
        "<think>boom</think><answer>14</answer>",
        "<think>12+7=19. 19-5=14.</think><answer>14</answer>",
    ]
    samples = [{"answer": "14", "prompt": "q"}] * 3 + [{"prompt": "q"}]
    table = score_completions(
        completions, samples, ["accuracy", "format", "test_rewards_boom"], [1.0, 0.5, 2.0]
    )
    assert isinstance(table, ScoreTable)
    assert table.columns == {
        "accuracy": [1.0, 0.0, 1.0, None],
        "format": [1.0, 1.0, 1.0, 1.0],
        "test_rewards_boom": [0.25, 0.25, None, 0.25],
    }
    # 1*1 + 0.5*1 + 2*0.25 = 2.0 and 1*0 + 0.5*1 + 2*0.25 = 1.0; the failed items have no total
    assert table.totals == [2.0, 1.0, None, None]
    assert table.errors == [
        None,
        None,
        "test_rewards_boom: RuntimeError: boom",
        "accuracy: ValueError: sample has no 'answer'",
    ]


def test_score_completions_treats_a_non_finite_value_as_a_failure():
    table = score_completions(
        ["<answer>14</answer>"], [{"answer": "14"}], ["accuracy", "test_rewards_nan"], [1.0, 1.0]
    )
    assert table.columns == {"accuracy": [1.0], "test_rewards_nan": [None]}
    assert table.totals == [None]
    assert table.errors == ["test_rewards_nan: ValueError: returned nan"]


@pytest.mark.parametrize(
    "completions,samples,names,weights,match",
    [
        (["a", "b"], [{"answer": "1"}], ["accuracy"], [1.0], "2 completions but 1 samples"),
        (["a"], [{"answer": "1"}], ["accuracy", "format"], [1.0], "2 reward functions but 1 weights"),
        (["a"], [{"answer": "1"}], [], [], "no reward functions"),
        (["a"], [{"answer": "1"}], ["accuracy", "accuracy"], [1.0, 1.0], "named twice"),
        (["a"], [{"answer": "1"}], ["acuracy"], [1.0], "Did you mean 'accuracy'"),
    ],
)
def test_score_completions_rejects_bad_arguments(completions, samples, names, weights, match):
    with pytest.raises(ValueError, match=match):
        score_completions(completions, samples, names, weights)


# --- adversarial text: every reward is linear in the completion -------------------------------------
# Each took seconds before (quadratic regex backtracking): "-" and 20,000 tabs 5.5 s in accuracy, 20,000
# unclosed <answer> tags 10 s, 4,000 tag pairs 1.2-1.6 s in format, soft_format and strict_format, a
# 20,000-word reference line without a role 11 s in knights_knaves.
ADVERSARIAL = [
    # (reward, completion, reference, expected value, or the start of the ValueError's message)
    ("accuracy", "<answer>-" + "\t" * 20000 + "x</answer>", "5", 0.0),
    ("accuracy", "<answer>-" + " " * 20000 + "$" + " " * 20000 + "x</answer>", "5", 0.0),
    ("accuracy", "<answer>5" + " " * 40000 + "!</answer>", "5", 0.0),
    ("accuracy", "<answer>5" + " " * 20000 + "/" + " " * 20000 + "x</answer>", "5", 0.0),
    ("accuracy", "<answer>" + "-" * 40000 + "</answer>", "5", 0.0),
    ("accuracy", "<answer>" + "1," * 20000 + "x</answer>", "5", 0.0),
    ("accuracy", "<answer>" + "9" * 40000 + ".x</answer>", "5", 0.0),
    ("accuracy", "<answer>" * 20000, "5", 0.0),  # unclosed: no tagged answer; the last number is none
    ("accuracy", "<answer>" * 10000 + "5" + "</answer>" * 10000, "5", 0.0),  # nested: the first pair holds "<answer>...5"
    ("accuracy", "<answer>" * 10000 + "</answer>5", "5", 0.0),
    ("accuracy", "A:" + " \t" * 20000 + "\n" + " " * 20000 + "x" * 600, "5", 0.0),  # over 500 characters: no math-verify
    ("accuracy", "16 - " * 10000 + "5", "5", 1.0),
    ("format", "<think>" + "</think><answer></answer>" * 4000 + "x", "5", 0.0),
    ("format", " " * 40000 + "<think>a</think><answer>5</answer>" + " " * 40000, "5", 1.0),
    ("soft_format", "<reasoning>" + "</reasoning><answer>" * 5000, "5", 0.0),
    ("soft_format", "<reasoning>" + "</reasoning>" + " " * 20000 + "<answer>" * 5000 + "</answer>", "5", 0.5),
    ("strict_format", "<reasoning>\n" + "\n</reasoning>\n<answer>\n" * 4000 + "x", "5", 0.0),
    ("strict_format", "<reasoning>\n" + "\n</reasoning>\n<answer>\n" * 4000 + "\n</answer>\n", "5", 0.5),
    ("int_answer", "<answer>" * 20000 + "5", "5", 0.5),
    ("correctness", "<answer>" * 20000 + "5</answer>", "5", 2.0),  # the recipe splits on the last <answer>
    ("knights_knaves", "<think>a</think><answer>" + "Zoey is a knight " * 5000 + "</answer>", "Zoey is a knight", -1.0),
    ("knights_knaves", "<think>a</think><answer>x</answer>", "(1) " + "Zoey " * 20000, "reference answer line 1 names no knight"),
]


@pytest.mark.parametrize("name,completion,reference,expected", ADVERSARIAL, ids=[f"{i}-{case[0]}" for i, case in enumerate(ADVERSARIAL)])
def test_adversarial_text_scores_in_well_under_a_second(name, completion, reference, expected):
    start = time.perf_counter()
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            score(name, completion, reference)
    else:
        assert score(name, completion, reference) == expected
    assert time.perf_counter() - start < 0.5


# The hand-written parsers against the regexes they replace, on text made of the pieces that matter.
SOFT_REGEX = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
STRICT_REGEX = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", re.DOTALL)
ANSWER_REGEX = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
REFERENCE_LINE_REGEX = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)
PIECES = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", " ", "x", "5"]
WORDS = ["Zoey", "zoe1", "knight", "Knaves", "knave", "is", "a", "(1)", " ", "_", "1", "\t", "K"]


@hypothesis.settings(derandomize=True, max_examples=1000, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(PIECES), max_size=12).map("".join))
def test_tag_parsers_agree_with_the_regexes_they_replace(text):
    assert (score("soft_format", text, "5") == 0.5) == bool(SOFT_REGEX.match(text))
    assert (score("strict_format", text, "5") == 0.5) == bool(STRICT_REGEX.match(text))
    tagged = ANSWER_REGEX.findall(text)
    assert last_answer_tag(text) == (tagged[-1] if tagged else None)


@hypothesis.settings(derandomize=True, max_examples=1000, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map("".join).filter(str.strip))  # blank lines are skipped
def test_reference_lines_read_as_paddlenlps_pattern_reads_them(line):
    match = REFERENCE_LINE_REGEX.search(line)
    if match is None:
        with pytest.raises(ValueError, match="names no knight or knave"):
            kk_reference_roles(line)
    else:
        assert kk_reference_roles(line) == {match[1]: match[2].lower()}


# --- numbers past int()'s 4,300 digits are scored, never an error -----------------------------------
BIG = "7" * 5000
BIG_NUMBERS = [
    ("<answer>" + BIG + "</answer>", BIG, 1.0),
    ("<answer>" + BIG + "</answer>", "5", 0.0),
    ("<answer>5</answer>", BIG, 0.0),
    ("<answer>" + BIG + "</answer>", "8" + BIG[1:], 0.0),  # differ in the first digit
    ("<answer>" + BIG[:-1] + "8</answer>", BIG, 1.0),  # in the last: within the relative 1e-6
    ("<answer>-" + BIG + "</answer>", BIG, 0.0),
    ("<answer>$" + ",".join([BIG[:2]] + ["777"] * 1666) + "</answer>", BIG, 1.0),  # 5000 digits with commas
    ("<answer>" + BIG + "." + BIG + "</answer>", "#### " + BIG, 1.0),
    ("<answer>1/" + BIG + "</answer>", "0", 0.0),
    ("<answer>" + BIG + "/" + BIG + "</answer>", "1", 1.0),
    ("The answer is " + BIG, "A: " + BIG, 1.0),
    ("She has " + BIG + " eggs", BIG, 1.0),  # the last number of the text
    ("<answer>" + "1" * 200_000 + "</answer>", "1" * 200_000, 1.0),
]


@pytest.mark.parametrize("completion,reference,expected", BIG_NUMBERS, ids=[str(i) for i in range(len(BIG_NUMBERS))])
def test_numbers_past_the_int_digit_limit_are_compared(completion, reference, expected):
    start = time.perf_counter()
    assert score("accuracy", completion, reference) == expected
    assert time.perf_counter() - start < 0.5


def test_an_integer_reference_past_the_digit_limit_is_read():
    # A reward server item's "answer" may be a JSON integer of any length; str() refuses one over 4,300 digits.
    assert score("accuracy", "<answer>1" + "0" * 5000 + "</answer>", 10**5000) == 1.0
    assert score("accuracy", "<answer>5</answer>", 10**5000) == 0.0
    assert score("correctness", "<answer>1" + "0" * 5000 + "</answer>", 10**5000) == 2.0
