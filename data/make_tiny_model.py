"""Build the bundled tiny model: a BPE tokenizer and a ~3M-parameter Qwen2, pre-trained briefly with
supervised learning on the arithmetic task so that it knows the answer format.

    python data/make_tiny_model.py      # rewrites data/tiny-qwen2/ (about 35 minutes on 2 CPU cores)

The supervised solutions are right in P_CORRECT of the examples; the others make the classic slip of
stopping one step early and reporting that intermediate result (data/arith_task.py:
solution(skip_last_step=True)). The model therefore starts out knowing the format and the arithmetic
but preferring the slip, so greedy decoding is mostly wrong while sampling is right a fair part of the
time: the situation where GRPO's group-relative advantage has signal to work with. Everything is
seeded; the same machine and thread count give the same weights.
"""

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from alignment.basics.runtime import configure_cpu_runtime, contiguous_kernels, import_paddle  # noqa: E402

configure_cpu_runtime()
paddle = import_paddle()

import arith_task  # noqa: E402
import numpy as np  # noqa: E402
from alignment.models.modeling import completion_logits, load_tokenizer, make_token_batch, save_model  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from alignment.algo.logprobs import token_logprobs  # noqa: E402
from alignment.rollout.base import SamplingParams  # noqa: E402
from alignment.rollout.eager import EagerEngine  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SYSTEM_PROMPT = (HERE / "arith" / "system_prompt.txt").read_text()
P_CORRECT = 0.3
SFT_SEED = 3
MODEL = dict(
    hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)


def build_tokenizer(texts: list, vocab_size: int) -> PreTrainedTokenizerFast:
    # Byte-level BPE like Qwen2's, with every digit its own token (the first may carry the space before it)
    # so numbers are spelled digit by digit.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r" ?\d"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=MODEL["max_position_embeddings"]
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def prompt_messages(question: str) -> list:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def encode_example(tokenizer, problem, rng: random.Random):
    prompt = tokenizer.apply_chat_template(prompt_messages(problem.question), add_generation_prompt=True, tokenize=False)
    completion = arith_task.solution(problem, skip_last_step=rng.random() >= P_CORRECT) + "<|im_end|>"
    return tokenizer(prompt, add_special_tokens=False)["input_ids"], tokenizer(completion, add_special_tokens=False)["input_ids"]


def fine_tune(model, examples: list, pad: int, steps: int, batch: int, lr: float, warmup: int, report_every: int) -> None:
    """Supervised steps over examples in order, `batch` at a time: (prompt ids, completion ids[, loss mask: 1 on the
    tokens to learn, default all]); AdamW, linear warmup then cosine decay to 0, gradient norm clipped to 1."""
    schedule = paddle.optimizer.lr.LambdaDecay(
        lr, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    optimizer = paddle.optimizer.AdamW(
        schedule, parameters=model.parameters(), weight_decay=0.01, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0)
    )
    model.train()
    start = time.time()
    for step in range(steps):
        chunk = examples[step * batch : (step + 1) * batch]
        completion_ids, completion_mask = pad_right([c[1] for c in chunk], pad)
        loss_mask = paddle.to_tensor(pad_right([c[2] if len(c) > 2 else [1] * len(c[1]) for c in chunk], 0)[0].astype(np.float32))  # (B, T)
        tokens = make_token_batch([c[0] for c in chunk], completion_ids, completion_mask, pad)
        with contiguous_kernels():
            logprobs = token_logprobs(completion_logits(model, tokens), tokens.completion_ids)
            loss = -(logprobs * loss_mask).sum() / loss_mask.sum()
            loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        schedule.step()
        if step % report_every == 0 or step == steps - 1:
            print(
                json.dumps({"step": step, "loss": round(float(loss), 4), "lr": schedule.get_lr(), "seconds": round(time.time() - start)}),
                flush=True,
            )
    model.eval()


def pad_right(rows: list, pad: int) -> tuple:
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.float32)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return ids, mask


def evaluate(model, tokenizer, rows: list, samples: int) -> dict:
    engine = EagerEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    prompts = [
        tokenizer.apply_chat_template(prompt_messages(r["src"]), add_generation_prompt=True, tokenize=True) for r in rows
    ]

    def correct(rollout, group):
        texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
        answers = [t.split("<answer>")[-1].split("</answer>")[0].strip() for t in texts]
        return [a == rows[i // group]["tgt"] for i, a in enumerate(answers)]

    greedy = correct(engine.generate(prompts, 1, SamplingParams(max_new_tokens=48, greedy=True)), 1)
    sampled = correct(engine.generate(prompts, samples, SamplingParams(max_new_tokens=48, temperature=1.0)), samples)
    return {"greedy_accuracy": float(np.mean(greedy)), "sampled_accuracy": float(np.mean(sampled))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "tiny-qwen2"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--skip_eval", action="store_true", help="do not report greedy and sampled accuracy")
    args = parser.parse_args()

    random.seed(SFT_SEED)
    np.random.seed(SFT_SEED)
    paddle.seed(SFT_SEED)
    held_out = {json.loads(line)["src"] for name in ("train", "test") for line in open(HERE / "arith" / f"{name}.jsonl")}
    problems = arith_task.unique_problems(SFT_SEED, args.steps * args.batch // 4, exclude=held_out)

    corpus = [SYSTEM_PROMPT] + [p.question for p in problems[:5000]] + [arith_task.solution(p) for p in problems[:5000]]
    tokenizer = build_tokenizer(corpus, args.vocab)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    tokenizer = load_tokenizer(str(out))

    from paddleformers.transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **MODEL,
    )
    model = Qwen2ForCausalLM(config)
    print(f"tokenizer: {len(tokenizer)} tokens; model: {sum(p.numel().item() for p in model.parameters()):,} parameters")

    rng = random.Random(SFT_SEED)
    examples = [encode_example(tokenizer, p, rng) for p in problems]
    order = rng.sample(range(len(examples)), len(examples)) * 4
    test_rows = [json.loads(line) for line in open(HERE / "arith" / "test.jsonl")]
    fine_tune(model, [examples[i] for i in order], tokenizer.pad_token_id, args.steps, args.batch, args.lr, warmup=100, report_every=100)
    if not args.skip_eval:
        print(json.dumps(evaluate(model, tokenizer, test_rows, samples=8)))
    save_model(model, str(out))
    print(f"saved to {out}")


if __name__ == "__main__":
    main()
