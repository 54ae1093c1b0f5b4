"""The training operators (csrc/, 8-10, 13 and grpo_silu_mul's backward) against paddle float64 references on
fresh random inputs, value and gradient with respect to every input, and the actor with its modules swapped
by alignment/models/fused_train.py against the same model unswapped. A failure names its seed; replay it with
GRPO_TEST_SEED=<seed>."""

import numpy as np
import paddle
import pytest
from helpers.float_references import bf16_round, close, rope_tables
from helpers.tiny_models import PAD, PROMPTS, llama3_tied, llama_untied, qwen2_tied, qwen3_tied, qwen3_untied

from alignment.algo.logprobs import token_logprobs
from alignment.models.fused_train import TrainingAttention, TrainingMLP, TrainingRMSNorm, use_training_ops
from alignment.models.lora import apply_lora, lora_layers
from alignment.models.modeling import completion_logits, enable_recompute, load_causal_lm, make_token_batch, save_model
from alignment.rollout import EagerEngine, SamplingParams
from alignment.rollout.fused import FusedEngine
from alignment.kernels.ops import load_ops
from alignment.basics.runtime import contiguous_kernels

MASKED = float(np.finfo(np.float32).min)  # what paddleformers' additive mask holds where a key is hidden


def leaf(a, dtype="float32"):
    tensor = paddle.to_tensor(np.ascontiguousarray(a), dtype=dtype)
    tensor.stop_gradient = False
    return tensor


def check_op(op, reference, inputs, rng, what):
    """op(*float32 inputs) against reference(*float64 inputs): the outputs, and the gradients of sum(output *
    random weights) with respect to every input."""
    ours = [leaf(a) for a in inputs]
    exact = [leaf(a, "float64") for a in inputs]
    out, ref = op(*ours), reference(*exact)
    out, ref = (list(out), list(ref)) if isinstance(out, (tuple, list)) else ([out], [ref])
    weights = [rng.standard_normal(r.shape) for r in ref]
    for i, (o, r) in enumerate(zip(out, ref)):
        close(o.numpy(), r.numpy(), rng, f"{what} output {i}")
    grads = paddle.grad(out, ours, [paddle.to_tensor(w, dtype="float32") for w in weights])
    ref_grads = paddle.grad(ref, exact, [paddle.to_tensor(w) for w in weights])
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        close(g.numpy(), r.numpy(), rng, f"{what} gradient of input {i}", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(7, 64), (3, 5, 96), (2, 2, 3, 256)])
def test_rms_norm(ops, rng, shape):
    eps = 1e-6

    def reference(x, w):
        return w * (x * paddle.rsqrt((x * x).mean(-1, keepdim=True) + eps))

    inputs = [rng.standard_normal(shape) * 3, rng.standard_normal(shape[-1])]
    check_op(lambda x, w: ops.grpo_rms_norm(x, w, eps), reference, inputs, rng, "rms_norm")


@pytest.mark.parametrize("shape", [(5, 2 * 64), (2, 7, 2 * 200)])
def test_silu_mul(ops, rng, shape):
    def reference(x):
        gate, up = x.chunk(2, axis=-1)
        return gate * paddle.nn.functional.sigmoid(gate) * up

    x = rng.standard_normal(shape) * 4
    x.flat[:4] = [-100.0, 100.0, 0.0, -30.0]  # saturated and zero gates
    check_op(ops.grpo_silu_mul, reference, [x], rng, "silu_mul")


def rotate_half(x):
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


@pytest.mark.parametrize("B,T,H,KVH,D", [(2, 5, 4, 2, 16), (1, 3, 14, 2, 64), (3, 4, 2, 2, 8)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_rope_qkv(ops, rng, B, T, H, KVH, D, with_bias):
    cos, sin = rope_tables(64, D)
    positions = rng.integers(0, 64, size=(B, T))
    cos, sin = paddle.to_tensor(cos[positions]), paddle.to_tensor(sin[positions])  # (B, T, D) each, as the model's

    def reference(qkv, bias=None):
        x = qkv + bias if bias is not None else qkv
        c, s = cos.astype("float64").unsqueeze(1), sin.astype("float64").unsqueeze(1)  # (B, 1, T, D)
        q, k, v = (x[..., a * D : b * D].reshape([B, T, b - a, D]).transpose([0, 2, 1, 3])
                   for a, b in [(0, H), (H, H + KVH), (H + KVH, H + 2 * KVH)])
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v

    def op(qkv, bias=None):
        return ops.grpo_rope_qkv(qkv, bias, cos, sin, H, KVH)

    width = (H + 2 * KVH) * D
    inputs = [rng.standard_normal((B, T, width))] + ([rng.standard_normal(width)] if with_bias else [])
    check_op(op, reference, inputs, rng, "rope_qkv")


def test_rope_qkv_checks_its_inputs(ops):
    cos = paddle.ones([2, 3, 8])
    with pytest.raises(Exception, match=r"qkv must be \[B, T, \(H \+ 2\*KVH\) \* D\] = \[2, 3, 64\]"):
        ops.grpo_rope_qkv(paddle.ones([2, 3, 56]), None, cos, cos, 4, 2)
    with pytest.raises(Exception, match="bias must be"):
        ops.grpo_rope_qkv(paddle.ones([2, 3, 64]), paddle.ones([8]), cos, cos, 4, 2)


def padded_causal_mask(first: list, length: int) -> np.ndarray:
    """(B, 1, T, T) additive mask as paddleformers builds it: causal, and keys before a row's first real token
    hidden (left padding), so the padded queries of a row see no key at all."""
    after_padding = np.arange(length) >= np.array(first)[:, None, None]  # (B, 1, T) over keys
    visible = np.tril(np.ones((length, length), dtype=bool))[None] & after_padding
    return np.where(visible, 0.0, MASKED)[:, None].astype(np.float32)


@pytest.mark.parametrize("group", [1, 2, 7])
def test_masked_softmax(ops, rng, group):
    B, KVH, T = 3, 2, 6
    mask = paddle.to_tensor(padded_causal_mask([0, 2, 5], T))
    scale = 0.125

    def reference(scores):
        rows = scores.reshape([B, KVH, group, T, T]) * scale + mask.astype("float64").unsqueeze(1)
        return paddle.nn.functional.softmax(rows, axis=-1).reshape(scores.shape)

    scores = rng.standard_normal((B, KVH, group * T, T)) * 5
    check_op(lambda s: ops.grpo_masked_softmax(s, mask, scale), reference, [scores], rng, "masked_softmax")
    probs = ops.grpo_masked_softmax(paddle.to_tensor(scores, dtype="float32"), mask, scale).numpy()
    np.testing.assert_allclose(probs[2, :, 0], 1.0 / T)  # row 2's first query sees no key: uniform, as paddle's softmax


def test_masked_softmax_checks_the_mask(ops):
    with pytest.raises(Exception, match=r"mask must be \[B, 1, Lq, L\]"):
        ops.grpo_masked_softmax(paddle.ones([2, 2, 10, 4]), paddle.zeros([2, 1, 3, 4]), 1.0)


def attention_reference(q, k, v, mask, group, scale):
    """float64 softmax(scale q k^T + mask) v with the group's heads stacked: q (B, KVH, G T, D), mask (B, 1, T, S)."""
    B, KVH, rows, D = q.shape
    scores = paddle.matmul(q, k, transpose_y=True).reshape([B, KVH, group, rows // group, -1]) * scale
    probs = paddle.nn.functional.softmax(scores + mask.astype("float64").unsqueeze(1), axis=-1)
    return paddle.matmul(probs.reshape([B, KVH, rows, -1]), v)


def needs_attention_op(ops):
    if not hasattr(ops, "grpo_attention"):
        pytest.skip("the operators were built without oneDNN (no libdnnl.so.3 in paddle's libs): no grpo_attention")


# T past one 64-query block and not a multiple of it; G 1 and 3 (SmolLM2); S > T: a cached prompt of 5 keys that
# every query sees (prefix_grouper's forward); padding of 0 to all but one key, and rows with none visible.
@pytest.mark.parametrize("B,KVH,G,T,cached,D", [(3, 2, 3, 70, 0, 16), (2, 1, 1, 130, 0, 8), (2, 3, 3, 9, 5, 64), (1, 1, 2, 1, 0, 4)])
def test_attention(ops, rng, B, KVH, G, T, cached, D):
    needs_attention_op(ops)
    first = [0, T - 1, T + 3][:B] if T > 1 else [0]
    mask_np = padded_causal_mask(first, T)
    if cached:  # every query also sees the cached keys in front
        mask_np = np.concatenate([np.zeros((B, 1, T, cached), np.float32), mask_np], axis=-1)
    mask = paddle.to_tensor(mask_np)
    S, scale = T + cached, D**-0.5
    inputs = [rng.standard_normal(shape) for shape in ((B, KVH, G * T, D), (B, KVH, S, D), (B, KVH, S, D))]
    check_op(lambda q, k, v: ops.grpo_attention(q, k, v, mask, scale)[0],
             lambda q, k, v: attention_reference(q, k, v, mask, G, scale), inputs, rng, "attention")


def bf16_attention_built() -> bool:  # csrc/build.py compiles with -march=native: the bf16 products where the CPU has them
    return "avx512_bf16" in open("/proc/cpuinfo").read()


@pytest.mark.parametrize("B,KVH,G,T,cached,D", [(3, 2, 3, 70, 0, 16), (2, 1, 1, 130, 0, 8), (2, 3, 3, 9, 5, 64), (1, 1, 2, 1, 0, 4),
                                                (2, 1, 2, 67, 3, 7)])
def test_attention_with_bf16_products_against_float64(ops, rng, B, KVH, G, T, cached, D):
    """bf16=True rounds q, k, v, the upstream gradient, the weights P and dS to bf16 before each product (fp32 sums):
    against float64 on the rounded inputs, each product may be off by its rounded factor's 2^-8 (P and dS) times
    |factor| @ |other|, plus fp32's own rounding. Where the operators are not built for AVX512-BF16 it is the fp32
    path, bit for bit. (A 7-wide head: pairs padded; blocks that start at an odd key.)"""
    needs_attention_op(ops)
    first = [1, T - 1, T + 3][:B] if T > 1 else [0]
    mask_np = padded_causal_mask(first, T)
    if cached:
        mask_np = np.concatenate([np.zeros((B, 1, T, cached), np.float32), mask_np], axis=-1)
    S, scale, mask = T + cached, D**-0.5, paddle.to_tensor(mask_np)
    q, k, v = [leaf(rng.standard_normal(shape)) for shape in ((B, KVH, G * T, D), (B, KVH, S, D), (B, KVH, S, D))]
    upstream = rng.standard_normal(q.shape).astype(np.float32)
    results = {}
    for bf16 in (False, True):
        out = ops.grpo_attention(q, k, v, mask, scale, bf16)[0]
        results[bf16] = [out.numpy()] + [g.numpy() for g in paddle.grad(out, [q, k, v], paddle.to_tensor(upstream))]
    if not bf16_attention_built():
        for fp32, bf16 in zip(results[False], results[True]):
            np.testing.assert_array_equal(bf16, fp32)
        return
    rq, rdo = [bf16_round(a).reshape(B, KVH, G, T, D) for a in (q.numpy(), upstream)]
    rk, rv = bf16_round(k.numpy()), bf16_round(v.numpy())  # (B, KVH, S, D), shared by the group's heads
    scores = scale * np.einsum("bhgtd,bhsd->bhgts", rq, rk) + mask_np[:, :, None].astype(np.float64)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = np.einsum("bhgtd,bhsd->bhgts", rdo, rv)
    dot = (p * dp).sum(-1, keepdims=True)
    ds, ds_size = scale * p * (dp - dot), scale * p * (np.abs(dp) + np.abs(dot))  # ds_size: the size fp32's rounding sees
    half_ulp = 1.01 * 2.0**-8
    checks = [  # (what, the operator's, float64's, the bound)
        ("out", results[True][0], np.einsum("bhgts,bhsd->bhgtd", p, rv), half_ulp * np.einsum("bhgts,bhsd->bhgtd", p, np.abs(rv))),
        ("dq", results[True][1], np.einsum("bhgts,bhsd->bhgtd", ds, rk),
         half_ulp * np.einsum("bhgts,bhsd->bhgtd", np.abs(ds), np.abs(rk)) + 1e-4 * np.einsum("bhgts,bhsd->bhgtd", ds_size, np.abs(rk))),
        ("dk", results[True][2], np.einsum("bhgts,bhgtd->bhsd", ds, rq),
         half_ulp * np.einsum("bhgts,bhgtd->bhsd", np.abs(ds), np.abs(rq)) + 1e-4 * np.einsum("bhgts,bhgtd->bhsd", ds_size, np.abs(rq))),
        ("dv", results[True][3], np.einsum("bhgts,bhgtd->bhsd", p, rdo), half_ulp * np.einsum("bhgts,bhgtd->bhsd", p, np.abs(rdo))),
    ]
    for what, actual, exact, bound in checks:
        excess = np.abs(actual.reshape(exact.shape) - exact) - bound - 1e-4 * bound.max() - 1e-6
        assert excess.max() <= 0, f"{what}: over the bound by {excess.max():.3g} (bound {bound.max():.3g})"
    assert np.abs(results[True][0] - results[False][0]).max() > 0  # the products did run in bf16


def test_attention_gives_hidden_queries_the_uniform_average_and_no_gradient(ops, rng):
    """A padded query sees no key: paddle's softmax gives it the mean of all values (the stored-weights path does too);
    its output never reaches the loss, so its upstream gradient is 0 and so are its contributions."""
    needs_attention_op(ops)
    B, KVH, G, T, D = 1, 1, 2, 8, 4
    mask = paddle.to_tensor(padded_causal_mask([3], T))
    q, k, v = [leaf(rng.standard_normal(shape)) for shape in ((B, KVH, G * T, D), (B, KVH, T, D), (B, KVH, T, D))]
    out = ops.grpo_attention(q, k, v, mask, 0.5)[0]
    for head in range(G):
        close(out.numpy()[0, 0, head * T : head * T + 3], np.tile(v.numpy()[0, 0].mean(0), (3, 1)), rng, "hidden queries")
    upstream = np.ones(out.shape, np.float32)
    upstream[0, 0, 0:3] = upstream[0, 0, T : T + 3] = 0.0  # the hidden queries' outputs are not used
    grads = paddle.grad(out, [q, k, v], paddle.to_tensor(upstream))
    assert not grads[0].numpy()[0, 0, 0:3].any() and not grads[0].numpy()[0, 0, T : T + 3].any()
    assert not grads[1].numpy()[0, 0, :3].any() and not grads[2].numpy()[0, 0, :3].any()


def test_attention_checks_its_inputs(ops):
    needs_attention_op(ops)
    k = v = paddle.ones([2, 1, 5, 4])
    with pytest.raises(Exception, match=r"shapes disagree"):
        ops.grpo_attention(paddle.ones([2, 1, 10, 4]), k, v, paddle.zeros([2, 1, 3, 5]), 1.0)  # 10 rows: not G x 3
    with pytest.raises(Exception, match=r"must be float32"):
        ops.grpo_attention(paddle.ones([2, 1, 10, 4], "float64"), k, v, paddle.zeros([2, 1, 5, 5]), 1.0)


@pytest.mark.parametrize("B,H,T,D", [(2, 9, 5, 64), (1, 3, 1, 16), (3, 2, 7, 8)])
def test_heads_to_tokens(ops, rng, B, H, T, D):
    def reference(x):
        return x.transpose([0, 2, 1, 3]).reshape([B, T, H * D])

    check_op(lambda x: ops.grpo_heads_to_tokens(x, H), reference, [rng.standard_normal((B, H, T, D))], rng, "heads_to_tokens")


def test_heads_to_tokens_checks_its_input(ops):
    with pytest.raises(Exception, match=r"x must be \[B, H, T, D\] with H = num_heads = 4, got \[2, 3, 5, 8\]"):
        ops.grpo_heads_to_tokens(paddle.ones([2, 3, 5, 8]), 4)


# --------------------------------------------------------------------------------------------- the actor


def swapped(build):
    model = build()
    assert use_training_ops(model) is None
    return model


@pytest.fixture(
    params=[qwen2_tied, llama_untied, llama3_tied, qwen3_tied, qwen3_untied],
    ids=["qwen2-tied-gqa-bias", "llama-untied-gqa", "llama3-tied-rope-scaling", "qwen3-tied-qknorm-head32", "qwen3-untied-qknorm"],
)
def build(request):
    if load_ops()[0] is None:
        pytest.skip(f"fused operators not available: {load_ops()[1]}")
    return request.param


def loss_and_gradients(model) -> tuple:
    """A masked mean log-prob over left-padded prompts and right-padded completions, and every trainable
    parameter's gradient, from the trainer's forward (contiguous kernels, no KV cache)."""
    draw = np.random.default_rng(0)
    prompts = [draw.integers(3, 97, n).tolist() for n in (5, 9, 3, 7)]
    completion_mask = np.ones((4, 6), np.float32)
    completion_mask[1, 4:] = completion_mask[3, 2:] = 0
    batch = make_token_batch(prompts, draw.integers(3, 97, (4, 6)), completion_mask, PAD)
    model.train()
    with contiguous_kernels():
        logprobs = token_logprobs(completion_logits(model, batch), batch.completion_ids)
        loss = -(logprobs * batch.completion_mask).sum() / batch.completion_mask.sum()
        loss.backward()
    return float(loss), {name: p.grad.numpy() for name, p in model.named_parameters() if not p.stop_gradient}


@pytest.mark.parametrize("recompute", [False, True])
def test_swapped_model_has_the_loss_and_gradients_of_the_original(build, recompute):
    original, fast = build(), swapped(build)
    if recompute:
        enable_recompute(fast, "full")
    loss, grads = loss_and_gradients(original)
    fast_loss, fast_grads = loss_and_gradients(fast)
    assert abs(fast_loss - loss) < 1e-5
    assert fast_grads.keys() == grads.keys()
    for name, grad in grads.items():
        np.testing.assert_allclose(fast_grads[name], grad, rtol=1e-4, atol=1e-5, err_msg=name)


def qwen3_with_lora():
    """qwen3_tied with adapters on every projection, B drawn at random (not 0) so that they count."""
    model = apply_lora(qwen3_tied(), 4, 8.0, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    for layer in lora_layers(model).values():
        layer.lora_B.set_value(paddle.randn(layer.lora_B.shape) * 0.5)
    return model


def test_swapped_qwen3_with_lora_has_the_loss_and_adapter_gradients_of_the_original(ops):
    original, fast = qwen3_with_lora(), swapped(qwen3_with_lora)
    loss, grads = loss_and_gradients(original)
    fast_loss, fast_grads = loss_and_gradients(fast)
    assert abs(fast_loss - loss) < 1e-5
    assert set(grads) == {f"{name}.lora_{m}" for name in lora_layers(original) for m in "AB"} == set(fast_grads)
    for name, grad in grads.items():
        np.testing.assert_allclose(fast_grads[name], grad, rtol=1e-4, atol=1e-5, err_msg=name)


def test_swap_keeps_the_parameters_and_their_names(build):
    model = build()
    before = dict(model.named_parameters())
    state_keys = list(model.state_dict())
    assert use_training_ops(model) is None
    layer = model.model.layers[0]
    assert isinstance(layer.input_layernorm, TrainingRMSNorm) and isinstance(model.model.norm, TrainingRMSNorm)
    assert isinstance(layer.self_attn, TrainingAttention) and isinstance(layer.mlp, TrainingMLP)
    assert list(model.state_dict()) == state_keys
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[name] is p for name, p in before.items())


def test_swapped_model_generates_what_the_original_does(build):
    """The eager engine's forward with a KV cache (prefill, then one token at a time) through the swapped
    attention."""
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    original, fast = build(), swapped(build)
    for model in (original, fast):
        model.eval()
    expected = EagerEngine(original, [96], PAD).generate(PROMPTS, 1, greedy)
    got = EagerEngine(fast, [96], PAD).generate(PROMPTS, 1, greedy)
    assert got.completion_ids.tolist() == expected.completion_ids.tolist()
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)


def test_the_fused_engine_runs_the_swapped_model(ops, build):
    """The trainer swaps the modules in before it builds the rollout engine, which reads the weights (Qwen3's
    q_norm / k_norm too) through the swapped modules and checks itself against the swapped forward."""
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    original, fast = build(), swapped(build)
    for model in (original, fast):
        model.eval()
    expected = EagerEngine(original, [96], PAD).generate(PROMPTS, 1, greedy)
    engine = FusedEngine(fast, [96], PAD, ops)
    assert engine.check_weight_sync() < 1e-5
    got = engine.generate(PROMPTS, 1, greedy)
    assert got.completion_ids.tolist() == expected.completion_ids.tolist()
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-4)


def test_unsupported_models_are_left_alone(ops):
    model = qwen2_tied()
    model.config.attention_dropout = 0.1
    layers = list(model.model.layers[0].children())
    assert "attention_dropout" in use_training_ops(model)
    assert list(model.model.layers[0].children()) == layers


def test_a_checkpoint_of_the_swapped_model_loads_as_the_plain_model(build, tmp_path):
    model = swapped(build)
    save_model(model, str(tmp_path))
    loaded = load_causal_lm(str(tmp_path))
    assert not isinstance(loaded.model.layers[0].self_attn, TrainingAttention)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[name].numpy(), value.numpy(), err_msg=name)


def test_the_training_operators_refuse_a_model_type_only_the_rollout_engine_accepts(ops, monkeypatch):
    """The training modules keep their own list: a model type added to the fused engine's does not switch them on."""
    from alignment.rollout import fused

    model = qwen2_tied()
    model.config.model_type = "mistral"  # a Qwen2 layout under another name: the fused engine would run it once listed
    monkeypatch.setattr(fused, "SUPPORTED_MODEL_TYPES", (*fused.SUPPORTED_MODEL_TYPES, "mistral"))
    assert fused.unsupported_reason(model) is None
    layers = list(model.model.layers[0].children())
    assert "model_type 'mistral'" in use_training_ops(model)
    assert list(model.model.layers[0].children()) == layers
