"""The fused engine's prefill with each prompt once per group (generate(prompts, G): FusedEngine._prefill_groups)
against the same rows prefilled one by one (generate(each prompt G times, 1)), on a real model folder.

    .venv/bin/python bench/bench_prefill_groups.py [--model models/SmolLM2-135M-Instruct] [--prompts 8] [--group 8]
        [--new-tokens 1] [--repeats 3]

Prompts: the first --prompts questions of data/arith/train.jsonl in the model's chat template with
data/arith/system_prompt.txt; --new-tokens tokens each (eos blocked), temperature 1. One untimed warm-up of each,
then --repeats timed runs alternating the two; prints one JSON object with the best seconds of each and their ratio.
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
import_paddle()

from alignment.models.modeling import load_causal_lm, load_tokenizer  # noqa: E402
from alignment.rollout import SamplingParams  # noqa: E402
from alignment.rollout.fused import FusedEngine  # noqa: E402
from alignment.kernels.ops import load_ops  # noqa: E402


def arith_chat_prompts(tokenizer, count: int) -> list:
    """The first `count` questions of data/arith/train.jsonl in the model's chat template with data/arith/system_prompt.txt."""
    system = (REPO / "data/arith/system_prompt.txt").read_text()
    questions = [json.loads(line)["src"] for line in (REPO / "data/arith/train.jsonl").open()][:count]
    return [
        tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}], add_generation_prompt=True)
        for q in questions
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ops, why_not = load_ops()
    if ops is None:
        sys.exit(f"fused operators not available: {why_not}")
    tokenizer = load_tokenizer(args.model)
    prompts = arith_chat_prompts(tokenizer, args.prompts)
    engine = FusedEngine(load_causal_lm(args.model, "float32"), [tokenizer.eos_token_id], tokenizer.pad_token_id, ops)
    params = SamplingParams(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
    runs = {
        "grouped": lambda: engine.generate(prompts, args.group, params),
        "row_by_row": lambda: engine.generate([p for p in prompts for _ in range(args.group)], 1, params),
    }
    best = {}
    for name, run in runs.items():
        run()  # warm-up
    for _ in range(args.repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - started)
    print(json.dumps({
        "model": args.model, "rows": args.prompts * args.group, "prompt_tokens": [len(p) for p in prompts], "new_tokens": args.new_tokens,
        "seconds_grouped": round(best["grouped"], 3), "seconds_row_by_row": round(best["row_by_row"], 3),
        "row_by_row_over_grouped": round(best["row_by_row"] / best["grouped"], 2),
    }))


if __name__ == "__main__":
    main()
