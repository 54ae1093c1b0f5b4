"""Multi-turn rollouts over either engine: the model writes a turn, the environment answers it (a tool's answer in
the model's chat template) or ends the episode, and the model goes on from the whole conversation.

Each row's trajectory after its prompt is one sequence: the model's turns (trained: loss mask 1, their sampling
log-probs kept for the importance weights) with the environment's tokens between them (the chat template's markup
and the answers: in the context, loss mask 0, no log-prob).

A turn is one call of the engine over the rows still going, each from its whole context (prompt and trajectory so
far). The fused engine keeps each row's keys and values from its last turn (generate_turn) and prefills only what
came after them, the eos and the environment's tokens, into its static cache; the eager engine prefills the whole
context again (bench/bench_multi_turn.py measures the difference). Rows that ended leave the batch; a turn starts
once every tool call of the previous one has answered, and each call is bounded by tool_timeout.

Limits, and what happens at each (the finish reason the row gets):
- max_turns model turns: a turn that still calls a tool at the last one ends the episode unanswered ("max_turns");
- max_turn_tokens: a turn that reaches it ends the episode mid-turn ("length");
- max_dec_len for the whole trajectory, the environment's tokens included: a turn is cut where the total reaches
  it, and an answer that does not fit with room for one more token ends the episode before it ("length").
"""

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np

from alignment.basics.errors import ConfigError
from alignment.rollout.base import Rollout, SamplingParams, TokenStream
from alignment.tools import ToolSettings, get_environment, get_tool
from alignment.tools.environment import Episode

TURN_MARK = "\u2063GRPO-TURN\u2063"  # stands for a model turn when the chat template renders what follows one


@dataclass(frozen=True)
class TurnLimits:
    max_turns: int
    max_turn_tokens: int
    max_total_tokens: int  # max_dec_len


class TemplateMarkup:
    """Messages the environment appends -> the token ids that follow a model turn in the chat template: the
    template's end of the assistant turn (less the eos the model wrote itself), the messages, and the next
    assistant turn's opening. Rendered around a placeholder turn, so templates that render earlier turns
    differently (Qwen3 drops their reasoning) give the same tokens."""

    def __init__(self, tokenizer, tool_schemas: Optional[list]):
        self.tokenizer, self.tool_schemas = tokenizer, tool_schemas or None

    def ids(self, messages: list, ended_with: Optional[int]) -> list:
        conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": TURN_MARK}, *messages]
        text = self.tokenizer.apply_chat_template(conversation, tools=self.tool_schemas, add_generation_prompt=True, tokenize=False)
        after = text.split(TURN_MARK, 1)[1]
        written = self.tokenizer.decode([ended_with]) if ended_with is not None else ""
        if written and after.startswith(written):  # the model's eos closed its turn already
            after = after[len(written):]
        return self.tokenizer(after, add_special_tokens=False)["input_ids"]


class MultiTurnEngine:
    def __init__(self, engine, tokenizer, environment, limits: TurnLimits, tool_schemas: Optional[list] = None):
        self.engine, self.tokenizer, self.environment, self.limits = engine, tokenizer, environment, limits
        self.markup = TemplateMarkup(tokenizer, tool_schemas)
        self.pad_token_id = engine.pad_token_id

    def sync(self) -> Optional[float]:
        return self.engine.sync()

    def generate(
        self, prompts: list, group_size: int, params: SamplingParams, samples: Optional[list] = None, on_tokens: TokenStream = None
    ) -> Rollout:
        """As RolloutEngine.generate; samples: each prompt's reward sample, which the environment sees."""
        if on_tokens is not None:
            raise ValueError("a multi-turn rollout does not stream its tokens")
        rows = [list(p) for p in prompts for _ in range(group_size)]
        episodes = [Episode(sample=samples[row // group_size] if samples else {}) for row in range(len(rows))]
        trajectories = [Trajectory() for _ in rows]
        finish: list = [None] * len(rows)
        known = [None] * len(rows)  # the fused engine's keys and values of each row's context so far
        active = list(range(len(rows)))
        for turn in range(1, self.limits.max_turns + 1):
            budgets = [min(self.limits.max_turn_tokens, self.limits.max_total_tokens - len(trajectories[r].ids)) for r in active]
            contexts = [rows[r] + trajectories[r].ids for r in active]
            turn_params = self._turn_params(params, turn, active, max(budgets))
            out, kept = self.engine.generate_turn(contexts, [known[r] for r in active], turn_params)
            for row, kv in zip(active, kept):
                known[row] = kv
            for index, (row, budget) in enumerate(zip(active, budgets)):
                length = min(int(out.lengths[index]), budget)
                ids = out.completion_ids[index, :length].tolist()
                trajectories[row].add(ids, out.logprobs[index, :length], generated=True)
                episodes[row].turns.append(self.tokenizer.decode(ids, skip_special_tokens=True))
                if out.finish_reasons[index] != "eos" or int(out.lengths[index]) > budget:
                    finish[row] = "length"
                elif self.environment.done(episodes[row]):
                    finish[row] = "eos"
                elif turn == self.limits.max_turns:
                    finish[row] = "max_turns"
            going = [row for row in active if finish[row] is None]
            for row in active:
                if finish[row] is not None:
                    known[row] = None
            replies = self.environment.reply([episodes[row] for row in going]) if going else []
            active = []
            for row, messages in zip(going, replies):
                ids = self.markup.ids(messages, trajectories[row].ids[-1])
                if len(trajectories[row].ids) + len(ids) >= self.limits.max_total_tokens:
                    finish[row] = "length"
                    continue
                trajectories[row].add(ids, np.zeros(len(ids), np.float32), generated=False)
                active.append(row)
            if not active:
                break
        return self._rollout(rows, trajectories, episodes, finish, group_size)

    def _turn_params(self, params: SamplingParams, turn: int, active: list, max_new_tokens: int) -> SamplingParams:
        """Turn 1 samples as a single-turn rollout would; later turns draw from a seed of their own, each row keyed on
        its index in the global batch, so a row's draws do not depend on which other rows are still going."""
        seed = params.seed if turn == 1 or params.seed is None else int(np.random.SeedSequence([params.seed, turn]).generate_state(1)[0])
        keys = tuple(params.first_row + row for row in active)
        return dataclasses.replace(params, max_new_tokens=max_new_tokens, seed=seed, row_keys=keys, first_row=0)

    def _rollout(self, rows: list, trajectories: list, episodes: list, finish: list, group_size: int) -> Rollout:
        width = max(1, max(len(t.ids) for t in trajectories))
        shape = (len(rows), width)
        completion_ids, completion_mask = np.full(shape, self.pad_token_id, np.int64), np.zeros(shape, np.float32)
        environment_mask, logprobs = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        for row, trajectory in enumerate(trajectories):
            n = len(trajectory.ids)
            completion_ids[row, :n], completion_mask[row, :n] = trajectory.ids, 1.0
            environment_mask[row, :n] = ~np.array(trajectory.generated, dtype=bool)
            logprobs[row, :n] = trajectory.logprobs
        return Rollout(
            prompt_ids=rows,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            logprobs=logprobs,
            finish_reasons=finish,
            group_size=group_size,
            environment_mask=environment_mask,
            episodes=episodes,
        )


class Trajectory:
    """One row's tokens after its prompt, and which the model generated."""

    def __init__(self):
        self.ids, self.logprobs, self.generated = [], [], []

    def add(self, ids: list, logprobs: np.ndarray, generated: bool) -> None:
        self.ids += list(ids)
        self.logprobs += [float(v) for v in logprobs]
        self.generated += [generated] * len(ids)


def tool_schemas(tools: list) -> list:
    """The named tools' JSON schemas, for the chat template's tools= (empty: no tools)."""
    return [get_tool(name).schema for name in tools]


@dataclass(frozen=True)
class TurnSettings:
    """The multi-turn section of a run's settings (alignment/run/build.py makes it from the config)."""

    environment: Optional[str]  # a registered environment's name; None: single-turn rollouts
    tools: ToolSettings
    limits: TurnLimits


def with_environment(engine, tokenizer, settings: TurnSettings):
    """The engine itself for single-turn rollouts; wrapped in a MultiTurnEngine when settings name an environment."""
    if settings.environment is None:
        return engine
    tools = settings.tools
    if not tools.limits.isolated and any(get_tool(name).sandboxed for name in tools.tools):
        warnings.warn("tool_isolation none: python and plugin tool calls run without operating-system isolation, with the "
                      "resource limits only; code they run can read and change what this user can")
    environment = get_environment(settings.environment).factory(tools)
    return MultiTurnEngine(engine, tokenizer, environment, settings.limits, tool_schemas(tools.tools))


def check_template(tokenizer, schemas: list) -> None:
    """Before any model loads: the chat template must render a tool's answer (some accept only user and assistant turns),
    and a template that ignores tools= gets a warning: the model then learns of the tools only from the system prompt."""
    try:
        TemplateMarkup(tokenizer, schemas).ids([{"role": "tool", "name": "t", "content": "1"}], None)
    except Exception as exc:  # jinja's own errors, or a template's raise_exception("...")
        raise ConfigError(
            f"chat_template: the chat template cannot render a tool's answer (a 'tool' message): {exc}; set chat_template to one that can"
        ) from None
    if schemas:
        question = [{"role": "system", "content": "."}, {"role": "user", "content": "?"}]
        # add_generation_prompt given: paddleformers warns whenever it is left to its default (True, unlike transformers)
        shown = tokenizer.apply_chat_template(question, tools=schemas, add_generation_prompt=True, tokenize=False)
        if shown == tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False):
            warnings.warn(
                "tools: the chat template does not show tools= to the model; "
                "describe the tools in system_prompt, or set a chat_template that renders them"
            )


def tool_use(episodes: list, correct: np.ndarray) -> dict:
    """Episodes that called a tool, and those among them that got an answer (no error) and ended correct."""
    answered = [any(call.error is None for call in episode.calls) for episode in episodes]
    return {
        "called_tools": float(sum(bool(episode.calls) for episode in episodes)),
        "useful_calls": float(sum(a and bool(c) for a, c in zip(answered, correct))),
    }


def episode_sums(rollout: Rollout, correct: np.ndarray) -> dict:
    """A multi-turn rollout's sums for the step's metrics, which divide all but tool_seconds by the number of episodes:
    model turns, tool calls and those that failed (malformed, unknown tool, the tool's error or limit), seconds spent in
    tools (summed over calls, which run in parallel), tokens the model generated and tokens the environment put in,
    the episodes each limit ended, and tool_use's counts."""
    calls = [call for episode in rollout.episodes for call in episode.calls]
    environment_tokens = float(rollout.environment_mask.sum())
    return {
        **tool_use(rollout.episodes, correct),
        "turns": float(sum(len(episode.turns) for episode in rollout.episodes)),
        "tool_calls": float(len(calls)),
        "tool_errors": float(sum(call.error is not None for call in calls)),
        "tool_seconds": float(sum(call.seconds for call in calls)),
        "generated_tokens": float(rollout.completion_mask.sum()) - environment_tokens,
        "environment_tokens": environment_tokens,
        "ended_by_max_turns": float(sum(reason == "max_turns" for reason in rollout.finish_reasons)),
        "ended_by_length": float(sum(reason == "length" for reason in rollout.finish_reasons)),
    }
