"""Memory (alignment/models/memory.py, alignment/run/memory_plan.py, alignment/step/memory.py): micro-batches cut by a
token budget give the gradient of one micro-batch; the estimate counts the parameters of real models and comes near
the measured peak of a real update; a run that cannot fit is refused before any model loads, naming what would fit;
and a run whose memory reaches its limit stops with a message naming the last checkpoint."""

import copy
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import paddle
import pytest
from helpers.tiny_models import PAD, PROMPTS, VOCAB, llama_untied, qwen2_tied

from alignment.models.fused_train import use_training_ops
from alignment.models.lora import apply_lora
from alignment.models.memory import MemorySettings, ModelShape, TokenBudget, kv_cache_bytes, lora_parameters, update_bytes
from alignment.parallel.distributed import World
from alignment.rollout import EngineSettings, Rollout, SamplingParams, build_engine
from alignment.config.schema import GRPOConfig
from alignment.config.cli import load_config
from alignment.run.build import update_settings
from alignment.run.memory_plan import expected_cache_dtype
from alignment.basics.data import EncodedPrompt, PromptRecord
from alignment.step.records import ScoredBatch
from alignment.step.update import Learner, update_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "rows_total, row_tokens, budget, most_rows, group, expected",
    [
        (64, 200, 0, 64, 1, 64),  # no budget: per_device_train_batch_size
        (64, 200, 0, 16, 1, 16),
        (64, 200, 200 * 40, 64, 1, 32),  # 40 rows fit: two equal micro-batches of 32
        (64, 200, 200 * 40, 64, 8, 32),  # whole groups of 8
        (64, 200, 200 * 20, 64, 8, 16),  # 20 fit, 16 in whole groups: 4 micro-batches
        (60, 200, 200 * 25, 64, 1, 20),  # 25 fit: 3 micro-batches of 20
        (10, 200, 200 * 4, 64, 1, 4),  # 4, 4, 2
        (64, 200, 200 * 5, 64, 8, 5),  # not even one group fits: rows, the group split
        (64, 200, 100, 64, 8, 1),  # not even one row fits: one row at a time
        (64, 200, 10**9, 16, 8, 16),  # per_device_train_batch_size still bounds
        (24, 200, 200 * 16, 64, 8, 16),  # 16 fit, in whole groups: 16 and 8
    ],
)
def test_micro_batch_rows(rows_total, row_tokens, budget, most_rows, group, expected):
    assert TokenBudget(budget, budget, most_rows, group).rows(rows_total, row_tokens) == expected


def test_the_logprob_passes_read_their_own_budget():
    budget = TokenBudget(update=200 * 8, logprobs=200 * 32, most_rows=64)
    assert budget.rows(64, 200) == 8 and budget.rows(64, 200, logprobs=True) == 32


def scored_batch(groups: int, group_size: int, length: int, seed: int) -> ScoredBatch:
    """A batch of groups x group_size rows of random tokens: prompts of different lengths, ragged completions, random
    rollout log-probs and advantages."""
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(1, 90, size=rng.integers(3, 9))] for _ in range(groups)]
    rows = groups * group_size
    completion_ids = rng.integers(1, 90, size=(rows, length)).astype(np.int64)
    ends = rng.integers(2, length + 1, size=rows)
    mask = (np.arange(length)[None, :] < ends[:, None]).astype(np.float32)
    completion_ids[mask == 0] = PAD
    rollout = Rollout(
        prompt_ids=[prompts[r // group_size] for r in range(rows)], completion_ids=completion_ids, completion_mask=mask,
        logprobs=(-rng.random((rows, length)) * mask).astype(np.float32), finish_reasons=["eos"] * rows, group_size=group_size,
    )
    records = [EncodedPrompt(PromptRecord(({"role": "user", "content": "q"},), "1"), tuple(p)) for p in prompts]
    rewards = rng.normal(size=rows)
    scored = ScoredBatch(records, rollout, [""] * rows, rewards, {}, [None] * rows, rewards > 0)
    scored.advantages = rng.normal(size=rows).astype(np.float32)
    return scored


def sgd_change(model, scored, config, budget):
    """-> minus the gradient of one update (plain SGD at learning rate 1) of a copy of the model."""
    model = copy.deepcopy(model)
    before = [p.numpy().copy() for p in model.parameters()]
    optimizer = paddle.optimizer.SGD(1.0, parameters=model.parameters())
    update_policy(Learner(model, None, optimizer), scored, update_settings(config), World(0, 1), PAD, 1, budget)
    return [p.numpy() - b for p, b in zip(model.parameters(), before)]


@pytest.mark.parametrize("loss_type, kl", [("dapo", "0"), ("grpo", "0.05"), ("dr_grpo", "0")])
def test_token_budget_micro_batches_give_the_gradient_of_one_micro_batch(ops, loss_type, kl):
    model = qwen2_tied()
    use_training_ops(model)  # the prefix grouper runs: whole groups per micro-batch where they fit
    scored = scored_batch(groups=3, group_size=4, length=6, seed=5)
    row_tokens = max(len(p) for p in scored.rollout.prompt_ids) + 6
    config = load_config(
        ["config/tiny/grpo_argument.json", "--rollout_n", "4", "--per_device_prompt_batch_size", "3", "--per_device_train_batch_size", "12",
         "--loss_type", loss_type, "--kl_loss_coeff", kl, "--temperature", "0.8"]
    )
    whole = sgd_change(model, scored, config, None)  # one micro-batch of 12 rows
    assert max(np.abs(g).max() for g in whole) > 1e-4
    for budget in (TokenBudget(8 * row_tokens, 5 * row_tokens, 12, group_size=4),  # 2 groups: 8 + 4 rows; log-probs 5 at a time
                   TokenBudget(5 * row_tokens, 3 * row_tokens, 12, group_size=1)):  # 4 + 4 + 4 rows, groups split
        assert budget.rows(12, row_tokens) < 12
        for a, b in zip(whole, sgd_change(model, scored, config, budget)):
            np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-7)


def config_json(model) -> dict:
    config = model.config.to_dict()
    config["model_type"] = model.config.model_type
    return config


@pytest.mark.parametrize("make", [qwen2_tied, llama_untied])
def test_the_parameter_count_is_the_models(make):
    model = make()
    assert ModelShape.from_config(config_json(model)).parameters == sum(int(np.prod(p.shape)) for p in model.parameters())


def test_the_lora_count_is_the_adapters():
    model = llama_untied()
    targets = ["q_proj", "v_proj", "down_proj"]
    apply_lora(model, 4, 8.0, 0.0, targets)
    trained = sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)
    assert lora_parameters(ModelShape.from_config(config_json(llama_untied())), 4, targets) == trained


MEASURE = textwrap.dedent(
    """
    import json, sys
    sys.path[:0] = [{here!r}, {tests!r}, {repo!r}]
    from alignment.basics.runtime import configure_cpu_runtime, contiguous_kernels, import_paddle
    configure_cpu_runtime()
    paddle = import_paddle()
    from test_memory import scored_batch
    from alignment.models.fused_train import use_training_ops
    from alignment.models.modeling import load_causal_lm
    from alignment.parallel.distributed import World
    from alignment.config.cli import load_config
    from alignment.run.memory_plan import resident_bytes
    from alignment.step.memory import step_peak_bytes
    from alignment.run.build import update_settings
    from alignment.step.update import Learner, update_policy
    model = load_causal_lm("data/tiny-qwen2", "float32")
    use_training_ops(model)
    scored = scored_batch(groups=4, group_size=8, length=96, seed=1)
    config = load_config(["config/tiny/grpo_argument.json", "--per_device_train_batch_size", "32"])
    optimizer = paddle.optimizer.AdamW(1e-5, parameters=model.parameters())
    static = 12 * sum(int(p.size) for p in model.parameters())  # the gradients and AdamW's two moments, made by the first update
    before = resident_bytes()
    with contiguous_kernels():  # the second update's peak: the allocator keeps some of what the first one freed
        for step in (1, 2):
            step_peak_bytes()
            update_policy(Learner(model, None, optimizer), scored, update_settings(config), World(0, 1), 0, step)
    added = step_peak_bytes() - before - static
    print(json.dumps({{"added": added, "prompt_width": max(len(p) for p in scored.rollout.prompt_ids)}}))
    """
)


def test_the_update_estimate_is_near_the_measured_peak(ops):
    """Real updates of the tiny model (32 rows, 96 completion tokens, the training operators, the prefix grouper) in a
    fresh process: what the second one's peak holds beyond the process before them, the gradients and AdamW's moments,
    against update_bytes, within the 25% the estimate promises."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE.format(here=str(Path(__file__).parent), tests=str(REPO / "tests"), repo=str(REPO))],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    shape = ModelShape.from_config(json.loads((REPO / "data/tiny-qwen2/config.json").read_text()))
    settings = MemorySettings(
        prompt_width=measured["prompt_width"], completion_width=96, group_size=8, generations=((4, 8),), training_ops=True,
        prefix_grouper=True, recompute=False, reference_model=False, lora_parameters=None, optimizer_share=1.0, logprob_chunk_tokens=512,
        attention_weights_kept=not hasattr(ops, "grpo_attention"),
    )
    estimated = update_bytes(shape, settings, 32)
    assert abs(estimated / measured["added"] - 1) < 0.25, (estimated, measured)


@pytest.mark.parametrize("cache_dtype, value_bytes", [("float32", 4), ("bfloat16", 2)])
def test_the_rollout_estimate_counts_the_caches_the_engine_allocates(ops, cache_dtype, value_bytes):
    """The fused engine generating 3 prompts x 4 copies of 5 new tokens: the bytes of the caches it allocates (the rows'
    and the prompts' own) are kv_cache_bytes' count, in either dtype."""
    model = qwen2_tied()
    engine = build_engine(EngineSettings(fused=True, kv_cache_dtype=cache_dtype), model, [VOCAB - 1], PAD)
    allocated, allocate = [], engine._empty_cache

    def counted(batch, slots):  # the engine's own allocation, its size noted
        cache = allocate(batch, slots)
        allocated.append(int(np.prod(cache.shape)) * cache.element_size())
        return cache

    engine._empty_cache = counted
    engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=5, seed=0))
    settings = MemorySettings(
        prompt_width=max(map(len, PROMPTS)), completion_width=5, group_size=4, generations=((3, 4),), training_ops=True,
        prefix_grouper=True, recompute=False, reference_model=False, lora_parameters=None, optimizer_share=1.0, logprob_chunk_tokens=512,
        cache_value_bytes=value_bytes,
    )
    shape = ModelShape.from_config(model.config.to_dict())
    assert len(allocated) == 2 and sum(allocated) == kv_cache_bytes(shape, settings, 3, 4), allocated


@pytest.mark.parametrize(
    "keys, bf16_flags, expected",
    [
        ({}, True, "bfloat16"),  # auto with bf16 matmuls
        ({}, False, "float32"),  # a CPU without bf16 (GRPO_CPU_BF16=0 hides the flags)
        ({"cpu_bf16_matmul": "off"}, True, "float32"),
        ({"use_fused_train_ops": False}, True, "float32"),  # no bf16 matmuls without the training operators
        ({"kv_cache_dtype": "float32"}, True, "float32"),
        ({"kv_cache_dtype": "bfloat16"}, False, "bfloat16"),
        ({"use_fusemt": False}, True, "float32"),  # the eager engine's cache is paddle's, float32
    ],
)
def test_the_estimate_expects_the_cache_dtype_the_engine_picks(ops, monkeypatch, keys, bf16_flags, expected):
    if bf16_flags and not any(flag in Path("/proc/cpuinfo").read_text() for flag in ("amx_bf16", "avx512_bf16")):
        pytest.skip("this CPU lacks amx_bf16 and avx512_bf16: auto keeps float32 matmuls here")
    if bf16_flags and not hasattr(ops, "grpo_prepack_bf16"):
        pytest.skip("the operators were built without oneDNN (paddle/libs has no libdnnl.so.3)")
    monkeypatch.setenv("GRPO_CPU_BF16", "1" if bf16_flags else "0")
    config = GRPOConfig(**{"use_fusemt": True, "use_fused_train_ops": True, **keys})  # the defaults are both false
    assert expected_cache_dtype(config) == expected


def launch(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "1", "--log_dir", str(tmp_path / "launch"),
        "run_grpo.py", "config/tiny/grpo_argument.json", "--output_dir", str(tmp_path / "out"), "--overwrite_output_dir", *flags,
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)


def error_line(tmp_path: Path, done: subprocess.CompletedProcess) -> str:
    log = (tmp_path / "launch" / "workerlog.0").read_text()
    lines = [line for line in log.splitlines() if line.startswith("run_grpo: error: ")]
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in log, log[-3000:]
    return lines[0]


def test_a_run_that_cannot_fit_is_refused_naming_what_would(ops, tmp_path):
    """A token budget that lets 32 rows of 882 tokens into one micro-batch under a 2 GB limit: refused before the model
    loads, naming what fits (where grpo_attention keeps no attention weights: 16 rows, two prompt groups, or recompute;
    where they are kept: 8 rows, one group); LoRA, which leaves the activations, is not named."""
    done = launch(tmp_path, "--max_dec_len", "800", "--micro_batch_token_budget", "100000", "--memory_limit_gb", "2", "--max_steps", "1",
                  "--eval_datasets", "")
    line = error_line(tmp_path, done)
    # without the attention weights, recompute (one layer's activations kept at a time) fits too
    fits = "14112 or recompute true" if hasattr(ops, "grpo_attention") else "7056"
    assert re.search(r"memory: the estimated peak [\d.]+ GB \(runtime .*update activations \(32 rows\) [\d.]+ GB\) exceeds "
                     rf"memory_limit_gb 2; it would fit with micro_batch_token_budget {fits} \(", line), line
    assert not (tmp_path / "out" / "checkpoint-1").exists()


LEAK = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from alignment.basics.runtime import configure_cpu_runtime, import_paddle
    configure_cpu_runtime()
    import_paddle()
    import numpy as np
    from alignment.basics.errors import OutOfMemoryError
    from alignment.config.cli import load_config
    from alignment.run.memory_plan import resident_bytes
    from alignment.run.setup import set_up_run
    from alignment.step.trainer import train
    out = Path({out!r})
    limit = (resident_bytes() + 2.5 * 2**30) / 2**30  # the tiny run needs about 0.4 GB of it
    config = load_config(["config/tiny/grpo_argument.json", "--output_dir", str(out), "--max_steps", "40", "--save_steps", "1",
                          "--eval_datasets", "", "--memory_limit_gb", f"{{limit:.2f}}"])
    held = []
    def leak():  # something in the process that grows once step 1 is saved, 1 GB a second, to 4 GB
        while not (out / "checkpoint-1").exists():
            time.sleep(0.05)
        for _ in range(400):
            held.append(np.ones(10 * 2**20, np.uint8))
            time.sleep(0.01)
    threading.Thread(target=leak, daemon=True).start()
    try:
        train(set_up_run(config))
    except OutOfMemoryError as error:
        print(f"error: {{error}}")
    print("peak under the limit:", resident_bytes("VmHWM") < limit * 2**30)
    """
)


def test_a_run_that_reaches_its_limit_stops_naming_the_last_checkpoint(tmp_path):
    """A real run (train, in a fresh process) whose process grows past memory_limit_gb after its first checkpoint: the
    guard stops it with one message naming the step and the newest checkpoint, before the limit is reached."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", LEAK.format(repo=str(REPO), out=str(out))], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    stopped = re.search(r"error: out of memory: resident memory [\d.]+ GB of memory_limit_gb [\d.]+, .* left on the machine .*; the run "
                        r"stopped before the kernel would kill it; during step (\d+); the last checkpoint is (\S+) \(resume with",
                        done.stdout)
    assert stopped, done.stdout[-3000:]
    newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert int(stopped.group(1)) >= 2 and stopped.group(2) == str(newest), (stopped.group(0), newest)
    assert "peak under the limit: True" in done.stdout


GUARD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    import numpy as np
    from alignment.basics.errors import OutOfMemoryError
    from alignment.run.memory_plan import resident_bytes
    from alignment.step.memory import RESERVE, MemoryGuard
    limit = resident_bytes() + RESERVE + 200 * 2**20
    held = []
    try:
        with MemoryGuard(limit, lambda: "test"):
            for _ in range(200):  # up to 2 GB, 10 MB at a time, each page written
                held.append(np.ones(10 * 2**20, np.uint8))
                __import__("time").sleep(0.01)
    except OutOfMemoryError as error:
        print(f"stopped at {{len(held) * 10}} MB: {{error}}")
    print("peak under the limit:", resident_bytes("VmHWM") < limit)
    """
)


def test_the_guard_interrupts_the_main_thread_before_the_limit():
    done = subprocess.run([sys.executable, "-c", GUARD.format(repo=str(REPO))], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stopped = re.search(r"stopped at (\d+) MB: out of memory: resident memory .* of memory_limit_gb .*; the run stopped before the kernel "
                        r"would kill it; test", done.stdout)
    assert stopped and 150 <= int(stopped.group(1)) <= 260, done.stdout
    assert "peak under the limit: True" in done.stdout


GUARD_IN_BACKWARD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    import numpy as np
    import paddle
    from alignment.basics.errors import OutOfMemoryError
    from alignment.run.memory_plan import resident_bytes
    from alignment.step.memory import RESERVE, MemoryGuard
    held = []

    class Grow(paddle.autograd.PyLayer):  # as the chunked log-probs' backward: Python code run by paddle's autograd
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, grad):
            for _ in range(200):  # up to 2 GB, 10 MB at a time
                held.append(np.ones(10 * 2**20, np.uint8))
                time.sleep(0.01)
            return grad

    x = paddle.ones([2])
    x.stop_gradient = False
    limit = resident_bytes() + RESERVE + 200 * 2**20
    try:
        with MemoryGuard(limit, lambda: "test"):
            Grow.apply(x).sum().backward()
    except OutOfMemoryError as error:
        print(f"stopped: {{error}}")
    """
)


def test_the_guards_stop_inside_a_pylayers_backward_is_its_own_error_not_paddles_wrapping():
    """paddle hands an exception raised inside a PyLayer's backward on as an OSError holding its text; the run must still
    stop with the guard's one line (the chunked log-probs' backward is where a run's update most often grows)."""
    done = subprocess.run([sys.executable, "-c", GUARD_IN_BACKWARD.format(repo=str(REPO))], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^stopped: out of memory: resident memory .* the run stopped before the kernel would kill it; test$",
                     done.stdout, re.MULTILINE), done.stdout


def test_verl_names_and_bad_values():
    config = load_config(
        ["config/tiny/grpo_argument.json", "--ppo_max_token_len_per_gpu", "4096", "--log_prob_max_token_len_per_gpu", "8192"]
    )
    assert (config.micro_batch_token_budget, config.logprob_token_budget) == (4096, 8192)
    with pytest.raises(Exception, match="micro_batch_token_budget = -1: must be at least 0"):
        load_config(["config/tiny/grpo_argument.json", "--micro_batch_token_budget", "-1"])
    with pytest.raises(Exception, match="memory_limit_gb = -2.0: must be at least 0"):
        load_config(["config/tiny/grpo_argument.json", "--memory_limit_gb", "-2"])
