"""The update on completions of the lengths a real run generates, in two or more source trees or with two or more sets of
config keys side by side: what cutting each micro-batch to its own longest completion, rows longest first
(alignment/step/micro_batches.py), saves; or what a key does to the update's time (use_rollout_logprobs).

    .venv/bin/python bench/bench_micro_batches.py --trees /tmp/before,. [--config config/smollm2/grpo_ifeval.json]
        [--repeats 2] [--completion 256]
    .venv/bin/python bench/bench_micro_batches.py --trees . --keys "--mini_batch_size 16" \
        "--mini_batch_size 16 --use_rollout_logprobs true"

One rollout of the config's model on its first per_device_prompt_batch_size training prompts (rollout_n completions
each, up to --completion new tokens, the config's temperature, ending at eos as in training), with the fused engine,
float32, is generated once and saved; then each tree (a checkout, for example `git worktree add /tmp/before <commit>`)
runs the config's policy update, with each --keys set's keys given after the config file (update_policy: its
micro-batches of per_device_train_batch_size rows, the training operators, AdamW) on that same batch, in a process of its
own that times one update after a warm-up one; --repeats such processes per variant (a tree with a set of keys), the
variants taking turns.
Prints the rollout's lengths, then one JSON object per variant (the median seconds of an update and the tokens its
micro-batches padded to, as that tree cuts them), then the ratios to the first variant."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def generate(config_file: str, completion: int, saved: Path) -> dict:
    from alignment.basics.runtime import configure_cpu_runtime, import_paddle

    configure_cpu_runtime()
    paddle = import_paddle()
    import numpy as np

    from alignment.config.cli import load_config
    from alignment.models.fused_train import use_training_ops
    from alignment.rollout import EngineSettings, build_engine
    from alignment.rollout.base import SamplingParams
    from alignment.run.model_source import load_model
    from alignment.models.modeling import load_tokenizer

    config = load_config([config_file])
    model = load_model(Path(config.actor_model_name_or_path))
    use_training_ops(model, bf16=False)
    tokenizer = load_tokenizer(config.actor_model_name_or_path)
    with open(config.train_datasets) as rows:
        requests = [json.loads(next(rows))["prompt"] for _ in range(config.per_device_prompt_batch_size)]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r}], add_generation_prompt=True, tokenize=True) for r in requests]
    eos = model.config.eos_token_id
    engine = build_engine(EngineSettings(fused=True), model, eos if isinstance(eos, list) else [eos], tokenizer.pad_token_id, False)
    paddle.seed(config.seed)
    rollout = engine.generate(prompts, config.rollout_n, SamplingParams(max_new_tokens=completion, temperature=config.temperature))
    rng = np.random.default_rng(0)
    np.savez(
        saved, completion_ids=rollout.completion_ids, completion_mask=rollout.completion_mask, logprobs=rollout.logprobs,
        advantages=rng.standard_normal(len(rollout.completion_ids)).astype(np.float32),
        prompt_ids=np.array(json.dumps([list(p) for p in rollout.prompt_ids])), finish_reasons=np.array(rollout.finish_reasons),
    )
    lengths = rollout.completion_mask.sum(axis=1)
    return {"rows": len(lengths), "completion_tokens_mean": float(lengths.mean()), "completion_tokens_max": int(lengths.max()),
            "cut_at_the_limit": int((lengths >= completion).sum())}


def time_updates(config_file: str, keys: list, saved: Path) -> dict:
    """In the tree first on sys.path: the seconds of one update after a warm-up one, and its micro-batches' padded tokens."""
    from alignment.basics.runtime import configure_cpu_runtime, import_paddle

    configure_cpu_runtime()
    import_paddle()
    import numpy as np

    import alignment.step.update as update
    from alignment.config.cli import load_config
    from alignment.models.fused_train import use_training_ops
    from alignment.parallel.distributed import World
    from alignment.rollout.base import Rollout
    from alignment.run.build import update_settings
    from alignment.run.model_source import load_model
    from alignment.step.records import ScoredBatch

    config = load_config([config_file, *keys])
    model = load_model(Path(config.actor_model_name_or_path))
    use_training_ops(model, bf16=False)
    model.train()
    data = np.load(saved)
    rows = len(data["advantages"])
    rollout = Rollout(json.loads(str(data["prompt_ids"])), data["completion_ids"], data["completion_mask"], data["logprobs"],
                      list(data["finish_reasons"]), config.rollout_n)
    scored = ScoredBatch([], rollout, [""] * rows, np.zeros(rows), {}, [None] * rows, np.zeros(rows, bool), data["advantages"])
    padded = []
    real_token_batch = update.make_token_batch
    update.make_token_batch = lambda *args: padded.append(args[1].size + len(args[0]) * max(map(len, args[0]))) or real_token_batch(*args)
    learner = update.Learner(model, None, import_paddle().optimizer.AdamW(1e-7, parameters=model.parameters()))
    seconds = []
    for _ in range(2):
        padded.clear()
        began = time.perf_counter()
        update.update_policy(learner, scored, update_settings(config), World(0, 1), 0, step=1)
        seconds.append(time.perf_counter() - began)
    return {"seconds": seconds[1:], "padded_tokens": sum(padded), "micro_batches": len(padded)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", required=True, help="comma-separated source trees; the first is the baseline")
    parser.add_argument("--config", default="config/smollm2/grpo_ifeval.json")
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--keys", nargs="+", default=[""], help="sets of config keys, each a variant in every tree (default: none)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--time-in", help=argparse.SUPPRESS)  # internal: the saved batch to time in this process's tree
    args = parser.parse_args()
    if args.time_in:
        print(json.dumps(time_updates(args.config, args.keys[0].split(), Path(args.time_in))))
        return
    trees = [str(Path(tree).resolve()) for tree in args.trees.split(",")]
    variants = [(tree, keys) for tree in trees for keys in args.keys]
    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "batch.npz"
        sys.path.insert(0, trees[-1])
        print(json.dumps({"rollout": generate(args.config, args.completion, saved), "config": args.config}), flush=True)
        runs = {variant: [] for variant in variants}
        for _ in range(args.repeats):  # the variants take turns, so that the machine's drift falls on each alike
            for tree, keys in variants:
                out = subprocess.run(
                    [sys.executable, str(HERE), "--trees", tree, "--config", args.config, "--keys", keys, "--time-in", str(saved)],
                    cwd=Path.cwd(), env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True,
                )
                if out.returncode:
                    sys.exit(f"bench_micro_batches: {tree} {keys} failed:\n{out.stderr[-3000:]}")
                runs[tree, keys].append(json.loads(out.stdout.strip().splitlines()[-1]))
    results = []
    for tree, keys in variants:
        run = runs[tree, keys]
        seconds = [s for timed in run for s in timed["seconds"]]
        results.append({"tree": tree, "keys": keys, "update_seconds": round(statistics.median(seconds), 2),
                        "runs": [round(s, 2) for s in seconds], "padded_tokens": run[0]["padded_tokens"],
                        "micro_batches": run[0]["micro_batches"]})
        print(json.dumps(results[-1]), flush=True)
    base = results[0]
    ratios = {f"{r['tree']} {r['keys']}".strip(): {key: round(r[key] / base[key], 3) for key in ("update_seconds", "padded_tokens")}
              for r in results}
    print(json.dumps({"ratio_to_first": ratios}))


if __name__ == "__main__":
    main()
