"""actor_model_name_or_path naming a .gguf (alignment/step/trainer.py model_folders): the file is imported once into
<output_dir>/imported/<file stem> by the main process, the import reused while the file is unchanged (its size and
modification time, else its SHA-256: alignment/models/gguf_import.py import_if_changed) and redone when it changed; a missing or
damaged file is one line and exit 2 before any model loads."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gguf import GGMLQuantizationType as Q
from helpers.gguf_files import write_gguf
from helpers.model_files import TINY

from alignment.models.gguf_import import import_if_changed
from alignment.config.cli import load_config
from run_grpo import main as run_grpo

REPO = Path(__file__).resolve().parents[2]
RUN = [
    "config/tiny/grpo_argument.json", "--max_steps", "1", "--eval_datasets", "", "--max_dec_len", "8",
    "--per_device_prompt_batch_size", "2", "--rollout_n", "4", "--per_device_train_batch_size", "8", "--log_completions_per_step", "0",
]


def stamp(folder: Path) -> int:
    return (folder / "model.safetensors").stat().st_mtime_ns


def test_import_is_reused_while_the_file_is_unchanged(tmp_path):
    source, folder = tmp_path / "tiny.gguf", tmp_path / "imported" / "tiny"
    write_gguf(TINY, source, Q.F32)
    assert import_if_changed(source, folder)
    recorded = json.loads((folder / "gguf_source.json").read_text())
    assert recorded["size"] == source.stat().st_size and recorded["mtime_ns"] == source.stat().st_mtime_ns
    first = stamp(folder)
    assert not import_if_changed(source, folder)
    os.utime(source, ns=(recorded["mtime_ns"] + 10**9,) * 2)  # touched: the same bytes, found by their SHA-256
    assert not import_if_changed(source, folder)
    assert json.loads((folder / "gguf_source.json").read_text())["mtime_ns"] == recorded["mtime_ns"] + 10**9  # next time: no reading
    (tmp_path / "copy").mkdir()
    copy = Path(shutil.copy(source, tmp_path / "copy" / "tiny.gguf"))
    assert not import_if_changed(copy, folder) and stamp(folder) == first
    data = bytearray(source.read_bytes())
    data[-4:] = bytes(4)  # the last weight's last value, the size unchanged
    source.write_bytes(bytes(data))
    assert import_if_changed(source, folder) and stamp(folder) != first
    write_gguf(TINY, source, Q.Q8_0)  # another size
    assert import_if_changed(source, folder)
    assert json.loads((folder / "gguf_source.json").read_text())["size"] == source.stat().st_size


def test_a_missing_or_damaged_gguf_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "missing.gguf"
    assert run_grpo(RUN + ["--actor_model_name_or_path", str(missing), "--output_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"run_grpo: error: actor_model_name_or_path: no such file '{missing}'"]
    write_gguf(TINY, tmp_path / "tiny.gguf", Q.F32)
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes((tmp_path / "tiny.gguf").read_bytes()[:-100])  # cut short
    assert run_grpo(RUN + ["--actor_model_name_or_path", str(damaged), "--output_dir", str(tmp_path / "out")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"run_grpo: error: actor_model_name_or_path: {damaged}: not a readable GGUF file (ValueError: ")
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_file_that_starts_with_gguf_is_one_whatever_its_name(tmp_path):
    blob = tmp_path / "sha256-6a0746a1ec1a"  # as Ollama stores its models
    write_gguf(TINY, blob, Q.F32)
    assert load_config(RUN + ["--actor_model_name_or_path", str(blob)]).actor_model_name_or_path == str(blob)


def run(*flags: str, launcher: tuple = ()) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *launcher, "run_grpo.py", *RUN, *flags], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow  # two runs from a .gguf (about 32 s)
def test_a_gguf_actor_trains_and_is_imported_once(tmp_path):
    source, out = tmp_path / "tiny.gguf", tmp_path / "out"
    write_gguf(TINY, source, Q.F32)
    folder = out / "imported" / "tiny"
    first = run("--actor_model_name_or_path", str(source), "--output_dir", str(out), "--kl_loss_coeff", "0.01")  # the reference model too
    assert f"actor_model_name_or_path: imported {source} into {folder} in " in first.stdout
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
    assert json.loads((out / "grpo_config.json").read_text())["actor_model_name_or_path"] == str(source)  # what a resume compares
    imported = stamp(folder)

    again = run(
        "--actor_model_name_or_path", str(source), "--output_dir", str(out), "--kl_loss_coeff", "0.01", "--resume_from_checkpoint", "auto"
    )
    assert f"actor_model_name_or_path: {source} is unchanged since its import: loading {folder}" in again.stdout
    assert "nothing to train" in again.stdout and stamp(folder) == imported

    # the file changes: two processes resume, the main one imports it again while the other waits
    write_gguf(TINY, source, Q.Q8_0)
    logs = tmp_path / "logs"
    run(
        "--actor_model_name_or_path", str(source), "--output_dir", str(out), "--kl_loss_coeff", "0.01", "--resume_from_checkpoint", "auto",
        "--per_device_prompt_batch_size", "1", "--per_device_train_batch_size", "4",
        launcher=("-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(logs)),
    )
    main_log, other_log = (logs / "workerlog.0").read_text(), (logs / "workerlog.1").read_text()
    assert f"actor_model_name_or_path: imported {source} into {folder} in " in main_log
    assert "imported" not in other_log and "nothing to train" in main_log
    assert stamp(folder) != imported
    assert json.loads((folder / "gguf_source.json").read_text())["size"] == source.stat().st_size


def test_a_lora_checkpoint_of_a_gguf_run_finds_its_base_in_the_imported_folder(tmp_path):
    from alignment.run.model_source import base_model_of

    checkpoint = tmp_path / "out" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "grpo_config.json").write_text(json.dumps({"actor_model_name_or_path": "/models/SmolLM2-135M.Q4_1.gguf"}))
    assert base_model_of(checkpoint) == str(tmp_path / "out" / "imported" / "SmolLM2-135M.Q4_1")
    (checkpoint / "grpo_config.json").write_text(json.dumps({"actor_model_name_or_path": "data/tiny-qwen2"}))
    assert base_model_of(checkpoint) == "data/tiny-qwen2"
