"""Where the fused engine's rollout time goes: seconds in each compiled operator (and in paddle.matmul) during one
generate at the step benchmark's shape.

    .venv/bin/python bench/bench_rollout_ops.py [--model models/SmolLM2-135M-Instruct] [--bf16] [--prompts 8]
        [--group 8] [--new-tokens 128]

Prompts: the first --prompts questions of data/arith/train.jsonl in the model's chat template with
data/arith/system_prompt.txt, --group completions of exactly --new-tokens tokens each (eos blocked), temperature 1;
--bf16: the engine's bf16 weight copies (cpu_bf16_matmul). One untimed generate, then one timed with every operator
call wrapped in a timer; prints one JSON object: the generate's seconds and, per operator, seconds and calls.
"""

import argparse
import collections
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
import_paddle()

import paddle  # noqa: E402
from bench_prefill_groups import arith_chat_prompts  # noqa: E402  (bench/ is on the path: the scripts' folder)

from alignment.models.modeling import load_causal_lm, load_tokenizer  # noqa: E402
from alignment.rollout import SamplingParams  # noqa: E402
from alignment.rollout.fused import FusedEngine  # noqa: E402
from alignment.kernels.ops import load_ops  # noqa: E402


def timed(name, function, seconds: collections.Counter, calls: collections.Counter):
    def run(*args, **kwargs):
        started = time.perf_counter()
        result = function(*args, **kwargs)
        seconds[name] += time.perf_counter() - started
        calls[name] += 1
        return result

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct"))
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    ops, why_not = load_ops()
    if ops is None:
        sys.exit(f"fused operators not available: {why_not}")
    seconds, calls = collections.Counter(), collections.Counter()
    for name in list(vars(ops)):  # the engine calls ops.NAME, so wrapping the namespace's functions times each call
        setattr(ops, name, timed(name, getattr(ops, name), seconds, calls))
    paddle.matmul = timed("paddle.matmul", paddle.matmul, seconds, calls)
    tokenizer = load_tokenizer(args.model)
    prompts = arith_chat_prompts(tokenizer, args.prompts)
    engine = FusedEngine(load_causal_lm(args.model, "float32"), [tokenizer.eos_token_id], tokenizer.pad_token_id, ops, bf16=args.bf16)
    params = SamplingParams(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
    engine.generate(prompts, args.group, params)  # warm-up
    seconds.clear()
    calls.clear()
    started = time.perf_counter()
    engine.generate(prompts, args.group, params)
    total = time.perf_counter() - started
    print(json.dumps({
        "model": args.model, "bf16": args.bf16, "rows": args.prompts * args.group, "new_tokens": args.new_tokens,
        "generate_seconds": round(total, 2),
        "operators": {name: {"seconds": round(value, 3), "calls": calls[name]} for name, value in seconds.most_common()},
    }))


if __name__ == "__main__":
    main()
