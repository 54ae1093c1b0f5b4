"""Is an instruction-following gain the instructions or a trick? An evaluation's answers, counted and side by side.

    .venv/bin/python bench/ifeval_examples.py eval/ifeval/input_data/records.jsonl --count 10 --seed 0 > examples.md

Prints Markdown. First, per model, the median and quartiles of answer lengths in words, the answers that are degenerate
(fewer than MIN_WORDS words, one word making up more than half of them, or more punctuation and symbols than word
characters: a model can satisfy "end with this phrase" or "wrap it in quotes" with nothing else, as the IFBench paper's
appendix shows), and prompt-level loose accuracy
with those counted as failed, each model against the first (Newcombe's interval, exact McNemar). Then a draw of
--count problems by `random.Random(seed).sample`, not chosen by hand: for each its prompt and, for every model in the
records (the evaluation command's order), the answer (cut at --chars characters), its length in tokens and which
instructions it followed strictly and loosely.

With --training FILE (a training jsonl with "prompt" fields): the same prompt-level loose comparison split into the
benchmark prompts that share a --shared_words-word sequence with some training prompt and the rest, so that a gain
can be seen not to come from wording the training data has in common with the benchmark:

    .venv/bin/python bench/ifeval_examples.py eval/ifeval/records.jsonl --count 0 --training data/instructions/train.jsonl --shared_words 8
"""

import argparse
import json
import random
import re
from collections import defaultdict

import numpy as np

from alignment.algo.eval_stats import paired_difference
from alignment.rewards.length_rewards import degenerate

MIN_WORDS = 10


def substance_table(by_problem: dict, models: list) -> None:
    problems = sorted(by_problem)
    loose = {m: np.array([by_problem[p][m]["correct"] for p in problems]) for m in models}
    kept = {m: np.array([not degenerate(by_problem[p][m]["completion"], MIN_WORDS) for p in problems]) for m in models}
    words = {m: np.array([len(re.findall(r"\w+", by_problem[p][m]["completion"])) for p in problems]) for m in models}
    print("| model | degenerate answers | words: median, quartiles | prompt loose | prompt loose, degenerate answers failed "
          "| against the first |")
    print("|---|---|---|---|---|---|")
    for model in models:
        substantive = loose[model] & kept[model]
        against = ""
        if model != models[0]:
            pair = paired_difference(loose[models[0]] & kept[models[0]], substantive)
            against = (f"{100 * pair['difference']:+.1f} points [{100 * pair['low']:+.1f}, {100 * pair['high']:+.1f}], "
                       f"{pair['only_first']} / {pair['only_second']}, McNemar p = {pair['mcnemar_p']:.2g}")
        quartiles = np.percentile(words[model], [50, 25, 75])
        print(f"| {model} | {int((~kept[model]).sum())} of {len(problems)} | {quartiles[0]:.0f} ({quartiles[1]:.0f}-{quartiles[2]:.0f}) | "
              f"{100 * loose[model].mean():.1f}% | "
              f"{100 * substantive.mean():.1f}% | {against} |")
    print()


def word_windows(text: str, size: int) -> set:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + size]) for i in range(len(words) - size + 1)}


def overlap_table(by_problem: dict, models: list, training: str, size: int) -> None:
    ours = set().union(*(word_windows(json.loads(line)["prompt"], size) for line in open(training)))
    problems = sorted(by_problem)
    shares = np.array([bool(word_windows(by_problem[p][models[0]]["prompt"], size) & ours) for p in problems])
    loose = {m: np.array([by_problem[p][m]["correct"] for p in problems]) for m in models}
    print(f"| prompts (one {size}-word sequence in common with {training}) | count | "
          + " | ".join(f"{m}, prompt loose" for m in models) + " | last against the first |")
    print("|---|---|" + "---|" * len(models) + "---|")
    for name, rows in ((f"sharing one {size}-word sequence or more", shares), ("sharing none", ~shares)):
        if not rows.any():
            print(f"| {name} | 0 |" + " |" * len(models) + " |")
            continue
        cells = " | ".join(f"{loose[m][rows].sum()} ({100 * loose[m][rows].mean():.1f}%)" for m in models)
        pair = paired_difference(loose[models[0]][rows], loose[models[-1]][rows])
        print(f"| {name} | {int(rows.sum())} | {cells} | {100 * pair['difference']:+.1f} points, "
              f"{pair['only_first']} / {pair['only_second']}, McNemar p = {pair['mcnemar_p']:.2g} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", help="records.jsonl written by python -m alignment.evaluate")
    parser.add_argument("--count", type=int, default=10, help="problems to draw (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    parser.add_argument("--chars", type=int, default=700, help="characters of each answer shown (default 700)")
    parser.add_argument("--training", help="a training jsonl: split prompt-level loose by wording shared with it (default none)")
    parser.add_argument("--shared_words", type=int, default=8, help="the shared sequence's length in words (default 8)")
    args = parser.parse_args()
    by_problem, models = defaultdict(dict), []
    for line in open(args.records):
        record = json.loads(line)
        if record["model"] not in models:
            models.append(record["model"])
        by_problem[record["problem"]][record["model"]] = record
    substance_table(by_problem, models)
    if args.training:
        overlap_table(by_problem, models, args.training, args.shared_words)
    drawn = sorted(random.Random(args.seed).sample(sorted(by_problem), args.count))
    for problem in drawn:
        records = by_problem[problem]
        first = records[models[0]]
        print(f"### Problem {problem} ({first['source']})\n\n> {first['prompt'].replace(chr(10), ' ')}\n")
        for model in models:
            record = records[model]
            verdicts = ", ".join(f"{v['id']} {'✓' if v['strict'] else '✗'}{'' if v['strict'] == v['loose'] else ' (loose ✓)'}"
                                 for v in record.get("instructions", []))
            answer = record["completion"][: args.chars] + (" [...]" if len(record["completion"]) > args.chars else "")
            print(f"**{model}** ({record['length']} tokens, {record['finish_reason']}): {verdicts}\n\n```text\n{answer}\n```\n")


if __name__ == "__main__":
    main()
