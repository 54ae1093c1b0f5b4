"""use_prefix_grouper (alignment/models/prefix_grouper.py): each distinct prompt of a micro-batch runs once and its
completions attend to its keys and values. Checked against the other code path, the same model running every
row whole: the hidden states, the log-probs and every parameter's gradient, on the five tiny model families of
tests/models/test_train_ops.py and Qwen3 with LoRA, with left-padded prompts of several lengths, rows sharing prompts
out of order, and right-padded completions."""

import numpy as np
import paddle
import pytest
import test_train_ops
from test_train_ops import qwen3_with_lora, swapped
from helpers.tiny_models import PAD, qwen2_tied

from alignment.algo.logprobs import chunked_token_logprobs
from alignment.models.fused_train import groups_prompts, head_kernels
from alignment.models.modeling import completion_hidden, enable_recompute, make_token_batch, output_head
from alignment.models.prefix_grouper import grouped_completion_hidden, prompt_groups
from alignment.config.cli import load_config
from alignment.run.build import update_settings
from alignment.basics.runtime import contiguous_kernels
from alignment.step.update import policy_logprobs

build = test_train_ops.build  # its fixture: the five tiny model builders; ops (the loaded operators) is conftest.py's


@pytest.mark.parametrize(
    "prompts, first_rows, prompt_of_row",
    [
        ([[5, 6], [5, 6], [5, 6]], [0], [0, 0, 0]),  # one prompt, three completions: GRPO's group
        ([[7], [5, 6], [7], [5, 6]], [0, 1], [0, 1, 0, 1]),  # two groups interleaved (a shuffled mini-batch)
        ([[1, 2, 3], [2, 3], [3]], [0, 1, 2], [0, 1, 2]),  # suffixes of each other: left padding keeps them apart
        ([[PAD, 4], [4]], [0, 1], [0, 1]),  # a prompt that begins with the pad token is not the shorter one
    ],
)
def test_prompt_groups(prompts, first_rows, prompt_of_row):
    batch = make_token_batch(prompts, np.ones((len(prompts), 2), np.int64), np.ones((len(prompts), 2)), PAD)
    width = batch.prompt_width
    firsts, of_row = prompt_groups(batch.input_ids[:, :width].numpy(), batch.attention_mask[:, :width].numpy())
    assert (firsts.tolist(), of_row.tolist()) == (first_rows, prompt_of_row)
    assert [prompts[firsts[i]] for i in of_row] == prompts  # each row's group holds its own prompt


def test_prompt_keys_are_index_select_and_concat_to_the_bit(ops):
    """grpo_prompt_keys against paddle's index_select + concat (what the grouper ran before it): the keys, the own
    rows' gradient and each prompt's, summed over its rows in row order; prompt 3 serves no row (a zero gradient)."""
    draw = np.random.default_rng(2)
    prompts, own = draw.standard_normal((4, 2, 5, 8)).astype(np.float32), draw.standard_normal((8, 2, 7, 8)).astype(np.float32)
    prompt_of_row = paddle.to_tensor(np.array([0, 1, 0, 2, 1, 0, 2, 1], np.int64))
    upstream = paddle.to_tensor(draw.standard_normal((8, 2, 12, 8)).astype(np.float32))
    results = []
    for compiled in (True, False):
        p, o = paddle.to_tensor(prompts, stop_gradient=False), paddle.to_tensor(own, stop_gradient=False)
        keys = ops.grpo_prompt_keys(p, o, prompt_of_row) if compiled else paddle.concat([p.index_select(prompt_of_row), o], axis=2)
        results.append([keys.numpy()] + [g.numpy() for g in paddle.grad(keys, [p, o], upstream)])
    for compiled, reference in zip(*results):
        np.testing.assert_array_equal(compiled, reference)
    assert not results[0][1][3].any()
    with pytest.raises(OSError, match=r"prompt_of_row\[1\] = 4 is not one of the 4 prompts"):
        ops.grpo_prompt_keys(paddle.to_tensor(prompts), paddle.to_tensor(own), paddle.to_tensor(np.array([0, 4, 0, 0, 0, 0, 0, 0])))


def grouped_batch():
    """8 rows: 3 distinct prompts (lengths 7, 3 and 5) shared out of order, completions of 6 tokens, some ending early."""
    draw = np.random.default_rng(1)
    distinct = [draw.integers(3, 97, n).tolist() for n in (7, 3, 5)]
    prompts = [distinct[i] for i in (0, 1, 0, 2, 1, 0, 2, 1)]
    completion_mask = np.ones((8, 6), np.float32)
    completion_mask[1, 4:] = completion_mask[3, 1:] = completion_mask[6, 5:] = 0
    return make_token_batch(prompts, draw.integers(3, 97, (8, 6)), completion_mask, PAD)


def logprobs_and_gradients(model, group_prompts: bool) -> tuple:
    """hidden states (B, T, H) and log-probs (B, T) of grouped_batch's completions, and every trainable parameter's
    gradient of their masked mean, as the update computes them (the chunked log-prob head with the compiled rows)."""
    batch = grouped_batch()
    model.train()
    with contiguous_kernels():
        hidden = completion_hidden(model, batch, group_prompts)
        weight, bias = output_head(model)
        logprobs, _ = chunked_token_logprobs(hidden, weight, bias, batch.completion_ids, 1.0, 16, head_kernels(model))
        loss = -(logprobs * batch.completion_mask).sum() / batch.completion_mask.sum()
        loss.backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters() if not p.stop_gradient}
    return hidden.numpy(), logprobs.numpy(), grads


def assert_same(grouped, whole):
    (hidden, logprobs, grads), (whole_hidden, whole_logprobs, whole_grads) = grouped, whole
    np.testing.assert_allclose(hidden, whole_hidden, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logprobs, whole_logprobs, rtol=1e-5, atol=1e-5)
    assert grads.keys() == whole_grads.keys()
    for name, grad in whole_grads.items():
        np.testing.assert_allclose(grads[name], grad, rtol=1e-4, atol=1e-6, err_msg=name)


def test_grouped_prompts_give_the_log_probs_and_gradients_of_whole_rows(build):
    assert_same(logprobs_and_gradients(swapped(build), True), logprobs_and_gradients(swapped(build), False))


def test_grouped_prompts_give_lora_adapters_the_gradients_of_whole_rows(ops):
    assert_same(logprobs_and_gradients(swapped(qwen3_with_lora), True), logprobs_and_gradients(swapped(qwen3_with_lora), False))


def test_the_grouped_forward_runs_the_distinct_prompts_once(ops):
    """The prompt pass sees 3 rows for grouped_batch's 8, and a batch whose prompts all differ takes the whole rows."""
    model, batch = swapped(qwen2_tied), grouped_batch()
    prompt_rows = []
    model.model.layers[0].mlp.register_forward_pre_hook(lambda layer, inputs: prompt_rows.append(inputs[0].shape[0]))
    with paddle.no_grad():
        grouped_completion_hidden(model.model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.prompt_width)
        assert prompt_rows == [3, 8]  # the prompts, then the completions
        distinct = make_token_batch([[4, 5], [6]], np.ones((2, 3), np.int64), np.ones((2, 3)), PAD)
        assert grouped_completion_hidden(
            model.model, distinct.input_ids, distinct.attention_mask, distinct.position_ids, distinct.prompt_width
        ) is None


def test_the_update_groups_prompts_only_where_the_training_attention_runs_without_recompute(ops):
    assert groups_prompts(swapped(qwen2_tied), recompute=False)
    assert not groups_prompts(qwen2_tied(), recompute=False)  # paddleformers' own attention
    recomputed = swapped(qwen2_tied)
    enable_recompute(recomputed, "full")
    assert not groups_prompts(recomputed, recompute=True)


def test_policy_logprobs_follow_use_prefix_grouper(ops):
    """The trainer's log-probs with the key on and off agree; grouped is what runs with it on (the key's default)."""
    config = load_config(["config/tiny/grpo_argument.json"])
    assert config.use_prefix_grouper
    model, batch = swapped(qwen2_tied), grouped_batch()
    with paddle.no_grad(), contiguous_kernels():
        grouped = policy_logprobs(model, batch, update_settings(config))[0].numpy()
        ungrouped = update_settings(load_config(["config/tiny/grpo_argument.json", "--use_prefix_grouper", "false"]))
        whole = policy_logprobs(model, batch, ungrouped)[0].numpy()
    np.testing.assert_allclose(grouped, whole, rtol=1e-5, atol=1e-5)
