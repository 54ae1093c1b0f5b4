"""Knights-and-knaves puzzles with 2 to 8 people, each with exactly one solution.

    python data/kk/make_kk.py --seed 0 --train 2000 --test 200 --out data/kk   # rewrites the bundled splits

Rows are PaddleNLP's src/tgt layout with the text of the K&K data set that PaddleNLP's RL example and
Logic-RL train on: `src` is the puzzle ("A very special island is inhabited only by knights and knaves.
... So who is a knight and who is a knave?"), `tgt` the solution, one line per person in the order they
were introduced ("(1) Zoey is a knave\\n(2) Oliver is a knight"). The chat template and the system prompt
are applied by the trainer, not stored in `src`.

Each person makes one statement of the K&K kinds: "X is a knight / knave", "X is not a knight / knave",
two such claims joined by "and", "or", "If ... then ...", "... if and only if ...", or "X and Y are of the
same type / of different types". A puzzle is kept only when the brute-force solver, over all 2^n
knight/knave assignments, finds exactly one consistent assignment. `parse_puzzle` reads a rendered
puzzle back into statements, so the bundled files can be re-solved from their text alone.

The same arguments write byte-identical files: each split draws from its own seeded random.Random, and
the test split skips any puzzle that also occurs in the train split.
"""

import argparse
import itertools
import json
import random
import re
from pathlib import Path

MIN_PEOPLE, MAX_PEOPLE = 2, 8
# One word of letters each (PaddleNLP's reward reads a name as \b[A-Za-z]+\b), none containing "knight" or
# "knave" (its answer check counts those words) and none inside another at a word boundary.
NAMES = [
    "Zoey", "Oliver", "Michael", "Ethan", "Emma", "Liam", "Olivia", "Noah", "Ava", "Sophia", "Mason",
    "Isabella", "William", "Mia", "James", "Charlotte", "Benjamin", "Amelia", "Lucas", "Harper", "Henry",
    "Evelyn", "Alexander", "Abigail", "Emily", "Daniel", "Elizabeth", "Jacob", "Sofia", "Logan", "Avery",
    "Jackson", "Ella", "Sebastian", "Scarlett", "Jack", "Aria", "Owen", "Chloe", "Samuel", "Grace",
    "Matthew", "Lily", "Joseph", "Hannah", "David", "Victoria", "Luke", "Nora", "Gabriel", "Riley", "Isaac",
    "Penelope", "Leo", "Layla", "Aiden", "Stella",
]
PREAMBLE = (
    "A very special island is inhabited only by knights and knaves. "
    "Knights always tell the truth, and knaves always lie."
)
QUESTION = "So who is a knight and who is a knave?"
# How a person's statement is reported; {statement} never ends with a period, the template adds one.
TEMPLATES = [
    '{name} said, "{statement}."',
    '"{statement}," {name} claimed.',
    '{name} was heard saying, "{statement}."',
    "In {name}'s words: \"{statement}.\"",
    '{name} asserted: "{statement}."',
    '"{statement}," {name} mentioned.',
    '{name} remarked, "{statement}."',
    '"{statement}," {name} declared.',
]
# Statement kinds and how often each is drawn: a lone claim about one person twice as often as the others.
KINDS = ["claim", "claim", "and", "or", "if", "iff", "same", "different"]
P_NEGATED = 0.2  # a claim is "X is not a knight / knave" this often

# Statements are tuples (index = position in the puzzle's name list, knight = True):
#   ("claim", i, says_knight, negated)     "X is (not) a knight/knave"
#   (op, claim, claim), op in and/or/if/iff
#   ("same", i, j), ("different", i, j)    "X and Y are of the same type / of different types"


def claim_value(claim: tuple, assignment: tuple) -> bool:
    _, i, says_knight, negated = claim
    return (assignment[i] == says_knight) != negated


def truth(statement: tuple, assignment: tuple) -> bool:
    kind = statement[0]
    if kind == "claim":
        return claim_value(statement, assignment)
    if kind in ("same", "different"):
        same = assignment[statement[1]] == assignment[statement[2]]
        return same if kind == "same" else not same
    a, b = claim_value(statement[1], assignment), claim_value(statement[2], assignment)
    if kind == "and":
        return a and b
    if kind == "or":
        return a or b
    if kind == "if":
        return (not a) or b
    if kind == "iff":
        return a == b
    raise ValueError(f"unknown statement kind {kind!r} in {statement}")


def solve(statements: list) -> list:
    """Every assignment (tuple of n bools, True = knight) under which each knight's statement is true and
    each knave's is false: brute force over all 2^n."""
    return [
        assignment
        for assignment in itertools.product((True, False), repeat=len(statements))
        if all(truth(s, assignment) == assignment[i] for i, s in enumerate(statements))
    ]


def random_claim(rng: random.Random, person: int) -> tuple:
    return ("claim", person, rng.random() < 0.5, rng.random() < P_NEGATED)


def random_statement(rng: random.Random, n: int) -> tuple:
    kind = rng.choice(KINDS)
    if kind == "claim":
        return random_claim(rng, rng.randrange(n))
    i, j = rng.sample(range(n), 2)  # two different people: "X and X are of the same type" says nothing
    if kind in ("same", "different"):
        return (kind, i, j)
    return (kind, random_claim(rng, i), random_claim(rng, j))


def render_claim(claim: tuple, names: list) -> str:
    _, i, says_knight, negated = claim
    return f"{names[i]} is {'not ' if negated else ''}a {'knight' if says_knight else 'knave'}"


def render_statement(statement: tuple, names: list) -> str:
    kind = statement[0]
    if kind == "claim":
        return render_claim(statement, names)
    if kind == "same":
        return f"{names[statement[1]]} and {names[statement[2]]} are of the same type"
    if kind == "different":
        return f"{names[statement[1]]} and {names[statement[2]]} are of different types"
    a, b = render_claim(statement[1], names), render_claim(statement[2], names)
    if kind == "if":
        return f"If {a} then {b}"
    return f"{a} {'if and only if' if kind == 'iff' else kind} {b}"


def name_list(names: list) -> str:
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return ", ".join(names[:-1]) + f", and {names[-1]}"


def render_puzzle(names: list, statements: list, templates: list) -> str:
    said = [t.format(name=name, statement=render_statement(s, names)) for name, s, t in zip(names, statements, templates)]
    return " ".join([PREAMBLE, f"You meet {len(names)} inhabitants: {name_list(names)}.", *said, QUESTION])


def render_solution(names: list, assignment: tuple) -> str:
    lines = [f"({k}) {name} is a {'knight' if knight else 'knave'}" for k, (name, knight) in enumerate(zip(names, assignment), 1)]
    return "\n".join(lines)


def make_puzzle(rng: random.Random, n: int) -> dict:
    names = rng.sample(NAMES, n)
    while True:  # about one draw in four has a unique solution at 8 people, one in two at 2
        statements = [random_statement(rng, n) for _ in range(n)]
        solutions = solve(statements)
        if len(solutions) == 1:
            break
    templates = [rng.choice(TEMPLATES) for _ in range(n)]
    return {"src": render_puzzle(names, statements, templates), "tgt": render_solution(names, solutions[0])}


def make_split(seed: int, split: str, count: int, exclude: frozenset = frozenset()) -> list:
    """count puzzles, people 2, 3, ..., 8, 2, 3, ... in turn, no src twice and none in exclude."""
    rng = random.Random(f"kk-{split}-{seed}")  # str seeds hash with sha512: the same on every platform
    rows, seen = [], set(exclude)
    while len(rows) < count:
        row = make_puzzle(rng, MIN_PEOPLE + len(rows) % (MAX_PEOPLE - MIN_PEOPLE + 1))
        if row["src"] not in seen:
            seen.add(row["src"])
            rows.append(row)
    return rows


# --- reading a rendered puzzle back -----------------------------------------------------------------

_NAME = r"[A-Z][a-z]+"
_CLAIM = rf"({_NAME}) is (not )?a (knight|knave)"
_PUZZLE = re.compile(
    rf"{re.escape(PREAMBLE)} You meet (\d+) inhabitants: ([A-Za-z, ]+)\. (.*) {re.escape(QUESTION)}", re.DOTALL
)
_SAID = [
    re.compile(re.escape(t).replace(r"\{name\}", f"(?P<name>{_NAME})").replace(r"\{statement\}", '(?P<statement>[^"]+)'))
    for t in TEMPLATES
]
_BINARY = [("iff", rf"{_CLAIM} if and only if {_CLAIM}"), ("if", rf"If {_CLAIM} then {_CLAIM}"),
           ("and", rf"{_CLAIM} and {_CLAIM}"), ("or", rf"{_CLAIM} or {_CLAIM}")]
_PAIR = [("same", rf"({_NAME}) and ({_NAME}) are of the same type"),
         ("different", rf"({_NAME}) and ({_NAME}) are of different types")]


def _index(name: str, names: list, text: str) -> int:
    if name not in names:
        raise ValueError(f"{name!r} in {text!r} is not one of the inhabitants {names}")
    return names.index(name)


def _parse_statement(text: str, names: list) -> tuple:
    def claim(name, negated, role):
        return ("claim", _index(name, names, text), role == "knight", negated is not None)

    if m := re.fullmatch(_CLAIM, text):
        return claim(*m.groups())
    for kind, pattern in _BINARY:
        if m := re.fullmatch(pattern, text):
            return (kind, claim(*m.groups()[:3]), claim(*m.groups()[3:]))
    for kind, pattern in _PAIR:
        if m := re.fullmatch(pattern, text):
            return (kind, _index(m[1], names, text), _index(m[2], names, text))
    raise ValueError(f"not a statement of a known kind: {text!r}")


def parse_puzzle(src: str) -> tuple:
    """A puzzle's text -> (names, statements) as make_puzzle drew them; ValueError naming what did not fit."""
    m = _PUZZLE.fullmatch(src)
    if m is None:
        raise ValueError(f"not a knights-and-knaves puzzle of this generator: {src[:120]!r}")
    names = re.split(r", and |, | and ", m[2])
    if len(names) != int(m[1]):
        raise ValueError(f"the puzzle announces {m[1]} inhabitants but lists {names}")
    statements, rest = {}, m[3]
    while rest:
        match = next(filter(None, (said.match(rest) for said in _SAID)), None)
        if match is None:
            raise ValueError(f"no statement template fits {rest[:80]!r}")
        speaker = _index(match["name"], names, rest)
        if speaker in statements:
            raise ValueError(f"{match['name']} speaks twice in {src[:80]!r}")
        statements[speaker] = _parse_statement(match["statement"], names)
        rest = rest[match.end():].removeprefix(" ")
    if sorted(statements) != list(range(len(names))):
        raise ValueError(f"not everyone speaks exactly once in {src[:80]!r}")
    return names, [statements[i] for i in range(len(names))]


def write_jsonl(rows: list, path: Path) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=2000, help="puzzles in train.jsonl")
    parser.add_argument("--test", type=int, default=200, help="puzzles in test.jsonl")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    train = make_split(args.seed, "train", args.train)
    test = make_split(args.seed, "test", args.test, exclude=frozenset(row["src"] for row in train))
    write_jsonl(train, args.out / "train.jsonl")
    write_jsonl(test, args.out / "test.jsonl")


if __name__ == "__main__":
    main()
