"""Train a causal LM with GRPO from one JSON file:

    python -m alignment.launch --nproc_per_node 1 run_grpo.py config/tiny/grpo_argument.json [--key value ...]
    python run_grpo.py --help        # the groups of keys; --help GROUP, KEY or part of one (or all): type, default, aliases, meaning
"""

import os
import shlex
import shutil
import sys
from pathlib import Path

from alignment.basics.runtime import configure_cpu_runtime, import_paddle, import_paddle_lazily, restart_with_huge_pages

if __name__ == "__main__":
    restart_with_huge_pages()  # glibc reads its tunables only at a process's start
configure_cpu_runtime()  # thread count, MKL path and paddle flags must be set before paddle loads
if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
    import_paddle_lazily()  # the option list needs no paddle: 0.4 s instead of 8
else:
    import_paddle()

from alignment.basics.errors import RUN_ERRORS  # noqa: E402
from alignment.config.schema import GRPOConfig  # noqa: E402
from alignment.config.help import help_text, help_topic, wants_help  # noqa: E402
from alignment.config.cli import load_config  # noqa: E402


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if wants_help(argv):
            return print_help(help_text(group=help_topic(argv)))
        from alignment.rollout.link import placement
        from alignment.run.setup import set_up_run
        from alignment.step.trainer import train

        config = load_config(argv)
        place = placement(config.rollout_workers)
        if place.is_rollout_worker:  # generates only, for the training process (rank 0)
            from alignment.rollout_worker import serve_rollouts

            return serve_rollouts(config, place) or 0
        checkpoint = train(set_up_run(config))
    except RUN_ERRORS as e:
        print(f"run_grpo: error: {e}", file=sys.stderr)
        return 2
    if checkpoint is not None and os.environ.get("PADDLE_TRAINER_ID", "0") == "0":  # the main process says it once
        print(end_message(config, checkpoint))
    return 0


def print_help(text: str) -> int:
    """A reader that stops early (run_grpo.py --help all | head -3) ends the help quietly, as pip's does: Python's own
    flush at exit would raise the broken pipe again, so stdout goes to /dev/null first."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def end_message(config: GRPOConfig, checkpoint) -> str:
    """Where everything went, and commands that work as printed: the tools of the interpreter that trained
    (.venv/bin/... after make train), so nothing needs activating first."""
    python = _shown(sys.executable)
    logs, wandb_files = config.resolved_logging_dir, f"{os.environ.get('WANDB_DIR') or config.output_dir}/wandb"
    dashboards = {
        "visualdl": f"{shlex.join([_tool('visualdl'), '--logdir', logs, '--port', '8040', '--language', 'en'])}"
                    f"    # then open http://localhost:8040/app/scalar",
        "tensorboard": f"{shlex.join([_tool('tensorboard'), '--logdir', logs, '--port', '6006'])}    # then open http://localhost:6006",
        "wandb": f"{wandb_files}    # offline runs (WANDB_MODE=offline): {_tool('wandb')} sync {shlex.quote(wandb_files)}/offline-run-*",
    }
    return (
        f"\ncheckpoint: {checkpoint}\n"
        f"metrics:    {config.output_dir}/metrics.jsonl (completions: {config.output_dir}/completions.jsonl)\n"
        f"curves:     {config.output_dir}/curves.png\n"
        + "".join(f"{name + ':':<11} {dashboards[name]}\n" for name in config.report_to if name in dashboards)
        + f"chat:       {shlex.join([python, '-m', 'alignment.chat', str(checkpoint)])}"
    )


def _tool(name: str) -> str:
    """A console script installed beside the interpreter (.venv/bin/visualdl), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return _shown(beside) if beside.is_file() else shutil.which(name) or name


def _shown(path) -> str:
    """path relative to the working folder where it lies inside it (.venv/bin/python), else absolute."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


if __name__ == "__main__":
    sys.exit(main())
