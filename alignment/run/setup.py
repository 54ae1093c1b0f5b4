"""A training run set up from its config, before its first step: the processes, the link to the rollout processes,
where the run starts, its data, its parts and the training state they resume, and what each phase of a step reads of
the config (StepSettings). step/trainer.py's train() takes the RunSetup and never sees the config."""

from dataclasses import dataclass
from typing import Optional

from alignment.config.schema import GRPOConfig
from alignment.parallel.distributed import World, init_world
from alignment.rollout.link import RunPlan, placement, trained_parameters
from alignment.rollout.trainer_link import TrainerLink
from alignment.run.build import RunData, RunParts, actor_sources, build_parts, read_run_data, step_settings
from alignment.run.settings import StepSettings
from alignment.run.start import nothing_to_train, start_point
from alignment.storage.optimizer_state import load_training_state
from alignment.storage.resume import Lineage, ResumePoint


@dataclass(frozen=True)
class RunSetup:
    world: World
    link: Optional[TrainerLink]  # the rollout processes, or None: this process generates
    resume: Optional[ResumePoint]  # the verified checkpoint the run resumes from
    lineage: Lineage  # what the run's checkpoints record of the runs before it
    data: RunData
    parts: Optional[RunParts]  # None: a resume at the run's last step, with nothing loaded and nothing to train
    state: dict  # the training state resumed: the last finished step, the log offsets, the skipped steps
    settings: StepSettings


def set_up_run(config: GRPOConfig) -> RunSetup:
    """Every process calls it; a refusal in any one stops all of them before any model loads. With rollout processes,
    they are sent the plan (the checkpoint, the model folders, the steps) and, one step off, the rollout in flight
    when the checkpoint was saved is restored."""
    placement(config.rollout_workers)  # one training process beside the rollout processes, or none of them
    world = init_world(config.sharding, config.sharding_parallel_degree, config.rollout_workers)
    link = TrainerLink(config.rollout_workers, config.async_generate, config.output_dir) if config.rollout_workers else None
    resume, lineage = start_point(config, world)  # refuses another run's output_dir; verifies the checkpoint
    data = read_run_data(config, world)  # the tokenizer and the prompts, before any model loads
    sources = actor_sources(config, resume, data.actor_folder)
    settings = step_settings(config)
    if resume and resume.step >= data.total_steps:
        if link:  # nothing to generate either
            link.publish(RunPlan(data.tokenizer_folder, *sources, data.total_steps, data.total_steps, False, []))
            link.wait_finished()
        nothing_to_train(resume, data.total_steps, world)
        return RunSetup(world, link, resume, lineage, data, None, resume.state, settings)

    # with rollout processes, the training process generates for evaluation only
    parts = build_parts(config, data, world, sources, generates=link is None or bool(data.eval_prompts))
    # moments, schedule
    trained = trained_parameters(parts.model)
    state = load_training_state(resume.path, parts.optimizer, trained, config.trust_pickled_checkpoint) if resume else {"step": 0}
    if link:
        if resume and config.async_generate:
            link.restore_pending(resume.path, state["step"] + 1, config.trust_pickled_checkpoint,
                                 data.schedule.global_batch * config.rollout_n, config.rollout_n, parts.model.config.vocab_size)
        names = [name for name, _ in trained]
        link.publish(RunPlan(data.tokenizer_folder, *sources, state["step"], data.total_steps, link.pending is not None, names))
    return RunSetup(world, link, resume, lineage, data, parts, state, settings)
