"""Each test that claims something ran, or that a limit holds, fails when the claim is made false.

    .venv/bin/python tests/helpers/mutations.py [NAME ...]        # make test-mutations: all of them

For each mutation below, a deliberately broken copy of the product: one source file changed in a copy of the working
tree, its named tests run there, and they must fail. A control run of the same tests on the unchanged copy must pass
first, so that a failure is the mutation's doing. Prints one JSON object per mutation and exits 1 if any mutation
survived (its tests passed on the broken copy) or a control failed.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # the source file it changes, relative to the repository
    replacements: tuple  # (old, new) pairs; each old text occurs exactly once in the file
    tests: tuple  # pytest node ids that must fail on the broken copy


MUTATIONS = (
    Mutation(
        "bf16-engine-in-float32",  # the engine asked for bf16 computes in float32, with the bf16 tolerance
        "alignment/rollout/fused.py",
        (("self.model, self.ops, self.bf16, self.cache_dtype = model, ops, bf16, cache_dtype",
          "self.model, self.ops, self.bf16, self.cache_dtype = model, ops, False, cache_dtype"),),
        ("tests/models/test_cpu_bf16.py::test_the_bf16_engine_samples_what_the_bf16_actor_computes",),
    ),
    Mutation(
        "bf16-linear-in-float32",  # a float32 product, which the bf16 error bound also admits
        "alignment/kernels/ops.py",
        (('    return _run("grpo_bf16_linear", x, list(weights), weight_bf16, bool(weight_grad))',
          '    import paddle\n    return paddle.matmul(x, paddle.concat(list(weights), axis=1)), x.astype("bfloat16")'),),
        ("tests/models/test_cpu_bf16.py::test_linear_and_its_gradients_against_float64",),
    ),
    Mutation(
        "recompute-ignored",
        "alignment/run/build.py",
        (("    if config.recompute:\n        enable_recompute(", "    if False:\n        enable_recompute("),),
        ("tests/models/test_recompute.py::test_a_run_with_recompute_equals_one_without",),
    ),
    Mutation(
        "reference-model-not-loaded",  # none loads, so the actor (without adapters, as with LoRA) stands in for it
        "alignment/run/build.py",
        (("    if not config.loads_reference_model:\n", "    if True:\n"),),
        ("tests/e2e/test_train_e2e.py::test_kl_penalty_loads_a_reference_model",),
    ),
    Mutation(
        "reference-on-paddle-kernels",  # the KL term's reference keeps paddle's fp32 kernels: other log-probs at equal weights
        "alignment/run/build.py",
        (("        use_training_ops(model, bf16)  # where", "        pass  # where"),),
        ("tests/run/test_reference_model.py::test_the_reference_runs_the_policys_operators_and_gives_its_logits_at_equal_weights",),
    ),
    Mutation(
        "time-limit-ignored",  # max_train_minutes never ends a run
        "alignment/step/trainer.py",
        (("    out_of_time = step < run.data.total_steps and terminate.out_of_time(run.world)\n", "    out_of_time = False\n"),),
        ("tests/e2e/test_faults.py::test_max_train_minutes_ends_the_run_after_the_step_that_passes_it_evaluated_and_saved",),
    ),
    Mutation(
        "weights-not-changed",  # the optimizer never steps
        "alignment/step/update.py",
        (("        learner.optimizer.step()\n", "        pass\n"),),
        ("tests/e2e/test_smollm2_recipes.py::test_recipe_trains_and_saves_a_step_of_the_real_model[arith]",),
    ),
    Mutation(
        "micro-batches-at-the-batch-width",  # every micro-batch padded to the batch's longest completion, as before
        "alignment/step/micro_batches.py",
        (("        return cls(rows, max(int(widths[rows].max(initial=0)), 1))",
          "        return cls(rows, max(int(widths.max(initial=0)), 1))"),),
        ("tests/step/test_micro_batches.py::test_micro_batches_cut_to_their_longest_completion_give_the_update_of_one_whole_batch[dapo]",),
    ),
    Mutation(
        "rollout-logprobs-recomputed",  # use_rollout_logprobs read but the trainer's pass run as before
        "alignment/step/update.py",
        (("    if settings.use_rollout_logprobs:  # validation", "    if False:  # validation"),),
        ("tests/step/test_rollout_logprobs.py::test_the_ratio_is_taken_against_the_engines_logprobs",),
    ),
    Mutation(
        "weight-sync-check-skipped",  # the fused engine refreshes its weights but checks nothing
        "alignment/rollout/fused.py",
        (("bf16=self.bf16)  # (V, Hd) weight\n        return self._check_probe()",
          "bf16=self.bf16)  # (V, Hd) weight\n        return 0.0"),),
        ("tests/rollout/test_fused_engine.py::test_sync_stops_where_its_refresh_left_the_engine_stale[float32]",),
    ),
    Mutation(
        "kk-wrong-answer-scored-as-unparsed",  # PaddleNLP's server gives a wrong answer -1.5
        "alignment/rewards/logic_rewards.py",
        (("ANSWER_RIGHT, ANSWER_WRONG, ANSWER_UNPARSED = 2.0, -1.5, -2.0",
          "ANSWER_RIGHT, ANSWER_WRONG, ANSWER_UNPARSED = 2.0, -2.0, -2.0"),),
        ("tests/rewards/test_kk.py::test_with_config_kk_the_reward_scores_as_paddlenlps_reward_server_does",),
    ),
    Mutation(
        "one-request-holds-every-worker",
        "reward_server/reward_server.py",
        (("job_workers=args.workers - 1", "job_workers=args.workers"),),
        ("tests/reward_server/test_reward_server.py::test_one_request_cannot_hold_every_worker",),
    ),
    Mutation(
        "request-budget-ignored",  # the request waits for all its items
        "alignment/rewards/pool.py",
        (("await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.done)), budget)", "await asyncio.wrap_future(job.done)"),),
        ("tests/reward_server/test_reward_server.py::test_a_request_is_scored_within_its_time_budget_and_its_other_items_get_an_error",),
    ),
    Mutation(
        "scoring-goes-on-after-the-client-left",
        "alignment/rewards/pool.py",
        (('        except asyncio.CancelledError:\n            self.end(job, "cancelled")\n            raise',
          "        except asyncio.CancelledError:\n            raise"),),
        ("tests/reward_server/test_reward_server.py::test_a_client_that_goes_away_stops_its_scoring_and_is_logged_as_gone_not_as_500",),
    ),
    Mutation(
        "stalled-head-left-open",
        "reward_server/reward_server.py",
        (("        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():\n            self.transport.close()",
          "        pass"),),
        ("tests/reward_server/test_reward_server.py::test_a_connection_that_stalls_in_its_headers_is_closed",),
    ),
    Mutation(
        "flood-read-to-its-end",  # the output is cut at the limit, but only after the child wrote all of it
        "alignment/tools/sandbox.py",
        (("    streams = {\"stdout\": bytearray(), \"stderr\": bytearray()}",
          "    streams, over = {\"stdout\": bytearray(), \"stderr\": bytearray()}, False"),
         ("                        del streams[name][cap:]\n                    return streams, False, True",
          "                        del streams[name][cap:]\n                    over = True"),
         ("    return streams, False, False", "    return streams, False, over")),
        ("tests/tools/test_sandbox.py::test_a_flood_is_stopped_at_the_output_limit_without_reading_it_all",),
    ),
    Mutation(
        "seccomp-filter-refuses-nothing",  # the filter loaded, but without its rules
        "alignment/tools/sandbox.py",
        (("        rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)\n", "        pass\n"),),
        ("tests/tools/test_sandbox.py::test_as_root_or_not_the_code_holds_no_privilege_on_the_host",),
    ),
    Mutation(
        "writable-places-unsized",  # tmpfs without --size: half the machine's memory each
        "alignment/tools/sandbox.py",
        (('        arguments += ["--size", str(disk_mb * 2**20), "--perms", "1777", "--tmpfs", place]',
          '        arguments += ["--perms", "1777", "--tmpfs", place]'),),
        ("tests/tools/test_sandbox.py::test_every_writable_place_is_bounded",),
    ),
    Mutation(
        "sandbox-shows-the-hosts-etc",  # read-only, as the package is, but not bound on purpose
        "alignment/tools/sandbox.py",
        (('"--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]',
          '"--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev", "--ro-bind", "/etc", "/etc"]'),),
        ("tests/tools/test_sandbox.py::test_the_host_is_read_only_and_mostly_absent",),
    ),
    Mutation(
        "tool-calls-one-at-a-time",
        "alignment/tools/environment.py",
        (("ThreadPoolExecutor(settings.parallel,", "ThreadPoolExecutor(1,"),),
        ("tests/tools/test_tools.py::test_calls_run_in_parallel",),
    ),
    Mutation(
        "rewards-read-the-tools-words",  # the whole conversation scored, as the last version did
        "alignment/step/scoring.py",
        (('        written = ["\\n".join(episode.turns) for episode in rollout.episodes]\n', ""),),
        ("tests/rollout/test_multi_turn.py::test_rewards_score_what_the_model_wrote_not_what_a_tool_printed",),
    ),
    Mutation(
        "pickled-checkpoint-resumed",  # no refusal: the pickle would be loaded
        "alignment/run/start.py",
        (("if resume and (pickled := pickled_files(resume.path)) and not config.trust_pickled_checkpoint:", "if False:"),),
        ("tests/storage/test_checkpoint.py::test_a_checkpoint_holding_pickle_is_refused_before_anything_loads_unless_trusted",),
    ),
    Mutation(
        "reward-server-timeout-per-read",  # httpx's own timeout bounds each read, not the whole answer
        "alignment/rewards/remote.py",
        (("with anyio.fail_after(timeout):", "with anyio.fail_after(None):"),
         ("httpx.AsyncClient(timeout=None,", "httpx.AsyncClient(timeout=timeout,")),
        ("tests/e2e/test_faults.py::test_a_trickling_answer_is_held_to_the_timeout_as_a_whole",),
    ),
    Mutation(
        "training-operators-take-the-engines-list",  # a model type the fused engine learns to run switches them on
        "alignment/models/fused_train.py",
        (("    if config.model_type not in TRAINING_MODEL_TYPES:",
          "    from alignment.rollout.fused import SUPPORTED_MODEL_TYPES as TRAINING_MODEL_TYPES\n"
          "    if config.model_type not in TRAINING_MODEL_TYPES:"),),
        ("tests/models/test_train_ops.py::test_the_training_operators_refuse_a_model_type_only_the_rollout_engine_accepts",),
    ),
    Mutation(
        "rollout-process-imports-the-trainer",  # the layering the house plan forbids
        "alignment/rollout_worker.py",
        (("from alignment.rollout import generate\n",
          "from alignment.rollout import generate\nfrom alignment.step.trainer import train  # noqa: F401\n"),),
        ("tests/project/test_layout.py::test_the_rollout_process_does_not_import_the_trainer",
         "tests/project/test_layout.py::test_every_module_imports_only_its_layer_and_those_below"),
    ),
    Mutation(
        "model-folder-settings-trusted",  # a checkpoint's grpo_config.json may import plugins and name a reward server again
        "alignment/run/model_source.py",
        (("        if key in USERS_ONLY or looser or names_file:", "        if looser or names_file:"),),
        ("tests/run/test_model_folders_are_data.py::test_evaluate_neither_imports_a_checkpoints_plugin_nor_sends_to_its_server",
         "tests/run/test_model_folders_are_data.py::test_chat_does_not_import_a_checkpoints_plugin"),
    ),
    Mutation(
        "link-key-from-the-environment",  # the link key in GRPO_ROLLOUT_LINK_KEY, which the launcher logs, accepted again
        "alignment/rollout/link_handshake.py",
        (("    if PLAIN_KEY_VARIABLE in os.environ:", "    if False:"),),
        ("tests/e2e/test_rollout_workers.py::test_a_link_across_machines_needs_a_key_file_of_the_users",),
    ),
    Mutation(
        "secret-written-in-grpo-config",  # grpo_config.json holds the reward server's key again
        "alignment/config/schema.py",
        (("return json.dumps(settings | {key: \"set\" if settings[key] not in (None, \"\", \"unset\") else \"unset\" "
          "for key in SECRET_KEYS}, indent=2)", "return json.dumps(settings, indent=2)"),),
        ("tests/run/test_secrets.py::test_grpo_config_json_holds_set_or_unset_in_a_secrets_place",),
    ),
    Mutation(
        "gguf-header-not-walked",  # the gguf package reads a hostile header as it comes (nested arrays: RecursionError)
        "alignment/models/gguf_model.py",
        (("    check_header(source)\n    try:\n        return GGUFReader(source)", "    try:\n        return GGUFReader(source)"),),
        ("tests/models/test_gguf.py::test_a_hostile_header_is_refused_before_the_gguf_package_reads_it[nested arrays]",),
    ),
    Mutation(
        "config-first-problem-only",  # a failed value check stops its section again: a config's second mistake is not reported
        "alignment/config/checks.py",
        (("        found.append(message)\n", "        raise ConfigError(message)\n"),),
        ("tests/config/test_paddlenlp_keys.py::test_every_problem_of_a_config_is_reported_at_once_before_anything_loads",),
    ),
    Mutation(
        "paddlenlp-refused-key-accepted",  # a PaddleNLP key this run cannot honour is accepted with a note instead
        "alignment/config/paddlenlp_keys.py",
        (("        raise Refusal(record.why)\n", "        return {}, record.why\n"),),
        ("tests/config/test_paddlenlp_keys.py::test_every_no_effect_key_says_so_at_start_and_every_refused_one_is_refused_with_its_reason"
         "[ptx_datasets]",),
    ),
    Mutation(
        "tool-call-depth-unchecked",  # arguments as a string 3,000 deep raise out of the environment again
        "alignment/tools/calls.py",
        (("    if depth := json_too_deep(text):\n", "    if depth := None:\n"),),
        ("tests/tools/test_tools.py::test_a_call_that_breaks_the_json_parser_or_its_bounds_is_answered_not_raised",),
    ),
    Mutation(
        "chat-prints-terminal-controls",
        "alignment/chat.py",
        (('    return TERMINAL_CONTROLS.sub("", text)', "    return text"),),
        ("tests/commands/test_chat.py::test_terminal_controls_from_the_model_or_a_tool_are_not_printed",),
    ),
    Mutation(
        "checkpoint-file-entries-outside-read",  # trainer_state.json's ../../../../etc/hostname is read and checksummed again
        "alignment/storage/resume.py",
        (("        if why := _outside(path, name):\n            return why\n", ""),),
        ("tests/storage/test_checkpoint.py::test_a_files_entry_outside_the_checkpoint_is_refused_unread",),
    ),
    Mutation(
        "forged-moments-loaded",  # a moment of another shape or dtype goes into the optimizer: a traceback at its step
        "alignment/storage/optimizer_state.py",
        (("        if why := optimizer_state_mismatch(state, named_parameters):", "        if why := None:"),),
        ("tests/storage/test_checkpoint.py::test_forged_optimizer_moments_are_refused_in_one_line",),
    ),
    Mutation(
        "reward-body-parsed-unmeasured",  # json.loads takes any body the size cap lets through
        "reward_server/body.py",
        (("    if why := check_shape(body, max_values, max_depth):", "    if why := None:"),),
        ("tests/reward_server/test_reward_server.py::test_an_extra_column_nested_too_deep_is_422_naming_it",),
    ),
    Mutation(
        "link-handshakes-one-at-a-time",  # the accept loop serves each connection to its end before the next
        "alignment/rollout/link_handshake.py",
        (("            threading.Thread(target=serve, args=(sock, peer), daemon=True, name=f\"rollout link {peer[0]}:{peer[1]}\").start()",
          "            serve(sock, peer)"),),
        ("tests/e2e/test_rollout_workers.py::test_silent_or_failing_connections_do_not_hold_up_the_rollout_processes",),
    ),
)


def copy_of_the_tree(destination: Path) -> None:
    """The working tree's files (tracked, and untracked ones git does not ignore) and the compiled operators, with
    their times kept: the operators must stay newer than csrc/'s sources, or they count as stale."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    if (REPO / "csrc" / "build").is_dir():
        shutil.copytree(REPO / "csrc" / "build", destination / "csrc" / "build", copy_function=shutil.copy2)


def run_tests(tree: Path, tests: tuple) -> tuple:
    """-> (pytest's exit code, seconds, the end of its output), run in `tree` with its own code first on the path; a
    skipped test fails there (GRPO_REQUIRE_ALL), so a test that did not run never counts as passing."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-o", "addopts=", "-p", "no:cacheprovider", *tests], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree), "GRPO_REQUIRE_ALL": "1"}, capture_output=True, text=True)
    return done.returncode, round(time.monotonic() - started, 1), (done.stdout + done.stderr)[-2000:]


def mutated(text: str, mutation: Mutation) -> str:
    for old, new in mutation.replacements:
        if text.count(old) != 1:
            raise SystemExit(f"{mutation.name}: {mutation.path} holds {text.count(old)} copies of {old!r}, not one")
        text = text.replace(old, new)
    return text


def check(tree: Path, mutation: Mutation) -> dict:
    control, control_seconds, control_output = run_tests(tree, mutation.tests)
    record = {"mutation": mutation.name, "tests": list(mutation.tests), "control_passed": control == 0, "control_seconds": control_seconds}
    if control != 0:
        return {**record, "output": control_output}
    source = tree / mutation.path
    original = source.read_text()
    source.write_text(mutated(original, mutation))
    try:
        code, seconds, output = run_tests(tree, mutation.tests)
    finally:
        source.write_text(original)
    # pytest's exit code 1: tests ran and failed; 0 means the mutation survived, others that the tests did not run
    record.update(broken_copy_failed=code == 1, seconds=seconds)
    first_error = next((line for line in output.splitlines() if line.startswith("E ")), output[-300:])
    return {**record, "failure": first_error[1:].strip()[:300]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"mutations to run (default all): {', '.join(m.name for m in MUTATIONS)}")
    names = parser.parse_args().names
    unknown = set(names) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="grpo-mutations-") as folder:
        tree = Path(folder)
        copy_of_the_tree(tree)
        for mutation in MUTATIONS:
            if names and mutation.name not in names:
                continue
            record = check(tree, mutation)
            ok &= record["control_passed"] and record.get("broken_copy_failed", False)
            print(json.dumps(record), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
