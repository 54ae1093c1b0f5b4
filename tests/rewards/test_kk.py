"""Knights and knaves: the reward (PaddleNLP's scoring), the puzzle generator and the bundled data/kk task."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.reward_servers import reward_server

from alignment.basics.errors import ConfigError
from alignment.models.modeling import load_tokenizer
from alignment.rewards import get_reward, score_completions
from alignment.rewards.remote import RewardServer, score_remote
from alignment.run.build import load_prompts
from alignment.config.cli import load_config
from alignment.basics.data import encode_prompts, read_prompt_records

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data" / "kk"))
import make_kk  # noqa: E402

KK = get_reward("knights_knaves").fn
SPLITS = {"train": 2000, "test": 200}

# data/kk/test.jsonl line 3, verbatim
PUZZLE = (
    "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves "
    "always lie. You meet 3 inhabitants: Isabella, Lily, and William. Isabella said, \"Lily and William are of "
    "different types.\" In Lily's words: \"Lily is a knight.\" William was heard saying, \"If William is a knight "
    "then Lily is a knave.\" So who is a knight and who is a knave?"
)
SOLUTION = "(1) Isabella is a knight\n(2) Lily is a knave\n(3) William is a knight"
THINK = (
    "<think>Suppose William is a knave. Then his statement is false, so William is a knight and Lily is a "
    "knight, a contradiction. So William is a knight, and Lily is a knave. Lily and William differ, so Isabella "
    "tells the truth and is a knight.</think>"
)

# (completion, score): format +1 / -1, answer +2 right, -1.5 parsed but wrong, -2 unparsed or bad format
REWARD_TABLE = [
    (THINK + f"<answer>{SOLUTION}</answer>", 3.0),
    (THINK + "\n<answer>\n(1) Isabella is a knight\n(2) Lily is a knave\n(3) William is a knight\n</answer>", 3.0),
    (THINK + "<answer>(1) William is a knight\n(2) Isabella is a knight\n(3) Lily is a knave</answer>", 3.0),  # any order
    (THINK + "<answer>ISABELLA IS A KNIGHT, lily is a Knave, William   is a\nKNIGHT</answer>", 3.0),  # case, spaces
    ("Let me see. " + THINK + " So: <answer>" + SOLUTION + "</answer> Done.", 3.0),  # text outside the tags is allowed
    # one role wrong
    (THINK + "<answer>(1) Isabella is a knight\n(2) Lily is a knight\n(3) William is a knight</answer>", -0.5),
    (THINK + "<answer>(1) Isabella is a knave\n(2) Lily is a knave\n(3) William is a knight</answer>", -0.5),
    # unparsed: a person missing, roles counted wrong, other phrasings, empty
    (THINK + "<answer>(1) Isabella is a knight\n(2) Lily is a knave</answer>", -1.0),
    (THINK + "<answer>(1) Isabella is a knight\n(2) Lily is a knave\n(3) Ethan is a knight</answer>", -1.0),
    (THINK + "<answer>Isabella and William are knights, Lily is a knave</answer>", -1.0),
    (THINK + "<answer>(1) Isabella: knight\n(2) Lily: knave\n(3) William: knight</answer>", -1.0),
    (THINK + "<answer>(1) Isabella is knight\n(2) Lily is knave\n(3) William is knight</answer>", -1.0),
    (THINK + f"<answer>{SOLUTION}\nSo there are two knights.</answer>", -1.0),  # "knights" counts: 4 roles for 3 people
    (THINK + "<answer> </answer>", -1.0),
    # bad format: the answer is not looked at
    (f"<answer>{SOLUTION}</answer>", -3.0),
    (f"{SOLUTION}", -3.0),
    (f"<answer>{SOLUTION}</answer>" + THINK, -3.0),
    (THINK + f"<answer>{SOLUTION}</answer><answer>{SOLUTION}</answer>", -3.0),
    ("<think><think>" + THINK[7:] + f"<answer>{SOLUTION}</answer>", -3.0),
    (THINK + f"<answer>{SOLUTION}", -3.0),  # cut off at max_dec_len
    ("", -3.0),
]


@pytest.mark.parametrize("completion, expected", REWARD_TABLE)
def test_knights_knaves_reward(completion, expected):
    assert KK(completion, {"prompt": PUZZLE, "answer": SOLUTION, "src": PUZZLE, "tgt": SOLUTION}) == expected


def test_prompt_ending_with_think_supplies_the_opening_tag():
    # PaddleNLP's pre-templated src ends with "<think>", so the model writes only the rest of the tag pair.
    completion = THINK.removeprefix("<think>") + f"<answer>{SOLUTION}</answer>"
    assert KK(completion, {"prompt": PUZZLE + "\n<|im_start|>assistant\n<think>", "answer": SOLUTION}) == 3.0
    assert KK(completion, {"prompt": PUZZLE, "answer": SOLUTION}) == -3.0
    assert KK(THINK + f"<answer>{SOLUTION}</answer>", {"prompt": PUZZLE + "<think>", "answer": SOLUTION}) == -3.0


@pytest.mark.parametrize(
    "answer, message",
    [
        ("", "lists nobody"),
        ("(1) Isabella is a knight\n(2) Lily is a wizard", "line 2 names no knight or knave"),
        ("(1) Lily is a knight\n(2) Lily is a knave", "names 'Lily' twice"),
        (None, "sample has no 'answer'"),
    ],
)
def test_unreadable_reference_raises_and_is_never_scored(answer, message):
    completion = THINK + f"<answer>{SOLUTION}</answer>"
    with pytest.raises(ValueError, match=message):
        KK(completion, {"prompt": PUZZLE, "answer": answer})
    table = score_completions([completion], [{"prompt": PUZZLE, "answer": answer}], ["knights_knaves"], [1.0])
    assert table.totals == [None] and table.columns["knights_knaves"] == [None]
    assert table.errors[0].startswith("knights_knaves: ValueError")


# --- the solver and generator ---------------------------------------------------------------------


def claim(person, knight, negated=False):
    return ("claim", person, knight, negated)


def test_solver_on_hand_solved_puzzles():
    # PaddleNLP's README example (Michael, Zoey, Ethan): "Ethan is a knight iff Michael is a knight",
    # "Zoey is a knight or Ethan is a knight", "Michael is a knave iff Zoey is a knave"; checked by hand over
    # all 8 assignments: only all knights is consistent, as its tgt says.
    readme = [("iff", claim(2, True), claim(0, True)), ("or", claim(1, True), claim(2, True)), ("iff", claim(0, False), claim(1, False))]
    assert make_kk.solve(readme) == [(True, True, True)]
    # Smullyan: A says "we are both knaves"; B says "A and B are of different types" -> A knave, B knight
    assert make_kk.solve([("and", claim(0, False), claim(1, False)), ("different", 0, 1)]) == [(False, True)]
    assert make_kk.solve([claim(0, False), claim(1, True)]) == []  # "I am a knave": nobody can say it
    # "I am a knight" says nothing: B agreeing with A leaves two solutions (the generator draws again)
    assert make_kk.solve([claim(0, True), claim(0, True)]) == [(True, True), (False, False)]
    assert make_kk.solve([claim(1, True, negated=True), ("same", 0, 1)]) == [(True, False)]
    # a knave cannot say an implication whose premise (that he is a knight) is false
    assert make_kk.solve([("if", claim(0, True), claim(1, False)), claim(0, False)]) == [(True, False)]


def bundled(split):
    with open(f"data/kk/{split}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("split", SPLITS)
def test_bundled_puzzles_have_exactly_one_solution_and_it_is_tgt(split):
    rows = bundled(split)
    assert len(rows) == SPLITS[split] and len({r["src"] for r in rows}) == len(rows)
    people, kinds = [], set()
    for row in rows:
        names, statements = make_kk.parse_puzzle(row["src"])
        solutions = make_kk.solve(statements)
        assert len(solutions) == 1, row["src"]
        assert make_kk.render_solution(names, solutions[0]) == row["tgt"]
        # The reward reads the same people from tgt, and the reference itself scores full marks.
        completion = f"<think>...</think><answer>{row['tgt']}</answer>"
        assert KK(completion, {"prompt": row["src"], "answer": row["tgt"]}) == 3.0
        people.append(len(names))
        kinds |= {s[0] if s[0] != "claim" else ("not" if s[3] else "claim") for s in statements}
    per_size = len(rows) // 7
    assert {n: people.count(n) for n in range(2, 9)} == {n: per_size + (n - 2 < len(rows) % 7) for n in range(2, 9)}
    assert kinds == {"claim", "not", "and", "or", "if", "iff", "same", "different"}


def test_bundled_splits_are_disjoint_and_small():
    assert not {r["src"] for r in bundled("train")} & {r["src"] for r in bundled("test")}
    assert sum(os.path.getsize(f"data/kk/{split}.jsonl") for split in SPLITS) < 2 * 2**20


def test_generator_is_deterministic(tmp_path):
    # Different hash seeds: nothing may depend on set or dict order of strings.
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / hash_seed
        command = [sys.executable, "data/kk/make_kk.py", "--seed", "7", "--train", "30", "--test", "10", "--out", str(out)]
        subprocess.run(command, check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        outputs.append([(out / f"{split}.jsonl").read_bytes() for split in SPLITS])
    assert outputs[0] == outputs[1]
    assert outputs[0][0].count(b"\n") == 30 and outputs[0][1].count(b"\n") == 10


@pytest.mark.parametrize(
    "src, message",
    [
        ("Who is a knight?", "not a knights-and-knaves puzzle"),
        (PUZZLE.replace("3 inhabitants", "4 inhabitants"), "announces 4 inhabitants"),
        (PUZZLE.replace("Lily is a knight.", "Lily is a wizard."), "not a statement of a known kind"),
        (PUZZLE.replace("If William", "If Ethan"), "'Ethan' in"),
        (PUZZLE.replace("William was heard saying", "William whispered"), "no statement template fits"),
    ],
)
def test_parse_puzzle_names_what_does_not_fit(src, message):
    with pytest.raises(ValueError, match=message):
        make_kk.parse_puzzle(src)


# --- the tiny K&K configuration -------------------------------------------------------------------


def test_tiny_tokenizer_round_trips_and_every_prompt_fits():
    config = load_config(["config/kk/grpo_argument.json"])
    assert config.reward_functions == ["knights_knaves"] and config.accuracy_function == "knights_knaves"
    tokenizer = load_tokenizer(config.actor_model_name_or_path, config.chat_template)
    for text in (config.system_prompt, *(t for split in SPLITS for r in bundled(split) for t in (r["src"], r["tgt"]))):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    for path in (config.train_datasets, config.eval_datasets):
        records = read_prompt_records(path)
        encoded, truncated, dropped = encode_prompts(records, tokenizer, config.max_prompt_len, "drop", config.system_prompt)
        assert (len(encoded), truncated, dropped) == (len(records), 0, 0)


def test_qwen_kk_config_is_valid_but_for_the_missing_model():
    with pytest.raises(ConfigError, match="actor_model_name_or_path: 'models/.*' is not a local model folder"):
        load_config(["config/qwen/grpo_kk.json", "--bf16", "false"])  # bf16 on this CPU: refused by the value checks, first
    # Every other key passes validation with a model that is here (and no bf16 on this CPU).
    overrides = ["--actor_model_name_or_path", "data/tiny-qwen2", "--max_seq_len", "4608", "--bf16", "false"]
    config = load_config(["config/qwen/grpo_kk.json", *overrides])
    assert config.reward_functions == ["knights_knaves"] and config.system_prompt.startswith("Solve the knights")


# --- who opens <think>: the prompt the model saw -----------------------------------------------------
R1_DISTILL = (  # DeepSeek-R1-Distill's template, reduced to what matters: it ends with the assistant's cue and "<think>\n"
    "{% for m in messages %}{{ '<｜' + m['role'] + '｜>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\n' }}{% endif %}"
)


def kk_samples(chat_template: str, tmp_path) -> list:
    """Reward samples of data/kk/test.jsonl as the trainer builds them, under chat_template (a file or text)."""
    if not Path(chat_template).is_file():
        (tmp_path / "template.jinja").write_text(chat_template)
        chat_template = str(tmp_path / "template.jinja")
    config = load_config(["config/kk/grpo_argument.json", "--chat_template", chat_template])
    tokenizer = load_tokenizer(config.actor_model_name_or_path, config.chat_template)
    encoded, _, _ = load_prompts(config.eval_datasets, tokenizer, config)
    return [prompt.record.reward_sample() for prompt in encoded[:20]]


@pytest.mark.parametrize(
    "chat_template,opens_think",
    [("config/kk/chat_template.jinja", True), (R1_DISTILL, True), ("data/tiny-qwen2/chat_template.jinja", False)],
    ids=["config/kk (as PaddleNLP's src)", "R1-distill", "tiny model's own"],
)
def test_the_prompt_the_model_saw_decides_who_writes_think(chat_template, opens_think, tmp_path):
    for sample in kk_samples(chat_template, tmp_path):
        assert sample["prompt_text"].rstrip().endswith("<think>") == opens_think
        assert sample["prompt"] == sample["src"]  # the raw question stays where it was
        right = f"Reasoning.</think><answer>{sample['tgt']}</answer>"
        assert KK(right if opens_think else "<think>" + right, sample) == 3.0
        assert KK("<think>" + right if opens_think else right, sample) == -3.0  # two <think> / none


def paddlenlp_kk_score(response: str, reference: str) -> float:
    """PaddleNLP's reward server's K&K score, written here from its published behaviour, independently of
    alignment/rewards: the server opens every response with the "<think>" its pre-templated src ends with, cuts it
    after a literal "Assistant:", and scores it with Logic-RL's kk.py (format_reward 1), whose steps are these."""
    text = "<think>" + response
    text = text.split("Assistant:", 1)[1] if "Assistant:" in text else text
    answers = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)  # the last one is the answer
    answer = answers[-1].strip() if answers else None
    tags = ["<think>", "</think>", "<answer>", "</answer>"]
    positions = [text.find(tag) for tag in tags]
    well_formed = all(text.count(tag) == 1 for tag in tags) and all(a <= b for a, b in zip(positions, positions[1:]))
    expected = {}
    for line in reference.split("\n"):  # "(1) Zoey is a knave": the line's first word and the first role after it
        found = re.search(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", line.strip(), re.IGNORECASE)
        if found:
            expected[found[1]] = found[2].lower()
    answer_score = -2.0  # bad format, no answer, or an answer that does not name every role
    if well_formed and answer:
        lowered = answer.lower()
        predicted = {}
        if lowered.count("knight") + lowered.count("knave") == len(expected):
            for name in expected:
                said = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer, re.IGNORECASE)
                if said is None:
                    predicted = {}
                    break
                predicted[name] = said[1].lower()
        if predicted:
            answer_score = 2.0 if predicted == expected else -1.5
    return (1.0 if well_formed else -1.0) + answer_score


def test_with_config_kk_the_reward_scores_as_paddlenlps_reward_server_does(tmp_path):
    # config/kk's template ends its prompts in "<think>" as PaddleNLP's src does, so the model writes what follows it
    for sample in kk_samples("config/kk/chat_template.jinja", tmp_path):
        tgt = sample["tgt"]
        wrong = tgt.replace("knight", "KNAVE") if "knight" in tgt else tgt.replace("knave", "knight")
        first = tgt.split("\n")[0]
        completions = [
            f"Reasoning.</think><answer>{tgt}</answer>",  # 3
            f"Reasoning.</think>\n<answer>\n{wrong}\n</answer>",  # -0.5
            f"Reasoning.</think><answer>{first}</answer>",  # too few roles: -1
            f"Reasoning.</think><answer>{tgt} and a knight</answer>",  # too many: -1
            f"Reasoning.</think><answer>{tgt.replace(' is a ', ' was a ')}</answer>",  # roles not said as "is a": -1
            "Reasoning.</think><answer>no idea</answer>",
            "Reasoning.</think><answer> </answer>",  # empty: -1
            f"Reasoning.</think><answer>{tgt}</answer> More.<answer>{wrong}</answer>",  # two answers: -3
            f"Reasoning.<answer>{tgt}</answer></think>",  # out of order: -3
            f"<think>Reasoning.</think><answer>{tgt}</answer>",  # a second <think>: -3
            f"<answer>{tgt}</answer>",  # no </think>: -3
        ]
        scores = [KK(completion, sample) for completion in completions]
        assert scores == [paddlenlp_kk_score(completion, tgt) for completion in completions], sample["src"]
        assert scores[:3] == [3.0, -0.5, -1.0] and scores[-1] == -3.0


def test_the_templated_prompt_reaches_the_reward_server(tmp_path):
    samples = kk_samples("config/kk/chat_template.jinja", tmp_path)[:4]
    completions = [f"Reasoning.</think><answer>{sample['tgt']}</answer>" for sample in samples]
    with reward_server(tmp_path) as server:
        table = score_remote(
            completions, samples, ["knights_knaves"], [1.0], RewardServer(url=server.url, protocol="v1", timeout=60, retries=0)
        )
    assert table.totals == [3.0] * 4 and table.errors == [None] * 4
