"""Generation throughput of the rollout engines: tokens per second for the eager engine, the fused engine
(built as the trainer builds it with use_fusemt; skipped with the reason on stderr where it cannot run:
not written yet, operators not built, failed weight check), fused-bf16 (the same with cpu_bf16_matmul's bf16
weight copies, on its own copy of the model), with --torch-python, transformers' generate in PyTorch
(bench/torch_generate.py under that interpreter), and with --llama-cpp-python, llama.cpp (bench/llama_cpp_generate.py
under that interpreter, llama-cpp-python 0.3.36 in .venv-llamacpp) on GGUF files of the same model.

    .venv/bin/python bench/bench_rollout.py [--shapes tiny,qwen2.5-0.5b] [--batches 8,32,128]
        [--engines eager,fused,fused-bf16] [--new-tokens 128] [--prompt 64] [--repeats N]
        [--torch-python /work/torch-venv/bin/python]
        [--llama-cpp-python .venv-llamacpp/bin/python [--llama-cpp-types f16,bf16,q8_0]]

Our bf16 engine beside llama.cpp's settings on the same CPU, at SmolLM2-135M's shape:

    .venv/bin/python bench/bench_rollout.py --shapes smollm2-135m --batches 64 --engines fused-bf16 --new-tokens 128
        --llama-cpp-python .venv-llamacpp/bin/python --llama-cpp-types f16,bf16,q8_0

Models are Qwen2 with random (seeded) float32 weights, built from a config, never downloaded:
tiny = hidden 256, 4 layers, 4 heads, 2 KV heads, intermediate 768, vocabulary 4096;
qwen2.5-0.5b = Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864,
vocabulary 151936, rope_theta 1e6); both tie the embeddings. Each batch is `batch` distinct prompts of
random token ids (group size 1), each exactly --new-tokens long (min_new_tokens = max_new_tokens keeps
eos out), sampled at temperature 1 over the whole vocabulary. Each engine runs one untimed warm-up
generate of 8 tokens, then --repeats timed ones (default 3 for tiny, 1 for qwen2.5-0.5b: one eager generate of
128 x 128 tokens at that shape takes minutes here); tokens_per_second = batch * new_tokens / median
seconds. Prints one JSON object per (shape, batch, engine) and a last one with the ratios between
engines per shape and batch (with llama.cpp: fused and fused-bf16 over each llama.cpp type and over the fastest,
"..._over_llama.cpp_best").

llama.cpp: the shape's model (build_model, the same seed: the same weights) is saved as a Hugging Face folder with
the tiny model's tokenizer (data/tiny-qwen2, 451 tokens: the prompts are ids, never text) and written as one GGUF file
per --llama-cpp-types entry by the project's exporter (alignment/models/gguf_export.py: linear weights in that type,
norms and biases f32) into a temporary folder. Each (type, batch) runs in one llama_context with one sequence per
prompt: all prompts prefilled in one llama_decode, then one llama_batch of one token per sequence per step, sampled
by llama.cpp's temp(1) + dist sampler chain, eos ignored, warm-up and repeats as above (bench/llama_cpp_generate.py).
Engine "llama.cpp-<type>", threads = OMP_NUM_THREADS. A missing interpreter or a llama_cpp that does not import is
reported on stderr and the engine skipped.
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import numpy as np  # noqa: E402

from alignment.rollout import EngineSettings  # noqa: E402
from alignment.rollout.base import SamplingParams  # noqa: E402
from alignment.rollout.eager import EagerEngine  # noqa: E402

# Keyword arguments that paddleformers' and transformers' Qwen2Config both take with the same meaning.
SHAPES = {
    "tiny": dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
        vocab_size=4096, tie_word_embeddings=True, rope_theta=10000.0, max_position_embeddings=1024,
    ),
    "smollm2-135m": dict(  # SmolLM2-135M-Instruct's sizes (a Llama there; Qwen2 here adds q/k/v biases)
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
        vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0, max_position_embeddings=8192,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
        vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768,
    ),
}
COMMON = dict(rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=2, pad_token_id=0, hidden_act="silu")
DEFAULT_REPEATS = {"tiny": 3, "smollm2-135m": 1, "qwen2.5-0.5b": 1}
# The GGUF files' tokenizer: byte-level BPE, 451 tokens (fewer than any shape's vocabulary), bos 0, eos 2 as COMMON
GGUF_TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "tiny-qwen2"


def make_prompts(vocab: int, batch: int, length: int, seed: int) -> list:
    """The same ids in bench/torch_generate.py (numpy's default_rng with the same seed)."""
    return np.random.default_rng(seed).integers(3, vocab, size=(batch, length)).tolist()


def build_model(shape: str, seed: int):
    from paddleformers.transformers import Qwen2Config, Qwen2ForCausalLM
    from paddleformers.utils.log import logger

    logger.set_level("WARNING")
    paddle.seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape], **COMMON))
    model.eval()
    return model


def fused_engine(model, eos_token_ids: list, pad_token_id: int, bf16: bool = False):
    """The fused engine as the trainer builds it (build_engine with use_fusemt; with bf16, on a model whose
    training modules multiply in bf16 too, as cpu_bf16_matmul makes them), or None with the reason on stderr:
    not written yet, operators not built, a model it does not run, or a failed weight check."""
    try:
        from alignment.models.fused_train import use_training_ops
        from alignment.rollout import build_engine
        from alignment.rollout.fused import FusedEngine

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            why_not = use_training_ops(model, bf16=True) if bf16 else None
            if why_not:
                raise RuntimeError(f"no bf16 training modules: {why_not}")
            engine = build_engine(EngineSettings(fused=True), model, eos_token_ids, pad_token_id, bf16)
    except Exception as error:  # ImportError while it is being written, WeightSyncError, ...
        print(f"bench_rollout: the fused engine is not available ({type(error).__name__}: {error}); skipping it", file=sys.stderr)
        return None
    if not isinstance(engine, FusedEngine):
        why = "; ".join(str(w.message) for w in caught) or "build_engine returned the eager engine"
        print(f"bench_rollout: the fused engine is not available ({why}); skipping it", file=sys.stderr)
        return None
    return engine


def time_engine(engine, prompts: list, params: SamplingParams, repeats: int) -> list:
    warm_up = SamplingParams(max_new_tokens=8, min_new_tokens=8, temperature=params.temperature)
    engine.generate(prompts, 1, warm_up)  # untimed: first calls allocate and load kernels
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        rollout = engine.generate(prompts, 1, params)
        seconds.append(time.perf_counter() - started)
        generated, expected = int(rollout.lengths.sum()), len(prompts) * params.max_new_tokens
        if generated != expected:
            raise RuntimeError(f"{type(engine).__name__} generated {generated} tokens, expected {expected}")
    return seconds


def run_torch(python: str, shape: str, batches: list, args, repeats: int):
    """bench/torch_generate.py under `python`; yields its JSON objects as they come."""
    command = [
        python, str(Path(__file__).with_name("torch_generate.py")), "--shape", shape,
        "--config", json.dumps({**SHAPES[shape], **COMMON}), "--batches", ",".join(map(str, batches)),
        "--new-tokens", str(args.new_tokens), "--prompt", str(args.prompt), "--repeats", str(repeats), "--seed", str(args.seed),
    ]
    yield from side_records(command)


def side_records(command: list):
    """Run a side script (another interpreter's bench/*_generate.py); yield the JSON objects it prints, as they come,
    and say on stderr if it failed."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
        for line in child.stdout:
            if line.startswith("{"):
                yield json.loads(line)
    if child.returncode:
        print(f"bench_rollout: {' '.join(command[:2])} exited with {child.returncode}", file=sys.stderr)


def llama_cpp_missing(python: str) -> str | None:
    """Why `python` cannot run bench/llama_cpp_generate.py (no such interpreter, llama_cpp does not import), or None."""
    try:
        done = subprocess.run([python, "-c", "import llama_cpp, numpy"], capture_output=True, text=True, timeout=300)
    except OSError as error:
        return f"{python}: {error.strerror or error}"
    lines = done.stderr.strip().splitlines()
    return f"{python}: {lines[-1] if lines else f'exited with {done.returncode}'}" if done.returncode else None


def export_ggufs(shape: str, seed: int, types: list, folder: Path) -> dict:
    """build_model(shape, seed) -> {type: folder/<shape>-<type>.gguf}: saved as a Hugging Face folder with
    GGUF_TOKENIZER's files (as tests/models/test_gguf_export.py exports random models), then the project's exporter."""
    from alignment.models.gguf_export import write_gguf_file
    from alignment.models.modeling import save_model

    model_folder = folder / "model"
    save_model(build_model(shape, seed), str(model_folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(GGUF_TOKENIZER / name, model_folder / name)
    files = {kind: folder / f"{shape}-{kind}.gguf" for kind in types}
    for kind, path in files.items():
        write_gguf_file(model_folder, path, kind)
    shutil.rmtree(model_folder)
    return files


def run_llama_cpp(python: str, shape: str, batches: list, args, repeats: int, types: list):
    """bench/llama_cpp_generate.py under `python` on the shape's model exported as GGUF in each of `types`; yields
    its JSON objects as they come."""
    with tempfile.TemporaryDirectory(prefix="bench-rollout-gguf-") as folder:
        files = export_ggufs(shape, args.seed, types, Path(folder))
        gc.collect()
        command = [
            python, str(Path(__file__).with_name("llama_cpp_generate.py")), "--shape", shape,
            "--vocab", str(SHAPES[shape]["vocab_size"]), "--gguf", ",".join(f"{kind}={path}" for kind, path in files.items()),
            "--batches", ",".join(map(str, batches)), "--new-tokens", str(args.new_tokens), "--prompt", str(args.prompt),
            "--repeats", str(repeats), "--seed", str(args.seed),
        ]
        yield from side_records(command)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="tiny,qwen2.5-0.5b")
    parser.add_argument("--batches", default="8,32,128")
    parser.add_argument("--engines", default="eager,fused", help="paddle engines: eager, fused, fused-bf16 (cpu_bf16_matmul's engine)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=None, help="timed generates per point (default: 3 tiny, 1 qwen2.5-0.5b)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-python", default=None, help="a Python with torch + transformers: also run bench/torch_generate.py")
    parser.add_argument("--llama-cpp-python", default=None,
                        help="a Python with llama-cpp-python (.venv-llamacpp/bin/python): also run bench/llama_cpp_generate.py")
    parser.add_argument("--llama-cpp-types", default="f16,bf16,q8_0", help="with --llama-cpp-python: the GGUF files' weight types")
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; known: {sorted(SHAPES)}")

    engines = [e for e in args.engines.split(",") if e]
    for name in engines:
        if name not in ("eager", "fused", "fused-bf16"):
            parser.error(f"unknown engine '{name}' (eager, fused, fused-bf16; torch comes with --torch-python)")
    llama_cpp_types = []
    if args.llama_cpp_python:
        from alignment.models.gguf_export import OUTTYPES

        llama_cpp_types = [t for t in args.llama_cpp_types.split(",") if t]
        if unknown := [t for t in llama_cpp_types if t not in OUTTYPES]:
            parser.error(f"unknown --llama-cpp-types {unknown}; the GGUF export writes {', '.join(OUTTYPES)}")
        if why_not := llama_cpp_missing(args.llama_cpp_python):
            print(f"bench_rollout: llama.cpp is not available ({why_not}); skipping it", file=sys.stderr)
            llama_cpp_types = []

    params = SamplingParams(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, temperature=1.0)
    threads = int(os.environ["OMP_NUM_THREADS"])
    speeds = {}  # (shape, batch) -> {engine: tokens_per_second}
    for shape in shapes:
        repeats = args.repeats or DEFAULT_REPEATS[shape]
        if engines:
            model = build_model(shape, args.seed)
            eos, pad = [COMMON["eos_token_id"]], COMMON["pad_token_id"]
            built = {"eager": EagerEngine(model, eos, pad)} if "eager" in engines else {}
            if "fused" in engines and (fused := fused_engine(model, eos, pad)) is not None:
                built["fused"] = fused
            # its own copy of the model: the bf16 training modules would change what the eager engine runs
            if "fused-bf16" in engines and (fused := fused_engine(build_model(shape, args.seed), eos, pad, bf16=True)) is not None:
                built["fused-bf16"] = fused
            for batch in batches:
                prompts = make_prompts(SHAPES[shape]["vocab_size"], batch, args.prompt, args.seed + batch)
                for name, engine in built.items():
                    seconds = statistics.median(time_engine(engine, prompts, params, repeats))
                    record = {
                        "shape": shape, "batch": batch, "engine": name,
                        "tokens_per_second": round(batch * args.new_tokens / seconds, 1), "seconds": round(seconds, 3),
                        "new_tokens": args.new_tokens, "prompt_len": args.prompt, "threads": threads, "repeats": repeats,
                    }
                    speeds.setdefault((shape, batch), {})[name] = record["tokens_per_second"]
                    print(json.dumps(record), flush=True)
            del built, model
            gc.collect()
        if args.torch_python:
            for record in run_torch(args.torch_python, shape, batches, args, repeats):
                speeds.setdefault((record["shape"], record["batch"]), {})["torch"] = record["tokens_per_second"]
                print(json.dumps(record), flush=True)
        if llama_cpp_types:
            for record in run_llama_cpp(args.llama_cpp_python, shape, batches, args, repeats, llama_cpp_types):
                speeds.setdefault((record["shape"], record["batch"]), {})[record["engine"]] = record["tokens_per_second"]
                print(json.dumps(record), flush=True)

    ratios = {}
    for (shape, batch), by_engine in speeds.items():
        pairs = {f"{a}_over_{b}": round(by_engine[a] / by_engine[b], 2)
                 for a, b in (("fused", "eager"), ("fused-bf16", "fused"), ("fused", "torch"), ("eager", "torch"))
                 if a in by_engine and b in by_engine}
        llama_cpp = {name: speed for name, speed in by_engine.items() if name.startswith("llama.cpp-")}
        for ours in ("fused", "fused-bf16"):
            if ours in by_engine and llama_cpp:
                pairs.update({f"{ours}_over_{name}": round(by_engine[ours] / speed, 2) for name, speed in llama_cpp.items()})
                pairs[f"{ours}_over_llama.cpp_best"] = round(by_engine[ours] / max(llama_cpp.values()), 2)
        if pairs:
            ratios[f"{shape}/{batch}"] = pairs
    print(json.dumps({"ratios": ratios}))


if __name__ == "__main__":
    main()
