"""The eager engine: the actor's own forward with its KV cache, one token per step for the whole batch.

It drives paddleformers' Qwen2/Llama forward directly rather than `model.generate`, because
paddleformers 1.0.0's generate returns only a summed score per sequence (GRPO needs each token's
log-prob) and, with left padding, its padded rows' greedy tokens diverge from the same prompt run
alone (tests/rollout/test_rollout.py holds the engine to that equality).
"""

from typing import Optional

import numpy as np
import paddle
import paddle.nn.functional as F

from alignment.algo.logprobs import log_softmax
from alignment.rollout.base import Rollout, SamplingParams, TokenStream
from alignment.basics.runtime import contiguous_kernels


def left_pad(prompts: list, pad_token_id: int):
    """-> input_ids (B, L) int64, attention_mask (B, L) int64, position_ids (B, L) int64."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    positions = np.maximum(mask.cumsum(axis=1) - 1, 0)
    return paddle.to_tensor(ids), paddle.to_tensor(mask), paddle.to_tensor(positions)


def choose_tokens(logits, params: SamplingParams, seen, step: int, eos_token_ids: list):
    """logits (B, V) fp32 -> (tokens (B,) int64, logprobs (B,) fp32).

    The returned log-prob is that of the temperature-scaled policy, log_softmax(logits / T), which is
    what the trainer recomputes; top-k, top-p, min-p, the repetition penalty and min_new_tokens shape only
    which token is drawn (TRL and verl make the same choice)."""
    temperature = 1.0 if params.greedy else params.temperature
    policy_logprobs = log_softmax(logits, temperature)
    shaped = logits
    if params.repetition_penalty != 1.0:  # CTRL's penalty, as in HF: divide positive logits, multiply negative
        penalised = paddle.where(shaped > 0, shaped / params.repetition_penalty, shaped * params.repetition_penalty)
        shaped = paddle.where(seen > 0, penalised, shaped)
    if step < params.min_new_tokens and eos_token_ids:
        blocked = paddle.zeros([shaped.shape[-1]], dtype="bool")
        blocked[eos_token_ids] = True
        shaped = paddle.where(blocked.unsqueeze(0), paddle.full_like(shaped, float("-inf")), shaped)
    if params.greedy:
        tokens = paddle.argmax(shaped, axis=-1)
    else:
        shaped = shaped / params.temperature
        if 0 < params.top_k < shaped.shape[-1]:
            kth = paddle.topk(shaped, params.top_k, axis=-1)[0][:, -1:]
            shaped = paddle.where(shaped < kth, paddle.full_like(shaped, float("-inf")), shaped)
        if params.top_p < 1.0:
            shaped = top_p_filter(shaped, params.top_p)
        if params.min_p > 0.0:  # p < min_p * p_max  <=>  logit < max logit + log(min_p)
            floor = shaped.max(axis=-1, keepdim=True) + float(np.log(params.min_p))
            shaped = paddle.where(shaped < floor, paddle.full_like(shaped, float("-inf")), shaped)
        tokens = paddle.multinomial(F.softmax(shaped, axis=-1), num_samples=1).squeeze(-1)
    chosen = paddle.take_along_axis(policy_logprobs, tokens.unsqueeze(-1), axis=-1).squeeze(-1)
    return tokens, chosen


def top_p_filter(logits, top_p: float):
    """Keep the smallest set of tokens whose probability reaches top_p (always the most likely one)."""
    sorted_logits, order = paddle.sort(logits, axis=-1, descending=True), paddle.argsort(logits, axis=-1, descending=True)
    probs = F.softmax(sorted_logits, axis=-1)
    mass_before = paddle.cumsum(probs, axis=-1) - probs  # probability of the tokens ranked above
    sorted_logits = paddle.where(mass_before >= top_p, paddle.full_like(sorted_logits, float("-inf")), sorted_logits)
    return paddle.put_along_axis(paddle.zeros_like(logits), order, sorted_logits, axis=-1)


class EagerEngine:
    def __init__(self, model, eos_token_ids: list, pad_token_id: int):
        self.model = model
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id

    def sync(self) -> None:
        return None  # the forward reads the actor's parameters themselves: nothing to refresh or check

    def generate_turn(self, contexts: list, known: list, params: SamplingParams) -> tuple:
        return self.generate(contexts, 1, params), [None] * len(contexts)  # each turn prefills its whole context

    # without no_grad every decode step's activations stayed in autograd's graph until the rollout ended: about 3 GB
    # per row of SmolLM2's 100-token completions
    @paddle.no_grad()
    @contiguous_kernels()
    def generate(
        self, prompts: list, group_size: int, params: SamplingParams, samples: Optional[list] = None, on_tokens: TokenStream = None
    ) -> Rollout:
        rows = [list(p) for p in prompts for _ in range(group_size)]
        input_ids, attention_mask, position_ids = left_pad(rows, self.pad_token_id)
        batch, vocab = len(rows), self.model.config.vocab_size
        eos = paddle.to_tensor(self.eos_token_ids, dtype="int64")
        seen = None  # (B, V) float32: how often each token occurred in the prompt and completion so far
        if params.repetition_penalty != 1.0:
            seen = paddle.put_along_axis(
                paddle.zeros([batch, vocab], dtype="float32"), input_ids, attention_mask.astype("float32"), axis=1, reduce="add"
            )
        was_training = self.model.training
        self.model.eval()
        out = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, return_dict=True)
        cache, logits = out.past_key_values, out.logits[:, -1, :].astype("float32")
        next_position = position_ids[:, -1:] + 1
        finished = paddle.zeros([batch], dtype="bool")
        tokens_per_step, logprobs_per_step, alive_per_step = [], [], []
        for step in range(params.max_new_tokens):
            tokens, logprobs = choose_tokens(logits, params, seen, step, self.eos_token_ids)
            alive = ~finished
            tokens = paddle.where(alive, tokens, paddle.full_like(tokens, self.pad_token_id))
            tokens_per_step.append(tokens)
            logprobs_per_step.append(paddle.where(alive, logprobs, paddle.zeros_like(logprobs)))
            alive_per_step.append(alive)
            finished = finished | (alive & paddle.isin(tokens, eos))
            if on_tokens is not None:
                on_tokens(tokens.numpy())
            if bool(finished.all()) or step == params.max_new_tokens - 1:
                break
            if seen is not None:
                seen = paddle.put_along_axis(seen, tokens.unsqueeze(-1), alive.astype("float32").unsqueeze(-1), axis=1, reduce="add")
            attention_mask = paddle.concat([attention_mask, paddle.ones([batch, 1], dtype="int64")], axis=1)
            out = self.model(
                tokens.unsqueeze(-1),
                attention_mask=attention_mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :].astype("float32")
            next_position = next_position + 1
        if was_training:
            self.model.train()
        finished_np = finished.numpy()
        return Rollout(
            prompt_ids=rows,
            completion_ids=paddle.stack(tokens_per_step, axis=1).numpy(),
            completion_mask=paddle.stack(alive_per_step, axis=1).astype("float32").numpy(),
            logprobs=paddle.stack(logprobs_per_step, axis=1).numpy().astype(np.float32),
            finish_reasons=["eos" if done else "length" for done in finished_np],
            group_size=group_size,
        )
