"""Prefix grouping (use_prefix_grouper; verl's key of the same name, after Liu et al. 2025, "Prefix Grouper:
Efficient GRPO Training through Shared-Prefix Forward"): the rows of a micro-batch that share a prompt (GRPO's
rollout_n completions of one prompt) run that prompt through the decoder once, and their completions attend to
its keys and values, gathered per row. The values and gradients are those of running every row whole (the
gather's backward sums each row's gradient into its prompt); the prompt's share of the work is divided by the
number of rows that share it.

    distinct prompts (U, W) -> decoder, keeping each layer's k, v (U, KVH, W, D) -> hidden at the last prompt position (U, H)
    completions (B, T)      -> decoder whose layers attend to [k of the row's prompt | k] (B, KVH, W + T, D) -> hidden (B, T, H)

The decoder layers see the two objects below as paddleformers' cache (get_seq_length, update), which its models
pass to each attention layer; the training attention (alignment/models/fused_train.py) attends to what update returns,
each row's prompt keys and values before its own (grpo_prompt_keys, one compiled copy, and a sum per prompt backward).
"""

import numpy as np
import paddle

from alignment.kernels.ops import load_ops


class _PromptKeysValues:
    """The prompt pass's cache: keeps each layer's keys and values (with their autograd history) and adds none."""

    def __init__(self):
        self.layers = {}  # layer index -> (k, v), each (U, KVH, W, D)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def update(self, key, value, layer_idx: int) -> tuple:
        self.layers[layer_idx] = (key, value)
        return key, value


class _SharedPromptKeysValues:
    """The completion pass's cache: each row's prompt keys and values, gathered from the prompt pass, before its own."""

    def __init__(self, prompt: _PromptKeysValues, prompt_of_row: paddle.Tensor, width: int):
        self.prompt, self.prompt_of_row, self.width = prompt, prompt_of_row, width

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width

    def update(self, key, value, layer_idx: int) -> tuple:
        prompt_key, prompt_value = self.prompt.layers[layer_idx]  # (U, KVH, W, D)
        ops = load_ops()[0]  # the training attention's operators, which a model that takes this cache runs
        return (
            ops.grpo_prompt_keys(prompt_key, key, self.prompt_of_row),  # (B, KVH, W + T, D)
            ops.grpo_prompt_keys(prompt_value, value, self.prompt_of_row),
        )


def prompt_groups(prompt_ids: np.ndarray, prompt_mask: np.ndarray) -> tuple:
    """Left-padded prompts (B, W) and their masks (B, W) -> (the first row of each distinct prompt (U,), each row's
    index among them (B,)), int64, numbered in order of first appearance. The mask is part of a prompt's identity: a
    prompt may begin with the pad token."""
    index, first_rows, prompt_of_row = {}, [], []
    for row, columns in enumerate(np.concatenate([prompt_ids, prompt_mask], axis=1)):
        key = columns.tobytes()
        if key not in index:
            index[key] = len(first_rows)
            first_rows.append(row)
        prompt_of_row.append(index[key])
    return np.array(first_rows, np.int64), np.array(prompt_of_row, np.int64)


def grouped_completion_hidden(decoder, input_ids, attention_mask, position_ids, width: int):
    """decoder: the model's paddleformers decoder (model.model); input_ids, attention_mask, position_ids (B, W + T)
    with the prompts left-padded to width W -> (B, T, H) final hidden states that predicted each completion token,
    as a forward over the whole rows gives them; None where no two rows share a prompt (nothing to save)."""
    first_rows, prompt_of_row = prompt_groups(input_ids[:, :width].numpy(), attention_mask[:, :width].numpy())
    if len(first_rows) == len(prompt_of_row):
        return None
    first_rows, prompt_of_row = paddle.to_tensor(first_rows), paddle.to_tensor(prompt_of_row)
    keys_values = _PromptKeysValues()
    prompt_hidden = decoder(
        input_ids[:, :width].index_select(first_rows, axis=0),
        attention_mask=attention_mask[:, :width].index_select(first_rows, axis=0),
        position_ids=position_ids[:, :width].index_select(first_rows, axis=0),
        past_key_values=keys_values,
        use_cache=False,
        return_dict=True,
    ).last_hidden_state  # (U, W, H)
    completion_hidden = decoder(
        input_ids[:, width:],
        attention_mask=attention_mask,  # (B, W + T): the prompt's padding stays masked
        position_ids=position_ids[:, width:],
        past_key_values=_SharedPromptKeysValues(keys_values, prompt_of_row, width),
        use_cache=False,
        return_dict=True,
    ).last_hidden_state  # (B, T, H)
    # the first completion token is predicted at the prompt's last position, the others at the completion's; split, not
    # [:, :-1]: paddle's CPU slice backward (Eigen's pad, one thread) took 45 ms for (64, 127, 576), split's 2.5 ms
    predicting = paddle.split(completion_hidden, [completion_hidden.shape[1] - 1, 1], axis=1)[0]  # (B, T - 1, H)
    return paddle.concat([prompt_hidden[:, -1:].index_select(prompt_of_row, axis=0), predicting], axis=1)
