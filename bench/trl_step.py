"""The TRL side of bench/bench_step.py: seconds per step of TRL's GRPOTrainer on CPU for the same workload
as the paddle runs. Run by bench_step.py (--trl-python) under an interpreter with torch, transformers and
trl, not the project's .venv. Measured with torch 2.13.0+cpu, transformers 4.57.6, trl 1.16.0 (accelerate
1.15.0, datasets 5.0.1) in /work/torch-venv:

    python3 -m venv /work/torch-venv
    /work/torch-venv/bin/pip install torch==2.13.0            # the CPU build
    /work/torch-venv/bin/pip install -c <(printf 'torch==2.13.0\\ntransformers==4.57.6\\n') transformers==4.57.6 trl==1.16.0

Standalone:

    /work/torch-venv/bin/python bench/trl_step.py [--max_steps 6] [--output_dir output/bench-step-trl]

Workload: a transformers Qwen2ForCausalLM with the shape of data/tiny-qwen2 (its config.json) and random
float32 weights (paddle's checkpoint is not loaded: the speed of a step does not depend on the values),
the tokenizer and chat template of data/tiny-qwen2, data/arith/train.jsonl prompts with
data/arith/system_prompt.txt as the system message; per step 4 prompts x num_generations 8 = one batch
of 32 completions, max_completion_length 64 with min_new_tokens 64 (eos blocked), temperature 1 over the
whole vocabulary, beta 0, one optimizer step per generation (so TRL computes no old or reference
log-probs), an exact-answer reward, float32, use_cpu, torch threads = usable cores.

Each step is timed from on_step_begin to on_step_end (generation, reward, loss, backward, optimizer step);
phases come from TRL's own profiling contexts: rollout = GRPOTrainer.transformers.generate, reward =
GRPOTrainer._calculate_rewards, update = step - GRPOTrainer._prepare_inputs (the loss forward, backward
and optimizer step). Prints one JSON object with the medians over the steps after the first.
"""

import argparse
import json
import os
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
import trl.extras.profiling as profiling  # noqa: E402
from transformers import AutoConfig, AutoTokenizer, Qwen2ForCausalLM, TrainerCallback  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=6)
    parser.add_argument("--output_dir", default=str(REPO / "output/bench-step-trl"))
    parser.add_argument("--model", default=str(REPO / "data/tiny-qwen2"))
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(42)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_input_names = ["input_ids", "attention_mask"]  # its config lists token_type_ids, which Qwen2 does not take
    model = Qwen2ForCausalLM(AutoConfig.from_pretrained(args.model)).to(torch.float32)
    system = (REPO / "data/arith/system_prompt.txt").read_text().strip()
    rows = [json.loads(line) for line in (REPO / "data/arith/train.jsonl").read_text().splitlines() if line.strip()]
    dataset = datasets.Dataset.from_list([
        {"prompt": [{"role": "system", "content": system}, {"role": "user", "content": r["src"]}], "answer": r["tgt"]} for r in rows
    ])
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=32,  # completions: 4 prompts x 8
        gradient_accumulation_steps=1,
        num_generations=8,
        max_completion_length=64,
        generation_kwargs={"min_new_tokens": 64},
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        learning_rate=4e-5,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        bf16=False,
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

    name = type(trainer).__name__
    phases = [durations[step] for step in sorted(durations)]  # profiling steps are global_step before the update
    measured = list(zip(timer.seconds, phases))[1:]  # the first step warms up

    def median(values):
        values = list(values)
        return round(statistics.median(values), 4) if values else None

    print(json.dumps({
        "engine": "trl",
        "seconds_per_step": median(s for s, _ in measured),
        "rollout": median(p[f"{name}.transformers.generate"] for _, p in measured),
        "reward": median(p[f"{name}._calculate_rewards"] for _, p in measured),
        "logprobs": None,  # beta 0 and one update per generation: TRL computes no old or reference log-probs
        "update": median(s - p[f"{name}._prepare_inputs"] for s, p in measured),
        "prepare_inputs": median(p[f"{name}._prepare_inputs"] for _, p in measured),
        "steps_measured": len(measured),
        "completion_tokens_per_step": int(32 * 64),
        "threads": threads,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
    }), flush=True)


if __name__ == "__main__":
    main()
