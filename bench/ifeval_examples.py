"""Side by side: a seeded draw of problems from an evaluation's records.jsonl, each model's greedy answer and verdicts.

    .venv/bin/python bench/ifeval_examples.py eval/ifeval/input_data/records.jsonl --count 10 --seed 0 > examples.md

Prints Markdown: for each drawn problem its prompt, its instruction ids, and for every model in the records (the order
of the evaluation command) the answer (cut at --chars characters), its length in tokens and which instructions it
followed strictly and loosely. The problems are drawn by `random.Random(seed).sample`, not chosen by hand.
"""

import argparse
import json
import random
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", help="records.jsonl written by python -m alignment.evaluate")
    parser.add_argument("--count", type=int, default=10, help="problems to draw (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    parser.add_argument("--chars", type=int, default=700, help="characters of each answer shown (default 700)")
    args = parser.parse_args()
    by_problem, models = defaultdict(dict), []
    for line in open(args.records):
        record = json.loads(line)
        if record["model"] not in models:
            models.append(record["model"])
        by_problem[record["problem"]][record["model"]] = record
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
