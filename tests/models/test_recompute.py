"""recompute: the backward pass recomputes each decoder layer instead of storing its activations, and
the gradients are the same."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from helpers.tiny_models import PAD, PROMPTS, llama_untied, qwen2_tied

from alignment.algo.logprobs import token_logprobs
from alignment.basics.errors import ConfigError
from alignment.models.modeling import completion_logits, enable_recompute, make_token_batch
from alignment.config.cli import load_config


def gradients(model) -> dict:
    completions = np.array([[7, 8, 9, 10], [11, 12, PAD, PAD], [13, 14, 15, PAD]])
    batch = make_token_batch(PROMPTS, completions, (completions != PAD).astype(np.float32), PAD)
    model.train()
    logprobs = token_logprobs(completion_logits(model, batch), batch.completion_ids, 0.9)
    (logprobs * batch.completion_mask).sum().backward()
    grads = {name: p.grad.numpy().copy() for name, p in model.named_parameters() if p.grad is not None}
    model.clear_gradients()
    return grads


@pytest.mark.parametrize("build", [qwen2_tied, llama_untied])
def test_recompute_gives_the_same_gradients(build):
    model = build()
    stored = gradients(model)
    enable_recompute(model, "full")
    recomputed = gradients(model)
    assert stored.keys() == recomputed.keys() and len(stored) == len(list(model.parameters()))
    for name, grad in stored.items():
        np.testing.assert_allclose(recomputed[name], grad, rtol=1e-5, atol=1e-7, err_msg=name)


def test_recompute_runs_in_the_backward_pass_only(monkeypatch):
    model = qwen2_tied()
    enable_recompute(model, "full")
    calls = []
    original = type(model.model).recompute_training_full
    monkeypatch.setattr(type(model.model), "recompute_training_full", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    with paddle.no_grad():
        model(paddle.to_tensor([PROMPTS[0]]))  # rollout and the reference model: nothing to recompute
    assert calls == []
    gradients(model)
    assert len(calls) == len(model.model.layers)


@pytest.mark.parametrize("granularity", ["core_attn", "full_attn"])
def test_granularities_paddleformers_lacks_for_dense_models_are_refused(granularity):
    with pytest.raises(ConfigError, match=f"recompute_granularity = {granularity}: paddleformers 1.0.0 recomputes"):
        load_config(["config/tiny/grpo_argument.json", "--recompute", "true", "--recompute_granularity", granularity])


# run_grpo.py as a user runs it, with paddleformers' recompute of a decoder layer counted: the count printed at the end
# shows whether the run recomputed, which the equal metrics alone cannot
COUNTING_RUN = """
import sys
sys.path.insert(0, ".")
import run_grpo
from paddleformers.transformers.qwen2.modeling import Qwen2Model
calls, recompute = [], Qwen2Model.recompute_training_full
Qwen2Model.recompute_training_full = lambda self, *args, **kwargs: calls.append(1) or recompute(self, *args, **kwargs)
code = run_grpo.main(sys.argv[1:])
print(f"recomputed decoder layers: {len(calls)}")
sys.exit(code)
"""


@pytest.mark.slow  # two runs (about 26 s)
def test_a_run_with_recompute_equals_one_without(tmp_path):
    runs, recomputed_layers = {}, {}
    for recompute in ("false", "true"):
        out = tmp_path / recompute
        command = [
            sys.executable, "-c", COUNTING_RUN, "config/tiny/grpo_argument.json", "--max_steps", "2", "--max_dec_len", "16",
            "--per_device_prompt_batch_size", "2", "--rollout_n", "4", "--per_device_train_batch_size", "4",
            "--learning_rate", "1e-3", "--warmup_steps", "0",
            "--eval_datasets", "", "--recompute", recompute, "--output_dir", str(out),
            # float32: with bf16 matmuls (auto where the CPU has them) the run without recompute, which runs each prompt
            # once (use_prefix_grouper), rounds its products differently from the recomputed run's whole rows
            "--cpu_bf16_matmul", "off",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[recompute] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        recomputed_layers[recompute] = int(re.search(r"recomputed decoder layers: (\d+)", done.stdout)[1])
    # 2 steps x 2 micro-batches (8 rows, 4 at a time) x the model's layers, and none without
    layers = json.loads(Path("data/tiny-qwen2/config.json").read_text())["num_hidden_layers"]
    assert recomputed_layers == {"false": 0, "true": 2 * 2 * layers}, recomputed_layers
    for plain, recomputed in zip(runs["false"], runs["true"]):
        for key in ("reward_mean", "loss", "grad_norm", "entropy", "response_length_mean"):
            assert recomputed[key] == pytest.approx(plain[key], rel=1e-5), key
