"""Seconds per GRPO step and per phase for one fixed workload: the eager engine with paddle's own kernels
against the fused one (use_fusemt and use_fused_train_ops, float32: cpu_bf16_matmul off) and fused-bf16 (the
same with cpu_bf16_matmul on: needs a CPU with AVX512-BF16 or AMX), and with --trl-python TRL's GRPOTrainer on
the same workload (bench/trl_step.py), at float32 and / or bf16=True (--trl-precisions).

    .venv/bin/python bench/bench_step.py [--max_steps 6] [--engines eager,fused,fused-bf16] [--model DIR]
        [--prompts 4] [--rollout_n 8] [--dec_len 64] [--token_budget 0,auto,N] [--micro_batch 64,32,16]
        [--trl-python /work/torch-venv/bin/python] [--trl-precisions fp32,bf16] [-- extra run_grpo overrides]

Micro-batches and memory: each --token_budget value is a run with per_device_train_batch_size = all the step's rows and
that micro_batch_token_budget (auto: the default, derived from the memory estimate; 0, the default here: one
micro-batch); each --micro_batch value is a run with that per_device_train_batch_size and no token budget (the
hand-picked sizes to compare the default against). Every run reports its peak resident memory over the steps
(peak_gb, from metrics.jsonl's memory/peak_gb), the estimate its first line printed (estimate_gb, and
estimate_over_peak) and the micro-batches it ran. SmolLM2 at 512 new tokens with the default budget, and at 128
against hand-picked sizes:

    .venv/bin/python bench/bench_step.py --engines fused --max_steps 3 --model models/SmolLM2-135M-Instruct --prompts 8 \\
        --rollout_n 8 --dec_len 512 --token_budget auto
    .venv/bin/python bench/bench_step.py --engines fused --max_steps 3 --model models/SmolLM2-135M-Instruct --prompts 8 \\
        --rollout_n 8 --dec_len 128 --token_budget auto --micro_batch 64,32,16

SmolLM2-135M-Instruct, 8 prompts x 8 completions of 128 tokens, against TRL at both precisions:

    .venv/bin/python bench/bench_step.py --model models/SmolLM2-135M-Instruct --prompts 8 --rollout_n 8 --dec_len 128 \\
        --trl-python /work/torch-venv/bin/python --trl-precisions fp32,bf16

Workload: the model folder --model (a Hugging Face layout folder: config.json, model.safetensors and the
tokenizer; default the bundled data/tiny-qwen2; its tokenizer and chat template come with it) on data/arith
with config/tiny/grpo_argument.json (its system prompt on both sides), overridden to --prompts prompts x
--rollout_n completions per step (one micro-batch), max_dec_len = min_dec_len = --dec_len (eos blocked, so
every completion is --dec_len tokens and the work per step is fixed: a run whose completions are not is left
out), kl_loss_coeff 0 (no reference model), no evaluation. Each engine is one `python -m paddle.distributed.launch
--nproc_per_node 1 run_grpo.py ...` into output/bench-step-<engine>; its metrics.jsonl gives each step's
`time/*`. Prints one JSON object per engine with the median over the steps after the first (the warm-up) of:
the whole step, rollout, reward, logprobs (null in this workload: with kl_loss_coeff 0 and one update per
rollout neither this trainer nor TRL runs a separate log-prob pass; the old log-probs come with the rollout),
update (time/train: forward, backward and optimizer step), sync (the fused engine's weight refresh and check);
then one object per TRL precision ("engine": "trl-fp32", "trl-bf16"), and a last object with the ratios
between engines, where "trl" is the faster TRL setting (lower seconds_per_step), named by its "trl" key.
A fused run that could not use the fused engine (the trainer then rolls out with the eager engine) is
reported on stderr and left out.
"""

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_CONFIG = REPO / "config/tiny/grpo_argument.json"
FIXED = {"kl_loss_coeff": "0", "eval_datasets": "", "save_steps": "0", "logging_steps": "1"}
PHASES = {"rollout": "time/rollout", "reward": "time/reward", "logprobs": "time/logprobs", "update": "time/train", "sync": "time/sync"}
TRL_PRECISIONS = ("fp32", "bf16")
ENGINES = ("eager", "fused", "fused-bf16")


def workload(model: Path, prompts: int, rollout_n: int, dec_len: int) -> dict:
    """run_grpo overrides: prompts x rollout_n completions of exactly dec_len tokens, one micro-batch."""
    return {
        "actor_model_name_or_path": str(model),
        "per_device_prompt_batch_size": str(prompts),
        "rollout_n": str(rollout_n),
        "per_device_train_batch_size": str(prompts * rollout_n),
        "max_dec_len": str(dec_len),
        "min_dec_len": str(dec_len),
        **FIXED,
    }


def median_after_first(steps: list, key: str):
    values = [s[key] for s in steps[1:] if s.get(key) is not None]
    return round(statistics.median(values), 4) if values else None


def cuts(token_budgets: list, micro_batches: list, rows: int) -> list:
    """-> (name suffix, run_grpo overrides) for each way of cutting the batch into micro-batches: each token budget with
    per_device_train_batch_size = all rows, then each hand-picked micro-batch size without a token budget."""
    found = [(f"budget={b}" if b != "0" else "", ({} if b == "auto" else {"micro_batch_token_budget": b})) for b in token_budgets]
    return found + [(f"micro={m}", {"per_device_train_batch_size": str(m), "micro_batch_token_budget": "0"}) for m in micro_batches
                    if m <= rows]


def run_paddle(engine: str, settings: dict, max_steps: int, overrides: list, cut: tuple = ("", {})):
    """-> the JSON object for one engine and one cut into micro-batches, or None (reason on stderr)."""
    name = engine + (f" {cut[0]}" if cut[0] else "")
    out = REPO / ("output/bench-step-" + name.replace(" ", "-").replace("=", ""))
    shutil.rmtree(out, ignore_errors=True)
    fused = engine.startswith("fused")
    settings = {**settings, **cut[1], "max_steps": str(max_steps), "output_dir": str(out), "use_fusemt": str(fused).lower(),
                "use_fused_train_ops": str(fused).lower(), "cpu_bf16_matmul": "on" if engine == "fused-bf16" else "off"}
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir", str(out / "launch_log"),
        "run_grpo.py", str(BASE_CONFIG.relative_to(REPO)), *[a for key, value in settings.items() for a in (f"--{key}", value)], *overrides,
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    log_file = out / "launch_log" / "workerlog.0"
    log = log_file.read_text(errors="replace") if log_file.is_file() else ""
    if done.returncode:
        tail = "\n".join(log.splitlines()[-15:])
        print(f"bench_step: the {engine} run failed (exit {done.returncode}); {log_file}:\n{tail}", file=sys.stderr)
        return None
    used = re.search(r"rollout with the (\w+)", log)
    engine_class = used.group(1) if used else None
    if fused and engine_class != "FusedEngine":
        why = re.search(r"use_fusemt: (.*)", log)
        print(f"bench_step: the fused run rolled out with the {engine_class or 'unknown engine'}"
              f"{' (' + why.group(1) + ')' if why else ''}; leaving it out", file=sys.stderr)
        return None
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "time/step" in line]
    config = json.loads((out / "grpo_config.json").read_text())
    # Every length is <= max_dec_len, so a mean of max_dec_len means every completion had that length.
    means = [s["response_length_mean"] for s in steps]
    if any(abs(m - config["max_dec_len"]) > 1e-6 for m in means):
        print(f"bench_step: the {engine} run's completions were not all {config['max_dec_len']} tokens (mean length per step: "
              f"{means}; {out / 'metrics.jsonl'}); leaving it out", file=sys.stderr)
        return None
    sequences = config["per_device_prompt_batch_size"] * config["rollout_n"]
    extra = sorted({k for s in steps for k in s if k.startswith("time/")} - set(PHASES.values()) - {"time/step"})
    plan = re.search(r"memory: estimated peak ([\d.]+) GB.*?; (micro_batch_token_budget .*)", log)
    peak = max(s["memory/peak_gb"] for s in steps)
    return {
        "engine": name,
        "seconds_per_step": median_after_first(steps, "time/step"),
        **{phase: median_after_first(steps, key) for phase, key in PHASES.items()},
        **{key[len("time/"):]: median_after_first(steps, key) for key in extra},
        "steps_measured": max(len(steps) - 1, 0),
        "peak_gb": round(peak, 2),  # the process's peak resident memory over all steps
        "estimate_gb": float(plan.group(1)) if plan else None,  # the run's own estimate, on its first line
        "estimate_over_peak": round(float(plan.group(1)) / peak, 2) if plan else None,
        "micro_batches": plan.group(2) if plan else None,
        "completion_tokens_per_step": round(statistics.median(means) * sequences),
        "engine_class": engine_class,
        "wall_seconds": round(wall, 1),
        "command": " ".join(command[1:]),
    }


def run_trl(python: str, precision: str, args, max_steps: int):
    """-> bench/trl_step.py's JSON object for one precision, or None (reason on stderr)."""
    base = json.loads(BASE_CONFIG.read_text())  # the same prompts and system prompt as the paddle runs
    command = [
        python, str(REPO / "bench/trl_step.py"), "--max_steps", str(max_steps),
        "--output_dir", str(REPO / f"output/bench-step-trl-{precision}"),
        "--model", str(args.model), "--prompts", str(args.prompts), "--rollout_n", str(args.rollout_n), "--dec_len", str(args.dec_len),
        "--precision", precision, "--system_prompt", str(REPO / base["system_prompt"]), "--train_file", str(REPO / base["train_datasets"]),
    ]
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"engine"')]  # not the Trainer's log dicts
    if done.returncode or not records:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        print(f"bench_step: bench/trl_step.py --precision {precision} failed (exit {done.returncode}):\n{tail}", file=sys.stderr)
        return None
    return {**records[-1], "command": " ".join(command[1:])}


def ratios(results: dict) -> dict:
    """Ratios of step and phase times; "trl" stands for the faster TRL setting, which the "trl" key names."""
    trl = [r for name, r in results.items() if name.startswith("trl-") and r.get("seconds_per_step")]
    named = dict(results)
    out = {}
    if trl:
        fastest = min(trl, key=lambda r: r["seconds_per_step"])
        named["trl"] = fastest
        out["trl"] = fastest["engine"]
    paddle_runs = [name for name in results if not name.startswith("trl-")]  # engines, and each with its cut of the batch
    for a, b in [("eager", "fused"), ("fused", "fused-bf16")] + [("trl", name) for name in paddle_runs]:
        if a in named and b in named:
            for phase in ("seconds_per_step", "rollout", "update"):
                if named[a].get(phase) and named[b].get(phase):
                    out[f"{phase}_{a}_over_{b}"] = round(named[a][phase] / named[b][phase], 2)
    return out


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer")
    return int(text)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=positive_int, default=6)
    parser.add_argument("--engines", default="eager,fused")
    parser.add_argument(
        "--model", default=str(REPO / "data/tiny-qwen2"), help="a Hugging Face layout model folder; the tokenizer comes with it"
    )
    parser.add_argument("--prompts", type=positive_int, default=4, help="prompts per step")
    parser.add_argument("--rollout_n", type=positive_int, default=8, help="completions per prompt")
    parser.add_argument("--dec_len", type=positive_int, default=64, help="tokens in every completion (max_dec_len = min_dec_len)")
    parser.add_argument("--token_budget", default="0",
                        help="micro_batch_token_budget values, comma-separated: auto (derived from memory), 0 (none: one micro-batch) or N")
    parser.add_argument("--micro_batch", default="", help="hand-picked per_device_train_batch_size values to run beside, comma-separated")
    parser.add_argument("--trl-python", default=None, help="a Python with torch, transformers and trl: also run bench/trl_step.py")
    parser.add_argument("--trl-precisions", default=None, help="with --trl-python: fp32, bf16 or fp32,bf16 (default fp32)")
    args, overrides = parser.parse_known_args()
    args.token_budget = [b for b in args.token_budget.split(",") if b]
    if any(b != "auto" and not b.isdigit() for b in args.token_budget):
        parser.error(f"--token_budget: each value is auto or a number of tokens, not {','.join(args.token_budget)}")
    args.micro_batch = [positive_int(m) for m in args.micro_batch.split(",") if m]
    args.model = Path(args.model).resolve()
    if not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: not a model folder (no config.json in it)")
    engines = [e for e in args.engines.split(",") if e]
    for engine in engines:
        if engine not in ENGINES:
            parser.error(f"--engines: unknown engine '{engine}' ({', '.join(ENGINES)}; trl comes with --trl-python)")
    if args.trl_precisions is not None and args.trl_python is None:
        parser.error("--trl-precisions needs --trl-python")
    precisions = [p for p in (args.trl_precisions or "fp32").split(",") if p]
    for precision in precisions:
        if precision not in TRL_PRECISIONS:
            parser.error(f"--trl-precisions: unknown precision '{precision}' ({', '.join(TRL_PRECISIONS)})")
    return args, engines, precisions if args.trl_python else [], [o for o in overrides if o != "--"]


def main() -> None:
    args, engines, precisions, overrides = parse_args()
    settings = workload(args.model, args.prompts, args.rollout_n, args.dec_len)
    results = {}
    for engine in engines:
        for cut in cuts(args.token_budget, args.micro_batch, args.prompts * args.rollout_n):
            if (record := run_paddle(engine, settings, args.max_steps, overrides, cut)) is not None:
                results[record["engine"]] = record
                print(json.dumps(record), flush=True)
    for precision in precisions:
        if (record := run_trl(args.trl_python, precision, args, args.max_steps)) is not None:
            results[record["engine"]] = record
            print(json.dumps(record), flush=True)
    print(json.dumps({"ratios": ratios(results)}))


if __name__ == "__main__":
    main()
