"""The bundled task: multi-step integer word problems in GSM8K's spirit.

    python data/arith_task.py [OUT_DIR]                 # rewrites data/arith/{train,test}.jsonl
    python data/arith_task.py data/arith_one_step --variant one_step   # config/smollm2/grpo_arith.json

Each row is PaddleNLP's src/tgt layout: `src` is the question, `tgt` the final number.
`solution()` writes the reasoning the way the bundled tiny model was taught to write it
(`<think>12+7=19. 19-5=14.</think><answer>14</answer>`); data/make_tiny_model.py imports
this module so that pre-training and the task share one generator.
"""

import argparse
import json
import random
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


@dataclass(frozen=True)
class Variant:
    steps: tuple  # the number of changes is drawn from these
    first_values: tuple  # (lowest, highest) starting count
    max_change: int  # largest number bought or lost
    doubling: bool  # whether a later change may double the count


# Changes of at most 9 keep the arithmetic within what a 3M-parameter model learns in minutes.
BUNDLED = Variant(steps=(2, 2, 3), first_values=(5, 30), max_change=9, doubling=True)
# One small change: SmolLM2-135M-Instruct answers 27.5% of the test rows right greedily with the recipe's system
# prompt (the bundled task: 1-3%), enough signal for GRPO to take it to 90% in 40 minutes on 2 cores
# (config/smollm2/grpo_arith.json).
ONE_STEP = Variant(steps=(1,), first_values=(3, 12), max_change=5, doubling=False)
VARIANTS = {"bundled": BUNDLED, "one_step": ONE_STEP}


def make_problem(rng: random.Random, variant: Variant = BUNDLED) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    pronoun = PRONOUN.get(name, "He")
    value = rng.randint(*variant.first_values)
    sentences = [f"{name} has {value} {item}."]
    equations = []
    for step in range(rng.choice(variant.steps)):
        kinds = ["gain"] * (value + 2 <= MAX_VALUE) + ["loss"] * 2 * (value >= 3)
        kinds += ["double"] * (variant.doubling and step > 0 and value <= 15)
        kind = rng.choice(kinds)
        if kind == "gain":
            x = rng.randint(2, min(variant.max_change, MAX_VALUE - value))
            sentence, new, equation = rng.choice(GAIN), value + x, f"{value}+{x}={value + x}"
        elif kind == "double":
            x, sentence, new, equation = 2, rng.choice(DOUBLE), value * 2, f"{value}*2={value * 2}"
        else:
            x = rng.randint(1, min(variant.max_change, value - 1))
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


def unique_problems(seed: int, count: int, exclude: set = frozenset(), variant: Variant = BUNDLED) -> list:
    rng, seen, problems = random.Random(seed), set(exclude), []
    while len(problems) < count:
        problem = make_problem(rng, variant)
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
    parser = argparse.ArgumentParser(description="Writes OUT_DIR/train.jsonl (4,000 rows) and OUT_DIR/test.jsonl (200 rows).")
    parser.add_argument("out_dir", nargs="?", type=Path, help="default data/arith (bundled) or data/arith_one_step")
    parser.add_argument("--variant", choices=VARIANTS, default="bundled", help="bundled: 2-3 changes; one_step: one small change")
    args = parser.parse_args()
    variant = VARIANTS[args.variant]
    out = args.out_dir or Path(__file__).resolve().parent / ("arith" if args.variant == "bundled" else f"arith_{args.variant}")
    test = unique_problems(TEST_SEED, 200, variant=variant)
    train = unique_problems(TRAIN_SEED, 4000, exclude={p.question for p in test}, variant=variant)
    write_jsonl(out / "test.jsonl", test)
    write_jsonl(out / "train.jsonl", train)
    print(f"wrote {len(train)} train and {len(test)} test rows under {out}")


if __name__ == "__main__":
    main()
