"""LoRA (alignment/models/lora.py): only the adapters train; checkpoints hold only them and resume; the merged model
(alignment/merge_lora.py) equals the adapted one; the fused rollout engine and the training operators see
the adapters."""

import contextlib
import json
import subprocess
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from safetensors import safe_open
from helpers.tiny_models import PAD, PROMPTS, VOCAB, llama_untied, qwen2_tied

import alignment.export
from alignment.merge_lora import main as merge_main
from alignment.models.lora import adapters_disabled, apply_lora, load_adapter, lora_layers
from alignment.models.modeling import enable_recompute, load_causal_lm, load_tokenizer, save_model, stop_token_ids
from alignment.parallel.optim import build_optimizer
from alignment.run.build import load_actor, optimizer_settings
from alignment.rollout import EagerEngine, SamplingParams
from alignment.kernels.ops import load_ops
from alignment.config.schema import GRPOConfig
from alignment.basics.data import encode_messages
from alignment.storage.checkpoint import CheckpointContents, save_checkpoint
from alignment.storage.optimizer_state import load_training_state

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IDS = paddle.to_tensor([[5, 17, 33, 8, 9, 41, 2, 60], [12, 3, 61, 62, 63, 64, 70, 71]])  # (2, 8)
OPS, WHY_NOT = load_ops()
needs_ops = pytest.mark.skipif(OPS is None, reason=f"compiled operators not available: {WHY_NOT}")
BUILDERS = pytest.mark.parametrize("build", [qwen2_tied, llama_untied], ids=["qwen2-tied-bias", "llama-untied"])


def logits(model, ids=IDS) -> np.ndarray:
    model.eval()
    with paddle.no_grad():
        return model(ids, return_dict=True).logits.numpy()


def with_lora(build, dropout=0.0, rank=4, alpha=8.0):
    paddle.seed(5)
    return apply_lora(build(), rank, alpha, dropout, TARGETS)


def train_steps(model, optimizer, steps=2):
    """Cross-entropy of IDS's next tokens, `steps` AdamW steps: B moves on the first (A's gradient is
    x^T (g B^T) = 0 while B = 0), A from the second on."""
    model.train()
    for _ in range(steps):
        out = model(IDS, use_cache=False, return_dict=True).logits  # (2, 8, V)
        loss = F.cross_entropy(out[:, :-1].reshape([-1, VOCAB]), IDS[:, 1:].reshape([-1, 1])).mean()
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()


def optimizer_for(model):
    return build_optimizer(model, optimizer_settings(GRPOConfig(learning_rate=1e-2, lr_scheduler_type="constant")), total_steps=10)[0]


def test_only_the_adapters_get_gradients_and_change():
    model = with_lora(qwen2_tied, dropout=0.1)
    trainable = {n for n, p in model.named_parameters() if not p.stop_gradient}
    assert trainable == {f"{name}.lora_{m}" for name in lora_layers(model) for m in "AB"}
    assert len(trainable) == 2 * len(TARGETS) * 2  # A and B x 7 projections x 2 layers
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    optimizer = optimizer_for(model)
    assert {p.name for p in optimizer._parameter_list} == {p.name for n, p in model.named_parameters() if n in trainable}

    model.train()
    F.cross_entropy(model(IDS, return_dict=True).logits.reshape([-1, VOCAB]), IDS.reshape([-1, 1])).mean().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == trainable
    optimizer.clear_grad()
    train_steps(model, optimizer)
    for name, parameter in model.named_parameters():
        changed = not np.array_equal(parameter.numpy(), before[name])
        assert changed == (name in trainable), name  # base weights bit-identical, every adapter matrix moved


@BUILDERS
def test_a_fresh_adapter_and_disabled_adapters_give_the_base_logits_exactly(build):
    base = logits(build())
    model = with_lora(build, dropout=0.1)
    assert np.array_equal(logits(model), base)  # B = 0
    train_steps(model, optimizer_for(model))
    assert not np.allclose(logits(model), base, atol=1e-3)
    with adapters_disabled(model):
        assert np.array_equal(logits(model), base)
    assert not np.allclose(logits(model), base, atol=1e-3)  # back on after the block


@BUILDERS
def test_checkpoint_holds_only_the_adapter_resumes_and_merges_to_the_same_logits(tmp_path, build):
    save_model(build(), str(tmp_path / "base"))
    model = with_lora(build)
    optimizer = optimizer_for(model)
    train_steps(model, optimizer)
    run_config = json.dumps({"actor_model_name_or_path": str(tmp_path / "base")})
    tokenizer = load_tokenizer("data/tiny-qwen2")
    path = save_checkpoint(
        str(tmp_path / "run"), 2, CheckpointContents(model, tokenizer, optimizer.state_dict(), run_config, {"total_steps": 10}), None
    )

    files = {p.name for p in path.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "optimizer.safetensors", "trainer_state.json"} <= files
    assert not files & {"model.safetensors", "config.json"}
    adapters = {n: p for n, p in model.named_parameters() if not p.stop_gradient}
    with safe_open(path / "adapter_model.safetensors", framework="np") as stored:
        shapes = {key: stored.get_tensor(key).shape for key in stored.keys()}
    assert len(shapes) == len(adapters) == 28
    assert sum(np.prod(s) for s in shapes.values()) == sum(np.prod(p.shape) for p in adapters.values())
    assert shapes["base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"] == (4, 64)  # peft's (r, in)
    assert shapes["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"] == (32, 4)  # (out, r)
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, sorted(TARGETS))
    assert config["base_model_name_or_path"] == str(tmp_path / "base")

    # Resume: the base from its folder, the adapters applied, then loaded back; the optimizer holds their moments only.
    resumed = apply_lora(load_causal_lm(str(tmp_path / "base")), 4, 8.0, 0.0, TARGETS)
    load_adapter(resumed, path)
    assert np.array_equal(logits(resumed), logits(model))
    fresh = optimizer_for(resumed)
    assert load_training_state(path, fresh, list(adapters.items()))["step"] == 2
    moments = [key for key in fresh.state_dict() if "moment" in key]
    assert len(moments) == 2 * len(adapters)

    # Merge into the base: a plain model whose forward (no adapter layers) gives the adapted logits.
    assert merge_main([str(path), str(tmp_path / "merged")]) == 0  # the base from grpo_config.json
    merged = load_causal_lm(str(tmp_path / "merged"))
    assert not lora_layers(merged)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "merged").iterdir()}
    np.testing.assert_allclose(logits(merged), logits(model), rtol=0, atol=1e-5)


def test_a_resume_with_other_lora_settings_names_the_difference(tmp_path):
    model = with_lora(qwen2_tied)
    save_checkpoint(
        str(tmp_path), 1, CheckpointContents(model, load_tokenizer("data/tiny-qwen2"), optimizer_for(model).state_dict(), "{}", {}), None
    )
    other_rank = apply_lora(qwen2_tied(), 8, 8.0, 0.0, TARGETS)
    with pytest.raises(ValueError, match="r 4, lora_alpha 8.0; the model's adapters have lora_rank 8"):
        load_adapter(other_rank, tmp_path / "checkpoint-1")
    fewer_targets = apply_lora(qwen2_tied(), 4, 8.0, 0.0, ["q_proj", "v_proj"])
    differ = "layers differ from the model's \\(target_modules\\): 10 only in the adapter \\(model.layers.0.mlp.down_proj, "
    with pytest.raises(ValueError, match=differ):
        load_adapter(fewer_targets, tmp_path / "checkpoint-1")


def test_export_and_merge_point_at_each_other(tmp_path, capsys):
    model = with_lora(qwen2_tied)
    path = save_checkpoint(
        str(tmp_path), 1, CheckpointContents(model, load_tokenizer("data/tiny-qwen2"), optimizer_for(model).state_dict(), "{}", {}), None
    )
    assert alignment.export.main([str(path), str(tmp_path / "out")]) == 2
    advice = (
        "a LoRA checkpoint, which holds the adapter and not the model; "
        f"merge it into its base model with: python -m alignment.merge_lora {path}"
    )
    assert advice in capsys.readouterr().err
    assert merge_main([str(path), str(tmp_path / "out")]) == 2  # no base named anywhere
    assert "names the base model; pass --base" in capsys.readouterr().err
    save_model(qwen2_tied(), str(tmp_path / "full"))
    assert merge_main([str(tmp_path / "full"), str(tmp_path / "out")]) == 2
    assert "no adapter_config.json, so not a LoRA checkpoint" in capsys.readouterr().err


def test_bad_target_modules_name_the_modules_there_are():
    listed = "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"
    with pytest.raises(ValueError, match=f"'q_prj' matches no module of Qwen2ForCausalLM; its Linear layers are named {listed}"):
        apply_lora(qwen2_tied(), 8, 16.0, 0.0, ["q_proj", "q_prj"])
    with pytest.raises(ValueError, match="'lm_head' matches lm_head \\(LMHead\\), not a Linear layer"):
        apply_lora(qwen2_tied(), 8, 16.0, 0.0, ["lm_head"])
    with pytest.raises(ValueError, match="lora_rank must be a positive integer, got 0"):
        apply_lora(qwen2_tied(), 0, 16.0, 0.0, TARGETS)
    only_layer_1_q = apply_lora(qwen2_tied(), 8, 16.0, 0.0, ["layers.1.self_attn.q_proj"])  # a longer suffix narrows
    assert list(lora_layers(only_layer_1_q)) == ["model.layers.1.self_attn.q_proj"]


def test_recompute_covers_every_layer_and_keeps_the_gradients(monkeypatch):
    """The embeddings are frozen, so without apply_lora's hook the first layer's input would carry no
    gradient and paddleformers would skip recomputing it."""
    plain, recomputed = with_lora(qwen2_tied, dropout=0.1), with_lora(qwen2_tied, dropout=0.1)
    enable_recompute(recomputed, "full")
    calls = []
    original = type(recomputed.model).recompute_training_full
    monkeypatch.setattr(type(recomputed.model), "recompute_training_full", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    with paddle.no_grad():
        recomputed(IDS, use_cache=False)  # rollout and the reference forward: nothing to recompute
    assert calls == []
    grads = []
    for model in (plain, recomputed):
        paddle.seed(3)  # the same dropout masks in both models; recompute replays them in the backward pass
        train_steps(model, optimizer_for(model), steps=1)  # B != 0 from here, so A gets a gradient too
        model.train()
        out = model(IDS, use_cache=False, return_dict=True).logits
        F.cross_entropy(out.reshape([-1, VOCAB]), IDS.reshape([-1, 1])).mean().backward()
        grads.append({n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None})
    assert len(calls) == 2 * len(recomputed.model.layers)  # both layers, in both passes
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 28
    for name, grad in grads[0].items():
        np.testing.assert_allclose(grads[1][name], grad, rtol=1e-5, atol=1e-7, err_msg=name)


@needs_ops
@BUILDERS
def test_the_fused_engine_decodes_with_the_merged_adapters(build):
    from alignment.basics.errors import WeightSyncError
    from alignment.rollout.fused import FusedEngine

    model = with_lora(build, dropout=0.1)
    optimizer = optimizer_for(model)
    train_steps(model, optimizer)
    engine = FusedEngine(model, [VOCAB - 1], PAD, OPS)  # its sync() checks it against the actor on the probe
    assert engine.check_weight_sync() < 1e-4
    model.eval()
    greedy = SamplingParams(max_new_tokens=10, greedy=True)
    eager = EagerEngine(model, [VOCAB - 1], PAD).generate(PROMPTS, 1, greedy)
    fused = engine.generate(PROMPTS, 1, greedy)
    assert fused.completion_ids.tolist() == eager.completion_ids.tolist()
    np.testing.assert_allclose(fused.logprobs, eager.logprobs, atol=1e-4)
    with adapters_disabled(model):
        base = EagerEngine(model, [VOCAB - 1], PAD).generate(PROMPTS, 1, greedy)
    assert base.completion_ids.tolist() != eager.completion_ids.tolist()  # the adapters changed the policy

    train_steps(model, optimizer, steps=1)  # adapters only: the engine's merged copies go stale
    with pytest.raises(WeightSyncError):
        engine.check_weight_sync()
    engine.sync()
    assert engine.check_weight_sync() < 1e-4


@needs_ops
def test_the_training_operators_keep_the_adapters():
    from alignment.models.fused_train import use_training_ops

    plain, swapped = with_lora(qwen2_tied), with_lora(qwen2_tied)
    train_steps(plain, optimizer_for(plain))
    swapped.set_state_dict(plain.state_dict())
    assert use_training_ops(swapped) is None
    for model in (plain, swapped):
        model.train()
        out = model(IDS, return_dict=True).logits
        F.cross_entropy(out[:, :-1].reshape([-1, VOCAB]), IDS[:, 1:].reshape([-1, 1])).mean().backward()
    np.testing.assert_allclose(logits(swapped), logits(plain), atol=1e-5)
    grads = {n: p.grad.numpy() for n, p in plain.named_parameters() if p.grad is not None}
    swapped_grads = {n: p.grad.numpy() for n, p in swapped.named_parameters() if p.grad is not None}
    assert set(swapped_grads) == set(grads) and len(grads) == 28
    for name, grad in grads.items():
        np.testing.assert_allclose(swapped_grads[name], grad, atol=1e-5, err_msg=name)
    with adapters_disabled(swapped), adapters_disabled(plain):
        np.testing.assert_allclose(logits(swapped), logits(plain), atol=1e-5)


def test_chat_answers_from_a_lora_checkpoint_with_the_adapter(tmp_path):
    """The bundled model as the base; chat merges the adapter in, the engine here runs it unmerged."""
    tokenizer = load_tokenizer("data/tiny-qwen2")
    paddle.seed(5)
    model = apply_lora(load_causal_lm("data/tiny-qwen2"), 4, 8.0, 0.0, TARGETS)
    for layer in lora_layers(model).values():
        layer.lora_B.set_value(paddle.randn(layer.lora_B.shape) * 0.5)
    run_config = GRPOConfig(system_prompt="", max_dec_len=16).to_json()
    path = save_checkpoint(str(tmp_path), 1, CheckpointContents(model, tokenizer, optimizer_for(model).state_dict(), run_config, {}), None)
    question = "What is 6 times 7?"
    prompt = encode_messages(({"role": "user", "content": question},), tokenizer, "")
    answers = []
    for adapted in (True, False):
        with contextlib.nullcontext() if adapted else adapters_disabled(model):
            engine = EagerEngine(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id)
            rollout = engine.generate([prompt], 1, SamplingParams(max_new_tokens=16, greedy=True))
        answers.append(tokenizer.decode(rollout.completion_ids[0, : rollout.lengths[0]].tolist(), skip_special_tokens=True))
    assert answers[0] != answers[1]  # the adapter changes the answer
    done = subprocess.run([sys.executable, "-m", "alignment.chat", str(path), "--greedy", "--use_fusemt", "false"],
                          input=question + "\n", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"> {question}\n{answers[0]}\n\n"  # the piped prompt echoed, then the answer


def test_the_adapters_start_from_the_runs_seed_in_every_process():
    """load_actor draws LoRA's A from `seed`: each process of a run (data-parallel ranks, rollout processes) starts from
    the same adapters, and so does every run with that seed. Unseeded, two runs of one config trained differently."""
    def initial_adapters(seed: int, process_state: int) -> dict:
        paddle.seed(process_state)  # whatever the process's generator held before: the run's seed decides
        model = load_actor(GRPOConfig(lora=True, lora_rank=4, seed=seed), "data/tiny-qwen2", None)
        return {name: p.numpy() for name, p in model.named_parameters() if "lora_A" in name}

    first, again, other = initial_adapters(42, 1), initial_adapters(42, 2), initial_adapters(43, 1)
    assert first and first.keys() == again.keys() == other.keys()
    assert all(np.array_equal(first[name], again[name]) for name in first)
    assert not any(np.array_equal(first[name], other[name]) for name in first)
