"""Multi-turn rollouts (alignment/rollout/multi_turn.py) over both engines: the trajectory, its masks, the limits,
and the loss, which must take no gradient from the environment's tokens."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from alignment.algo.loss import LossInputs, policy_loss
from alignment.algo.loss_settings import LossSettings
from alignment.basics.errors import ConfigError
from alignment.models.modeling import load_causal_lm, load_tokenizer, make_token_batch, stop_token_ids
from alignment.rollout import EagerEngine, SamplingParams
from alignment.rollout.multi_turn import MultiTurnEngine, TemplateMarkup, TurnLimits, check_template, episode_sums
from alignment.kernels.ops import load_ops
from alignment.config.schema import GRPOConfig
from alignment.run.build import update_settings
from alignment.basics.plugins import load_plugins
from alignment.step.update import policy_logprobs
from alignment.tools import ToolSettings, get_environment, get_tool
from alignment.tools.sandbox import SandboxLimits

OPS, WHY_NOT = load_ops()
PLUGINS = "tests/plugins/tool_plugins.py"
TEMPLATE = Path("data/tiny_tools/chat_template.jinja")
QUESTIONS = [
    "Mia has 12 apples. She buys 7 more. How many apples does Mia have now?",
    "Tom has 30 coins. He loses 4. Then he loses 9. How many coins does Tom have now?",
]


@pytest.fixture(scope="module")
def tiny():
    load_plugins([PLUGINS])
    tokenizer = load_tokenizer("data/tiny-qwen2", (Path(__file__).parents[2] / TEMPLATE).read_text())
    model = load_causal_lm("data/tiny-qwen2")
    model.eval()
    return model, tokenizer


def prompts(tokenizer, tools=None) -> list:
    system = Path("data/arith/system_prompt.txt").read_text()
    return [tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}],
                                          tools=tools, add_generation_prompt=True, tokenize=True) for q in QUESTIONS]


def multi_turn(engine, tokenizer, environment: str = "nudge", tools: tuple = (), **limits) -> MultiTurnEngine:
    settings = ToolSettings(tools=tools, limits=SandboxLimits(seconds=5.0), plugin_sources=())
    turn_limits = TurnLimits(**{"max_turns": 3, "max_turn_tokens": 48, "max_total_tokens": 160, **limits})
    schemas = [get_tool(name).schema for name in tools]
    return MultiTurnEngine(engine, tokenizer, get_environment(environment).factory(settings), turn_limits, schemas)


def engines(model, tokenizer) -> dict:
    eos = stop_token_ids(model, tokenizer)
    found = {"eager": EagerEngine(model, eos, tokenizer.pad_token_id)}
    if OPS is not None:
        from alignment.rollout.fused import FusedEngine

        found["fused"] = FusedEngine(model, eos, tokenizer.pad_token_id, OPS)
    return found


def test_each_turn_follows_the_environments_answer_in_the_chat_template(tiny):
    model, tokenizer = tiny
    rollout = multi_turn(engines(model, tokenizer)["eager"], tokenizer).generate(
        prompts(tokenizer), 2, SamplingParams(max_new_tokens=160, greedy=True)
    )
    markup = TemplateMarkup(tokenizer, None)
    for row, episode in enumerate(rollout.episodes):
        assert len(episode.turns) == 3 and rollout.finish_reasons[row] == "max_turns"
        n = int(rollout.lengths[row])
        ids, environment = rollout.completion_ids[row, :n].tolist(), rollout.environment_mask[row, :n].astype(bool)
        # the environment's tokens are exactly its two answers, each after a turn that ended with eos
        runs = np.flatnonzero(np.diff(np.concatenate([[0], environment.astype(int), [0]])))
        answers = [ids[start:end] for start, end in zip(runs[::2], runs[1::2])]
        assert answers == [markup.ids([{"role": "user", "content": f"turn {t} please"}], tokenizer.eos_token_id) for t in (2, 3)]
        assert all(ids[start - 1] == tokenizer.eos_token_id for start in runs[::2])
        # the text the model and the environment wrote together is the conversation the chat template renders
        text = tokenizer.decode(ids)
        assert "<|im_start|>user\nturn 2 please<|im_end|>\n<|im_start|>assistant\n" in text
        assert (rollout.logprobs[row, :n][environment] == 0).all() and (rollout.logprobs[row, :n][~environment] < 0).any()
    np.testing.assert_array_equal(rollout.loss_mask, rollout.completion_mask * (1 - rollout.environment_mask))
    sums = episode_sums(rollout, np.zeros(len(rollout.episodes), bool))
    assert sums["turns"] == 12 and sums["ended_by_max_turns"] == 4
    assert sums["generated_tokens"] + sums["environment_tokens"] == rollout.lengths.sum()


@pytest.mark.skipif(OPS is None, reason=f"fused operators not available: {WHY_NOT}")
def test_greedy_tool_turns_are_token_identical_in_both_engines(tiny):
    model, tokenizer = tiny
    greedy = SamplingParams(max_new_tokens=160, greedy=True)
    found = {
        name: multi_turn(engine, tokenizer).generate(prompts(tokenizer), 1, greedy) for name, engine in engines(model, tokenizer).items()
    }
    eager, fused = found["eager"], found["fused"]
    np.testing.assert_array_equal(fused.completion_ids, eager.completion_ids)
    np.testing.assert_array_equal(fused.environment_mask, eager.environment_mask)
    assert fused.finish_reasons == eager.finish_reasons
    np.testing.assert_allclose(fused.logprobs, eager.logprobs, atol=2e-4)


@pytest.mark.skipif(OPS is None, reason=f"fused operators not available: {WHY_NOT}")
def test_a_rows_samples_do_not_depend_on_the_other_rows_of_the_batch(tiny):
    model, tokenizer = tiny
    engine = multi_turn(engines(model, tokenizer)["fused"], tokenizer, max_turns=2)
    sampling = SamplingParams(max_new_tokens=160, temperature=1.0, seed=7)
    both = engine.generate(prompts(tokenizer), 2, sampling)
    second = engine.generate(prompts(tokenizer)[1:], 2, SamplingParams(max_new_tokens=160, temperature=1.0, seed=7, first_row=2))
    width = int(second.lengths.max())
    np.testing.assert_array_equal(both.completion_ids[2:, :width], second.completion_ids[:, :width])
    assert [e.turns for e in both.episodes[2:]] == [e.turns for e in second.episodes]


@pytest.mark.parametrize(
    "limits, reasons, most_turns",
    [
        ({"max_turns": 1}, {"max_turns"}, 1),  # the nudge would answer, but no turn is left
        ({"max_turn_tokens": 6}, {"length"}, 1),  # every first turn is longer than 6 tokens
        ({"max_total_tokens": 60}, {"length"}, 3),  # cut within the budget, wherever it falls
    ],
)
def test_each_limit_ends_the_episode_with_its_reason(tiny, limits, reasons, most_turns):
    model, tokenizer = tiny
    engine = multi_turn(engines(model, tokenizer)["eager"], tokenizer, **limits)
    rollout = engine.generate(prompts(tokenizer), 2, SamplingParams(max_new_tokens=160, greedy=True))
    assert set(rollout.finish_reasons) == reasons
    assert max(len(e.turns) for e in rollout.episodes) <= most_turns
    budget = limits.get("max_total_tokens", 160)
    assert rollout.lengths.max() <= budget
    for row in range(len(rollout.episodes)):  # no turn is longer than its budget
        turn_lengths = np.diff(
            np.flatnonzero(np.diff(np.concatenate([[1], rollout.environment_mask[row, : rollout.lengths[row]], [1]])))
        )[::2]
        assert max(turn_lengths) <= limits.get("max_turn_tokens", 48)


def test_the_environments_tokens_get_no_gradient(tiny):
    """The loss over a multi-turn rollout equals, in value and in every parameter's gradient, a loss summed by hand
    over the generated tokens only; counting the environment's tokens too changes the gradient."""
    model, tokenizer = tiny
    model.train()
    paddle.seed(7)  # the eager engine draws from paddle's generator: the same episodes whatever ran before
    rollout = multi_turn(engines(model, tokenizer)["eager"], tokenizer).generate(
        prompts(tokenizer), 2, SamplingParams(max_new_tokens=160, temperature=1.0)
    )
    batch = make_token_batch(rollout.prompt_ids, rollout.completion_ids, rollout.completion_mask, tokenizer.pad_token_id)
    advantages = paddle.to_tensor(np.array([1.0, -1.0, 0.5, -0.5], np.float32))
    settings = update_settings(GRPOConfig())

    def gradients(mask: np.ndarray, by_hand: bool) -> list:
        model.clear_gradients()
        logprobs = policy_logprobs(model, batch, settings)[0]
        weights = paddle.to_tensor((mask / mask.sum()).astype(np.float32))
        if by_hand:  # - sum over generated tokens of A * ratio(=1, value) * grad log pi
            loss = -(advantages.unsqueeze(1) * paddle.exp(logprobs - logprobs.detach()) * weights).sum()
        else:
            loss = policy_loss(logprobs, LossInputs(logprobs.detach(), advantages, weights, paddle.to_tensor(mask)), LossSettings())[0]
        loss.backward()
        return [p.grad.numpy().copy() for p in model.parameters() if p.grad is not None]

    ours = gradients(rollout.loss_mask, by_hand=False)
    reference = gradients(rollout.loss_mask, by_hand=True)
    every_token = gradients(rollout.completion_mask, by_hand=False)
    model.eval()
    assert rollout.environment_mask.sum() > 0
    for mine, theirs in zip(ours, reference):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-7)
    assert max(np.abs(a - b).max() for a, b in zip(ours, every_token)) > 1e-4


def test_a_chat_template_that_cannot_show_tools_is_caught_before_any_model_loads(tiny):
    _, tokenizer = tiny
    schemas = [get_tool("calculator").schema]
    check_template(tokenizer, schemas)  # the tools template renders both
    plain = load_tokenizer("data/tiny-qwen2")  # ChatML without tools: a warning, the run goes on
    with pytest.warns(UserWarning, match="does not show tools= to the model"):
        check_template(plain, schemas)
    strict = load_tokenizer("data/tiny-qwen2", "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
                                               "{{ raise_exception('Only user and assistant roles are supported') }}{% endif %}"
                                               "{{ m['content'] }}{% endfor %}")
    with pytest.raises(ConfigError, match="chat_template: the chat template cannot render a tool's answer.*Only user and assistant"):
        check_template(strict, schemas)


class PrefillAgain:
    """The fused engine keeping nothing between turns, as the eager engine does: every turn prefills the whole context."""

    def __init__(self, engine):
        self.engine, self.pad_token_id = engine, engine.pad_token_id

    def generate_turn(self, contexts, known, params):
        return self.engine.generate(contexts, 1, params), [None] * len(contexts)


@pytest.mark.skipif(OPS is None, reason=f"fused operators not available: {WHY_NOT}")
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_the_tools_model_calls_its_calculator_and_kept_keys_and_values_change_nothing(cache_dtype):
    """data/tiny-qwen2-tools with the real `tools` environment, sampled: its calls are answered by the calculator, and the
    fused engine continuing each row from its kept keys and values samples what it samples prefilling each turn whole
    (with a bfloat16 cache too, whose kept keys and values are the rounded ones)."""
    from alignment.rollout.fused import FusedEngine

    tokenizer, model = load_tokenizer("data/tiny-qwen2-tools"), load_causal_lm("data/tiny-qwen2-tools")
    model.eval()
    schemas = [get_tool("calculator").schema]
    system = Path("data/tiny_tools/system_prompt.txt").read_text()
    rows = [json.loads(line) for line in open("data/arith/test.jsonl")][:16]
    prompts = [tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": row["src"]}],
                                             tools=schemas, add_generation_prompt=True, tokenize=True) for row in rows]
    sampling = SamplingParams(max_new_tokens=128, temperature=1.0, seed=3)
    fused = FusedEngine(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, OPS, cache_dtype=cache_dtype)
    kept, again = (multi_turn(engine, tokenizer, "tools", ("calculator",), max_total_tokens=128, max_turn_tokens=128)
                   .generate(prompts, 4, sampling)
                   for engine in (fused, PrefillAgain(fused)))
    np.testing.assert_array_equal(kept.completion_ids, again.completion_ids)
    np.testing.assert_allclose(kept.logprobs, again.logprobs, atol=1e-4)
    called = [(row, episode) for row, episode in enumerate(kept.episodes) if len(episode.calls) == 1 and episode.calls[0].error is None]
    assert len(called) >= 4  # the others wrote no call, or one the tool answered with an error (counted too)
    markup = TemplateMarkup(tokenizer, schemas)
    for row, episode in called:
        call = episode.calls[0]
        expression = call.arguments["expression"]
        assert call.name == "calculator" and re.fullmatch(r"[\d+\-*() ]+", expression)
        assert call.answer == str(eval(expression))  # the reference: Python on an expression of digits, + - * and parentheses
        n = int(kept.lengths[row])
        ids, environment = kept.completion_ids[row, :n], kept.environment_mask[row, :n].astype(bool)
        assert ids[environment].tolist() == markup.ids(
            [{"role": "tool", "name": "calculator", "content": call.answer}], tokenizer.eos_token_id
        )


@pytest.mark.parametrize(
    "turns, tool_answer, reward",
    [
        # the model's code assembles the tags, so only the tool's output holds <answer>19</answer>
        (['<tool_call>{"name": "python", "arguments": {"code": "print(\'<ans\' + \'wer>\' + str(12 + 7) + '
          '\'</ans\' + \'wer>\')"}}</tool_call>', "So."],
         "<answer>19</answer>", 0.0),
        (['<tool_call>{"name": "calculator", "arguments": {"expression": "12+7"}}</tool_call>', "<answer>19</answer>"], "19", 1.0),
    ],
    ids=["a tool prints the answer", "the model writes it"],
)
def test_rewards_score_what_the_model_wrote_not_what_a_tool_printed(tiny, turns, tool_answer, reward):
    from alignment.run.build import scoring_settings
    from alignment.run.scorer import build_scorer
    from alignment.rollout import Rollout
    from alignment.config.cli import load_config
    from alignment.basics.data import EncodedPrompt, PromptRecord
    from alignment.step.scoring import score_rollout
    from alignment.tools import Episode, ToolCall

    _, tokenizer = tiny
    pieces = [(turns[0], 0.0), (f"\n<tool_response>\n{tool_answer}\n</tool_response>\n", 1.0), (turns[1], 0.0)]
    ids = [[tokenizer.encode(text, add_special_tokens=False), environment] for text, environment in pieces]
    completion_ids = np.array([[token for part, _ in ids for token in part]], np.int64)
    environment_mask = np.array([[environment for part, environment in ids for _ in part]], np.float32)
    episode = Episode(sample={}, turns=list(turns), calls=[ToolCall("python", {}, tool_answer, None, 0.1)])
    rollout = Rollout(
        prompt_ids=[[1, 2]], completion_ids=completion_ids, completion_mask=np.ones_like(environment_mask),
        logprobs=np.zeros_like(environment_mask), finish_reasons=["eos"], group_size=1, environment_mask=environment_mask,
        episodes=[episode],
    )
    config = load_config(["config/tiny_tools/grpo_argument.json"])  # reward: accuracy
    prompts = [EncodedPrompt(PromptRecord(({"role": "user", "content": QUESTIONS[0]},), "19"), (1, 2))]
    scored = score_rollout(prompts, rollout, build_scorer(config), tokenizer, scoring_settings(config))
    assert scored.rewards.tolist() == [reward] and bool(scored.correct[0]) == bool(reward)
    assert "<tool_response>" in scored.completions[0]  # the logs keep the whole conversation


def test_checking_a_template_leaves_no_library_warning():
    """paddleformers warns (once a process, on the console of every tools run) wherever apply_chat_template is
    called without add_generation_prompt; check_template's calls give it."""
    code = (
        "from alignment.models.modeling import load_tokenizer\n"
        "from alignment.rollout.multi_turn import check_template\n"
        "from alignment.tools import get_tool\n"
        "check_template(load_tokenizer('data/tiny-qwen2-tools'), [get_tool('calculator').schema])\n"
        "print('checked')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "checked" in done.stdout, done.stderr[-3000:]
    assert "add_generation_prompt" not in done.stdout + done.stderr
