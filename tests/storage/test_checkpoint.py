import json
import re

import numpy as np
import paddle
import pytest
from helpers.tiny_models import small_qwen2
from paddleformers.transformers import Qwen2ForCausalLM

from alignment.basics.errors import CheckpointError
from alignment.models.modeling import load_causal_lm, load_tokenizer
from alignment.storage.checkpoint import CheckpointContents, previous_run_files, remove_previous_run, save_checkpoint
from alignment.storage.optimizer_state import load_training_state
from alignment.storage.resume import Lineage, complete_checkpoints, resolve_resume, settings_changes, sha256


@pytest.fixture(scope="module")
def parts():
    model = small_qwen2(vocab_size=451, seed=0, layers=1)
    optimizer = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    return model, load_tokenizer("data/tiny-qwen2"), optimizer


def save(out, step, parts, keep=None, tokenizer=None, lineage=Lineage("")):
    model, real_tokenizer, optimizer = parts
    return save_checkpoint(
        str(out),
        step,
        CheckpointContents(model, tokenizer or real_tokenizer, optimizer.state_dict(), '{"max_steps": 9}', {"total_steps": 9}),
        keep,
        lineage,
    )


def test_checkpoint_holds_everything_and_reloads(tmp_path, parts):
    path = save(tmp_path, 3, parts)
    assert path == tmp_path / "checkpoint-3"
    state = json.loads((path / "trainer_state.json").read_text())
    assert {k: state[k] for k in ("step", "total_steps", "run_id", "ancestry")} == {
        "step": 3,
        "total_steps": 9,
        "run_id": "",
        "ancestry": [],
    }
    files = {p.name: p for p in path.iterdir() if p.name != "trainer_state.json"}
    assert set(state["files"]) == set(files)  # every other file, with its size and checksum
    assert all(state["files"][name]["size"] == file.stat().st_size for name, file in files.items())
    assert {"config.json", "tokenizer.json", "grpo_config.json", "optimizer.safetensors"} <= {p.name for p in path.iterdir()}
    assert not list(path.glob("saved_signal_*"))
    ids = paddle.to_tensor([[1, 2, 3]])
    model = parts[0]
    model.eval()
    assert (load_causal_lm(str(path))(ids)[0] - model(ids)[0]).abs().max().item() == 0.0


def test_save_total_limit_keeps_the_newest(tmp_path, parts):
    for step in (1, 2, 3, 4):
        save(tmp_path, step, parts, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-4"]  # nothing set aside is left


class DiskFullTokenizer:
    """Fault injection: the disk fills while the tokenizer is being written."""

    def save_pretrained(self, path):
        raise OSError(28, "No space left on device")


def test_interrupted_save_leaves_nothing_that_looks_complete(tmp_path, parts):
    save(tmp_path, 1, parts)
    with pytest.raises(CheckpointError) as failure:
        save(tmp_path, 2, parts, tokenizer=DiskFullTokenizer())
    assert str(failure.value) == (
        f"could not save checkpoint {tmp_path}/checkpoint-2: OSError: [Errno 28] No space left on device; the newest "
        f"complete checkpoint is {tmp_path}/checkpoint-1 (untouched): resume_from_checkpoint auto continues from it"
    )
    assert not (tmp_path / "checkpoint-2").exists() and not list(tmp_path.glob(".checkpoint-*"))  # staging removed
    assert [p.name for p in complete_checkpoints(str(tmp_path))] == ["checkpoint-1"]
    save(tmp_path, 2, parts)
    assert [p.name for p in complete_checkpoints(str(tmp_path))] == ["checkpoint-1", "checkpoint-2"]


def test_a_failed_first_save_says_there_is_nothing_to_resume(tmp_path, parts):
    with pytest.raises(CheckpointError, match="there is no complete checkpoint in this output_dir yet"):
        save(tmp_path, 1, parts, tokenizer=DiskFullTokenizer())


def test_leftovers_of_a_save_cut_short_are_removed_by_the_next(tmp_path, parts):
    for leftover in (".checkpoint-3.tmp", ".checkpoint-2.old"):  # a SIGKILL while staging, and while replacing
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "model.safetensors").write_bytes(b"partial")
    save(tmp_path, 4, parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]


def test_saving_a_step_again_replaces_its_checkpoint_whole(tmp_path, parts):
    # A run resumed from an earlier checkpoint saves a step that a later one already holds.
    save(tmp_path, 2, parts)
    (tmp_path / "checkpoint-2" / "stale-file").write_text("from the first run")
    save(tmp_path, 2, parts)
    assert not (tmp_path / "checkpoint-2" / "stale-file").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]


def resumed(resume_from_checkpoint, out, matches=lambda settings, state: True):
    point, skipped = resolve_resume(resume_from_checkpoint, str(out), matches)
    return point and point.path, [(path.name, why) for path, why in skipped]


def test_resume_auto_takes_the_newest_complete_checkpoint(tmp_path, parts):
    assert resumed("auto", tmp_path / "nothing-yet") == (None, [])  # a first start
    for step in (2, 10):
        save(tmp_path, step, parts)
    (tmp_path / ".checkpoint-12.tmp").mkdir()  # a save cut short
    (tmp_path / "checkpoint-11").mkdir()  # no trainer_state.json: incomplete
    assert resumed("auto", tmp_path) == (tmp_path / "checkpoint-10", [])  # by number, not by name order
    assert resumed(str(tmp_path / "checkpoint-2"), tmp_path) == (tmp_path / "checkpoint-2", [])
    assert resumed(None, tmp_path) == (None, [])


def test_optimizer_state_comes_back(tmp_path, parts):
    model, tokenizer, _ = parts
    schedule = lambda step: 1.0 / (1 + step)  # noqa: E731
    scheduler = paddle.optimizer.lr.LambdaDecay(0.1, schedule)
    optimizer = paddle.optimizer.AdamW(scheduler, parameters=model.parameters())
    for _ in range(3):
        model(paddle.to_tensor([[1, 2, 3]]))[0].mean().backward()
        optimizer.step()
        optimizer.clear_grad()
        scheduler.step()
    path = save_checkpoint(str(tmp_path), 3, CheckpointContents(model, tokenizer, optimizer.state_dict(), "{}", {"total_steps": 9}), None)

    fresh_scheduler = paddle.optimizer.lr.LambdaDecay(0.1, schedule)
    fresh = paddle.optimizer.AdamW(fresh_scheduler, parameters=model.parameters())
    assert load_training_state(path, fresh, list(model.named_parameters()))["step"] == 3
    assert fresh_scheduler.get_lr() == scheduler.get_lr() == 0.1 / 4
    saved, restored = optimizer.state_dict(), fresh.state_dict()
    moments = [k for k in saved if "moment" in k]
    assert len(moments) == 2 * len(model.parameters())
    for key in moments:
        assert (saved[key] == restored[key]).all().item(), key


def test_the_optimizer_state_is_safetensors_and_json_and_comes_back_bit_for_bit(tmp_path):
    from alignment.storage.optimizer_state import load_optimizer_state, save_optimizer_state

    state = {
        "linear_0.w_0_moment1_0": paddle.to_tensor([[1.0, -2.5e-38], [3.0, 4.0]]), "step_count": paddle.to_tensor([7], "int64"),
        "linear_0.w_0_beta1_pow_acc_0": paddle.to_tensor([0.9**7]), "LR_Scheduler": {"last_epoch": 3, "last_lr": 2.4e-05},
        "master_weights": {"linear_0.w_0": paddle.to_tensor([[0.1, 0.2]])}, "bf16": paddle.to_tensor([1.5, -2.0]).astype("bfloat16"),
    }
    save_optimizer_state(state, tmp_path / "optimizer.safetensors")
    with open(tmp_path / "optimizer.safetensors", "rb") as f:  # safetensors: an 8-byte length, then a JSON header
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert json.loads(header["__metadata__"]["grpo_optimizer"]) == {"LR_Scheduler": {"last_epoch": 3, "last_lr": 2.4e-05}}
    back = load_optimizer_state(tmp_path / "optimizer.safetensors")
    assert back.keys() == state.keys() and back["LR_Scheduler"] == state["LR_Scheduler"]
    for key in ("linear_0.w_0_moment1_0", "step_count", "linear_0.w_0_beta1_pow_acc_0", "bf16"):
        assert back[key].dtype == state[key].dtype and (back[key].astype("float64") == state[key].astype("float64")).all().item(), key
    assert (back["master_weights"]["linear_0.w_0"] == state["master_weights"]["linear_0.w_0"]).all().item()


class Exploit:
    """Unpickling this runs code: it creates the file it names."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("name", ["optimizer.pdopt", "pending_rollout.pkl"])
def test_a_checkpoint_holding_pickle_is_refused_before_anything_loads_unless_trusted(tmp_path, parts, name):
    """A checkpoint of an earlier version, or one crafted to look like it: its pickle would run code on resume."""
    import pickle

    from alignment.basics.errors import ConfigError
    from alignment.parallel.distributed import World
    from alignment.config.cli import load_config
    from alignment.run.start import start_point

    path, marker = save(tmp_path / "out", 2, parts), tmp_path / "code-ran"
    if name == "optimizer.pdopt":
        (path / "optimizer.safetensors").unlink()
    (path / name).write_bytes(pickle.dumps(Exploit(marker)))
    state = json.loads((path / "trainer_state.json").read_text())  # whoever writes a checkpoint writes its checksums too
    state["files"] = {
        file.name: {"size": file.stat().st_size, "sha256": sha256(file)} for file in path.iterdir() if file.name != "trainer_state.json"
    }
    (path / "trainer_state.json").write_text(json.dumps(state))
    config = load_config(["config/tiny/grpo_argument.json", "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", str(path)])
    with pytest.raises(
        ConfigError, match=rf"{path} holds {name}, pickle written by an earlier version, .* --trust_pickled_checkpoint true"
    ):
        start_point(config, World(0, 1))
    with pytest.raises(CheckpointError, match="has no optimizer.safetensors") if name == "optimizer.pdopt" else _nothing():
        load_training_state(path, paddle.optimizer.AdamW(1e-3, parameters=parts[0].parameters()), list(parts[0].named_parameters()))
    assert not marker.exists()
    trusted = load_config(["config/tiny/grpo_argument.json", "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", str(path),
                           "--trust_pickled_checkpoint", "true"])
    assert start_point(trusted, World(0, 1))[0].path == path  # the user's explicit choice


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def lineage_of(path):
    return Lineage.of(json.loads((path / "trainer_state.json").read_text()))


def test_retention_counts_only_the_lineage_and_keeps_what_the_run_wrote_and_resumed_from(tmp_path, parts):
    first = Lineage.new()
    for step in (1, 2, 3, 4):  # another run's checkpoints, higher-numbered than what the next run writes
        save(tmp_path, step, parts, lineage=first)
    resumed_run = lineage_of(tmp_path / "checkpoint-1").continued(1, tmp_path / "checkpoint-1")
    assert save(tmp_path, 2, parts, keep=1, lineage=resumed_run).is_dir()  # kept: just saved (the old rule removed it)
    assert save(tmp_path, 3, parts, keep=1, lineage=resumed_run).is_dir()
    # checkpoint-2 of the resumed run is past the limit; checkpoint-1 is where it resumed from; checkpoint-4 is the first run's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-3", "checkpoint-4"]
    assert resumed_run.holds(json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text()))
    assert not resumed_run.holds(json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text()))


def test_resume_auto_follows_the_newest_lineage_not_the_highest_step(tmp_path, parts):
    first = Lineage.new()
    for step in (1, 2, 3):
        save(tmp_path, step, parts, lineage=first)
    second = first.continued(1, tmp_path / "checkpoint-1")
    save(tmp_path, 2, parts, lineage=second)  # replaces the first run's checkpoint-2
    assert resumed("auto", tmp_path) == (tmp_path / "checkpoint-2", [])
    # a run whose settings match only the first run's checkpoints resumes that lineage
    first_only = lambda settings, state: state["run_id"] == first.run_id  # noqa: E731
    assert resumed("auto", tmp_path, first_only) == (tmp_path / "checkpoint-3", [])


@pytest.mark.parametrize("damaged", ["model.safetensors", "optimizer.safetensors", "tokenizer.json", "trainer_state.json"])
def test_a_damaged_checkpoint_is_skipped_by_auto_and_refused_by_name(tmp_path, parts, damaged):
    lineage = Lineage.new()
    for step in (1, 2):
        save(tmp_path, step, parts, lineage=lineage)
    file = tmp_path / "checkpoint-2" / damaged
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])  # truncated, as by a full disk or a copy cut short
    point, skipped = resolve_resume("auto", str(tmp_path))
    assert point.path == tmp_path / "checkpoint-1" and point.step == 1
    assert [path.name for path, _ in skipped] == ["checkpoint-2"]
    why = skipped[0][1]
    assert damaged in why and ("truncated" in why or "cannot be read" in why)
    with pytest.raises(CheckpointError, match=f"checkpoint-2.*{damaged}") as refused:
        resolve_resume(str(tmp_path / "checkpoint-2"), str(tmp_path))
    assert "\n" not in str(refused.value)


def test_a_changed_byte_of_the_same_size_is_caught_by_the_checksum(tmp_path, parts):
    path = save(tmp_path, 1, parts, lineage=Lineage.new())
    weights = bytearray((path / "model.safetensors").read_bytes())
    weights[-1] ^= 0xFF
    (path / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(CheckpointError, match="does not match the checksum"):
        resolve_resume(str(path), str(tmp_path))
    assert resolve_resume("auto", str(tmp_path))[0] is None  # nothing intact left: a fresh start, saying why


@pytest.mark.parametrize(
    "recorded, recorded_processes, current, processes, refused, allowed",
    [
        ({"rollout_n": 8, "learning_rate": 1e-6}, 1, {"rollout_n": 8, "learning_rate": 2e-6}, 1, [], ["learning_rate: 1e-06 -> 2e-06"]),
        ({"rollout_n": 8, "seed": 1}, 1, {"rollout_n": 4, "seed": 1}, 1, ["rollout_n: 8 -> 4"], []),
        # the same global batch on another layout is the same run
        ({"per_device_prompt_batch_size": 8}, 1, {"per_device_prompt_batch_size": 4}, 2, [], []),
        (
            {"per_device_prompt_batch_size": 8}, 1, {"per_device_prompt_batch_size": 8}, 2,
            ["per_device_prompt_batch_size: 8 -> 8 x 2 processes"], [],
        ),
        (
            {"train_datasets": "a.jsonl", "eval_steps": 5}, None, {"train_datasets": "b.jsonl", "eval_steps": 10}, 1,
            ['train_datasets: "a.jsonl" -> "b.jsonl"'], ["eval_steps: 5 -> 10"],
        ),
        # how a run starts is not a setting; a key the checkpoint does not record is not compared
        (
            {"resume_from_checkpoint": None, "overwrite_output_dir": False}, 1,
            {"resume_from_checkpoint": "auto", "overwrite_output_dir": True, "new_key": 1}, 1, [], [],
        ),
        # a forged batch size that is no count differs (no TypeError multiplying it by the processes)
        ({"per_device_prompt_batch_size": {}}, 1, {"per_device_prompt_batch_size": 8}, 1, ["per_device_prompt_batch_size: {} -> 8"], []),
    ],
)
def test_settings_changes(recorded, recorded_processes, current, processes, refused, allowed):
    assert settings_changes(recorded, recorded_processes, current, processes) == (refused, allowed)


def test_previous_run_files_are_the_runs_own(tmp_path):
    (tmp_path / "launch_log").mkdir()  # paddle.distributed.launch's --log_dir, made before the run starts
    (tmp_path / "notes.txt").write_text("the user's own")
    assert previous_run_files(str(tmp_path), str(tmp_path / "vdl_log")) == []
    for name in ("metrics.jsonl", "grpo_config.json", "wandb_run_id"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "wandb").mkdir()  # report_to wandb's folder
    (tmp_path / "vdl_log").mkdir()
    (tmp_path / "vdl_log" / "vdlrecords.1.log").write_text("")
    found = previous_run_files(str(tmp_path), str(tmp_path / "vdl_log"))
    assert [p.name for p in found] == ["checkpoint-3", "grpo_config.json", "metrics.jsonl", "wandb", "wandb_run_id", "vdl_log"]
    remove_previous_run(found)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch_log", "notes.txt"]


# --- forged contents: whoever writes a checkpoint writes its checksums too -------------------------------------


def forged(path, files: dict | None = None):
    """trainer_state.json's checksums recomputed over the checkpoint's files as they are now (and `files` added)."""
    state = json.loads((path / "trainer_state.json").read_text())
    state["files"] = {
        file.name: {"size": file.stat().st_size, "sha256": sha256(file)} for file in path.iterdir() if file.name != "trainer_state.json"
    } | (files or {})
    (path / "trainer_state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("entry", ["../../secret.txt", "absolute", "link", "unlisted link"])
def test_a_files_entry_outside_the_checkpoint_is_refused_unread(tmp_path, parts, entry):
    path, secret = save(tmp_path / "out", 2, parts), tmp_path / "secret.txt"
    secret.write_text("another file of this machine")
    listed = {"../../secret.txt": "../../secret.txt", "absolute": str(secret), "link": "link", "unlisted link": None}[entry]
    if "link" in entry:
        (path / "link").symlink_to(secret)
    forged(path, {listed: {"size": secret.stat().st_size, "sha256": sha256(secret)}} if listed else {})
    refusal = {
        "link": rf"{path}/link is a link to {secret} outside the checkpoint",
        "unlisted link": rf"{path}/link is a link to {secret} outside the checkpoint",
    }.get(entry, rf"{path}/trainer_state.json lists the file '{listed}', which is not a path inside the checkpoint")
    with pytest.raises(CheckpointError, match=refusal) as refused:
        resolve_resume(str(path), str(tmp_path / "out"))
    assert "\n" not in str(refused.value)
    assert resolve_resume("auto", str(tmp_path / "out"))[0] is None  # auto skips it


@pytest.mark.parametrize(
    "field, value, refusal",
    [
        ("skipped_steps", "3", "skipped_steps = '3', not a count"),
        ("log_offsets", {"metrics.jsonl": -5}, "log_offsets = {'metrics.jsonl': -5}, not byte offsets"),
        ("ancestry", [["run", "one"]], "run_id = '' and ancestry = [['run', 'one']], not a run id and [run id, step] pairs"),
        ("saved_at", "yesterday", "saved_at = 'yesterday', not a time"),
    ],
)
def test_forged_trainer_state_fields_are_refused_in_one_line(tmp_path, parts, field, value, refusal):
    path = save(tmp_path, 2, parts)
    state = json.loads((path / "trainer_state.json").read_text())
    (path / "trainer_state.json").write_text(json.dumps(state | {field: value}))  # the checksums do not cover it: it holds them
    message = f"{path}/trainer_state.json holds {refusal}: the checkpoint is damaged"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        resolve_resume(str(path), str(tmp_path))
    assert resolve_resume("auto", str(tmp_path)) == (None, [(path, message)])  # skipped, saying why


@pytest.fixture(scope="module")
def stepped(parts):
    """An optimizer that has made one update (so its state holds every moment), and (name, parameter) of its parameters."""
    model = parts[0]
    optimizer = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    model(paddle.to_tensor([[1, 2, 3]]))[0].mean().backward()
    optimizer.step()
    optimizer.clear_grad()
    return optimizer, list(model.named_parameters())


def test_moments_saved_by_the_models_names_come_back_where_paddle_named_the_parameters_otherwise(tmp_path, parts, stepped):
    """Paddle names parameters by process-wide counters: a model built after another (a resume in the process that
    trained, or a reference model built first) has other names. The checkpoint names the moments as the model does, so
    they come back all the same (before, set_state_dict matched none and the resume went on with no moments)."""
    from alignment.storage.optimizer_state import accumulators_renamed

    optimizer, named = stepped
    model, tokenizer, _ = parts
    saved = accumulators_renamed(optimizer.state_dict(), {parameter.name: name for name, parameter in named})
    assert not any(parameter.name in key for key in saved for _, parameter in named)  # only the model's names in the file
    path = save_checkpoint(str(tmp_path), 1, CheckpointContents(model, tokenizer, saved, "{}", {"total_steps": 9}), None)
    paddle.seed(1)
    again = Qwen2ForCausalLM(model.config)  # the same model, built later: every parameter named anew
    assert {p.name for p in again.parameters()}.isdisjoint(p.name for _, p in named)
    fresh = paddle.optimizer.AdamW(1e-3, parameters=again.parameters())
    load_training_state(path, fresh, list(again.named_parameters()))
    by_model_name = dict(again.named_parameters())
    restored = fresh.state_dict()
    for name, parameter in named:
        key = next(key for key in optimizer.state_dict() if key.startswith(parameter.name + "_moment1_"))
        moved = key.replace(parameter.name, by_model_name[name].name, 1)
        assert np.array_equal(restored[moved].numpy(), optimizer.state_dict()[key].numpy()), name


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda v: paddle.zeros([7, 7]), r"holds \S+_moment1_\d+ as float32 \[7, 7\], not float32 \[[\d, ]+\]"),
        (lambda v: v.astype("float64"), r"holds \S+_moment1_\d+ as float64 \[[\d, ]+\], not float32 \[[\d, ]+\]"),
        (lambda v: v.astype("int64"), r"holds \S+_moment1_\d+ as int64"),
        (None, r"lacks \S+'s moment1"),
    ],
    ids=["shape", "float64", "int64", "missing"],
)
def test_forged_optimizer_moments_are_refused_in_one_line(tmp_path, parts, stepped, change, message):
    from alignment.storage.optimizer_state import load_optimizer_state, save_optimizer_state

    optimizer, parameters = stepped
    model, tokenizer, _ = parts
    path = save_checkpoint(str(tmp_path), 1, CheckpointContents(model, tokenizer, optimizer.state_dict(), "{}", {"total_steps": 9}), None)
    state = load_optimizer_state(path / "optimizer.safetensors")
    key = sorted(key for key in state if "_moment1_" in key)[0]
    if change is None:
        del state[key]
    else:
        state[key] = change(state[key])
    save_optimizer_state(state, path / "optimizer.safetensors")
    forged(path)
    assert resolve_resume(str(path), str(tmp_path))[0].path == path  # the checksums hold
    fresh = paddle.optimizer.AdamW(1e-3, parameters=[parameter for _, parameter in parameters])
    with pytest.raises(CheckpointError, match=rf"{path}/optimizer.safetensors {message}.*not this model's optimizer state") as refused:
        load_training_state(path, fresh, parameters)
    assert "\n" not in str(refused.value)


def test_a_forged_rollout_in_flight_is_refused_in_one_line(tmp_path, parts):
    """A one-step-off run's checkpoint holds the next step's rollout: token ids past the vocabulary, or another
    number of completions than the run's, are refused naming the file (not a traceback inside the step)."""
    import numpy as np

    from alignment.rollout.base import Rollout
    from alignment.rollout.trainer_link import PENDING_FILE, read_pending
    from alignment.rollout.wire import RolloutPart, pending_bytes

    def rollout(token: int) -> Rollout:
        ids = np.array([[5, token], [6, 7]], dtype=np.int64)
        return Rollout([[1, 2], [1, 2]], ids, np.ones(ids.shape, np.float32), np.zeros(ids.shape, np.float32), ["eos", "eos"], 2)

    path = save(tmp_path, 2, parts)
    (path / PENDING_FILE).write_bytes(pending_bytes(3, [RolloutPart(3, rollout(8), 2, 1.0, 0.0)]))
    forged(path)
    assert read_pending(path, 3, False, 2, 2, 451)[0] == 3  # as the run saved it
    with pytest.raises(CheckpointError, match=rf"{PENDING_FILE} holds 2 completions in groups of 2, not this run's 8 in groups of 4"):
        read_pending(path, 3, False, 8, 4, 451)
    (path / PENDING_FILE).write_bytes(pending_bytes(3, [RolloutPart(3, rollout(999_999), 2, 1.0, 0.0)]))
    forged(path)
    assert resolve_resume(str(path), str(tmp_path))[0].path == path
    past = rf"{path}/{PENDING_FILE}: part 0: token id 999999 is past the model's vocabulary of 451"
    with pytest.raises(CheckpointError, match=past) as refused:
        read_pending(path, 3, False, 2, 2, 451)
    assert "\n" not in str(refused.value)
