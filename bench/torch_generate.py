"""The PyTorch side of bench/bench_rollout.py: transformers' Qwen2ForCausalLM.generate on CPU, same shapes,
same prompt ids, random float32 weights. Run by bench_rollout.py (--torch-python) under an interpreter that
has torch and transformers, not the project's .venv. Measured with torch 2.13.0+cpu, transformers 4.57.6
in /work/torch-venv:

    python3 -m venv /work/torch-venv
    /work/torch-venv/bin/pip install torch==2.13.0            # the CPU build
    /work/torch-venv/bin/pip install -c <(echo torch==2.13.0) transformers==4.57.6

Standalone (bench_rollout.py passes the config of a shape as JSON):

    /work/torch-venv/bin/python bench/torch_generate.py --shape tiny --config '{"hidden_size": 256, ...}'
        [--batches 8,32,128] [--new-tokens 128] [--prompt 64] [--repeats 3] [--seed 0]

Prints one JSON object per batch, with engine "torch".
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", required=True)
    parser.add_argument("--config", required=True, help="Qwen2Config keyword arguments as JSON")
    parser.add_argument("--batches", default="8,32,128")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    config = Qwen2Config(**json.loads(args.config), torch_dtype="float32")
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    for batch in (int(b) for b in args.batches.split(",")):
        # the same ids as bench_rollout.make_prompts
        ids = np.random.default_rng(args.seed + batch).integers(3, config.vocab_size, size=(batch, args.prompt))
        input_ids = torch.from_numpy(ids).to(torch.int64)
        attention_mask = torch.ones_like(input_ids)

        def generate(new_tokens: int) -> float:
            started = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(
                    input_ids, attention_mask=attention_mask, do_sample=True, max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, temperature=1.0, top_k=0, top_p=1.0,
                    eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
                )
            seconds = time.perf_counter() - started
            assert out.shape[1] == args.prompt + new_tokens, out.shape
            return seconds

        generate(8)  # warm-up, untimed, as bench_rollout.py's engines
        seconds = statistics.median(generate(args.new_tokens) for _ in range(args.repeats))
        print(json.dumps({
            "shape": args.shape, "batch": batch, "engine": "torch",
            "tokens_per_second": round(batch * args.new_tokens / seconds, 1), "seconds": round(seconds, 3),
            "new_tokens": args.new_tokens, "prompt_len": args.prompt, "threads": threads, "repeats": args.repeats,
            "torch": torch.__version__, "transformers": transformers.__version__,
        }), flush=True)


if __name__ == "__main__":
    main()
