"""What keeping the keys and values across turns saves: the fused engine continues each row of a multi-turn rollout
from its cache, prefilling only the tokens after them (the eos and the tool's answer); the eager engine, and the fused
engine seen only through generate(), prefill each row's whole context again every turn. This runs one training-sized
multi-turn rollout both ways on the same fused engine, same seed, one after the other, twice each (the second of each
pair is timed), and prints one JSON object with the seconds per turn and the ratio.

    .venv/bin/python bench/bench_multi_turn.py CONFIG.json [--key value ...]

CONFIG.json and the keys are run_grpo.py's (tools or environment must be set, use_fusemt is forced on);
per_device_prompt_batch_size prompts x rollout_n rows are sampled at the config's temperature, seed 0.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

from alignment.models.modeling import load_causal_lm, load_tokenizer, stop_token_ids  # noqa: E402
from alignment.rollout import (  # noqa: E402
    SamplingParams,
    build_engine,
    generate,  # noqa: E402
)
from alignment.rollout.multi_turn import with_environment  # noqa: E402
from alignment.run.build import engine_settings, load_prompts, turn_settings  # noqa: E402
from alignment.config.cli import load_config  # noqa: E402


class Reprefill:
    """The fused engine seen through generate() only, as the eager engine is: every turn prefills the whole context."""

    def __init__(self, engine):
        self.engine, self.pad_token_id = engine, engine.pad_token_id

    def generate_turn(self, contexts, known, params):
        return self.engine.generate(contexts, 1, params), [None] * len(contexts)


def timed_rollout(engine, config, tokenizer, prompts) -> dict:
    multi_turn = with_environment(engine, tokenizer, turn_settings(config))
    sampling = SamplingParams(max_new_tokens=config.max_dec_len, temperature=config.temperature, seed=0)
    for _ in range(2):  # the first warms the allocator and the rotary tables
        started = time.perf_counter()
        rollout = generate(multi_turn, prompts, config.rollout_n, sampling)
        seconds = time.perf_counter() - started
    turns = [len(episode.turns) for episode in rollout.episodes]
    return {
        "seconds": round(seconds, 3), "turns_per_episode": round(sum(turns) / len(turns), 3),
        "tokens": int(rollout.completion_mask.sum()), "environment_tokens": int(rollout.environment_mask.sum()),
        "tool_seconds": round(sum(call.seconds for e in rollout.episodes for call in e.calls), 3),
    }


def main() -> None:
    config = load_config([*sys.argv[1:], "--use_fusemt", "true"])
    if config.resolved_environment is None:
        sys.exit("bench_multi_turn: the config names no tools and no environment")
    tokenizer = load_tokenizer(config.tokenizer_name_or_path or config.actor_model_name_or_path, config.chat_template)
    model = load_causal_lm(config.actor_model_name_or_path)
    model.eval()
    engine = build_engine(engine_settings(config), model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
    if type(engine).__name__ != "FusedEngine":
        sys.exit(f"bench_multi_turn: the fused engine cannot run here ({type(engine).__name__} was built)")
    prompts = load_prompts(config.train_datasets, tokenizer, config)[0][: config.per_device_prompt_batch_size]
    kept = timed_rollout(engine, config, tokenizer, prompts)
    again = timed_rollout(Reprefill(engine), config, tokenizer, prompts)
    print(json.dumps({
        "command": " ".join(sys.argv), "rows": len(prompts) * config.rollout_n,
        "cache_kept": kept, "prefill_again": again, "speedup": round(again["seconds"] / kept["seconds"], 3),
    }))


if __name__ == "__main__":
    main()
