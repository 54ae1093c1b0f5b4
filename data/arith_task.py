"""The bundled task: multi-step integer word problems in GSM8K's spirit.

    python data/arith_task.py [OUT_DIR]   # rewrites data/arith/{train,test}.jsonl

Each row is PaddleNLP's src/tgt layout: `src` is the question, `tgt` the final number.
`solution()` writes the reasoning the way the bundled tiny model was taught to write it
(`<think>12+7=19. 19-5=14.</think><answer>14</answer>`); data/make_tiny_model.py imports
this module so that pre-training and the task share one generator.
"""

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

NAMES = ["Mia", "Leo", "Ana", "Sam", "Ivy", "Tom", "Zoe", "Max", "Eva", "Ben", "Lily", "Omar"]
PRONOUN = {"Mia": "She", "Ana": "She", "Ivy": "She", "Zoe": "She", "Eva": "She", "Lily": "She"}
ITEMS = ["apples", "stickers", "coins", "books", "marbles", "cards", "pencils", "shells", "stamps", "eggs"]
GAIN = ["{p} buys {x} more.", "{p} finds {x} more.", "{p} gets {x} more from a friend.", "{p} wins {x} more."]
LOSS = ["{p} gives away {x}.", "{p} loses {x}.", "{p} sells {x}.", "{p} uses {x}."]
DOUBLE = ["{p} doubles them.", "The number of {item} doubles."]
MAX_VALUE = 60


@dataclass(frozen=True)
class Problem:
    question: str
    equations: tuple  # ("12+7=19", "19-5=14")
    answer: int


def make_problem(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    pronoun = PRONOUN.get(name, "He")
    value = rng.randint(5, 30)
    sentences = [f"{name} has {value} {item}."]
    equations = []
    for step in range(rng.choice([2, 2, 3])):
        # Changes of at most 9 keep the arithmetic within what a 3M-parameter model learns in minutes.
        kinds = ["gain"] * (value + 2 <= MAX_VALUE) + ["loss"] * 2 * (value >= 3)
        kinds += ["double"] * (step > 0 and value <= 15)
        kind = rng.choice(kinds)
        if kind == "gain":
            x = rng.randint(2, min(9, MAX_VALUE - value))
            sentence, new, equation = rng.choice(GAIN), value + x, f"{value}+{x}={value + x}"
        elif kind == "double":
            x, sentence, new, equation = 2, rng.choice(DOUBLE), value * 2, f"{value}*2={value * 2}"
        else:
            x = rng.randint(1, min(9, value - 1))
            sentence, new, equation = rng.choice(LOSS), value - x, f"{value}-{x}={value - x}"
        text = sentence.format(p=pronoun, x=x, item=item)
        sentences.append(text if step == 0 else "Then " + text[0].lower() + text[1:])
        equations.append(equation)
        value = new
    sentences.append(f"How many {item} does {name} have now?")
    return Problem(" ".join(sentences), tuple(equations), value)


def solution(problem: Problem, skip_last_step: bool = False) -> str:
    """The model's reasoning; `skip_last_step` writes the classic slip of stopping one step early and
    reporting that intermediate result as the answer."""
    equations = problem.equations[:-1] if skip_last_step else problem.equations
    answer = equations[-1].split("=")[1]
    return "<think>" + " ".join(e + "." for e in equations) + f"</think><answer>{answer}</answer>"


def unique_problems(seed: int, count: int, exclude: set = frozenset()) -> list:
    rng, seen, problems = random.Random(seed), set(exclude), []
    while len(problems) < count:
        problem = make_problem(rng)
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems


def write_jsonl(path: Path, problems: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for problem in problems:
            f.write(json.dumps({"src": problem.question, "tgt": str(problem.answer)}) + "\n")


TEST_SEED, TRAIN_SEED = 1, 2


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "arith"
    test = unique_problems(TEST_SEED, 200)
    train = unique_problems(TRAIN_SEED, 4000, exclude={p.question for p in test})
    write_jsonl(out / "test.jsonl", test)
    write_jsonl(out / "train.jsonl", train)
    print(f"wrote {len(train)} train and {len(test)} test rows under {out}")


if __name__ == "__main__":
    main()
