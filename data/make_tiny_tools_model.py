"""Build the bundled tool-calling model, data/tiny-qwen2-tools: the bundled tiny model (data/tiny-qwen2) taught to
call a calculator, for config/tiny_tools.

    python data/make_tiny_tools_model.py      # rewrites data/tiny-qwen2-tools/ (a few minutes on 2 CPU cores)

It starts from data/tiny-qwen2's weights (training from scratch takes 35 minutes), adds Qwen2.5's tool tokens
<tool_call> </tool_call> <tool_response> </tool_response> (not special: decoding keeps them, as in Qwen2.5) with
embedding rows set to the mean of the others, sets data/tiny_tools/chat_template.jinja (ChatML that lists the tools
in the system turn and renders a tool's answer as Qwen2.5 does), and fine-tunes on three kinds of traces of the
bundled word problems:
- P_TOOL: the whole problem as one calculator call, then the answer it reads back:
  `<tool_call>{"name": "calculator", "arguments": {"expression": "(20-7)*2"}}</tool_call>`, the tool's answer in the
  template's markup (as the trainer's rollout renders it; no loss on it), then `<answer>26</answer>`;
- P_SELF: the correct worked solution without the tool;
- the rest: the classic slip of stopping one step early, without the tool.
So the model starts knowing both ways and mostly slipping: greedy decoding is mostly wrong, sampling right a fair part
of the time by either way, and GRPO has signal to prefer the calculator. Everything is seeded.
"""

import argparse
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from alignment.basics.runtime import configure_cpu_runtime, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import arith_task  # noqa: E402
import numpy as np  # noqa: E402
from alignment.basics.data import encode_messages  # noqa: E402
from alignment.models.modeling import load_causal_lm, load_tokenizer, save_model  # noqa: E402
from make_tiny_model import fine_tune  # noqa: E402

from alignment.rewards.math_rewards import accuracy  # noqa: E402
from alignment.rollout.base import SamplingParams  # noqa: E402
from alignment.rollout.eager import EagerEngine  # noqa: E402
from alignment.rollout.multi_turn import MultiTurnEngine, TemplateMarkup, TurnLimits  # noqa: E402
from alignment.tools import ToolSettings, get_environment, get_tool  # noqa: E402
from alignment.tools.sandbox import SandboxLimits  # noqa: E402

BASE = HERE / "tiny-qwen2"
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
TEMPLATE = (HERE / "tiny_tools" / "chat_template.jinja").read_text()
SYSTEM_PROMPT = (HERE / "tiny_tools" / "system_prompt.txt").read_text()
P_TOOL, P_SELF = 0.25, 0.2
SEED = 5
MAX_DEC_LEN = 128


def expression(problem: arith_task.Problem) -> str:
    """The problem as one expression: ("20-7=13", "13*2=26") -> "(20-7)*2"."""
    text = problem.equations[0].split("=")[0]
    for equation in problem.equations[1:]:
        left, _ = equation.split("=")
        for operator in "+-*":
            if operator in left:
                _, operand = left.split(operator)
                text = f"({text}){operator}{operand}" if operator == "*" else f"{text}{operator}{operand}"
    return text


def tool_call(problem: arith_task.Problem) -> str:
    arguments = {"name": "calculator", "arguments": {"expression": expression(problem)}}
    return f"<tool_call>{json.dumps(arguments)}</tool_call>"


def encode_example(tokenizer, markup: TemplateMarkup, schemas: list, problem, rng: random.Random) -> tuple:
    """-> (prompt ids, completion ids, loss mask: 0 on the tool's answer)."""
    prompt = encode_messages(({"role": "user", "content": problem.question},), tokenizer, SYSTEM_PROMPT, schemas)

    def ids(text: str) -> list:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    draw = rng.random()
    if draw < P_TOOL:
        call = ids(tool_call(problem) + "<|im_end|>")
        answer = markup.ids([{"role": "tool", "name": "calculator", "content": str(problem.answer)}], tokenizer.eos_token_id)
        final = ids(f"<answer>{problem.answer}</answer><|im_end|>")
        return prompt, call + answer + final, [1] * len(call) + [0] * len(answer) + [1] * len(final)
    completion = ids(arith_task.solution(problem, skip_last_step=draw >= P_TOOL + P_SELF) + "<|im_end|>")
    return prompt, completion, [1] * len(completion)


def with_tool_tokens(tokenizer, model):
    """The tokenizer with TOOL_TOKENS added and a model whose (tied) embedding has rows for them: their mean."""
    from paddleformers.transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer.add_tokens(TOOL_TOKENS)
    tokenizer.chat_template = TEMPLATE
    weights = model.state_dict()
    embedding = weights["model.embed_tokens.weight"].numpy()
    added = np.repeat(embedding.mean(axis=0, keepdims=True), len(tokenizer) - embedding.shape[0], axis=0)
    grown = paddle.to_tensor(np.concatenate([embedding, added]))
    config = Qwen2Config(**{**model.config.to_dict(), "vocab_size": len(tokenizer)})
    bigger = Qwen2ForCausalLM(config)
    bigger.set_state_dict({**weights, "model.embed_tokens.weight": grown, "lm_head.weight": grown})
    return tokenizer, bigger


def multi_turn_accuracy(model, tokenizer, rows: list, samples: int) -> dict:
    """Held-out accuracy through the trainer's own multi-turn rollout with the calculator, scored as the trainer
    scores it (the accuracy reward over the whole conversation after the prompt), and the share of episodes that
    called the calculator."""
    schemas = [get_tool("calculator").schema]
    settings = ToolSettings(tools=("calculator",), limits=SandboxLimits())
    engine = MultiTurnEngine(
        EagerEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id), tokenizer,
        get_environment("tools").factory(settings), TurnLimits(3, MAX_DEC_LEN, MAX_DEC_LEN), schemas,
    )
    prompts = [encode_messages(({"role": "user", "content": r["src"]},), tokenizer, SYSTEM_PROMPT, schemas) for r in rows]

    def measure(rollout, group: int) -> tuple:
        texts = tokenizer.batch_decode(
            [ids[:n].tolist() for ids, n in zip(rollout.completion_ids, rollout.lengths)], skip_special_tokens=True
        )
        correct = [accuracy(text, {"answer": rows[i // group]["tgt"]}) for i, text in enumerate(texts)]
        return float(np.mean(correct)), float(np.mean([bool(episode.calls) for episode in rollout.episodes]))

    greedy, greedy_calls = measure(engine.generate(prompts, 1, SamplingParams(max_new_tokens=MAX_DEC_LEN, greedy=True)), 1)
    sampled, sampled_calls = measure(
        engine.generate(prompts, samples, SamplingParams(max_new_tokens=MAX_DEC_LEN, temperature=1.0)), samples
    )
    return {
        "greedy_accuracy": greedy,
        "greedy_tool_call_rate": greedy_calls,
        "sampled_accuracy": sampled,
        "sampled_tool_call_rate": sampled_calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "tiny-qwen2-tools"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--skip_eval", action="store_true", help="do not report held-out accuracy and tool use")
    args = parser.parse_args()

    random.seed(SEED)
    np.random.seed(SEED)
    paddle.seed(SEED)
    tokenizer, model = with_tool_tokens(load_tokenizer(str(BASE)), load_causal_lm(str(BASE)))
    print(f"tokenizer: {len(tokenizer)} tokens ({', '.join(TOOL_TOKENS)} added)")
    held_out = {json.loads(line)["src"] for name in ("train", "test") for line in open(HERE / "arith" / f"{name}.jsonl")}
    problems = arith_task.unique_problems(SEED, args.steps * args.batch, exclude=held_out)
    schemas = [get_tool("calculator").schema]
    markup = TemplateMarkup(tokenizer, schemas)
    rng = random.Random(SEED)
    examples = [encode_example(tokenizer, markup, schemas, p, rng) for p in problems]

    fine_tune(model, examples, tokenizer.pad_token_id, args.steps, args.batch, args.lr, warmup=20, report_every=50)
    if not args.skip_eval:
        test_rows = [json.loads(line) for line in open(HERE / "arith" / "test.jsonl")]
        print(json.dumps(multi_turn_accuracy(model, tokenizer, test_rows, samples=4)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    save_model(model, str(out))
    print(f"saved to {out}")


if __name__ == "__main__":
    main()
