"""A rollout process (rollout_workers): it loads what the training process's plan names, then generates its
share of every step's completions in the order alignment.rollout.link.rollout_order gives, taking new weights
after each word from the trainer. It never trains, scores or writes to the run folder: the training process
scores every rollout, logs and checkpoints.

Each share samples exactly what the same rows of a colocated run would (the fused engine keys every row's draws
on the step's seed and the row's index in the global batch), so with async_generate false the run equals a
colocated one. Signals are left to the training process: a rollout process ignores Ctrl-C and SIGTERM and stops
when the trainer says so, or when the trainer is gone.
"""

import dataclasses
import signal
import time

import paddle.distributed as dist

from alignment.basics.errors import TrainerGone
from alignment.models.modeling import load_tokenizer
from alignment.rollout import generate
from alignment.rollout.link import Placement, rollout_order, trained_parameters, worker_share
from alignment.rollout.wire import RolloutPart
from alignment.rollout.worker_link import WorkerLink
from alignment.run.build import load_actor, load_prompts, matmul_compute, rollout_engine, sampling_params
from alignment.config.schema import GRPOConfig
from alignment.basics.data import PromptSchedule
from alignment.run.seeding import seed_phase


def serve_rollouts(config: GRPOConfig, place: Placement) -> None:
    dist.init_parallel_env()  # the collective the weights come through; the trainer joins it too
    link = WorkerLink(place, config.output_dir)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    try:
        _serve(config, link, place)
    except TrainerGone as gone:
        print(f"rollout process {place.rank}: {gone}", flush=True)
        raise SystemExit(1) from None
    except Exception as error:  # the trainer names this process and the error, and saves, before it exits
        link.report(error)
        raise
    link.finished()


def _serve(config: GRPOConfig, link: WorkerLink, place: Placement) -> None:
    plan = link.plan()
    if plan.first_step >= plan.total_steps:
        return
    tokenizer = load_tokenizer(plan.tokenizer_folder, config.chat_template)
    prompts = load_prompts(config.train_datasets, tokenizer, config)[0]
    schedule = PromptSchedule(len(prompts), config.per_device_prompt_batch_size, 1, config.seed)
    model = load_actor(config, plan.weights_folder, plan.adapter_folder)
    parameters = trained_parameters(model)
    names = [name for name, _ in parameters]
    if names != plan.trained_parameters:
        raise RuntimeError(
            f"this process's model trains other parameters than the trainer's ({len(names)} against {len(plan.trained_parameters)})"
        )
    for parameter in model.parameters():
        parameter.stop_gradient = True
    model.eval()
    engine = rollout_engine(config, model, tokenizer, matmul_compute(config, model).bf16)
    print(f"rollout process {place.rank}: generating with the {type(engine).__name__} from step {plan.first_step + 1}", flush=True)
    sampling, weights_step = sampling_params(config), plan.first_step
    for step, word_step in rollout_order(plan.first_step, plan.total_steps, config.async_generate, plan.pending):
        synced, gap = 0.0, None
        if word_step is not None:
            if not link.receive_word(word_step, parameters):
                return
            started = time.perf_counter()
            gap = engine.sync()  # the receiving side's check: the engine against the weights just received
            weights_step, synced = word_step, time.perf_counter() - started
        batch = [prompts[i] for i in schedule.indices(step - 1, 0)]
        first, end = worker_share(len(batch), place.rollout_workers, place.worker_index)
        started = time.perf_counter()
        params = dataclasses.replace(sampling, seed=seed_phase(config.seed, step, 0, "train"), first_row=first * config.rollout_n)
        rollout = generate(engine, batch[first:end], config.rollout_n, params)
        link.send(RolloutPart(step, rollout, weights_step, time.perf_counter() - started, synced, gap))
