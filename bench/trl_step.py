"""The TRL side of bench/bench_step.py: seconds per step of TRL's GRPOTrainer on CPU for the same workload
as the paddle runs. Run by bench_step.py (--trl-python, once per --trl-precisions entry) under an interpreter
with torch, transformers and trl, not the project's .venv. Measured with torch 2.13.0+cpu, transformers 4.57.6,
trl 1.16.0 (accelerate 1.15.0, datasets 5.0.1) in /work/torch-venv:

    python3 -m venv /work/torch-venv
    /work/torch-venv/bin/pip install torch==2.13.0            # the CPU build
    /work/torch-venv/bin/pip install -c <(printf 'torch==2.13.0\\ntransformers==4.57.6\\n') transformers==4.57.6 trl==1.16.0

Standalone:

    /work/torch-venv/bin/python bench/trl_step.py [--max_steps 6] [--output_dir output/bench-step-trl-fp32]
        [--model data/tiny-qwen2] [--prompts 4] [--rollout_n 8] [--dec_len 64] [--precision fp32|bf16]
        [--system_prompt data/arith/system_prompt.txt] [--train_file data/arith/train.jsonl] [--no_gradient_checkpointing]

Workload: the model folder --model loaded with AutoModelForCausalLM in float32 (the folder the paddle runs
load: Hugging Face layout), its tokenizer and chat template, --train_file's prompts (src / tgt lines) with
--system_prompt's text (read as the trainer reads it, not stripped) as the system message; per step --prompts
prompts x num_generations --rollout_n = one batch, max_completion_length --dec_len with min_new_tokens --dec_len
(TRL's generation config blocks the tokenizer's eos, which is the trainer's stop token too, until then; the
completion lengths TRL logs are checked to be --dec_len each step, and the run fails otherwise), temperature 1
over the whole vocabulary, beta 0, one optimizer step per generation (so TRL computes no old or reference
log-probs), gradient checkpointing as TRL's GRPOConfig defaults it, on (--no_gradient_checkpointing: off, as
the paddle runs, which store activations; off, SmolLM2-135M's 64 x 128-token workload grew past 24 GB and was
killed for memory), an exact-answer reward, use_cpu, torch threads = usable cores. --precision fp32: bf16=False;
bf16: bf16=True (the Trainer's mixed precision: float32 weights and optimizer, bfloat16 autocast).

Each step is timed from on_step_begin to on_step_end (generation, reward, loss, backward, optimizer step);
phases come from TRL's own profiling contexts: rollout = GRPOTrainer.transformers.generate, reward =
GRPOTrainer._calculate_rewards, update = step - GRPOTrainer._prepare_inputs (the loss forward, backward
and optimizer step). Prints one JSON object ("engine": "trl-fp32" or "trl-bf16") with the medians over the
steps after the first.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
import trl.extras.profiling as profiling  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")

# TRL's profiling contexts report to wandb / mlflow / trackio only; collect their durations per step here.
durations = defaultdict(lambda: defaultdict(float))  # global step -> name -> seconds
_log_metrics = profiling.ProfilingContext._log_metrics


def _collect(self, duration: float) -> None:
    durations[self.step][self.name] += duration
    _log_metrics(self, duration)


profiling.ProfilingContext._log_metrics = _collect


def accuracy(completions, answer, **_) -> list:
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if (m := ANSWER.search(t)) and m.group(1) == str(a).strip() else 0.0 for t, a in zip(texts, answer)]


class StepTimer(TrainerCallback):
    def __init__(self):
        self.seconds = []  # per optimizer step

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


def load_prompts(train_file: Path, system: str) -> datasets.Dataset:
    rows = []
    for number, line in enumerate(train_file.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not {"src", "tgt"} <= row.keys():
                sys.exit(f"trl_step: {train_file}:{number}: needs 'src' and 'tgt' keys, has {sorted(row)}")
            rows.append({"prompt": [{"role": "system", "content": system}, {"role": "user", "content": row["src"]}], "answer": row["tgt"]})
    return datasets.Dataset.from_list(rows)


def completion_lengths(log_history: list, dec_len: int) -> list:
    """TRL's logged mean completion length per step; exits unless every completion had dec_len tokens."""
    logged = [h for h in log_history if "completions/min_length" in h]
    if not logged:
        sys.exit("trl_step: TRL logged no completions/min_length: cannot check that completions are fixed-length")
    wrong = [(h.get("step"), h["completions/min_length"], h["completions/max_length"]) for h in logged
             if h["completions/min_length"] != dec_len or h["completions/max_length"] != dec_len]
    if wrong:
        sys.exit(f"trl_step: completions were not all {dec_len} tokens: (step, min, max) = {wrong}")
    return [h["completions/mean_length"] for h in logged]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=6)
    parser.add_argument("--output_dir", default=None, help="default output/bench-step-trl-<precision>")
    parser.add_argument("--model", default=str(REPO / "data/tiny-qwen2"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--rollout_n", type=int, default=8)
    parser.add_argument("--dec_len", type=int, default=64)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--no_gradient_checkpointing", action="store_true", help="store activations (TRL's default recomputes them)")
    parser.add_argument("--system_prompt", type=Path, default=REPO / "data/arith/system_prompt.txt")
    parser.add_argument("--train_file", type=Path, default=REPO / "data/arith/train.jsonl")
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(42)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_input_names = ["input_ids", "attention_mask"]  # a config may list token_type_ids, which causal LMs do not take
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = load_prompts(args.train_file, args.system_prompt.read_text())
    sequences = args.prompts * args.rollout_n
    config = GRPOConfig(
        output_dir=args.output_dir or str(REPO / f"output/bench-step-trl-{args.precision}"),
        max_steps=args.max_steps,
        per_device_train_batch_size=sequences,  # completions: prompts x rollout_n, one micro-batch
        gradient_accumulation_steps=1,
        num_generations=args.rollout_n,
        max_completion_length=args.dec_len,
        generation_kwargs={"min_new_tokens": args.dec_len},  # blocks generation_config.eos_token_id = the tokenizer's eos
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        learning_rate=4e-5,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        gradient_checkpointing=not args.no_gradient_checkpointing,
        bf16=args.precision == "bf16",
        fp16=False,
        use_cpu=True,
        seed=42,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model, reward_funcs=accuracy, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.train()
    mean_lengths = completion_lengths(trainer.state.log_history, args.dec_len)

    name = type(trainer).__name__
    phases = [durations[step] for step in sorted(durations)]  # profiling steps are global_step before the update
    measured = list(zip(timer.seconds, phases))[1:]  # the first step warms up

    def median(values):
        values = list(values)
        return round(statistics.median(values), 4) if values else None

    print(json.dumps({
        "engine": f"trl-{args.precision}",
        "seconds_per_step": median(s for s, _ in measured),
        "rollout": median(p[f"{name}.transformers.generate"] for _, p in measured),
        "reward": median(p[f"{name}._calculate_rewards"] for _, p in measured),
        "logprobs": None,  # beta 0 and one update per generation: TRL computes no old or reference log-probs
        "update": median(s - p[f"{name}._prepare_inputs"] for s, p in measured),
        "prepare_inputs": median(p[f"{name}._prepare_inputs"] for _, p in measured),
        "steps_measured": len(measured),
        "completion_tokens_per_step": round(statistics.median(mean_lengths) * sequences),
        "precision": {"fp32": "bf16=False", "bf16": "bf16=True"}[args.precision],
        "gradient_checkpointing": config.gradient_checkpointing,
        "model": str(args.model),
        "threads": threads,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
    }), flush=True)


if __name__ == "__main__":
    main()
