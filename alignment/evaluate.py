"""Evaluate models on a data set, each problem scored by the rewards training uses, and compare them on the same problems:

    python -m alignment.evaluate output/smollm2-arith/checkpoint-32 models/SmolLM2-135M-Instruct --data data/arith_one_step/test.jsonl
    python -m alignment.evaluate MODEL.gguf --data test.jsonl --n 8 --temperature 0.6 --limit 100

MODEL is a run's checkpoint folder (its grpo_config.json brings the run's system prompt, chat template, reward
functions, data keys, max_dec_len, sampling settings and tools), a Hugging Face-layout folder (the trainer's defaults,
or --config's run file), a LoRA checkpoint (its adapter merged into the run's base model) or a .gguf (imported once
into --gguf_cache). A model folder is data: its grpo_config.json never imports code, names a reward server or loosens
the tools' isolation or limits (one line names what was ignored); those come from --config's file. Flags override each
model's settings. Every problem is decoded greedily as the run's own evaluation decodes it (its batch size, its matmuls:
bf16 where cpu_bf16_matmul chose them), so a checkpoint scores as its run's evaluation scored it (accuracy: the accuracy
function's value > 0); --n K adds K samples per problem at the temperature for mean@K and pass@k. Each figure comes with a 95%
confidence interval; with two or more models, each is compared with the first on the same problems (the paired
difference of greedy accuracy, Newcombe's interval, and the exact McNemar test). Per-problem records go to
OUTPUT/records.jsonl, the summary to OUTPUT/summary.json and the console. Bad input exits 2 with one line naming it.

Instruction following (IFEval, IFBench: rows with `instruction_id_list` and `kwargs`, no reference answer):

    python -m alignment.evaluate MODEL --data ../shared/data/ifeval/input_data.jsonl

Each such record keeps the greedy completion's verdict on each of its row's instructions ("instructions": id, strict,
loose), and the summary adds IFEval's four figures (prompt-level and instruction-level accuracy, strict and loose), the
prompt-level comparisons with the first model and a table per instruction id (alignment/algo/instruction_stats.py).
Where the data has such rows and --reward_funcs is not given, every model is scored with ifeval_all_loose ifeval_all
ifeval_loose ifeval, whatever its run's rewards (those need a reference these rows lack): greedy accuracy is then
prompt-level loose accuracy and the reward the sum of the four. --skip_bad_rows leaves out, with the loader's printed
reasons, rows the verifiers cannot check (IFBench's words:start_verb needs an NLTK tagger no registry package carries).
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from alignment.basics.runtime import configure_cpu_runtime, import_paddle

configure_cpu_runtime()
import_paddle()

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from tqdm import tqdm  # noqa: E402

from alignment.algo.eval_stats import mean_interval, paired_difference, pass_at_k, pass_at_k_values, wilson_interval  # noqa: E402
from alignment.algo.instruction_stats import METHODS as INSTRUCTION_METHODS  # noqa: E402
from alignment.algo.instruction_stats import instruction_summary  # noqa: E402
from alignment.basics.errors import ConfigError, DataError, ExportError, ModelLoadError, RewardServerError  # noqa: E402
from alignment.run.model_source import load_model, model_folder, saved_settings  # noqa: E402
from alignment.models.modeling import load_tokenizer  # noqa: E402
from alignment.parallel.distributed import World  # noqa: E402
from alignment.rollout.multi_turn import check_template, tool_schemas  # noqa: E402
from alignment.rewards.instructions import check_row, followed  # noqa: E402
from alignment.rewards.registry import sample_checks  # noqa: E402
from alignment.run.build import load_prompts, model_compute, rollout_engine, rollout_settings, sampling_params  # noqa: E402
from alignment.config.schema import GRPOConfig  # noqa: E402
from alignment.config.validation import validate_generation  # noqa: E402
from alignment.basics.data_files import read_rows  # noqa: E402
from alignment.run.scorer import build_scorer  # noqa: E402
from alignment.step.evaluation import decoded, greedy_and_sampled  # noqa: E402
from alignment.step.rollout import Sampler  # noqa: E402

OVERRIDES = {  # flag -> type; each defaults to the model's run's value
    "system_prompt": str,
    "max_dec_len": int,
    "temperature": float,
    "top_p": float,
    "prompt_key": str,
    "response_key": str,
    "calculation_steps": str,
}
SIGNIFICANCE = 0.05
INSTRUCTIONS = "instruction_id_list"  # the column that makes a row an instruction-following problem
INSTRUCTION_REWARDS = ["ifeval_all_loose", "ifeval_all", "ifeval_loose", "ifeval"]  # their default; the first decides correctness
SAMPLED_BATCH = 32  # problems whose --n samples decode together unless --batch_size says (32 x n rows; an eval batch x n: GBs)
BY_INSTRUCTION_SHOWN = 10  # rows of the per-instruction table on the console; summary.json has all


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alignment.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="checkpoint folders, Hugging Face-layout folders, LoRA checkpoints or .gguf files")
    parser.add_argument("--data", required=True,
                        help="the problems: files or folders (comma-separated) in any format and layout the trainer reads, with a "
                        "reference answer where the rewards read one (IFEval/IFBench rows have none: their rewards read the row's "
                        "instructions)")
    parser.add_argument("--n", type=int, default=0,
                        help="samples per problem at the temperature, for mean@n and pass@k (default 0: greedy only)")
    parser.add_argument("--limit", type=int, help="evaluate the first N problems only (default: all)")
    parser.add_argument("--batch_size", type=int, help="problems decoded together (default: greedily, the run's "
                        "per_device_eval_batch_size, so a checkpoint's problems are decoded in the batches of its run's evaluation; "
                        f"with --n, {SAMPLED_BATCH} problems' samples at a time)")
    parser.add_argument("--seed", type=int, default=42, help="the samples' random seed, the same for every model (default 42)")
    parser.add_argument("--output", help="folder for records.jsonl and summary.json (default: eval/<data folder>/<data file name>)")
    parser.add_argument("--config", help="a run's grpo_argument.json whose settings apply to models without a grpo_config.json, and whose "
                        "plugins, reward server and tool limits apply to every model (a model folder may not set those)")
    parser.add_argument("--gguf_cache", default="eval/imported",
                        help="where a .gguf is imported, reused while unchanged (default eval/imported)")
    parser.add_argument("--reward_funcs", nargs="+", help="reward functions of the registry, weight 1 each; the first also decides "
                        "correctness (default: the run's reward_functions and accuracy_function; where the data has rows with "
                        f"{INSTRUCTIONS}: {' '.join(INSTRUCTION_REWARDS)}, so greedy accuracy is IFEval's prompt-level loose accuracy)")
    parser.add_argument("--skip_bad_rows", action="store_true",
                        help="leave out rows that cannot be read or scored, printing each one's file:line and why, instead of stopping "
                        "at the first (e.g. IFBench's 6 words:start_verb rows, whose NLTK tagger cannot be installed offline)")
    parser.add_argument("--use_fusemt", type=json.loads, choices=[True, False], default=True,
                        help="true (default): the fused engine where its operators are built; false: the eager engine")
    for name, kind in OVERRIDES.items():
        parser.add_argument(f"--{name}", type=kind, help=f"default: the run's {name}")
    args = parser.parse_args(argv)
    for name, least in (("n", 0), ("limit", 1), ("batch_size", 1)):
        if getattr(args, name) is not None and getattr(args, name) < least:
            parser.error(f"--{name} must be at least {least}")
    return args


def flags_given(args: argparse.Namespace) -> dict:
    """The config keys the flags set, each model's own settings aside."""
    flags = {name: getattr(args, name) for name in OVERRIDES if getattr(args, name) is not None}
    if args.reward_funcs:
        flags |= {"reward_functions": args.reward_funcs, "reward_function_weights": None, "accuracy_function": args.reward_funcs[0]}
    if args.skip_bad_rows:
        flags["skip_bad_rows"] = True
    return flags | {"use_fusemt": args.use_fusemt, "prompt_truncation": "left"}  # every model sees every problem


def has_instructions(data: str) -> bool:
    """Whether a row of the data's files carries instructions (lines that are no JSON object are left to the loader)."""
    paths = [path.strip() for path in data.split(",") if path.strip()]
    return any(INSTRUCTIONS in row for path in paths for _, row in read_rows(path, lambda error: None))


def model_config(folder: Path, args: argparse.Namespace) -> tuple:
    """-> (the model's settings with the flags applied, validated for generating and scoring; where they came from)."""
    settings, source = saved_settings(folder, args.config)
    try:
        config = GRPOConfig(**settings)
    except TypeError as e:  # a saved value of the wrong shape
        raise ConfigError(f"{source}: {e}") from None
    return validate_generation(dataclasses.replace(config, **flags_given(args))), source


@dataclasses.dataclass
class Prepared:
    """One model, its settings and its problems, ready before any model loads."""

    label: str  # the path as given
    folder: Path
    config: GRPOConfig
    source: str  # where its settings came from
    tokenizer: object
    prompts: list  # EncodedPrompts, the first --limit
    truncated: int  # prompts cut from the left to max_prompt_len


def prepare(label: str, args: argparse.Namespace) -> Prepared:
    folder = model_folder(label, Path(args.gguf_cache))
    config, source = model_config(folder, args)
    tokenizer = load_tokenizer(str(folder), config.chat_template)
    if config.resolved_environment:
        check_template(tokenizer, tool_schemas(config.tools))
    prompts, truncated, _ = load_prompts(args.data, tokenizer, config, instruction_checks(config))
    return Prepared(label, folder, config, source, tokenizer, prompts[: args.limit], truncated)


def instruction_checks(config: GRPOConfig) -> dict:
    """The verdicts' check of the rows with instructions, for the loader, unless one of the model's rewards has it run
    already (--reward_funcs may name none that reads them)."""
    if check_row in sample_checks([*config.reward_functions, config.accuracy_function]).values():
        return {}
    return {"the instruction verdicts": lambda sample: INSTRUCTIONS in sample and check_row(sample)}


def problem_records(model: Prepared, start: int, greedy) -> list:
    """One record per problem of a batch: the greedy completion and its score."""
    records = []
    for i, prompt in enumerate(greedy.prompts):
        reward = greedy.rewards[i]
        record = {
            "model": model.label, "problem": start + i, "source": prompt.record.source, "prompt": prompt.record.question,
            "reference": prompt.record.answer, "completion": greedy.completions[i], "correct": bool(greedy.correct[i]),
            "reward": None if np.isnan(reward) else float(reward),
            "rewards": {name: None if np.isnan(v[i]) else float(v[i]) for name, v in greedy.reward_columns.items()},
            "length": int(greedy.rollout.lengths[i]), "finish_reason": greedy.rollout.finish_reasons[i],
        }
        episodes = greedy.rollout.episodes
        if episodes is not None:  # turns: what the rewards scored, the model's turns without the tools' answers
            record |= {"turns": list(episodes[i].turns), "tool_calls": len(episodes[i].calls)}
        if INSTRUCTIONS in prompt.record.columns:  # judged on the text the rewards score
            text = greedy.completions[i] if episodes is None else "\n".join(episodes[i].turns)
            record["instructions"] = [{"id": verdict.instruction_id, "strict": verdict.strict, "loose": verdict.loose}
                                      for verdict in followed(text, prompt.record.reward_sample())]
        records.append(record)
    return records


def add_samples(records: list, sampled, k: int) -> None:
    """The samples' counts into the records of their problems (sampled: k rows per problem, in the records' order)."""
    for i, record in enumerate(records):
        rows = slice(i * k, (i + 1) * k)
        rewards = sampled.rewards[rows]
        record["samples_correct"] = int(sampled.correct[rows].sum())
        record["samples_reward_mean"] = float(np.nanmean(rewards)) if np.isfinite(rewards).any() else None
        if sampled.rollout.episodes is not None:
            record["samples_tool_calls"] = sum(len(episode.calls) for episode in sampled.rollout.episodes[rows])


def decoder(model: Prepared) -> tuple:
    """The engine as the model's run built it for its evaluation -> (engine, its matmuls' precision): bf16 matmuls where
    cpu_bf16_matmul chose them there (auto: on a CPU with AMX or AVX512-BF16; on: here only where this CPU can), and the
    actor's forward through the training operators with use_fused_train_ops (what the eager engine runs). Decoded in
    float32 instead, a checkpoint of a bf16 run scored one problem of 200 otherwise than its run's evaluation."""
    config = model.config
    actor = load_model(model.folder)
    setting = "auto" if config.cpu_bf16_matmul == "on" else config.cpu_bf16_matmul  # on, where this CPU cannot: float32, no error
    # as the run: the training operators, or paddle's own kernels where they cannot run (the run warned of that)
    compute, _ = model_compute(dataclasses.replace(config, cpu_bf16_matmul=setting), actor)
    return rollout_engine(config, actor, model.tokenizer, compute.bf16), compute.reason


def run_model(model: Prepared, args: argparse.Namespace) -> tuple:
    """Greedy decoding of every problem, and --n samples of each -> (records, seconds, the engine's name, its precision)."""
    started = time.perf_counter()
    config = model.config
    engine, precision = decoder(model)
    sampler = Sampler(engine, build_scorer(config), model.tokenizer, rollout_settings(config), World(0, 1), sampling_params(config))
    paddle.seed(args.seed)  # the eager engine's draws; the fused engine keys each row's on (seed, its row)
    sampling = dataclasses.replace(sampler.sampling, seed=args.seed)
    greedy_size = args.batch_size or config.per_device_eval_batch_size  # the batches of the run's evaluation: its greedy answers
    sampled_size = args.batch_size or SAMPLED_BATCH
    prompts, records = model.prompts, []
    with tqdm(total=len(prompts) * (2 if args.n else 1), desc=model.label[-40:], unit="problem", dynamic_ncols=True) as bar:
        for start in range(0, len(prompts), greedy_size):
            greedy, _ = greedy_and_sampled(sampler, prompts[start : start + greedy_size], 0, sampling)
            records += problem_records(model, start, greedy)
            bar.update(len(greedy.prompts))
        for start in range(0, len(prompts) if args.n else 0, sampled_size):
            chunk = prompts[start : start + sampled_size]
            sampled = decoded(sampler, chunk, args.n, dataclasses.replace(sampling, first_row=start * args.n))
            add_samples(records[start : start + len(chunk)], sampled, args.n)
            bar.update(len(chunk))
    inner = getattr(engine, "engine", engine)  # a multi-turn engine wraps the one that generates
    return records, time.perf_counter() - started, type(inner).__name__, precision


def interval(value: float, low: float, high: float, **more) -> dict:
    return {"value": value, "low": low, "high": high, **more}


def model_summary(model: Prepared, records: list, seconds: float, engine: str, compute: str, k: int) -> dict:
    correct = np.array([r["correct"] for r in records])
    rewards = np.array([np.nan if r["reward"] is None else r["reward"] for r in records])
    config = model.config
    summary = {
        "model": model.label,
        "settings": {
            "from": model.source, "system_prompt": config.system_prompt, "reward_functions": config.reward_functions,
            "reward_function_weights": config.reward_function_weights, "accuracy_function": config.accuracy_function,
            "max_dec_len": config.max_dec_len, "temperature": config.temperature, "top_p": config.top_p, "tools": config.tools,
            "environment": config.resolved_environment, "engine": engine, "compute": compute,
        },
        "problems": len(records),
        "greedy_accuracy": interval(correct.mean(), *wilson_interval(int(correct.sum()), len(correct)), correct=int(correct.sum())),
        "reward_mean": float(np.nanmean(rewards)) if np.isfinite(rewards).any() else None,
        "length_mean": float(np.mean([r["length"] for r in records])),
        "truncated_fraction": float(np.mean([r["finish_reason"] == "length" for r in records])),
        "prompts_cut": model.truncated,
        "seconds": round(seconds, 1),
    }
    if k:
        counts = [r["samples_correct"] for r in records]
        summary[f"mean@{k}"] = interval(*mean_interval(np.array(counts) / k))
        for j in pass_at_k_values(k):
            summary[f"pass@{j}"] = interval(*mean_interval(np.array([pass_at_k(k, c, j) for c in counts])))
    return summary


def comparison(first: list, second: list) -> dict:
    """second's records against first's, problem by problem."""
    paired = paired_difference(np.array([r["correct"] for r in first]), np.array([r["correct"] for r in second]))
    return {"baseline": first[0]["model"], "model": second[0]["model"], **paired, "significant": paired["mcnemar_p"] < SIGNIFICANCE}


def percent(figure: dict) -> str:
    return f"{100 * figure['value']:5.1f}% [{100 * figure['low']:4.1f}, {100 * figure['high']:5.1f}]"


def settings_notes(models: list, flags: set) -> list:
    """A line per model saying where its settings came from, and the settings that score it differently from the first."""
    lines = []
    first = models[0]["settings"]
    for i, model in enumerate(models, 1):
        settings = model["settings"]
        lines.append(f"[{i}] {model['model']}: settings from {settings['from']}" + (f"; flags: {', '.join(sorted(flags))}" if flags else "")
                     + f"; {settings['engine']}, {settings['compute']}")
        differ = [key for key in ("system_prompt", "reward_functions", "reward_function_weights", "accuracy_function", "max_dec_len",
                                  "temperature", "top_p", "tools")
                  if settings[key] != first[key]]
        if differ:
            lines.append(f"    note: scored with other {', '.join(differ)} than [1] "
                         "(each model keeps its run's settings unless a flag sets them)")
    return lines


def report(summary: dict) -> str:
    """The console's account of summary.json: the settings, a table of the models, and each comparison with the first."""
    k, models = summary["n"], summary["models"]
    lines = [f"{summary['problems']} problems of {summary['data']}, greedy decoding"
             + (f" and {k} samples each at each model's temperature" if k else "") + "; 95% confidence intervals"]
    if summary["instruction_rewards_default"]:
        lines.append(f"rewards: {' '.join(INSTRUCTION_REWARDS)}, the rows carrying instructions and --reward_funcs not given "
                     "(greedy accuracy: every instruction followed, loose)")
    lines += settings_notes(models, set(summary["flags"]))
    width = max(len(m["model"]) for m in models) + 5
    columns = ["greedy accuracy"] + ([f"mean@{k}", f"pass@{k}"] if k else [])
    lines.append("".join(["model".ljust(width), *(c.ljust(24) for c in columns), "reward  length  seconds"]))
    for i, model in enumerate(models, 1):
        figures = [model["greedy_accuracy"]] + ([model[f"mean@{k}"], model[f"pass@{k}"]] if k else [])
        reward = "-" if model["reward_mean"] is None else f"{model['reward_mean']:.3f}"
        lines.append("".join([f"[{i}] {model['model']}".ljust(width), *(percent(f).ljust(24) for f in figures),
                              f"{reward:>6}  {model['length_mean']:6.1f}  {model['seconds']:7.1f}"]))
    for j, pair in enumerate(summary["comparisons"], 2):
        verdict = ("beyond noise at the 5% level" if pair["significant"] else
                   "within noise at the 5% level: these problems do not tell the two models apart")
        lines.append(
            f"[{j}] against [1] on the same {summary['problems']} problems: greedy accuracy {100 * pair['difference']:+.1f} points, "
            f"95% interval [{100 * pair['low']:+.1f}, {100 * pair['high']:+.1f}] (Newcombe, paired);\n    right only with [1]: "
            f"{pair['only_first']}, only with [{j}]: {pair['only_second']}; exact McNemar p = {pair['mcnemar_p']:.3g}. "
            f"The difference is {verdict}."
        )
    if "instruction_following" in summary:
        lines += instruction_report(summary["instruction_following"])
    return "\n".join(lines)


def instruction_report(section: dict) -> list:
    """The console's lines of IFEval's figures: a table of the models, each comparison with the first on prompt-level
    accuracy, and the instruction ids that moved most (with one model: the hardest)."""
    models, names = section["models"], ["prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose"]
    lines = [f"instruction following: {section['problems']} prompts, {section['instructions']} instructions (prompt level: all of a "
             "prompt's followed; loose: also with the first or last line, or '*', left out)"]
    width = max(len(m["model"]) for m in models) + 5
    lines.append("".join(["model".ljust(width), *(name.replace("_", " ").ljust(24) for name in names)]).rstrip())
    for i, model in enumerate(models, 1):
        lines.append("".join([f"[{i}] {model['model']}".ljust(width), *(percent(model[name]).ljust(24) for name in names)]).rstrip())
    for j, pair in enumerate(section["comparisons"], 2):
        for name in ("prompt_loose", "prompt_strict"):
            figure = pair[name]
            lines.append(
                f"[{j}] against [1], {name.replace('_', ' ')}: {100 * figure['difference']:+.1f} points, 95% interval "
                f"[{100 * figure['low']:+.1f}, {100 * figure['high']:+.1f}] (Newcombe, paired); only with [1]: {figure['only_first']}, "
                f"only with [{j}]: {figure['only_second']}; exact McNemar p = {figure['mcnemar_p']:.3g} "
                f"({'beyond' if figure['significant'] else 'within'} noise at the 5% level)"
            )
    rows = section["by_instruction"]
    shown = rows[:BY_INSTRUCTION_SHOWN]
    id_width = max(len(row["id"]) for row in shown) + 2
    lines.append(f"instruction ids, the {len(shown)} " + ("that moved most" if len(models) > 1 else "hardest") + f" of {len(rows)} "
                 "(summary.json has all): loose rate per model" + (", change against [1] in points" if len(models) > 1 else ""))
    lines.append("  " + "id".ljust(id_width) + "count" + "".join(f"[{i}]".rjust(8) for i in range(1, len(models) + 1))
                 + "".join(f"[{j}]-[1]".rjust(8) for j in range(2, len(models) + 1)))
    for row in shown:
        rates = "".join(f"{100 * rate['loose']:7.1f}%" for rate in row["rates"])
        changes = "".join(f"{100 * change['loose']:+8.1f}" for change in row["change"])
        lines.append(f"  {row['id'].ljust(id_width)}{row['count']:5d}{rates}{changes}")
    return lines


def default_output(data: str) -> Path:
    path = Path(data.split(",")[0])
    return Path("eval", path.parent.name, path.stem) if path.parent.name else Path("eval", path.stem)


def write_results(output: Path, records: list, summary: dict) -> None:
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "records.jsonl", "w") as f:
        f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for model in records for record in model)
    (output / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")


def evaluate_models(args: argparse.Namespace) -> tuple:
    """Every model over the problems -> (each model's records, the summary)."""
    flags = sorted(set(flags_given(args)) - {"use_fusemt", "prompt_truncation", "reward_function_weights", "accuracy_function"})
    defaulted = not args.reward_funcs and has_instructions(args.data)
    if defaulted:  # the runs' own rewards may need a reference these rows lack, and would score the models differently
        args.reward_funcs = INSTRUCTION_REWARDS
    prepared = [prepare(label, args) for label in args.models]  # every model's settings and problems before any loads
    records, summaries = [], []
    for model in prepared:
        model_records, seconds, engine, compute = run_model(model, args)
        records.append(model_records)
        summaries.append(model_summary(model, model_records, seconds, engine, compute, args.n))
    summary = {
        "data": args.data, "problems": len(records[0]), "n": args.n, "seed": args.seed, "flags": flags,
        "instruction_rewards_default": defaulted, "models": summaries,
        "comparisons": [comparison(records[0], other) for other in records[1:]],
        "methods": {
            "greedy_accuracy": "Wilson score interval", "mean@n, pass@k": "Student t interval over problems",
            "pass@k": "unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021)",
            "difference": "Newcombe's paired interval (method 10) of the second model's greedy accuracy minus the first's",
            "mcnemar_p": "exact two-sided McNemar test: binomial(b + c, 1/2) on the discordant problems",
        },
    }
    instructions = instruction_summary(records)
    if instructions is not None:
        summary["instruction_following"] = instructions
        summary["methods"] |= INSTRUCTION_METHODS
    return records, summary


def main(argv: list | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    output = Path(args.output) if args.output else default_output(args.data)
    try:
        records, summary = evaluate_models(args)
        write_results(output, records, summary)
    except (ConfigError, DataError, ModelLoadError, ExportError, RewardServerError, OSError) as e:
        print(f"evaluate: error: {e}", file=sys.stderr)
        return 2
    print(report(summary))
    print(f"per-problem records: {output / 'records.jsonl'}; summary: {output / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
