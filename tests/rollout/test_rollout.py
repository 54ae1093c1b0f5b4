import numpy as np
import paddle
import pytest
from helpers.tiny_models import PAD, PROMPTS, VOCAB, llama_untied, qwen2_tied

from alignment.algo.logprobs import token_logprobs
from alignment.models.modeling import completion_logits, make_token_batch
from alignment.rollout import EagerEngine, SamplingParams
from alignment.rollout.eager import choose_tokens, top_p_filter


@pytest.fixture(params=[qwen2_tied, llama_untied], ids=["qwen2-tied-gqa", "llama-untied-gqa"])
def model(request):
    model = request.param()
    model.eval()
    return model


def test_greedy_batch_equals_each_prompt_alone(model):
    engine = EagerEngine(model, eos_token_ids=[VOCAB - 1], pad_token_id=PAD)
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    batched = engine.generate(PROMPTS, 1, greedy)
    for row, prompt in enumerate(PROMPTS):
        alone = engine.generate([prompt], 1, greedy)
        length = int(alone.lengths[0])
        assert batched.completion_ids[row, :length].tolist() == alone.completion_ids[0, :length].tolist()


def test_decoding_records_no_autograd_graph(model):
    # a rollout called outside any no_grad (the trainer's, evaluate's, chat's) once kept every decode step's
    # activations in autograd's graph: 3 GB per row of SmolLM2's 100-token completions
    engine = EagerEngine(model, eos_token_ids=[VOCAB - 1], pad_token_id=PAD)
    assert paddle.is_grad_enabled() and not model.parameters()[0].stop_gradient
    seen = []
    engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=4, temperature=0.7), on_tokens=lambda tokens: seen.append(
        (paddle.is_grad_enabled(), paddle.get_flags(["FLAGS_use_stride_kernel"])["FLAGS_use_stride_kernel"])
    ))
    assert seen == [(False, False)] * 4  # neither autograd nor stride kernels while it decodes
    assert paddle.is_grad_enabled()


def test_sampling_logprobs_equal_the_trainer_forward(model):
    paddle.seed(3)
    engine = EagerEngine(model, eos_token_ids=[VOCAB - 1], pad_token_id=PAD)
    rollout = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=10, temperature=0.7, top_p=0.9, top_k=40))
    assert rollout.completion_ids.shape[0] == 12 and rollout.prompt_ids[4] == PROMPTS[1]  # prompt-major groups of 4
    batch = make_token_batch(rollout.prompt_ids, rollout.completion_ids, rollout.completion_mask, PAD)
    with paddle.no_grad():
        trainer = token_logprobs(completion_logits(model, batch), batch.completion_ids, temperature=0.7).numpy()
    np.testing.assert_allclose(rollout.logprobs, trainer * rollout.completion_mask, atol=1e-4)


def test_eos_in_the_middle_stops_that_row_only():
    model = qwen2_tied()
    model.eval()
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    free = EagerEngine(model, eos_token_ids=[VOCAB - 1], pad_token_id=PAD).generate(PROMPTS, 1, greedy)
    stop = int(free.completion_ids[0, 2])  # make row 0's third token the eos
    rollout = EagerEngine(model, eos_token_ids=[stop], pad_token_id=PAD).generate(PROMPTS, 1, greedy)
    first = list(free.completion_ids[0]).index(stop)
    assert rollout.finish_reasons[0] == "eos" and rollout.lengths[0] == first + 1
    assert (rollout.completion_ids[0, first + 1 :] == PAD).all() and (rollout.logprobs[0, first + 1 :] == 0).all()
    for row in range(3):
        if stop not in free.completion_ids[row]:
            assert rollout.finish_reasons[row] == "length" and rollout.lengths[row] == 8


def test_min_new_tokens_blocks_eos():
    model = qwen2_tied()
    model.eval()
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    first = int(EagerEngine(model, [VOCAB - 1], PAD).generate([PROMPTS[0]], 1, greedy).completion_ids[0, 0])
    engine = EagerEngine(model, eos_token_ids=[first], pad_token_id=PAD)
    assert engine.generate([PROMPTS[0]], 1, greedy).lengths[0] == 1
    held = engine.generate([PROMPTS[0]], 1, SamplingParams(max_new_tokens=8, min_new_tokens=3, greedy=True))
    assert held.lengths[0] >= 3 and first not in held.completion_ids[0, :3]


def test_top_k_one_is_greedy():
    model = llama_untied()
    model.eval()
    engine = EagerEngine(model, eos_token_ids=[VOCAB - 1], pad_token_id=PAD)
    greedy = engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6, greedy=True))
    top1 = engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6, temperature=1.3, top_k=1))
    np.testing.assert_array_equal(greedy.completion_ids, top1.completion_ids)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = paddle.log(paddle.to_tensor([[0.2, 0.5, 0.3]]))
    kept = lambda p: np.isfinite(top_p_filter(logits, p).numpy()[0]).tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False]  # 0.5 alone reaches 0.5
    assert kept(0.6) == [False, True, True]  # 0.5 + 0.3
    assert kept(0.95) == [True, True, True]


def test_repetition_penalty_and_reported_logprob():
    logits = paddle.to_tensor([[2.0, 1.9, -1.0]])
    seen = paddle.to_tensor([[1.0, 0.0, 0.0]])
    params = SamplingParams(max_new_tokens=1, greedy=True, repetition_penalty=1.5)
    token, logprob = choose_tokens(logits, params, seen, step=0, eos_token_ids=[2])
    assert int(token) == 1  # 2.0 / 1.5 = 1.33 < 1.9
    # the reported log-prob is the unpenalised policy's: log softmax([2.0, 1.9, -1.0])[1]
    expected = 1.9 - np.log(np.exp([2.0, 1.9, -1.0]).sum())
    assert float(logprob) == pytest.approx(expected, abs=1e-6)


def test_min_p_never_draws_a_token_below_min_p_times_the_top():
    # probabilities 0.5, 0.3, 0.15, 0.05; min_p 0.2 keeps tokens with p >= 0.1: the first three
    logits = paddle.log(paddle.to_tensor([[0.5, 0.3, 0.15, 0.05]] * 4000))
    paddle.seed(5)
    tokens, _ = choose_tokens(logits, SamplingParams(max_new_tokens=1, min_p=0.2), None, step=0, eos_token_ids=[])
    counts = np.bincount(tokens.numpy(), minlength=4) / 4000
    assert counts[3] == 0
    np.testing.assert_allclose(counts[:3], np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.03)
