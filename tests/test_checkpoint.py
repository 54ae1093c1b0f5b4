import json

import paddle
import pytest
from paddleformers.transformers import Qwen2Config, Qwen2ForCausalLM

from alignment.checkpoint import CheckpointError, complete_checkpoints, load_training_state, resolve_resume, save_checkpoint
from alignment.modeling import load_causal_lm, load_tokenizer


@pytest.fixture(scope="module")
def parts():
    paddle.seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=451, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    optimizer = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    return model, load_tokenizer("data/tiny-qwen2"), optimizer


def save(out, step, parts, keep=None, tokenizer=None):
    model, real_tokenizer, optimizer = parts
    return save_checkpoint(str(out), step, model, tokenizer or real_tokenizer, optimizer.state_dict(), '{"max_steps": 9}', {"total_steps": 9}, keep)


def test_checkpoint_holds_everything_and_reloads(tmp_path, parts):
    path = save(tmp_path, 3, parts)
    assert path == tmp_path / "checkpoint-3"
    assert json.loads((path / "trainer_state.json").read_text()) == {"step": 3, "total_steps": 9}
    assert {"config.json", "tokenizer.json", "grpo_config.json", "optimizer.pdopt"} <= {p.name for p in path.iterdir()}
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


def test_resume_auto_takes_the_newest_complete_checkpoint(tmp_path, parts):
    assert resolve_resume("auto", str(tmp_path / "nothing-yet")) is None  # a first start
    for step in (2, 10):
        save(tmp_path, step, parts)
    (tmp_path / ".checkpoint-12.tmp").mkdir()  # a save cut short
    (tmp_path / "checkpoint-11").mkdir()  # no trainer_state.json: incomplete
    assert resolve_resume("auto", str(tmp_path)) == tmp_path / "checkpoint-10"  # by number, not by name order
    assert resolve_resume(str(tmp_path / "checkpoint-2"), str(tmp_path)) == tmp_path / "checkpoint-2"
    assert resolve_resume(None, str(tmp_path)) is None


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
    path = save_checkpoint(str(tmp_path), 3, model, tokenizer, optimizer.state_dict(), "{}", {"total_steps": 9}, None)

    fresh_scheduler = paddle.optimizer.lr.LambdaDecay(0.1, schedule)
    fresh = paddle.optimizer.AdamW(fresh_scheduler, parameters=model.parameters())
    assert load_training_state(path, fresh)["step"] == 3
    assert fresh_scheduler.get_lr() == scheduler.get_lr() == 0.1 / 4
    saved, restored = optimizer.state_dict(), fresh.state_dict()
    moments = [k for k in saved if "moment" in k]
    assert len(moments) == 2 * len(model.parameters())
    for key in moments:
        assert (saved[key] == restored[key]).all().item(), key
