"""How often a model writes the GSM8K recipe's format before any training, under several prompt layouts: the
signal GRPO starts from. Samples --samples completions of each of the first --prompts GSM8K train questions at
the recipe's temperature with the recipe's engine, and scores them with its five reward functions.

    .venv/bin/python bench/bench_prompt_layouts.py [--gsm8k ../shared/data/gsm8k] [--model models/SmolLM2-135M-Instruct]
        [--prompts 16] [--samples 8]

Layouts, each from config/smollm2/grpo_gsm8k.json's system prompt and chat template (the assistant's turn opened
with "<reasoning>\\n" in all):
  no-examples      the template's worked exchanges removed: the system prompt alone says the format
  example-in-system  no exchanges; the template's first example appended to the system prompt as text
  one-exchange     the first worked exchange only
  two-exchanges    the recipe as committed
Prints one JSON object per layout: the mean of each reward, the format sum (xmlcount + soft_format +
strict_format, of 1.5), how many samples have soft_format, and the fraction cut at max_dec_len.
"""

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
import_paddle()

import numpy as np  # noqa: E402

from alignment.models.modeling import load_tokenizer  # noqa: E402
from alignment.rewards.scoring import score_completions  # noqa: E402
from alignment.rollout import generate  # noqa: E402
from alignment.run.build import load_actor, load_prompts, matmul_compute, rollout_engine, sampling_params  # noqa: E402
from alignment.config.cli import load_config  # noqa: E402
from alignment.step.scoring import decode_completions  # noqa: E402

FORMAT_REWARDS = ("xmlcount", "soft_format", "strict_format")
EXAMPLES = re.compile(r"\{%- set examples = (\[.*?\]) -%\}", re.DOTALL)  # the template's list of [question, answer]


def layouts(system_prompt: str, template: str) -> dict:
    """name -> (system prompt, chat template)."""
    match = EXAMPLES.search(template)
    if match is None:
        raise SystemExit("bench_prompt_layouts: the chat template has no `{%- set examples = [...] -%}` list to vary")
    first = re.search(r'\[\s*"(.*?)",\s*"(.*?)"\]', match[1], re.DOTALL)
    question, answer = (json.loads(f'"{text}"') for text in first.groups())  # the template's strings are JSON-escaped

    def with_examples(examples: str) -> str:
        return template[: match.start(1)] + examples + template[match.end(1) :]

    shown = f"{system_prompt.rstrip()}\n\nFor example:\nQuestion: {question}\n{answer}"
    return {
        "no-examples": (system_prompt, with_examples("[]")),
        "example-in-system": (shown, with_examples("[]")),
        "one-exchange": (system_prompt, with_examples(f"[{first[0]}]")),
        "two-exchanges": (system_prompt, template),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gsm8k", default="../shared/data/gsm8k")
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    base = load_config([
        str(REPO / "config/smollm2/grpo_gsm8k.json"), "--actor_model_name_or_path", args.model, "--rollout_n", str(args.samples),
        "--train_datasets", f"{args.gsm8k}/train.jsonl", "--eval_datasets", f"{args.gsm8k}/test.jsonl",
    ])
    model = load_actor(base, base.actor_model_name_or_path, None)
    compute = matmul_compute(base, model)
    names = list(base.reward_functions)
    for name, (system_prompt, template) in layouts(base.system_prompt, base.chat_template).items():
        config = dataclasses.replace(base, system_prompt=system_prompt, chat_template=template)
        tokenizer = load_tokenizer(config.actor_model_name_or_path, config.chat_template)
        engine = rollout_engine(config, model, tokenizer, compute.bf16)
        prompts = load_prompts(config.train_datasets, tokenizer, config)[0][: args.prompts]
        started = time.perf_counter()
        rollout = generate(engine, prompts, config.rollout_n, sampling_params(config))
        completions = decode_completions(rollout, tokenizer)
        samples = [prompts[row // config.rollout_n].record.reward_sample() for row in range(len(completions))]
        table = score_completions(completions, samples, names, [1.0] * len(names), settings=config.reward_settings())
        columns = {reward: np.asarray(table.columns[reward], dtype=np.float64) for reward in names}
        print(json.dumps({
            "layout": name,
            **{reward: round(float(values.mean()), 4) for reward, values in columns.items()},
            "format_sum": round(float(sum(columns[reward] for reward in FORMAT_REWARDS).mean()), 4),
            "with_soft_format": f"{int((columns['soft_format'] > 0).sum())} of {len(completions)}",
            "cut_at_max_dec_len": round(float(np.mean(rollout.lengths >= config.max_dec_len)), 4),
            "prompt_tokens_mean": round(float(np.mean([len(p.ids) for p in prompts])), 1),
            "seconds": round(time.perf_counter() - started, 1),
            "compute": "bf16" if compute.bf16 else "fp32",
        }), flush=True)


if __name__ == "__main__":
    main()
