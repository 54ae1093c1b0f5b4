"""Where a GRPO step's time goes: each phase's matrix products against everything else, per operator, from paddle's
profiler.

    .venv/bin/python bench/bench_profile.py [--model models/SmolLM2-135M-Instruct] [--phases rollout,update,cycle]
        [--prompts 8] [--rollout_n 8] [--prompt 64] [--completion 128] [--precisions bf16,fp32] [--repeats 2]
        [--token_budget 0|auto|N] [--cycle_parts rollout,update,sync]

bench/bench_step.py's SmolLM2 workload (8 prompts x 8 completions, a 64-token prompt and exactly 128 completion
tokens, one micro-batch), with random prompt ids, as the trainer runs it with use_fusemt and use_fused_train_ops:
- rollout: the fused engine (alignment/rollout/fused.py; packed bf16 copies of the weights with bf16) generates the 64
  completions at temperature 1 (min_new_tokens = max_new_tokens: eos never ends a row);
- update: each micro-batch's forward (the decoder layers with each shared prompt run once, alignment/models/
  prefix_grouper.py, then the log-prob head 512 tokens at a time), a GRPO-style loss (sum of log-prob x advantage
  over the tokens), its backward, then one AdamW step. The micro-batches are cut as the trainer cuts them
  (alignment/run/memory_plan.py) with per_device_train_batch_size = all rows and --token_budget as
  micro_batch_token_budget: 0 (the default) one micro-batch, auto the trainer's default (derived from the memory
  estimate, so that long completions profile without running out of memory), or a number of padded tokens.
Each phase runs once to warm up (the update twice: its first optimizer step allocates AdamW's moments, and the pass
after it grows the heap around them, which on an AMD EPYC took half a million page faults and 5 s of system time; the
trainer pays that once, at its second step), --repeats times timed without the profiler (seconds, with the page faults
and system seconds of a pass: what the kernel spent on the process's memory), then --repeats times under paddle.profiler
(CPU events), each operator's own time (its events less those inside them) summed into:
- matmul: the projections' and the head's products (grpo_bf16_linear and its grad, grpo_bf16_matmul; the fused
  engine's grpo_prepacked_matmul in bf16, its MKL-packed and paddle matmuls in fp32);
- mlp: in bf16, the MLP's three products with SwiGLU between them, one operator (grpo_bf16_mlp and its grad):
  bench/bench_mlp.py measures how much of it is SwiGLU and how much the products;
- attention: the training attention and its grad (grpo_attention; or the paddle matmuls around grpo_masked_softmax),
  the rollout's attention over its cache (grpo_cache_attention);
- optimizer (AdamW), bf16_copies (grpo_to_bf16: the weights' bf16 copies remade after an optimizer step, and the
  log-prob head's gradient converted once for its two products), elementwise (the rest: norms,
  rotary, SwiGLU, the head's row kernels, sampling, adds, copies).
In fp32 the update's projections are paddle matmuls (F.linear) like the attention's batched products, which the
events cannot tell apart: there "attention" holds both. Prints one JSON object per (phase, precision): seconds, each
category's seconds and its share of the phase's wall time (the rest: Python and the framework between operators),
and the ten largest operators.

The phase cycle is the trainer's loop without the trainer: a rollout, an update and the engine's weight refresh
(engine.sync), --repeats + 1 rounds without the profiler (--cycle_parts leaves parts out), one JSON object per round
with each part's seconds. Its first rollout runs in a fresh process's memory, the later ones in the heap the updates
leave behind. The process restarts itself as run_grpo.py does, on transparent huge pages where the kernel has them
(restart_with_huge_pages; GLIBC_TUNABLES=glibc.malloc.hugetlb=0 keeps 4 KB pages), so that its figures are those of
the trainer's memory.
"""

import argparse
import dataclasses
import json
import os
import re
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.basics.runtime import HUGE_PAGES_TUNABLE, configure_cpu_runtime, import_paddle, restart_with_huge_pages  # noqa: E402

if __name__ == "__main__":
    restart_with_huge_pages()
configure_cpu_runtime()
paddle = import_paddle()

import numpy as np  # noqa: E402

from alignment.algo.logprobs import chunked_token_logprobs  # noqa: E402
from alignment.models.fused_train import groups_prompts, head_kernels, use_training_ops, weights_changed  # noqa: E402
from alignment.models.modeling import completion_hidden, make_token_batch, output_head  # noqa: E402
from alignment.rollout import EngineSettings, build_engine  # noqa: E402
from alignment.rollout.base import SamplingParams  # noqa: E402
from alignment.kernels.ops import load_ops  # noqa: E402

# What each operator is, by the name its profiler event gets (see event_name). In bf16 the update's projections are
# grpo_bf16_linear and the head's products grpo_bf16_matmul, so its only paddle matmuls are the attention's (where
# grpo_attention is not built); in fp32 the projections are paddle matmuls too and count as attention (docstring).
MATMUL = ("grpo_bf16_linear", "grpo_bf16_linear_grad", "grpo_bf16_matmul", "grpo_packed_matmul", "grpo_prepacked_matmul")
ATTENTION = (
    "grpo_attention", "grpo_attention_grad", "grpo_cache_attention", "matmul", "MatmulGradNode", "grpo_masked_softmax",
    "grpo_masked_softmax_grad",
)
MLP = ("grpo_bf16_mlp", "grpo_bf16_mlp_grad")  # products and SwiGLU in one operator
OPTIMIZER = ("adamw_",)
BF16_COPIES = ("grpo_to_bf16",)  # the weights' bf16 copies, remade after each optimizer step; the head's gradient


def category(name: str, phase: str) -> str:
    if name in MATMUL or (phase == "rollout" and name == "matmul"):  # the fused engine's fp32 products
        return "matmul"
    if name in ATTENTION:
        return "attention"
    if name in MLP:
        return "mlp"
    if name in OPTIMIZER:
        return "optimizer"
    if name in BF16_COPIES:
        return "bf16_copies"
    return "elementwise"


def event_name(event: dict) -> str:
    """'matmul dygraph[1.2 ms]' -> 'matmul'; 'Global_CustomOpGradNode: grpo_bf16_linear_grad[..]' ->
    'grpo_bf16_linear_grad'; 'Global_MatmulGradNode[..]' -> 'MatmulGradNode'; a RecordEvent keeps its name."""
    name = re.sub(r"\[[^\]]*\]$", "", event["name"]).removesuffix(" dygraph")
    return name.split(": ")[-1].removeprefix("Global_")


def record_custom_ops(ops) -> None:
    """The compiled operators' forward calls get no profiler event of their own (their backward does, as a grad node):
    wrap each in one named after it. The model's modules and the engine hold this same namespace, so they call the
    wrappers."""
    import paddle.profiler as profiler

    def recorded(name, function):
        def call(*args, **kwargs):
            with profiler.RecordEvent(name):
                return function(*args, **kwargs)

        return call

    for name in [n for n in dir(ops) if n.startswith("grpo_")]:
        setattr(ops, name, recorded(name, getattr(ops, name)))


def operator_seconds(trace: Path) -> dict:
    """Each operator's own time in a chrome-trace JSON: its events' durations less those of the events inside them
    (an operator calling another, the head's backward calling its products), so that nothing counts twice. The
    Python-side events (the wrappers of record_custom_ops) and the C++ ones of the same thread carry different tid
    labels ("123(Python)", "123(C++)"): both are the thread 123."""
    events = [
        e for e in json.loads(trace.read_text())["traceEvents"]
        if e.get("ph") == "X" and (e.get("cat") == "Operator" or (e.get("cat") == "PythonUserDefined" and e["name"].startswith("grpo_")))
    ]
    totals = defaultdict(float)
    for thread in {re.match(r"\d+", str(e["tid"])).group() for e in events}:
        stack = []  # [end time, name, own microseconds] of the events that enclose the current one
        ordered = sorted((e for e in events if re.match(r"\d+", str(e["tid"])).group() == thread), key=lambda e: (e["ts"], -e["dur"]))
        for event in ordered + [None]:
            while stack and (event is None or event["ts"] >= stack[-1][0]):
                _, name, own = stack.pop()
                totals[name] += own / 1e6
            if event is not None:
                if stack:
                    stack[-1][2] -= event["dur"]
                stack.append([event["ts"] + event["dur"], event_name(event), event["dur"]])
    return totals


def build(model_dir: str, bf16: bool):
    from alignment.run.model_source import load_model

    model = load_model(Path(model_dir))
    why_not = use_training_ops(model, bf16=bf16)
    if why_not:
        sys.exit(f"bench_profile: the training operators cannot run: {why_not}")
    return model


def rollout_phase(model, bf16: bool, prompts: list, rollout_n: int, completion: int):
    """-> (the fused engine, a call that rolls out the prompts with it)."""
    eos = model.config.eos_token_id
    engine = build_engine(EngineSettings(fused=True), model, eos if isinstance(eos, list) else [eos], 0, bf16)
    params = SamplingParams(max_new_tokens=completion, min_new_tokens=completion, temperature=1.0)
    return engine, lambda: engine.generate(prompts, rollout_n, params)


def micro_batch_rows(args, precision: str) -> tuple:
    """-> (rows per micro-batch, the trainer's memory line) for all the step's rows, cut as the trainer cuts them with
    per_device_train_batch_size = all rows and micro_batch_token_budget = --token_budget (auto: the derived default)."""
    from alignment.config.schema import GRPOConfig
    from alignment.config.validation import validate
    from alignment.run.memory_plan import plan_memory

    rows = args.prompts * args.rollout_n
    config = validate(dataclasses.replace(
        GRPOConfig(), actor_model_name_or_path=args.model, per_device_prompt_batch_size=args.prompts, rollout_n=args.rollout_n,
        per_device_train_batch_size=rows, max_dec_len=args.completion, use_fusemt=True, use_fused_train_ops=True,
        cpu_bf16_matmul="on" if precision == "bf16" else "off",
        micro_batch_token_budget=None if args.token_budget == "auto" else int(args.token_budget),
    ))
    plan = plan_memory(config, args.model, args.prompt, world_size=1)
    return plan.budget.rows(rows, args.prompt + args.completion), plan.line


def planned_update(args, precision: str, model, prompts: list, rng) -> tuple:
    """-> (rows per micro-batch, the update_phase call with the trainer's cut), the trainer's memory line on stderr."""
    micro_rows, memory_line = micro_batch_rows(args, precision)
    print(f"bench_profile: {memory_line}", file=sys.stderr)
    return micro_rows, update_phase(model, prompts, args.rollout_n, args.completion, micro_rows, rng)


def update_phase(model, prompts: list, rollout_n: int, completion: int, micro_rows: int, rng):
    model.train()
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-6, parameters=model.parameters())
    rows = [p for p in prompts for _ in range(rollout_n)]
    vocab, tokens = model.config.vocab_size, len(rows) * completion
    completions = rng.integers(3, vocab, size=(len(rows), completion))
    advantages = rng.standard_normal((len(rows), 1)).astype(np.float32)
    micro_batches = []  # (token batch, [rows, 1] advantages) per micro-batch, each a run of whole rows
    for at in range(0, len(rows), micro_rows):
        part = slice(at, at + micro_rows)
        mask = np.ones(completions[part].shape, np.float32)
        micro_batches.append((make_token_batch(rows[part], completions[part], mask, 0), paddle.to_tensor(advantages[part])))

    def one_update():
        for batch, batch_advantages in micro_batches:
            hidden = completion_hidden(model, batch, groups_prompts(model, recompute=False))
            weight, bias = output_head(model)
            logprobs, _ = chunked_token_logprobs(hidden, weight, bias, batch.completion_ids, 1.0, 512, head_kernels(model))
            loss = -(logprobs * batch_advantages).sum() / tokens  # the mean over the whole batch's tokens
            loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        weights_changed(model)

    return one_update


def cycle(engine, rollout, update, rounds: int, precision: str, parts: list) -> None:
    """Rollout, update, weight refresh (those of them in `parts`), `rounds` times: one JSON line per round."""
    runs = {"rollout": rollout, "update": update, "sync": engine.sync}
    for round_number in range(rounds):
        seconds = {}
        for part in parts:
            began = time.perf_counter()
            runs[part]()
            seconds[part] = round(time.perf_counter() - began, 2)
        print(json.dumps({"phase": "cycle", "precision": precision, "round": round_number, **seconds,
                          "huge_pages": f"{HUGE_PAGES_TUNABLE}=1" in os.environ.get("GLIBC_TUNABLES", "")}), flush=True)


def profile(run, repeats: int, warmups: int) -> tuple:
    """-> (wall seconds per run without the profiler, {operator: own seconds per run} under it, {minor_faults,
    system_seconds} per run without it)."""
    import paddle.profiler as profiler

    for _ in range(warmups):
        run()
    usage, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(repeats):
        run()
    wall, after = (time.perf_counter() - began) / repeats, resource.getrusage(resource.RUSAGE_SELF)
    kernel = {
        "minor_faults": (after.ru_minflt - usage.ru_minflt) // repeats,
        "system_seconds": round((after.ru_stime - usage.ru_stime) / repeats, 2),
    }
    with tempfile.TemporaryDirectory() as folder:
        prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU], on_trace_ready=lambda _: None)
        prof.start()
        for _ in range(repeats):
            run()
        prof.stop()
        trace = Path(folder) / "trace.json"
        prof.export(str(trace), format="json")
        return wall, {name: seconds / repeats for name, seconds in operator_seconds(trace).items()}, kernel


def report(phase: str, precision: str, wall: float, totals: dict, kernel: dict, args, micro_rows: int) -> dict:
    by_category = defaultdict(float)
    for name, seconds in totals.items():
        by_category[category(name, phase)] += seconds
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:10]
    return {
        "phase": phase, "precision": precision, "seconds": round(wall, 2),
        **{f"{key}_seconds": round(value, 2) for key, value in sorted(by_category.items())},
        **{f"{key}_share": round(value / wall, 3) for key, value in sorted(by_category.items())},
        "outside_operators_seconds": round(wall - sum(by_category.values()), 2),
        "top_operators": {name: round(seconds, 3) for name, seconds in top},
        **kernel,
        "prompts": args.prompts, "rollout_n": args.rollout_n, "prompt": args.prompt, "completion": args.completion, "model": args.model,
        **({"micro_batch_rows": micro_rows, "token_budget": args.token_budget} if phase == "update" else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--phases", default="rollout,update")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rollout_n", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--token_budget", default="0", help="the update's micro_batch_token_budget: 0 (one micro-batch), auto, or N")
    parser.add_argument("--cycle_parts", default="rollout,update,sync",
                        help="what a round of the cycle phase runs, in order (default all three: leave one out to see what it "
                             "does to the others)")
    args = parser.parse_args()
    phases, precisions = args.phases.split(","), args.precisions.split(",")
    if set(phases) - {"rollout", "update", "cycle"} or set(precisions) - {"bf16", "fp32"}:
        parser.error("phases: rollout, update, cycle; precisions: bf16, fp32")
    if set(args.cycle_parts.split(",")) - {"rollout", "update", "sync"}:
        parser.error("--cycle_parts: rollout, update, sync")
    ops, why_not = load_ops()
    if ops is None:
        sys.exit(f"bench_profile: the compiled operators are not available: {why_not}")
    record_custom_ops(ops)
    rng = np.random.default_rng(0)
    for precision in precisions:
        model = build(args.model, precision == "bf16")
        prompts = [rng.integers(3, model.config.vocab_size, size=args.prompt).tolist() for _ in range(args.prompts)]
        for phase in phases:
            micro_rows = None
            if phase == "cycle":
                engine, rollout = rollout_phase(model, precision == "bf16", prompts, args.rollout_n, args.completion)
                update = planned_update(args, precision, model, prompts, rng)[1]
                cycle(engine, rollout, update, args.repeats + 1, precision, args.cycle_parts.split(","))
                continue
            if phase == "rollout":
                run = rollout_phase(model, precision == "bf16", prompts, args.rollout_n, args.completion)[1]
            else:
                micro_rows, run = planned_update(args, precision, model, prompts, rng)
            wall, totals, kernel = profile(run, args.repeats, warmups=2 if phase == "update" else 1)
            print(json.dumps(report(phase, precision, wall, totals, kernel, args, micro_rows)), flush=True)


if __name__ == "__main__":
    main()
