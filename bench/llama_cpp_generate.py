"""The llama.cpp side of bench/bench_rollout.py: batched generation with llama-cpp-python's low-level API from GGUF
files of the same model (bench_rollout.py exports them with alignment/models/gguf_export.py), the same prompt ids.
Run by bench_rollout.py (--llama-cpp-python) under an interpreter that has llama-cpp-python, not the project's .venv;
measured with llama-cpp-python 0.3.36 in .venv-llamacpp (make .venv-llamacpp/.installed).

Standalone:

    .venv-llamacpp/bin/python bench/llama_cpp_generate.py --shape tiny --vocab 4096 --gguf f16=tiny-f16.gguf,q8_0=...
        [--batches 8,32,128] [--new-tokens 128] [--prompt 64] [--repeats 3] [--seed 0]

Per GGUF file and batch: one llama_context with n_seq_max = batch and kv_unified off (each sequence its own KV
stream of n_ctx / n_seq_max = prompt + new_tokens cells, so a token attends to its own sequence only), n_threads =
n_threads_batch = OMP_NUM_THREADS (else 2), llama.cpp's defaults otherwise (f16 KV cache, flash attention auto).
A generate clears the memory, decodes all prompts in one llama_batch (positions 0..prompt-1, one sequence id each,
logits for the last token of each), then new_tokens - 1 decode steps of one llama_batch holding one token per
sequence. Tokens are drawn by llama.cpp's own sampler chain, temp(1.0) + dist(seed): temperature 1 over the whole
vocabulary, as bench_rollout.py's engines sample; one chain serves all sequences (llama_sampler_sample on each
output in batch order, as llama.h asks; neither sampler keeps per-sequence state). eos is never checked: every sequence gets
exactly new_tokens tokens. One untimed warm-up generate of 8 tokens, then --repeats timed ones; tokens_per_second =
batch * new_tokens / median seconds, prefill included. Prints one JSON object per (file, batch), engine
"llama.cpp-<type>".
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import llama_cpp
import numpy as np


@llama_cpp.llama_log_callback
def errors_only(level: int, text: bytes, data) -> None:
    """llama.cpp's log: errors (GGML_LOG_LEVEL_ERROR, 4 in ggml.h; llama_cpp._logger's table is older) to stderr."""
    if level == 4:
        sys.stderr.write(text.decode(errors="replace"))


class Generator:
    """One llama_context for `batch` sequences of prompt + new_tokens tokens, a llama_batch big enough for all prompts,
    and the temp + dist sampler chain."""

    def __init__(self, model, batch: int, prompt: int, new_tokens: int, threads: int, seed: int):
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = batch
        params.kv_unified = False
        params.n_ctx = batch * (prompt + new_tokens)  # split into n_seq_max streams of prompt + new_tokens cells
        params.n_batch = batch * prompt  # the whole prefill in one llama_decode
        params.n_ubatch = max(512, batch)  # a decode step (batch tokens) in one graph
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError(f"llama_init_from_model failed (n_ctx {params.n_ctx}, n_seq_max {batch})")
        if llama_cpp.llama_n_ctx_seq(self.ctx) < prompt + new_tokens:
            raise RuntimeError(f"context per sequence {llama_cpp.llama_n_ctx_seq(self.ctx)} < {prompt + new_tokens} tokens")
        self.batch = llama_cpp.llama_batch_init(batch * prompt, 0, 1)
        self.sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(self.sampler, llama_cpp.llama_sampler_init_temp(1.0))
        llama_cpp.llama_sampler_chain_add(self.sampler, llama_cpp.llama_sampler_init_dist(seed))

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self.sampler)
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)

    def decode(self, tokens: list, positions: list, sequences: list, outputs: list) -> None:
        b = self.batch
        for i, (token, pos, seq, out) in enumerate(zip(tokens, positions, sequences, outputs)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, pos, 1, seq, out
        b.n_tokens = len(tokens)
        if (code := llama_cpp.llama_decode(self.ctx, b)) != 0:
            raise RuntimeError(f"llama_decode returned {code} for {len(tokens)} tokens")

    def sample(self, indices: range) -> list:
        """-> one token for each output of the last decode, named by its token's index in the llama_batch."""
        return [llama_cpp.llama_sampler_sample(self.sampler, self.ctx, i) for i in indices]

    def generate(self, prompts: list, new_tokens: int) -> np.ndarray:
        """prompts (batch lists of prompt ids) -> (batch, new_tokens) sampled ids."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        n, length = len(prompts), len(prompts[0])
        self.decode(
            [t for ids in prompts for t in ids], list(range(length)) * n,
            [s for s in range(n) for _ in range(length)], ([False] * (length - 1) + [True]) * n,
        )
        tokens = [self.sample(range(length - 1, n * length, length))]  # each prompt's last token
        for step in range(1, new_tokens):
            self.decode(tokens[-1], [length + step - 1] * n, list(range(n)), [True] * n)
            tokens.append(self.sample(range(n)))
        return np.array(tokens, dtype=np.int64).T


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", required=True)
    parser.add_argument("--vocab", type=int, required=True, help="the model's vocabulary (the prompts' ids are below it)")
    parser.add_argument("--gguf", required=True, help="TYPE=PATH[,TYPE=PATH...]")
    parser.add_argument("--batches", default="8,32,128")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS") or 2)
    files = dict(item.split("=", 1) for item in args.gguf.split(","))

    llama_cpp.llama_log_set(errors_only, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    for kind, path in files.items():
        model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
        if not model:
            raise RuntimeError(f"{path}: llama_model_load_from_file failed")
        for batch in (int(b) for b in args.batches.split(",")):
            # the same ids as bench_rollout.make_prompts
            prompts = np.random.default_rng(args.seed + batch).integers(3, args.vocab, size=(batch, args.prompt)).tolist()
            generator = Generator(model, batch, args.prompt, args.new_tokens, threads, args.seed)
            try:
                generator.generate(prompts, 8)  # warm-up, untimed, as bench_rollout.py's engines
                seconds = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    out = generator.generate(prompts, args.new_tokens)
                    seconds.append(time.perf_counter() - started)
                    assert out.shape == (batch, args.new_tokens) and out.min() >= 0 and out.max() < args.vocab, out.shape
            finally:
                generator.close()
            median = statistics.median(seconds)
            print(json.dumps({
                "shape": args.shape, "batch": batch, "engine": f"llama.cpp-{kind}",
                "tokens_per_second": round(batch * args.new_tokens / median, 1), "seconds": round(median, 3),
                "new_tokens": args.new_tokens, "prompt_len": args.prompt, "threads": threads, "repeats": args.repeats,
                "sampler": "temp 1 + dist", "llama_cpp_python": llama_cpp.__version__,
            }), flush=True)
        llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
