"""Four runs whose results a change that keeps behaviour must leave bitwise the same (issue 33's proof):
the bundled run (cpu_bf16_matmul off), a LoRA run, the tools run, and a one-step-off run (rollout_workers 1,
async_generate) killed after step 3 and resumed from its step-2 checkpoint.

    .venv/bin/python tests/helpers/behaviour_runs.py record RESULT.json [--work DIR] [--only NAME ...]
    .venv/bin/python tests/helpers/behaviour_runs.py compare BEFORE.json AFTER.json

`record` runs them from the current directory (the checkout under test) and writes, per run, every
metrics.jsonl row without its timings, and the sha256 of each file of the last checkpoint (weights, adapters,
optimizer state, pending rollout; not trainer_state.json, which holds the time and a random run id; grpo_config.json
without the folders) and of completions.jsonl. `compare` prints what differs and exits 1 if
anything does. About 12 minutes on 2 cores. Not part of the suite: it compares two checkouts.
"""
import argparse
import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

LAUNCH = [sys.executable, "-W", "ignore:No ccache found", "-m", "paddle.distributed.launch"]
TIMINGS = ("time/", "tokens_per_second", "memory/")  # and the peak memory, which varies as timings do
RUNS = {
    "bundled": (1, ["config/tiny/grpo_argument.json", "--cpu_bf16_matmul", "off"]),
    "lora": (1, ["config/tiny/grpo_argument.json", "--cpu_bf16_matmul", "off", "--lora", "true", "--lora_rank", "8",
                 "--lora_alpha", "32", "--learning_rate", "2e-3", "--max_steps", "12", "--save_steps", "6"]),
    "tools": (1, ["config/tiny_tools/grpo_argument.json", "--cpu_bf16_matmul", "off"]),
    "one_step_off": (2, ["config/tiny/grpo_argument.json", "--cpu_bf16_matmul", "off", "--rollout_workers", "1",
                         "--async_generate", "true", "--max_steps", "6", "--save_steps", "2", "--eval_steps", "3",
                         "--per_device_eval_batch_size", "32", "--kl_loss_coeff", "0.05"]),
}


def launch(out: Path, processes: int, args: list, *extra: str) -> subprocess.Popen:
    command = [*LAUNCH, "--nproc_per_node", str(processes), "--log_dir", str(out / "launch_log"), "run_grpo.py", *args,
               "--output_dir", str(out), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(process: subprocess.Popen, name: str) -> None:
    output, _ = process.communicate()
    if process.returncode != 0:
        sys.exit(f"{name}: the run failed ({process.returncode}):\n{output[-4000:]}")


def kill_after_step(process: subprocess.Popen, out: Path, step: int) -> None:
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and any(json.loads(line)["step"] >= step for line in metrics.read_text().splitlines()
                                         if line.strip())):
        if process.poll() is not None:
            sys.exit(f"the run ended before step {step}")
        time.sleep(0.05)
    subprocess.run(["pkill", "-KILL", "-f", f"run_grpo.py.*{out}"], check=False)
    process.send_signal(signal.SIGKILL)
    process.wait()


def comparable(path: Path) -> bytes:
    """A file's bytes; the run's config without the folders it was written to, which differ between the two runs."""
    if path.name != "grpo_config.json":
        return path.read_bytes()
    config = json.loads(path.read_text())
    return json.dumps({k: v for k, v in config.items() if k not in ("output_dir", "logging_dir")}, sort_keys=True).encode()


def summary(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [{k: v for k, v in row.items() if not (k.startswith(TIMINGS) or "seconds" in k)} for row in rows]
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    files = {p.relative_to(out).as_posix(): hashlib.sha256(comparable(p)).hexdigest()
             for p in sorted(last.rglob("*")) if p.is_file() and p.name != "trainer_state.json"}
    files["completions.jsonl"] = hashlib.sha256((out / "completions.jsonl").read_bytes()).hexdigest()
    return {"metrics": rows, "files": files}


def record(result: Path, work: Path, only: list) -> None:
    summaries = json.loads(result.read_text()) if result.is_file() else {}
    for name, (processes, args) in RUNS.items():
        if only and name not in only:
            continue
        out = work / name
        subprocess.run(["rm", "-rf", str(out)], check=True)
        started = time.monotonic()
        if name == "one_step_off":
            kill_after_step(launch(out, processes, args), out, 3)
            finish(launch(out, processes, args, "--resume_from_checkpoint", "auto"), name)
        else:
            finish(launch(out, processes, args), name)
        summaries[name] = summary(out)
        print(f"{name}: {time.monotonic() - started:.0f} s, {len(summaries[name]['metrics'])} rows", flush=True)
        result.write_text(json.dumps(summaries, indent=1, sort_keys=True))


def compare(before: dict, after: dict) -> int:
    differences = 0
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            print(f"{name}: only in {'the first' if name in before else 'the second'}")
            differences += 1
            continue
        for field in ("metrics", "files"):
            if before[name][field] != after[name][field]:
                print(f"{name}: {field} differ")
                differences += 1
        print(f"{name}: {len(after[name]['metrics'])} metric rows and {len(after[name]['files'])} files compared")
    print("bitwise the same" if differences == 0 else f"{differences} differences")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    recording = commands.add_parser("record")
    recording.add_argument("result", type=Path)
    recording.add_argument("--work", type=Path, default=Path("output/behaviour"))
    recording.add_argument("--only", nargs="*", default=[])
    comparing = commands.add_parser("compare")
    comparing.add_argument("before", type=Path)
    comparing.add_argument("after", type=Path)
    arguments = parser.parse_args()
    if arguments.command == "record":
        record(arguments.result.resolve(), arguments.work.resolve(), arguments.only)
        return 0
    return compare(json.loads(arguments.before.read_text()), json.loads(arguments.after.read_text()))


if __name__ == "__main__":
    sys.exit(main())
