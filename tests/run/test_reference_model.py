"""The frozen reference model of the KL term (alignment/run/build.py reference_model): the policy's operators and
matmuls, so that at equal weights the KL term is zero and the reference pass costs what the policy's forward does."""

import numpy as np
import paddle
import pytest

from alignment.config.cli import load_config
from alignment.models.cpu_bf16 import cpu_bf16_flags
from alignment.models.fused_train import TrainingAttention
from alignment.models.modeling import load_causal_lm
from alignment.run.build import model_compute, model_dtype, reference_model

TINY = "data/tiny-qwen2"


@pytest.mark.parametrize("bf16", ["off", "on"])
def test_the_reference_runs_the_policys_operators_and_gives_its_logits_at_equal_weights(bf16):
    if bf16 == "on" and not cpu_bf16_flags():
        pytest.skip("this CPU lists neither amx_bf16 nor avx512_bf16: no bf16 matmuls to compare")
    config = load_config(["config/tiny/grpo_argument.json", "--kl_loss_coeff", "0.1", "--cpu_bf16_matmul", bf16])
    policy = load_causal_lm(TINY, model_dtype(config))
    compute, why_not = model_compute(config, policy)
    assert why_not is None and compute.bf16 == (bf16 == "on")
    reference = reference_model(config, TINY, compute.bf16)
    assert all(isinstance(layer.self_attn, TrainingAttention) for layer in reference.model.layers)
    assert (reference.bf16_matmuls is None) == (policy.bf16_matmuls is None) == (bf16 == "off")
    assert all(parameter.stop_gradient for parameter in reference.parameters())
    ids = paddle.to_tensor(np.random.default_rng(0).integers(3, 450, (2, 12)))
    policy.eval()
    with paddle.no_grad():  # paddle's own kernels give other float rounding: the old reference's KL was not zero here
        np.testing.assert_array_equal(reference(ids)[0].numpy(), policy(ids)[0].numpy())


@pytest.mark.parametrize("flags", [["--kl_loss_coeff", "0"], ["--kl_loss_coeff", "0.1", "--lora", "true"]])
def test_no_reference_model_without_a_kl_term_or_with_lora(flags):
    assert reference_model(load_config(["config/tiny/grpo_argument.json", *flags]), TINY, False) is None
