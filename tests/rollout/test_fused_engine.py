"""The fused engine (alignment/rollout/fused.py) against the eager engine and the actor's forward."""

import warnings

import numpy as np
import paddle
import pytest
from paddleformers.transformers import Phi3Config, Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from helpers.tiny_models import PAD, PROMPTS, SHAPE, VOCAB, llama3_tied, llama_untied, qwen2_tied, qwen3_tied, qwen3_untied

from alignment.algo.logprobs import token_logprobs
from alignment.models.fused_train import use_training_ops, weights_changed
from alignment.models.modeling import completion_logits, make_token_batch
from alignment.rollout import EagerEngine, EngineSettings, SamplingParams, build_engine
from alignment.kernels.ops import bf16_primitive_missing, load_ops

OPS, WHY_NOT = load_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason=f"fused operators not available: {WHY_NOT}")

if OPS is not None:
    from alignment.basics.errors import WeightSyncError
    from alignment.rollout.fused import FusedEngine


@pytest.fixture(
    params=[qwen2_tied, llama_untied, qwen3_tied, qwen3_untied, llama3_tied],
    ids=["qwen2-tied-gqa-bias", "llama-untied-gqa", "qwen3-tied-gqa-qknorm-head32", "qwen3-untied-gqa-qknorm", "llama3-tied-rope-scaling"],
)
def model(request):
    model = request.param()
    model.eval()
    return model


@pytest.mark.parametrize("min_new_tokens", [0, 3])
def test_greedy_output_is_token_identical_to_the_eager_engine(model, min_new_tokens):
    greedy = SamplingParams(max_new_tokens=12, min_new_tokens=min_new_tokens, greedy=True)
    free = EagerEngine(model, [VOCAB - 1], PAD).generate(PROMPTS, 1, greedy)
    stop = int(free.completion_ids[0, 4])  # an eos in the middle of row 0 (and wherever else it comes)
    eager = EagerEngine(model, [stop], PAD).generate(PROMPTS, 1, greedy)
    fused = FusedEngine(model, [stop], PAD, OPS).generate(PROMPTS, 1, greedy)
    if min_new_tokens == 0:
        assert "eos" in eager.finish_reasons and "length" in eager.finish_reasons  # rows end at different steps
    assert (eager.lengths >= min_new_tokens).all()
    assert fused.completion_ids.tolist() == eager.completion_ids.tolist()
    assert fused.completion_mask.tolist() == eager.completion_mask.tolist()
    assert fused.finish_reasons == eager.finish_reasons
    np.testing.assert_allclose(fused.logprobs, eager.logprobs, atol=1e-4)


def test_sampling_logprobs_equal_the_actor_forward(model):
    """Many rows ending at different steps, so finished rows are compacted out of the batch on the way."""
    paddle.seed(3)
    engine = FusedEngine(model, [7, 11, 13], PAD, OPS)  # frequent enough eos ids
    params = SamplingParams(max_new_tokens=16, min_new_tokens=2, temperature=0.7, top_p=0.9, top_k=40, min_p=0.02, repetition_penalty=1.1)
    rollout = engine.generate(PROMPTS, 8, params)
    lengths = rollout.lengths
    assert rollout.completion_ids.shape[0] == 24 and rollout.prompt_ids[8] == PROMPTS[1]  # prompt-major groups
    assert len(set(lengths.tolist())) > 2 and "eos" in rollout.finish_reasons, lengths
    assert (lengths >= 2).all()  # min_new_tokens held eos back
    batch = make_token_batch(rollout.prompt_ids, rollout.completion_ids, rollout.completion_mask, PAD)
    with paddle.no_grad():
        actor = token_logprobs(completion_logits(model, batch), batch.completion_ids, temperature=0.7).numpy()
    np.testing.assert_allclose(rollout.logprobs, actor * rollout.completion_mask, atol=1e-4)
    for row, length in enumerate(lengths):  # eos ends a row and nothing follows it
        ended_by_eos = rollout.completion_ids[row, length - 1] in (7, 11, 13)
        assert rollout.finish_reasons[row] == ("eos" if ended_by_eos else "length")
        assert (rollout.completion_ids[row, length:] == PAD).all()


def test_a_group_prefilled_once_decodes_as_its_prompt_alone(model):
    """generate(prompts, 3) prefills each prompt once, into a cache its group's 3 rows read (FusedEngine._prefill_groups,
    SharedPrompts); greedy, every row must equal the prompt generated alone (group size 1)."""
    engine = FusedEngine(model, [7, 11, 13], PAD, OPS)
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    alone, grouped = engine.generate(PROMPTS, 1, greedy), engine.generate(PROMPTS, 3, greedy)
    assert grouped.completion_ids.tolist() == np.repeat(alone.completion_ids, 3, axis=0).tolist()
    assert grouped.finish_reasons == [reason for reason in alone.finish_reasons for _ in range(3)]
    np.testing.assert_allclose(grouped.logprobs, np.repeat(alone.logprobs, 3, axis=0), atol=1e-5)


def test_same_seed_same_completions():
    model = qwen2_tied()
    engine = FusedEngine(model, [VOCAB - 1], PAD, OPS)
    params = SamplingParams(max_new_tokens=8)
    paddle.seed(9)
    first = engine.generate(PROMPTS, 2, params).completion_ids
    paddle.seed(9)
    assert engine.generate(PROMPTS, 2, params).completion_ids.tolist() == first.tolist()
    assert engine.generate(PROMPTS, 2, params).completion_ids.tolist() != first.tolist()


@pytest.mark.parametrize("make_model", [qwen2_tied, qwen3_tied], ids=["qwen2", "qwen3"])
def test_the_weight_sync_check_catches_a_stale_layout_and_sync_repairs_it(make_model):
    model = make_model()
    engine = FusedEngine(model, [VOCAB - 1], PAD, OPS)
    assert engine.check_weight_sync() < 1e-5
    q_proj = model.model.layers[1].self_attn.q_proj.weight  # lives in the engine's concatenated copy
    q_proj.set_value(q_proj + 0.01 * paddle.randn(q_proj.shape))
    with pytest.raises(WeightSyncError, match="max \\|log-prob difference\\| on the probe"):
        engine.check_weight_sync()
    engine.sync()  # what the trainer calls after every optimizer step
    assert engine.check_weight_sync() < 1e-5
    down = model.model.layers[0].mlp.down_proj.weight  # read in place: no copy to go stale
    down.set_value(down * 1.5)
    assert engine.check_weight_sync() < 1e-5
    if make_model is qwen3_tied:  # the per-head q/k norms are read in place too
        for norm in (model.model.layers[1].self_attn.q_norm, model.model.layers[0].self_attn.k_norm):
            norm.weight.set_value(norm.weight * 1.5)
        assert engine.check_weight_sync() < 1e-5
    head = model.lm_head.weight  # tied to the embedding; packed into a copy where the operators have MKL
    head.set_value(head * 1.1)
    if hasattr(OPS, "grpo_pack_weight"):
        with pytest.raises(WeightSyncError):
            engine.check_weight_sync()
        engine.sync()
    assert engine.check_weight_sync() < 1e-5


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_sync_stops_where_its_refresh_left_the_engine_stale(monkeypatch, bf16):
    """sync(), which the trainer calls after every optimizer step (rollout/weight_sync_gap is what it returns), checks
    the engine it has just refreshed. A fresh engine's gap cannot show that the check works: it is rounding, and
    exactly 0 where the two forwards round alike (bf16 matmuls on an AMX Xeon). An engine whose refresh missed the
    new weights can: its gap is whole nats (2.4 measured in float32), over even the bf16 tolerance (0.25)."""
    missing = bf16_primitive_missing() if bf16 else None
    if missing:
        pytest.skip(f"this CPU lacks what the bf16 engine needs: {missing}")
    model = qwen2_tied()
    if bf16:
        use_training_ops(model, bf16=True)
    model.eval()
    engine = FusedEngine(model, [VOCAB - 1], PAD, OPS, bf16=bf16)
    held = engine.layers
    monkeypatch.setattr(engine, "_layer_weights", lambda: held)  # the refresh of the layers' weight copies skipped
    paddle.seed(5)
    for layer in model.model.layers:  # what q|k|v and gate|up copy, in both engines
        for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
            projection.weight.set_value(projection.weight + 0.1 * paddle.randn(projection.weight.shape))
    weights_changed(model)  # as the trainer after a step: the bf16 actor's own copies remade
    with pytest.raises(WeightSyncError, match="max \\|log-prob difference\\| on the probe is"):
        engine.sync()
    monkeypatch.undo()
    assert 0 <= engine.sync() <= engine.tolerance  # refreshed, the same check passes


def test_build_engine_warns_and_falls_back_for_a_model_it_does_not_run():
    paddle.seed(1)
    phi3 = Phi3ForCausalLM(Phi3Config(**SHAPE))  # a fused q|k|v projection: not a layout the fused engine runs
    settings = EngineSettings(fused=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = build_engine(settings, phi3, [VOCAB - 1], PAD)
    assert isinstance(engine, EagerEngine)
    assert any("model_type 'phi3'" in str(w.message) and "eager engine" in str(w.message) for w in caught)
    assert isinstance(build_engine(settings, qwen2_tied(), [VOCAB - 1], PAD), FusedEngine)
    assert isinstance(build_engine(settings, qwen3_tied(), [VOCAB - 1], PAD), FusedEngine)
    paddle.seed(2)
    with_o_bias = Qwen3ForCausalLM(Qwen3Config(attention_bias=True, head_dim=16, **SHAPE))
    with pytest.warns(UserWarning, match="a bias on o_proj .* generating with the eager engine"):
        assert isinstance(build_engine(settings, with_o_bias, [VOCAB - 1], PAD), EagerEngine)
