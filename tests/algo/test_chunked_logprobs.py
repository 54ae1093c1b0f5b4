"""chunked_token_logprobs (alignment/algo/logprobs.py) against float64 and against the unchunked path's autograd, with
paddle's row kernels and with the compiled ones (grpo_logprob_rows and its gradient, csrc/grpo_ops.cc), and
completion_hidden + output_head (alignment/models/modeling.py) against completion_logits."""

import contextlib

import numpy as np
import paddle
import pytest
from paddleformers.transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
from helpers.tiny_models import PAD, PROMPTS, SHAPE, VOCAB, llama_untied, qwen2_tied

from alignment.algo.logprobs import (
    HeadKernels,
    ReferenceHead,
    chunked_full_kl,
    chunked_token_logprobs,
    paddle_row_grad,
    paddle_row_stats,
    token_logprobs,
)
from alignment.models.modeling import completion_hidden, completion_logits, make_token_batch, output_head
from alignment.kernels.ops import load_ops
from alignment.basics.runtime import contiguous_kernels

OPS, WHY_NOT = load_ops()


def compiled_kernels() -> HeadKernels:
    if OPS is None:
        pytest.skip(f"fused operators not available: {WHY_NOT}")
    return HeadKernels(paddle.matmul, OPS.grpo_logprob_rows, OPS.grpo_logprob_rows_grad)


ROW_KERNELS = pytest.mark.parametrize("row_kernels", [HeadKernels, compiled_kernels], ids=["paddle-rows", "compiled-rows"])

B, T, H, V = 2, 5, 8, 13  # 10 tokens: chunks of 3 leave a remainder, 64 is more than all of them
CHUNKS = [1, 3, 4, 10, 64]
TEMPERATURE = 0.7


def qwen2_untied_head_bias():
    paddle.seed(13)
    model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=False, lm_head_bias=True, **SHAPE))
    model.lm_head.bias.set_value(paddle.randn([VOCAB]) * 0.5)  # initialised to zero; make it count
    return model


def qwen3_tied():
    paddle.seed(14)
    return Qwen3ForCausalLM(Qwen3Config(tie_word_embeddings=True, **SHAPE))


MODELS = pytest.mark.parametrize(
    "build",
    [qwen2_tied, qwen2_untied_head_bias, llama_untied, qwen3_tied],
    ids=["qwen2-tied", "qwen2-untied-head-bias", "llama-untied", "qwen3-tied"],
)


def random_inputs(with_bias: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "hidden": rng.normal(size=(B, T, H)) * 2.0,  # logits of a few units, as a real head gives
        "weight": rng.normal(size=(V, H)),
        "bias": rng.normal(size=V) if with_bias else None,
        "tokens": rng.integers(0, V, size=(B, T)),
        "upstream": rng.normal(size=(B, T)),  # the loss's weight on each log-prob: a non-uniform gradient
    }


def tensors(inputs: dict, trainable=("hidden", "weight", "bias")) -> dict:
    """float64 arrays -> float32 paddle tensors; those named in `trainable` require gradients."""
    out = {}
    for name, value in inputs.items():
        if value is None:
            out[name] = None
            continue
        out[name] = paddle.to_tensor(value.astype(np.int64 if name == "tokens" else np.float32))
        out[name].stop_gradient = name not in trainable
    return out


def unchunked_logprobs(t: dict) -> paddle.Tensor:
    logits = paddle.matmul(t["hidden"], t["weight"], transpose_y=True)
    if t["bias"] is not None:
        logits = logits + t["bias"]
    return token_logprobs(logits, t["tokens"], TEMPERATURE)


def gradients(t: dict, logprobs: paddle.Tensor) -> dict:
    (logprobs * t["upstream"]).sum().backward()
    return {name: None if t[name] is None or t[name].grad is None else t[name].grad.numpy() for name in ("hidden", "weight", "bias")}


@ROW_KERNELS
@pytest.mark.parametrize("chunk_tokens", CHUNKS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_logprobs_and_entropy_against_float64(chunk_tokens, with_bias, row_kernels):
    inputs = random_inputs(with_bias)
    logits = inputs["hidden"] @ inputs["weight"].T + (inputs["bias"] if with_bias else 0.0)  # (B, T, V) float64
    scaled = logits / TEMPERATURE
    logp64 = scaled - np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1, keepdims=True)) - scaled.max(-1, keepdims=True)
    t = tensors(inputs)
    logprobs, entropy = chunked_token_logprobs(t["hidden"], t["weight"], t["bias"], t["tokens"], TEMPERATURE, chunk_tokens, row_kernels())
    np.testing.assert_allclose(logprobs.numpy(), np.take_along_axis(logp64, inputs["tokens"][..., None], -1)[..., 0], atol=1e-5)
    np.testing.assert_allclose(entropy.numpy(), -(np.exp(logp64) * logp64).sum(-1), atol=1e-5)
    assert logprobs.shape == entropy.shape == [B, T] and entropy.stop_gradient and not logprobs.stop_gradient


@ROW_KERNELS
@pytest.mark.parametrize("chunk_tokens", CHUNKS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("kernels", [contextlib.nullcontext, contiguous_kernels], ids=["strided", "contiguous"])
def test_gradients_equal_the_unchunked_path(chunk_tokens, with_bias, kernels, row_kernels):
    """Under both kernel modes: the trainer's update runs under contiguous_kernels, where slices are copies."""
    inputs = random_inputs(with_bias, seed=1)
    reference = tensors(inputs)
    expected = gradients(reference, unchunked_logprobs(reference))
    t = tensors(inputs)
    with kernels():
        logprobs, _ = chunked_token_logprobs(t["hidden"], t["weight"], t["bias"], t["tokens"], TEMPERATURE, chunk_tokens, row_kernels())
        # relative: float32 values near -19 are 1.9e-6 apart, and MKL's AVX-512 path rounds a 1-row matmul
        # differently from a 10-row one
        np.testing.assert_allclose(logprobs.numpy(), unchunked_logprobs(reference).numpy(), rtol=1e-6, atol=1e-6)
        got = gradients(t, logprobs)
    for name in ("hidden", "weight", "bias"):
        if with_bias or name != "bias":
            np.testing.assert_allclose(got[name], expected[name], atol=1e-5, err_msg=name)


@ROW_KERNELS
@pytest.mark.parametrize("chunk_tokens", [1, 3, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_entropy_gradient_equals_autograd_through_the_whole_logits_in_float64(chunk_tokens, with_bias, row_kernels):
    """entropy_grad: the loss sum(u log p) + sum(e H) (an entropy bonus beside the policy term) differentiated
    through the chunks, against paddle's autograd over the (B, T, V) logits in float64."""
    inputs = random_inputs(with_bias, seed=4)
    entropy_upstream = np.random.default_rng(5).normal(size=(B, T))
    reference = {
        name: None if value is None else paddle.to_tensor(value, stop_gradient=name not in ("hidden", "weight", "bias"))
        for name, value in inputs.items()
    }
    logits = paddle.matmul(reference["hidden"], reference["weight"], transpose_y=True) + (reference["bias"] if with_bias else 0.0)
    logp_all = paddle.nn.functional.log_softmax(logits / TEMPERATURE, axis=-1)  # float64
    chosen = paddle.take_along_axis(logp_all, reference["tokens"].unsqueeze(-1), -1).squeeze(-1)
    entropy64 = -(logp_all.exp() * logp_all).sum(-1)
    ((chosen * reference["upstream"]).sum() + (entropy64 * paddle.to_tensor(entropy_upstream)).sum()).backward()
    t = tensors(inputs)
    logprobs, entropy = chunked_token_logprobs(
        t["hidden"], t["weight"], t["bias"], t["tokens"], TEMPERATURE, chunk_tokens, row_kernels(), entropy_grad=True
    )
    assert not entropy.stop_gradient
    ((logprobs * t["upstream"]).sum() + (entropy * paddle.to_tensor(entropy_upstream.astype(np.float32))).sum()).backward()
    np.testing.assert_allclose(entropy.numpy(), entropy64.numpy(), atol=1e-5)
    for name in ("hidden", "weight") + (("bias",) if with_bias else ()):
        np.testing.assert_allclose(
            t[name].grad.numpy(), reference[name].grad.numpy(), rtol=1e-5, atol=2e-5, err_msg=name
        )  # float32 against float64


@pytest.mark.parametrize(
    "trainable",
    [("hidden",), ("weight", "bias"), ("hidden", "bias"), ()],
    ids=["frozen-head", "frozen-hidden", "frozen-weight", "nothing-trains"],
)
@ROW_KERNELS
def test_frozen_inputs_get_no_gradient(trainable, row_kernels):
    inputs = random_inputs(with_bias=True, seed=2)
    reference, t = tensors(inputs, trainable), tensors(inputs, trainable)
    logprobs, _ = chunked_token_logprobs(t["hidden"], t["weight"], t["bias"], t["tokens"], TEMPERATURE, 3, row_kernels())
    assert logprobs.stop_gradient == (not trainable)
    if not trainable:
        return
    expected = gradients(reference, unchunked_logprobs(reference))
    got = gradients(t, logprobs)
    for name in ("hidden", "weight", "bias"):
        if name in trainable:
            np.testing.assert_allclose(got[name], expected[name], atol=1e-5, err_msg=name)
        else:
            assert got[name] is None, name


def real_vocabulary_rows(seed: int) -> dict:
    """Rows of logits as SmolLM2's head gives them (49,152 words, a few units apart, some rows peaked), targets,
    normalisers and incoming gradients: what the compiled row kernels see in training."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(7, 49152)) * 3.0
    logits[2, 123] += 40.0  # one near-certain token: p close to 1, log p close to 0
    return {
        "logits": logits,
        "targets": rng.integers(0, 49152, size=(7, 1)),
        "scale": rng.normal(size=(7, 1)),
        "entropy_scale": rng.normal(size=(7, 1)),
    }


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_compiled_rows_equal_float64_and_paddles_rows_at_a_real_vocabulary(temperature, with_entropy):
    kernels = compiled_kernels()
    r = real_vocabulary_rows(seed=6)
    scaled = r["logits"] / temperature
    normaliser64 = scaled.max(-1, keepdims=True) + np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp64 = scaled - normaliser64  # (c, V)
    p64 = np.exp(logp64)
    entropy64 = -(p64 * logp64).sum(-1, keepdims=True)
    f32 = {name: paddle.to_tensor(value.astype(np.int64 if name == "targets" else np.float32)) for name, value in r.items()}
    logprobs, entropy, normaliser = kernels.row_stats(f32["logits"].clone(), f32["targets"], temperature)
    np.testing.assert_allclose(normaliser.numpy(), normaliser64, rtol=1e-6)
    np.testing.assert_allclose(logprobs.numpy(), np.take_along_axis(logp64, r["targets"], -1), atol=2e-5)
    np.testing.assert_allclose(entropy.numpy(), entropy64, atol=2e-5)
    # no further from float64 than paddle's chain is (its float32 logsumexp is up to 1e-4 off on these rows)
    for got, paddles, exact in zip((logprobs, entropy, normaliser), paddle_row_stats(f32["logits"].clone(), f32["targets"], temperature),
                                   (np.take_along_axis(logp64, r["targets"], -1), entropy64, normaliser64)):
        assert np.abs(got.numpy() - exact).max() <= max(np.abs(paddles.numpy() - exact).max(), 2e-5)

    entropy_scale = f32["entropy_scale"] if with_entropy else None
    grad = kernels.row_grad(f32["logits"].clone(), f32["targets"], normaliser, entropy, f32["scale"], entropy_scale, temperature)
    grad64 = -p64 * (r["scale"] + (r["entropy_scale"] * (logp64 + entropy64) if with_entropy else 0.0))
    np.put_along_axis(grad64, r["targets"], np.take_along_axis(grad64, r["targets"], -1) + r["scale"], -1)
    np.testing.assert_allclose(grad.numpy(), grad64, rtol=1e-4, atol=1e-7)
    reference = paddle_row_grad(f32["logits"].clone(), f32["targets"], normaliser, entropy, f32["scale"], entropy_scale, temperature)
    np.testing.assert_allclose(grad.numpy(), reference.numpy(), rtol=1e-4, atol=1e-7)  # both near float32 rounding


def test_compiled_rows_keep_nan_and_refuse_targets_outside_the_vocabulary():
    kernels = compiled_kernels()
    logits = paddle.to_tensor(np.random.default_rng(7).normal(size=(3, 50)).astype(np.float32))
    logits[1, 7] = float("nan")
    logprobs, entropy, normaliser = kernels.row_stats(logits, paddle.to_tensor([[0], [1], [2]], dtype="int64"), 1.0)
    assert (
        np.isnan(logprobs.numpy()[1]) and np.isnan(entropy.numpy()[1]) and np.isnan(normaliser.numpy()[1])
    )  # the trainer's non-finite check sees it
    assert np.isfinite(logprobs.numpy()[[0, 2]]).all()
    with pytest.raises(Exception, match=r"target token 50 is outside the vocabulary \[0, 50\)"):
        kernels.row_stats(logits, paddle.to_tensor([[0], [50], [2]], dtype="int64"), 1.0)


def test_no_grad_gives_the_same_values():
    t = tensors(random_inputs(with_bias=False, seed=3))
    logprobs, entropy = chunked_token_logprobs(t["hidden"], t["weight"], None, t["tokens"], TEMPERATURE, 4)
    with paddle.no_grad():
        frozen_logprobs, frozen_entropy = chunked_token_logprobs(t["hidden"], t["weight"], None, t["tokens"], TEMPERATURE, 4)
    np.testing.assert_array_equal(frozen_logprobs.numpy(), logprobs.numpy())
    np.testing.assert_array_equal(frozen_entropy.numpy(), entropy.numpy())
    assert frozen_logprobs.stop_gradient


def test_chunk_tokens_must_be_positive():
    t = tensors(random_inputs(with_bias=False))
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_logprobs(t["hidden"], t["weight"], None, t["tokens"], TEMPERATURE, 0)


def token_batch():
    rng = np.random.default_rng(4)
    completions = rng.integers(1, VOCAB, size=(len(PROMPTS), 6))
    mask = np.ones(completions.shape, dtype=np.float32)
    mask[1, 4:] = 0  # one completion ends early: right padding
    return make_token_batch(PROMPTS, completions, mask, PAD)


@MODELS
def test_head_of_completion_hidden_is_completion_logits(build):
    model, batch = build(), token_batch()
    model.eval()
    with paddle.no_grad():
        weight, bias = output_head(model)
        logits = paddle.matmul(completion_hidden(model, batch), weight, transpose_y=True)
        if bias is not None:
            logits = logits + bias
        # not bit-equal: the head's matmul over (B, T) rows instead of (B, P+T) rows rounds differently
        np.testing.assert_allclose(logits.numpy(), completion_logits(model, batch).numpy(), rtol=0, atol=1e-5)
    assert (bias is not None) == (build is qwen2_untied_head_bias)
    assert (weight is model.model.embed_tokens.weight) == model.config.tie_word_embeddings  # tied: one Parameter, used twice


@MODELS
def test_model_gradients_equal_the_unchunked_path(build):
    """Every parameter's gradient of a masked, advantage-weighted loss, including a tied embedding's, which
    collects one gradient through the embedding lookup and one through the PyLayer."""
    model, batch = build(), token_batch()
    model.eval()  # no dropout either way; gradients still flow
    coefficients = paddle.to_tensor(np.random.default_rng(5).normal(size=batch.completion_ids.shape).astype(np.float32))
    weights = coefficients * batch.completion_mask  # (B, T)

    def parameter_gradients(logprobs):
        (logprobs * weights).sum().backward()
        grads = {name: p.grad.numpy().copy() for name, p in model.named_parameters()}
        model.clear_gradients()
        return grads

    weight, bias = output_head(model)
    with contiguous_kernels():  # as the trainer's update runs
        expected = parameter_gradients(token_logprobs(completion_logits(model, batch), batch.completion_ids, TEMPERATURE))
        logprobs, _ = chunked_token_logprobs(completion_hidden(model, batch), weight, bias, batch.completion_ids, TEMPERATURE, 5)
        got = parameter_gradients(logprobs)
    assert got.keys() == expected.keys()
    for name in expected:  # float32 rounding, relative to each tensor's largest gradient (about 6e-7 seen)
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-5 * np.abs(expected[name]).max(), err_msg=name)


@pytest.mark.parametrize("chunk_tokens", [1, 3, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_full_kl_and_its_gradient_equal_autograd_through_both_models_logits_in_float64(chunk_tokens, with_bias):
    """kl_estimator full: KL(pi || pi_ref) over the whole vocabulary, through the chunks, against paddle's autograd over
    the (B, T, V) logits of both heads in float64; the reference side gets no gradient."""
    inputs, ref_inputs = random_inputs(with_bias, seed=6), random_inputs(with_bias, seed=7)
    reference = {name: paddle.to_tensor(inputs[name], stop_gradient=False) for name in ("hidden", "weight") + (("bias",) * with_bias)}
    reference.setdefault("bias", None)

    def logp64(side: dict) -> paddle.Tensor:
        logits = paddle.matmul(side["hidden"], side["weight"], transpose_y=True) + (side["bias"] if with_bias else 0.0)
        return paddle.nn.functional.log_softmax(logits / TEMPERATURE, axis=-1)

    ref64 = {name: None if value is None else paddle.to_tensor(value) for name, value in ref_inputs.items()}
    logp, logq = logp64(reference), logp64(ref64)
    kl64 = (logp.exp() * (logp - logq)).sum(-1)  # (B, T)
    (kl64 * paddle.to_tensor(inputs["upstream"])).sum().backward()
    t, r = tensors(inputs), tensors(ref_inputs, trainable=())
    kl = chunked_full_kl(t["hidden"], t["weight"], t["bias"], ReferenceHead(r["hidden"], r["weight"], r["bias"]), TEMPERATURE, chunk_tokens)
    (kl * t["upstream"]).sum().backward()
    np.testing.assert_allclose(kl.numpy(), kl64.numpy(), rtol=1e-5, atol=1e-6)
    assert (kl.numpy() > 0).all()
    for name in ("hidden", "weight") + (("bias",) if with_bias else ()):
        # float32 against float64: log q reaches -40 here, and log p - log q carries its rounding into every term
        np.testing.assert_allclose(t[name].grad.numpy(), reference[name].grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)


def test_full_kl_is_what_the_sampled_estimators_estimate():
    """k1 and k3 averaged over tokens drawn from pi are unbiased estimates of the exact KL that chunked_full_kl computes."""
    inputs = random_inputs(False, seed=8)
    inputs["hidden"] = inputs["hidden"] / 4  # logits of a unit or two, and a reference near the policy: no token is so rare
    # under pi and likely under pi_ref that 20,000 draws would miss it (the estimators' variance is finite)
    ref_inputs = {**inputs, "weight": inputs["weight"] + np.random.default_rng(9).normal(0, 0.5, size=(V, H))}
    t, r = tensors(inputs, trainable=()), tensors(ref_inputs, trainable=())
    exact = chunked_full_kl(t["hidden"], t["weight"], None, ReferenceHead(r["hidden"], r["weight"], None), TEMPERATURE).numpy()
    logp = paddle.nn.functional.log_softmax(paddle.matmul(t["hidden"], t["weight"], transpose_y=True) / TEMPERATURE, -1).numpy()
    logq = paddle.nn.functional.log_softmax(paddle.matmul(r["hidden"], r["weight"], transpose_y=True) / TEMPERATURE, -1).numpy()
    rng = np.random.default_rng(10)
    draws = np.stack([[rng.choice(V, size=20000, p=np.exp(logp[b, s]) / np.exp(logp[b, s]).sum()) for s in range(T)] for b in range(B)])
    d = np.take_along_axis(logq, draws, -1) - np.take_along_axis(logp, draws, -1)  # (B, T, draws) log q - log p at each
    assert 0.01 < exact.mean() < 2
    np.testing.assert_allclose((-d).mean(-1), exact, rtol=0.1, atol=0.01)  # k1
    np.testing.assert_allclose((np.exp(d) - d - 1).mean(-1), exact, rtol=0.1, atol=0.01)  # k3
