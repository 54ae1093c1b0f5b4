"""Every key of grpo_argument.json: one flat, frozen dataclass, filled from the JSON file and then from
`--key value` pairs on the command line, validated once before any model is loaded.

Key names are PaddleNLP's; the names TRL and ms-swift users bring are accepted as aliases (ALIASES).
PaddleNLP's keys this trainer spells otherwise or does not have are read as paddlenlp_keys.py says.
An unknown key is an error naming the closest known key; values that disagree fail with a message
naming the keys, every problem of a config in one message. The file's values must have their key's JSON type
("4" is not an integer; a boolean is true, false, 0 or 1, as PaddleNLP's files write them); the command
line is parsed by paddleformers' PdArgumentParser (argparse over dataclass fields), so `--key value` works
exactly as in PaddleNLP's launchers (a list key takes the values up to the next --key). Every number must be
finite and fit in int64.
"""

import codecs
import dataclasses
import difflib
import inspect
import json
import math
import os
import re
import shutil
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from alignment.algo.advantages import ADVANTAGE_ESTIMATORS, REWARD_AGGREGATIONS, REWARD_SCALES
from alignment.algo.aggregation import LOSS_AGGREGATIONS
from alignment.algo.corrections import ROLLOUT_CORRECTIONS, rejection_rules
from alignment.algo.kl import KL_ESTIMATOR_SYNONYMS, KL_ESTIMATORS
from alignment.algo.objectives import IMPORTANCE_RATIOS, OBJECTIVES
from alignment.algo.schedule import SCHEDULES
from alignment.errors import ConfigError
from alignment.run.checks import check, collected, show
from alignment.run.data import parse_step_range
from alignment.run.paddlenlp_keys import PADDLENLP_ALIASES, PADDLENLP_KEYS, PADDLENLP_VALUES, Refusal, from_text, read_key
from alignment.step.dashboards import DASHBOARDS, NONE, DashboardSettings


# verl's loss_mode values, stored as the surrogates they are
SURROGATE_SYNONYMS = {"vanilla": "clip", "geo_mean": "gmpo"}
# TRL's loss_type values that name an objective: cispo is refused (its clip keys mean another thing there), sapo is read as
# surrogate sapo with the per-sequence mean TRL gives it
TRL_LOSS_TYPES = {"cispo": None, "sapo": ("sapo", "grpo")}


def _key(default, help: str, **kwargs):
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class GRPOConfig:
    # Model and data
    actor_model_name_or_path: str = _key(
        "data/tiny-qwen2",
        "Policy model: a local Hugging Face-layout folder (config.json, safetensors, tokenizer), or a .gguf file (llama.cpp, Ollama), "
        "imported into <output_dir>/imported/<file name without .gguf> and reused while the file is unchanged.",
    )
    tokenizer_name_or_path: Optional[str] = _key(
        None,
        "Tokenizer folder (or .gguf file, imported as the actor's is); default: the actor's.",
    )
    chat_template: Optional[str] = _key(None, "Jinja chat template (text or file) replacing the tokenizer's.")
    train_datasets: str = _key(
        "data/arith/train.jsonl",
        "Training data, comma-separated: .jsonl, .json, .parquet or .csv files, or folders written by datasets' save_to_disk.",
    )
    eval_datasets: Optional[str] = _key(None, "Held-out data, comma-separated, as train_datasets; none: no evaluation.")
    prompt_key: Optional[str] = _key(None, "Column holding the prompt; default: detected (src, question, messages, prompt).")
    response_key: Optional[str] = _key(
        None,
        "Column holding the reference answer, a dotted key for a nested field; default: detected (tgt, answer, solution, response, "
        "ground_truth, reward_model.ground_truth as verl writes it).",
    )
    calculation_steps: Optional[str] = _key(
        None,
        "Keep only the rows whose reference answer marks this many <<...>> calculations, as GSM8K's worked answers do: a count (2) "
        "or a range (1-2); applies to train_datasets and eval_datasets. Default: every row.",
    )
    system_prompt: Optional[str] = _key(None, "System prompt (text or a file) put before every prompt without one.")
    max_prompt_len: int = _key(512, "Longest prompt in tokens, chat template included.")
    skip_bad_rows: bool = _key(
        False,
        "Skip malformed data rows (bad JSON, missing or wrong-typed fields, invalid UTF-8), printing each one's file:line and the count, "
        "instead of stopping at the first.",
    )
    prompt_truncation: str = _key("left", "Prompts over max_prompt_len: left (cut from the start) or drop.", choices=["left", "drop"])
    max_dec_len: int = _key(256, "Most tokens generated per completion.")
    min_dec_len: int = _key(0, "Fewest tokens generated before an eos token may end a completion.")
    max_seq_len: Optional[int] = _key(None, "Upper bound on max_prompt_len + max_dec_len; default: the model's max_position_embeddings.")
    # Rollout
    rollout_n: int = _key(8, "Completions sampled per prompt (the group size G).")
    per_device_prompt_batch_size: Optional[int] = _key(
        None,
        "Prompts per process per step; default 8, or derived from gradient_accumulation_steps.",
    )
    per_device_train_batch_size: int = _key(8, "Sequences per forward/backward micro-batch.")
    gradient_accumulation_steps: Optional[int] = _key(None, "Micro-batches per optimizer step; derived when not given, checked when given.")
    temperature: float = _key(1.0, "Sampling temperature; log-probs are those of softmax(logits / temperature).")
    top_p: float = _key(1.0, "Nucleus sampling mass (1.0: off).")
    top_k: int = _key(0, "Sample among the k most likely tokens (0: off).")
    repetition_penalty: float = _key(1.0, "CTRL-style penalty on tokens already present (1.0: off).")
    min_p: float = _key(0.0, "Drop tokens less likely than min_p x the most likely one (0: off).")
    use_fusemt: bool = _key(False, "Generate with the fused engine built from csrc/ (make ops); eager when the operators are not built.")
    use_fused_train_ops: bool = _key(
        False,
        "Run the actor's forward and backward through the compiled csrc/ training operators (RMSNorm, rotary q|k|v, attention softmax, "
        "SwiGLU with backward kernels; CPU, float32 Qwen2 / Llama / Qwen3); paddle's own kernels, with a warning, where they cannot run.",
    )
    cpu_bf16_matmul: str = _key(
        "auto",
        "CPU runs: the matmuls of the actor's projections, attention and log-prob head in bfloat16 with float32 accumulation, master "
        "weights, gradients and AdamW in float32 (csrc/grpo_bf16.cc, paddle's oneDNN; needs use_fused_train_ops). auto: on where the CPU "
        "has AMX or AVX512-BF16 (the run's first line says which); off: float32 as before; on: bf16, an error where it cannot run. GPU "
        "runs use the bf16 key instead.",
        choices=["auto", "on", "off"],
    )
    kv_cache_dtype: str = _key(
        "auto",
        "The fused engine's KV cache on the CPU (vLLM's name): auto (bfloat16 where the CPU matmuls run in bf16, cpu_bf16_matmul; else "
        "float32), float32, or bfloat16 (keys and values computed in float32 and rounded when written: half the cache's memory and of "
        "what decode's attention reads; with bf16 matmuls the actor's attention rounds keys and values alike, and the rollout's "
        "log-probs differ from the actor's by 0.011 a token on average on SmolLM2-135M, bench/RESULTS.md). bfloat16 needs use_fusemt.",
        choices=["auto", "float32", "bfloat16"],
    )
    rollout_workers: int = _key(
        0,
        "Processes that only generate, beside one training process under the same launch (python -m paddle.distributed.launch "
        "--nproc_per_node 1+N): each holds its own copy of the weights in its rollout engine and generates its share of every step's "
        "completions; after every optimizer step the trainer sends the new weights (a broadcast over the launcher's collective: gloo on "
        "CPU, NCCL on GPU) and the engine's weight-sync check runs on the receiving side. 0: the training processes generate (colocated).",
    )
    async_generate: bool = _key(
        False,
        "With rollout_workers: one step off (ms-swift's name): step s+1's completions are generated while step s trains, from weights one "
        "optimizer step old (metric rollout/staleness), which the importance-sampling correction accounts for; a checkpoint holds the "
        "rollout in flight, so a resume is exact. false: the trainer waits for completions of its current weights, and the run equals a "
        "colocated one.",
    )
    weight_sync_tolerance: Optional[float] = _key(
        None,
        "Largest |log-prob difference| allowed between the fused engine and the actor on its probe after each weight refresh; default 1e-4 "
        "with float32 matmuls, 0.25 with bf16 ones or a bfloat16 kv_cache_dtype (the gap is rounding there, 0.039 measured on "
        "SmolLM2-135M, and stale bf16 weight copies are caught exactly instead).",
    )
    # Algorithm
    loss_type: str = _key(
        "dapo",
        "How token losses become the step's loss: dapo (sum over the global batch's tokens / their count), grpo (mean over each sequence's "
        "tokens, then over sequences), dr_grpo (sum / (sequences x max_dec_len)), bnpo (TRL's: the token mean of each micro-batch, then "
        "the mean over micro-batches and processes; it depends on per_device_train_batch_size). TRL's sapo means surrogate sapo with "
        "loss_type grpo.",
        choices=[*LOSS_AGGREGATIONS.names(), *TRL_LOSS_TYPES],
    )  # cispo: TRL's spelling, refused naming surrogate; sapo: TRL's, read as surrogate sapo
    advantage_estimator: str = _key(
        "grpo",
        "How rewards become advantages: grpo (reward - group mean, scaled by scale_rewards), rloo (reward - the mean of the group's other "
        "members, unscaled), reinforce_plus_plus (the reward whitened over the step's loss tokens, no group baseline), "
        "reinforce_plus_plus_baseline (reward - group mean, then whitened over the step's loss tokens), grpo_passk (pass@k: only the "
        "group's best member gets an advantage, best - second best, divided by the group's std under scale_rewards group), opo (reward - "
        "the group's length-weighted mean reward, OPO's optimal baseline).",
        choices=ADVANTAGE_ESTIMATORS.names(),
    )
    scale_rewards: str = _key(
        "group",
        "advantage_estimator grpo: reward - group mean, divided by the group's std (group), the whole batch's std (batch) or nothing "
        "(none: Dr.GRPO); grpo_passk: group or none.",
        choices=REWARD_SCALES.names(),
    )
    multi_objective_aggregation: str = _key(
        "sum_then_normalize",
        "Several reward functions: sum_then_normalize (the weighted sum is the reward) or normalize_then_sum (GDPO: each function's values "
        "normalised within their group first, the weighted sum then whitened over the step; advantage_estimator grpo).",
        choices=REWARD_AGGREGATIONS.names(),
    )
    importance_sampling_level: str = _key(
        "token",
        "The ratio pi / pi_old per token (PPO, GRPO) or per sequence (GSPO: the geometric mean of its tokens' ratios, clipped as a whole; "
        "the GSPO paper clips at clip_range_ratio_low 3e-4, clip_range_ratio_high 4e-4).",
        choices=IMPORTANCE_RATIOS.names(),
    )
    surrogate: str = _key(
        "clip",
        "Per-token policy objective: clip (PPO's clipped ratio x advantage), cispo (MiniMax-M1: the ratio clipped to [1 - "
        "clip_range_ratio_low, 1 + clip_range_ratio_high] as a weight without gradient, times advantage x log pi; no token's gradient is "
        "dropped), sapo (a smooth sigmoid gate of the ratio in place of the clip, temperatures sapo_temperature_pos / _neg), gmpo (the "
        "geometric mean of each sequence's token ratios, each clipped in log space to [-clip_range_ratio_low, clip_range_ratio_high]: the "
        "paper uses 0.4 and 0.4). verl's vanilla and geo_mean are clip and gmpo.",
        choices=[*OBJECTIVES.names(), *SURROGATE_SYNONYMS],
    )
    sapo_temperature_pos: float = _key(1.0, "surrogate sapo: the gate's temperature for tokens with positive advantage (TRL, verl: 1.0).")
    sapo_temperature_neg: float = _key(
        1.05,
        "surrogate sapo: the gate's temperature for tokens with advantage <= 0; higher than the positive one, so negative updates fade "
        "sooner off-policy (TRL's and verl's 1.05).",
    )
    off_policy_mask_threshold: Optional[float] = _key(
        None,
        "DeepSeek-V3.2's off-policy sequence masking: a sequence with negative advantage whose mean over its loss tokens of log "
        "pi_rollout - log pi exceeds this is left out of the policy term (not the KL); null: off (TRL's key; the paper's delta, e.g. 0.5).",
    )
    top_entropy_quantile: float = _key(
        1.0,
        "Train the policy term on this fraction of each step's loss tokens with the highest entropy under the policy before the update "
        "(\"Beyond the 80/20 rule\": 0.2); 1.0: all tokens.",
    )
    entropy_coeff: float = _key(
        0.0,
        "Entropy bonus: entropy_coeff x the mean entropy (with its gradient) of the tokens the policy term trains on is subtracted from "
        "the loss, whatever loss_type (TRL's entropy_coef); 0: off.",
    )
    clip_range_ratio: float = _key(0.2, "PPO clip: the ratio is clipped to [1 - c, 1 + c] (both sides unless the next two keys are given).")
    clip_range_ratio_low: Optional[float] = _key(None, "Lower clip: the ratio is kept above 1 - low; default: clip_range_ratio.")
    clip_range_ratio_high: Optional[float] = _key(
        None,
        "Upper clip (DAPO's clip-higher, e.g. 0.28): the ratio is kept below 1 + high; default: clip_range_ratio.",
    )
    dual_clip_ratio: Optional[float] = _key(
        None,
        "Dual-clip constant c > 1: a token with negative advantage loses at most -A x c however large its ratio (null: off).",
    )
    num_iterations: int = _key(1, "Policy updates over each rollout batch (the old log-probs are computed once per batch).")
    mini_batch_size: Optional[int] = _key(
        None,
        "Sequences per process per optimizer step; default: the whole step's sequences (one optimizer step per iteration).",
    )
    shuffle_minibatch: bool = _key(False, "Shuffle the sequences (seeded per step and iteration) before cutting mini-batches.")
    importance_sampling_correction: bool = _key(
        True,
        "Weight each token's policy loss by pi_old / pi_rollout, the rollout engine's numerical gap to the trainer, as "
        "importance_sampling_mode says.",
    )
    importance_sampling_mode: str = _key(
        "token_truncate",
        "token_truncate (each token's ratio clipped to [importance_sampling_min, importance_sampling_cap]), token_mask (a token's weight 0 "
        "outside that range), sequence_truncate / sequence_mask (the same with one ratio per sequence, the product of its tokens'); verl's "
        "token and sequence mean the truncating ones.",
        choices=[*ROLLOUT_CORRECTIONS.names(), "token", "sequence"],
    )  # and verl's synonyms, IMPORTANCE_SAMPLING_SYNONYMS
    importance_sampling_cap: float = _key(2.0, "Upper bound of the importance-sampling weight (truncated to it, or masked above it).")
    importance_sampling_min: Optional[float] = _key(None, "Lower bound of the importance-sampling weight (null: none).")
    kl_loss_coeff: float = _key(0.0, "Weight of the KL penalty to the reference model; 0 loads no reference model.")
    kl_estimator: str = _key(
        "k3",
        "Per-token KL estimator of the KL loss with d = log pi_ref - log pi: k1 (-d), k2 (d^2 / 2), k3 (exp(d) - d - 1), low_var_kl "
        "(verl's: k3 with d clamped to [-20, 20], the estimate to [-10, 10]), abs (|d|); a trailing + (k1+, k3+, low_var_kl+) keeps the "
        "value and takes k2's gradient (verl's straight-through); full: the exact KL over the whole vocabulary at each position (the "
        "reference model runs in every micro-batch). verl's kl and mse are k1 and k2; its k3 is low_var_kl.",
        choices=[*KL_ESTIMATORS.names(), "full", *KL_ESTIMATOR_SYNONYMS],
    )  # full: not an estimator of the sampled token, computed from both models' hidden states (algo.logprobs.chunked_full_kl)
    use_bias_correction_kl: bool = _key(
        False,
        "Multiply each token's KL term by the ratio pi / pi_old (TRL's option, DeepSeek-V3.2's unbiased KL estimate under off-policy "
        "samples).",
    )
    use_kl_in_reward: bool = _key(
        False,
        "The KL to the reference model as a penalty in the reward instead of (or beside) the loss (verl's, REINFORCE++'s place for it): "
        "each sequence's reward less kl_in_reward_coeff x the sum over its loss tokens of kl_in_reward_estimator's KL, before the "
        "advantages. Loads the reference model.",
    )
    kl_in_reward_coeff: float = _key(0.001, "Weight of the KL in the reward (verl's algorithm.kl_ctrl.kl_coef).")
    kl_in_reward_estimator: str = _key(
        "k1",
        "Estimator of the KL in the reward, as kl_estimator (verl's algorithm.kl_penalty; its default kl is k1).",
        choices=[*KL_ESTIMATORS.names(), *KL_ESTIMATOR_SYNONYMS],
    )
    rejection_sampling: Optional[str] = _key(
        None,
        "Rejection sampling of rollout tokens by the gap between the trainer's pi_old and the engine's pi_rollout (verl's rollout_rs): "
        "comma-separated options, all of which must pass: token_k1, token_k2, token_k3 (per token), seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, "
        "seq_max_k2/k3 (per sequence: the sum, mean or max of the token divergences); token, sequence and geometric are token_k1, "
        "seq_sum_k1 and seq_mean_k1. Rejected tokens leave the loss mask. null: off.",
    )
    rejection_sampling_threshold: Optional[str] = _key(
        None,
        "rejection_sampling's bounds, one shared or one per option, comma-separated: an upper bound, or for a k1 option lower_upper "
        "ratios (one number u means 1/u_u), e.g. \"0.5_2.0\" (verl's rollout_rs_threshold).",
    )
    dynamic_sampling: bool = _key(
        False,
        "DAPO's dynamic sampling: drop groups whose reward std is below dynamic_sampling_min_std and refill with groups of freshly sampled "
        "prompts.",
    )
    dynamic_sampling_min_std: float = _key(
        1e-4,
        "A group whose reward sample std is below this carries no signal (not exact equality: rewards can differ by rounding).",
    )
    max_resample_times: int = _key(
        3,
        "Refill rounds per step at most; groups still missing are filled with dropped ones (their advantage is 0) and counted.",
    )
    overlong_filter: bool = _key(False, "Leave completions cut off at max_dec_len out of the loss (DAPO's overlong filtering).")
    reward_functions: list[str] = _key(
        ["accuracy", "format"],
        "Reward functions by name (alignment/rewards; the Rewards page of docs/ lists them; reward_model: the model at "
        "reward_model_name_or_path).",
    )
    reward_function_weights: Optional[list[float]] = _key(None, "One weight per reward function; default: all 1.0.")
    clip_range_score: Optional[float] = _key(
        None,
        "Each completion's reward (the weighted sum of reward_functions, or the reward server's total) is clipped into "
        "[-clip_range_score, clip_range_score] before the advantages (PaddleNLP's key; its files give 10.0); null: no clipping.",
    )
    accuracy_function: str = _key("accuracy", "Reward function whose positive value counts as a correct answer for the accuracy metrics.")
    external_plugins: list[str] = _key(
        [],
        "Python files whose @register_reward functions become reward functions (they receive every dataset column); give the reward server "
        "the same files with --plugins.",
    )
    reward_model_name_or_path: Optional[str] = _key(
        None,
        "Sequence-classification reward model folder (one label, with its tokenizer), scored in process as the reward function "
        "reward_model.",
    )
    cosine_min_len_value_wrong: float = _key(-0.5, "cosine reward of a wrong answer of 0 tokens.")
    cosine_max_len_value_wrong: float = _key(0.0, "cosine reward of a wrong answer of cosine_max_len tokens or more.")
    cosine_min_len_value_correct: float = _key(1.0, "cosine reward of a correct answer of 0 tokens.")
    cosine_max_len_value_correct: float = _key(0.5, "cosine reward of a correct answer of cosine_max_len tokens or more.")
    cosine_max_len: Optional[int] = _key(
        None,
        "Length (tokens, 1 to 2^24) at which the cosine reward reaches its max-length values and stays; default: max_dec_len.",
    )
    repetition_n_grams: int = _key(3, "n of the word n-grams the repetition reward counts (1 to 1024).")
    repetition_max_penalty: float = _key(-1.0, "repetition reward of a completion made of one repeated n-gram (<= 0).")
    soft_max_length: Optional[int] = _key(
        None,
        "soft_overlong reward: the length L_max (tokens, at most 2^24): -1 at and beyond it; default: max_dec_len.",
    )
    soft_cache_length: Optional[int] = _key(
        None,
        "soft_overlong reward: the interval L_cache (tokens, >= 1, < soft_max_length) before L_max over which the penalty grows linearly "
        "from 0 to -1 (required with soft_overlong).",
    )
    substance_min_words: int = _key(
        20,
        "substance reward: an answer of fewer words (0 to 1024; half the row's own 'less than N words' limit where lower) is "
        "degenerate, -1.0.",
    )
    reward_item_timeout: float = _key(
        10.0,
        "Scoring in process (without use_rm_server): seconds one item may take. A slower one (a degenerate completion, a hung plugin) is "
        "an error, its reward NaN and left out of its group, never 0, and its worker process is replaced; the rest of the batch is "
        "scored. The reward server's --item_timeout.",
    )
    use_rm_server: bool = _key(False, "Score through the HTTP reward server at reward_server instead of in process.")
    reward_server: Optional[str] = _key(None, "Reward server address, http://host:port.")
    reward_server_protocol: str = _key(
        "v1",
        "v1 (POST /v1/score: per-function scores and per-item errors) or paddlenlp (POST /: totals only).",
        choices=["v1", "paddlenlp"],
    )
    reward_server_timeout: float = _key(
        60.0,
        "Seconds one scoring attempt may take, from connecting to the last byte of the answer (a limit on the whole exchange, not on each "
        "read).",
    )
    reward_server_retries: int = _key(3, "Retries of a failed request (with exponential backoff) before the run stops.")
    reward_server_api_key: Optional[str] = _key(
        None,
        "Bearer token for the reward server; default: the key in the file $GRPO_REWARD_SERVER_API_KEY_FILE names (mode 0600), else "
        "$GRPO_REWARD_SERVER_API_KEY. grpo_config.json records only \"set\" or \"unset\"; a resume reads the key again.",
    )
    # Multi-turn rollouts with tools
    tools: list[str] = _key(
        [],
        "Tools the model may call, by name: calculator, python (built in), or @register_tool functions of external_plugins; shown to the "
        "model through the chat template's tools=. Given: rollouts are multi-turn (environment tools).",
    )
    environment: Optional[str] = _key(
        None,
        "What answers each model turn: a registered environment (built in: tools, which runs the turn's tool calls and ends the episode at "
        "a turn without one; more from external_plugins' @register_environment); default: tools when tools are given, else single-turn "
        "rollouts.",
    )
    max_turns: int = _key(
        4,
        "Model turns per episode at most; a turn that still calls a tool at the last one ends the episode unanswered (finish reason "
        "max_turns).",
    )
    max_turn_tokens: Optional[int] = _key(
        None,
        "Tokens the model may generate in one turn; a turn that reaches it ends the episode (finish reason length). Default: max_dec_len, "
        "which bounds the whole trajectory after the prompt, tool answers included.",
    )
    tool_timeout: float = _key(
        10.0,
        "Seconds one tool call may take (wall clock); a slower one is killed and answered with an error, and the episode goes on.",
    )
    tool_memory_mb: int = _key(
        512, "Memory limit (MB) of a python or plugin tool call: each process's address space, and as root all the call's processes "
        "together (a memory cgroup, its tmpfs files on top); as a user a call of tool_processes processes may hold that many times it."
    )
    tool_output_bytes: int = _key(
        4096,
        "Bytes of a tool's output kept; a tool that prints more is stopped and its answer says so (verl's max_tool_response_length "
        "counts characters).",
    )
    tool_workers: int = _key(8, "Tool calls running at once.")
    max_tool_calls_per_turn: int = _key(
        4,
        "Tool calls one model turn may make; the ones after are not run, and one error answer says so.",
    )
    tool_isolation: str = _key(
        "bwrap",
        "How python and plugin tools are isolated: bwrap (each call in bubblewrap's namespaces: a read-only view of /usr and the Python "
        "installation only, no network, its own processes, a private folder; the run refuses to start where bubblewrap cannot run) or none "
        "(no isolation, only the limits below: for code you trust; a warning at start). docs/security.md says what it promises.",
        choices=["bwrap", "none"],
    )
    tool_disk_mb: int = _key(
        64, "Size (MB) of each of a python or plugin tool call's two writable places, tmpfs both: its private folder (also /tmp) "
        "and /dev/shm; the rest of what it sees is read-only."
    )
    tool_processes: int = _key(16, "Processes and threads a python or plugin tool call may have at once.")
    # Optimisation
    learning_rate: float = _key(1e-6, "Peak learning rate.")
    min_learning_rate: float = _key(0.0, "Learning rate at the end of the linear or cosine schedule.")
    lr_scheduler_type: str = _key("linear", "Schedule after warmup.", choices=SCHEDULES.names())
    warmup_ratio: float = _key(0.0, "Warmup as a fraction of max_steps.")
    warmup_steps: int = _key(0, "Warmup steps (give warmup_ratio or warmup_steps, not both).")
    weight_decay: float = _key(0.0, "AdamW decoupled weight decay (not applied to biases and norms).")
    adam_beta1: float = _key(0.9, "AdamW beta1.")
    adam_beta2: float = _key(0.999, "AdamW beta2.")
    adam_epsilon: float = _key(1e-8, "AdamW epsilon.")
    max_grad_norm: float = _key(1.0, "Clip the global gradient norm to this (0: no clipping).")
    max_consecutive_skips: int = _key(
        3,
        "A step whose loss or gradients are not finite is skipped (no optimizer step) and counted; this many skipped in a row stop the "
        "run, naming the step and the phase.",
    )
    max_steps: int = _key(-1, "Optimizer steps to run; -1: num_train_epochs over train_datasets.")
    num_train_epochs: float = _key(1.0, "Passes over the training prompts when max_steps is -1.")
    seed: int = _key(42, "Seed for data order, sampling and initialisation.")
    use_prefix_grouper: bool = _key(
        True,
        "The policy update's forward runs each prompt once per micro-batch and its completions attend to its keys and values, instead of "
        "running it again with every completion (verl's key; the same log-probs and gradients up to float32 rounding, and a prompt shared "
        "by n completions costs 1/n). Where the training operators run (use_fused_train_ops) and recompute is off; elsewhere whole rows "
        "are run.",
    )
    micro_batch_token_budget: Optional[int] = _key(
        None,
        "Most padded tokens (rows x (prompt width + completion width)) in one micro-batch of the update: micro-batches hold at most "
        "per_device_train_batch_size rows and at most this many tokens (whole prompt groups where the prefix grouper runs, at least one "
        "row), cut into equal parts; the gradient is the same whatever the cut. Default: derived at start from the memory estimate, so "
        "that the estimated peak stays under 60% of memory_limit_gb (the run's first line says it); 0: no budget.",
    )
    logprob_token_budget: Optional[int] = _key(
        None,
        "The same for the passes without gradients (the old and the reference model's log-probs); default: micro_batch_token_budget.",
    )
    memory_limit_gb: Optional[float] = _key(
        None,
        "Resident memory this process may use, in GB (2^30 bytes). A run whose estimate (printed at start: weights, gradients, AdamW "
        "state, the rollout cache, a micro-batch's activations) exceeds it is refused before any model loads, naming settings that "
        "would fit; a run whose resident memory reaches it stops with a message naming the last checkpoint, before the kernel's "
        "out-of-memory killer would end it silently. Default: the memory available at start (MemAvailable, or the cgroup's limit), "
        "divided among the launch's processes on this machine; 0: no estimate check, no derived budget and no guard.",
    )
    logprob_chunk_tokens: int = _key(
        512,
        "Tokens whose full-vocabulary logits exist at once when computing log-probs for the update (backward recomputes each chunk); "
        "smaller uses less memory for the same result.",
    )
    lora: bool = _key(
        False,
        "Train LoRA adapters (paddleformers.peft) instead of all the actor's weights; checkpoints hold the adapter in Hugging Face peft's "
        "layout (python -m alignment.merge_lora merges it into the base).",
    )
    lora_rank: int = _key(8, "Rank r of each adapter (A is in x r, B is r x out).")
    lora_alpha: float = _key(32.0, "Adapter scale numerator: the update is A B (lora_alpha / lora_rank).")
    lora_dropout: float = _key(
        0.0,
        "Dropout on the adapters' input during the update (off in rollout and evaluation); 0 by default, as TRL disables dropout for GRPO: "
        "it makes pi_old and the importance weights noisy.",
    )
    target_modules: list[str] = _key(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Linear layers that get adapters: a module matches when its dotted name equals a listed name or ends in .name.",
    )
    recompute: bool = _key(
        False,
        "Recompute each decoder layer's activations in the backward pass instead of storing them (less memory; measured: the update took "
        "about as long).",
    )
    recompute_granularity: str = _key(
        "full",
        "What is recomputed: full (each decoder layer); core_attn and full_attn exist only for paddleformers' MoE models.",
        choices=["full", "full_attn", "core_attn"],
    )
    sharding: str = _key(
        "",
        "stage1: each process keeps the AdamW state of its share of the parameters only (paddle's DygraphShardingOptimizer, ZeRO-1), with "
        "the same update as plain data parallel; empty: every process keeps all of it. stage2 and stage3 are refused (paddle runs them in "
        "GPU builds only; not run here).",
        choices=["", "stage1", "stage2", "stage3"],
    )
    sharding_parallel_degree: int = _key(
        -1,
        "With sharding: the processes that share one copy of the optimizer state; -1 (or the number of processes): all of them; 1: no "
        "sharding. Groups of fewer processes are refused (paddle's sub-groups for them fail over gloo; not run on GPUs).",
    )
    tensor_parallel_degree: int = _key(
        1,
        "Processes splitting each weight matrix: 1 only (paddle's tensor parallel layers run in GPU builds only; not run here).",
    )
    bf16: bool = _key(False, "bfloat16 weights and compute (GPU only).")
    fp16: bool = _key(False, "float16 weights and compute (GPU only).")
    # Evaluation, logging, checkpoints
    eval_steps: int = _key(0, "Evaluate every this many steps (0: only before the first and after the last step).")
    eval_on_start: bool = _key(True, "Evaluate before the first step.")
    per_device_eval_batch_size: int = _key(64, "Prompts per evaluation batch.")
    eval_rollout_n: int = _key(
        0,
        "Samples per evaluation prompt at the training sampling settings, for eval_mean@k and eval_pass@k (0: greedy only).",
    )
    max_evaluate_steps: int = _key(-1, "Evaluation batches per process at most (-1: the whole eval_datasets).")
    output_dir: str = _key("output", "Run folder: checkpoints, metrics.jsonl, completions.jsonl, the resolved config.")
    report_to: list[str] = _key(
        ["visualdl"],
        "Dashboards that get the run's scalars (train/<key> every step, validation/<key> at each evaluation, the same names on "
        "each): visualdl, tensorboard (event files in logging_dir; pip install tensorboardX), wandb (Weights & Biases: project "
        "$WANDB_PROJECT or paddle-grpo, files under $WANDB_DIR or output_dir, WANDB_MODE=offline without a network; pip install "
        "wandb), or none. metrics.jsonl is written whatever this says.",
        choices=[*DASHBOARDS.names(), NONE],
    )
    logging_dir: Optional[str] = _key(None, "VisualDL's and TensorBoard's log folder; default: <output_dir>/vdl_log.")
    logging_steps: int = _key(1, "Print a console line every this many steps (metrics.jsonl gets every step).")
    disable_tqdm: bool = _key(False, "No progress bar on the console (the lines of logging_steps stay).")
    log_completions_per_step: int = _key(4, "Completions written to completions.jsonl per step (0: none).")
    save_steps: int = _key(0, "Save a checkpoint every this many steps (0: only at the end).")
    save_total_limit: Optional[int] = _key(
        None,
        "Keep at most this many checkpoints of this run's lineage (the lowest steps removed first; never the one just saved nor the one "
        "the run resumed from; other runs' checkpoints are not counted).",
    )
    resume_from_checkpoint: Optional[str] = _key(
        None,
        "Continue a run from a checkpoint folder, or auto: the newest intact checkpoint of this run's lineage in output_dir (a fresh start "
        "when there is none).",
    )
    overwrite_output_dir: bool = _key(
        False,
        "Start a new run in an output_dir that holds another run's files (they are removed first); without it such a folder is refused "
        "unless resume_from_checkpoint is set.",
    )
    allow_config_change: bool = _key(
        False,
        "On resume, accept changes to keys that change what a step trains on (rollout_n, batch sizes, seed, datasets, max_dec_len, ...); "
        "without it they are refused, naming the old and new values.",
    )
    trust_pickled_checkpoint: bool = _key(
        False,
        "Resume from a checkpoint of an earlier version, whose optimizer.pdopt and pending_rollout.pkl are pickle (loading them runs any "
        "code their writer put in them): only for checkpoints you or someone you trust wrote. Without it such a checkpoint is refused; its "
        "next save writes safetensors and JSON.",
    )

    @property
    def resolved_logging_dir(self) -> str:
        return self.logging_dir or os.path.join(self.output_dir, "vdl_log")

    @property
    def resolved_environment(self) -> Optional[str]:
        """The environment of multi-turn rollouts; None: single-turn."""
        return self.environment or ("tools" if self.tools else None)

    def dashboard_settings(self) -> DashboardSettings:
        boards = tuple(name for name in self.report_to if name != NONE)
        return DashboardSettings(boards, self.resolved_logging_dir, self.output_dir, json.loads(self.to_json()))

    def reward_settings(self):
        from alignment.rewards import RewardSettings

        return RewardSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RewardSettings)})

    def to_json(self) -> str:
        """The config as grpo_config.json (in output_dir and every checkpoint) and W&B's run config hold it: a secret
        as "set" or "unset", never its value (a resume reads it again from the user's config or environment)."""
        settings = dataclasses.asdict(self)
        return json.dumps(settings | {key: "set" if settings[key] not in (None, "", "unset") else "unset" for key in SECRET_KEYS}, indent=2)


# Keys whose values are secrets: never written where the config is (GRPOConfig.to_json); "set" and "unset" in their
# place (a grpo_config.json read back as a config) are no secret: alignment/run/scorer.py reads the key again
SECRET_KEYS = ("reward_server_api_key",)


# verl's importance_sampling_mode values, stored as the modes they are
IMPORTANCE_SAMPLING_SYNONYMS = {"token": "token_truncate", "sequence": "sequence_truncate"}

# alias -> canonical key: the names TRL (GRPOConfig), ms-swift (swift rlhf --rlhf_type grpo) and
# Hugging Face generate use for the same thing.
ALIASES = {
    "model_name_or_path": "actor_model_name_or_path",  # TRL ModelConfig
    "model": "actor_model_name_or_path",  # ms-swift
    "dataset": "train_datasets",  # ms-swift
    "val_dataset": "eval_datasets",  # ms-swift
    "system": "system_prompt",  # ms-swift
    "max_prompt_length": "max_prompt_len",  # TRL
    "max_completion_length": "max_dec_len",  # TRL, ms-swift
    "max_new_tokens": "max_dec_len",  # HF generate
    "min_new_tokens": "min_dec_len",  # HF generate
    "num_generations": "rollout_n",  # TRL, ms-swift
    "epsilon": "clip_range_ratio",  # TRL, ms-swift: both clips, the upper one unless epsilon_high is given
    "epsilon_high": "clip_range_ratio_high",  # TRL, ms-swift
    "clip_ratio_low": "clip_range_ratio_low",  # verl
    "clip_ratio_high": "clip_range_ratio_high",  # verl
    "clip_ratio_c": "dual_clip_ratio",  # verl
    "update_iters": "num_iterations",  # PaddleNLP
    "ppo_epochs": "num_iterations",  # verl
    "beta": "kl_loss_coeff",  # TRL, ms-swift
    "kl_loss_type": "kl_estimator",  # verl
    "vllm_importance_sampling_correction": "importance_sampling_correction",  # TRL
    "vllm_importance_sampling_clip_max": "importance_sampling_cap",  # TRL
    "vllm_importance_sampling_clip_min": "importance_sampling_min",  # TRL
    "vllm_importance_sampling_mode": "importance_sampling_mode",  # TRL
    "rollout_importance_sampling_mode": "importance_sampling_mode",  # ms-swift
    "rollout_is": "importance_sampling_mode",  # verl (token, sequence)
    "rollout_is_threshold": "importance_sampling_cap",  # verl (a number: truncation)
    "adv_estimator": "advantage_estimator",  # verl
    "loss_mode": "surrogate",  # verl's actor.policy_loss.loss_mode
    "tau_pos": "sapo_temperature_pos",  # verl, ms-swift
    "tau_neg": "sapo_temperature_neg",  # verl, ms-swift
    "kl_penalty": "kl_in_reward_estimator",  # verl's algorithm.kl_penalty
    "kl_coef": "kl_in_reward_coeff",  # verl's algorithm.kl_ctrl.kl_coef
    "rollout_rs": "rejection_sampling",  # verl
    "rollout_rs_threshold": "rejection_sampling_threshold",  # verl
    "entropy_coef": "entropy_coeff",  # TRL
    "vllm_importance_sampling_cap": "importance_sampling_cap",  # TRL, deprecated there
    "delta": "dual_clip_ratio",  # TRL's two-sided GRPO clipping (INTELLECT-2): the same bound for A < 0
    "rollout_importance_sampling_threshold": "importance_sampling_cap",  # ms-swift
    "dynamic_sample": "dynamic_sampling",  # ms-swift
    "mask_truncated_completions": "overlong_filter",  # TRL
    "reward_model": "reward_model_name_or_path",  # ms-swift
    "use_peft": "lora",  # TRL
    "lora_r": "lora_rank",  # TRL
    "lora_target_modules": "target_modules",  # TRL
    "reward_funcs": "reward_functions",  # TRL, ms-swift
    "multi_turn_scheduler": "environment",  # ms-swift
    "max_assistant_turns": "max_turns",  # verl's multi_turn
    "max_tool_response_length": "tool_output_bytes",  # verl (there in characters)
    "max_parallel_calls": "max_tool_calls_per_turn",  # verl's multi_turn
    "reward_weights": "reward_function_weights",  # TRL, ms-swift
    "min_lr": "min_learning_rate",  # Megatron, ms-swift
    "lr": "learning_rate",  # verl (actor.optim.lr), Megatron, most training scripts' --lr
    "ppo_max_token_len_per_gpu": "micro_batch_token_budget",  # verl (with use_dynamic_bsz)
    "log_prob_max_token_len_per_gpu": "logprob_token_budget",  # verl (rollout and ref)
    **PADDLENLP_ALIASES,  # PaddleNLP's other names: num_return_sequences, max_length, max_src_len
}

KEYS = {f.name for f in dataclasses.fields(GRPOConfig)}
_HINTS = typing.get_type_hints(GRPOConfig)  # the annotations as written: PdArgumentParser rewrites the fields' .type
INT64 = 2**63  # integers reach numpy and paddle as int64


def _value_type(key: str) -> tuple:
    """-> (type, whether null is allowed): Optional[int] -> (int, True), list[str] -> (list[str], False)."""
    args = typing.get_args(_HINTS[key])
    if type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return _HINTS[key], False


def _parser():
    """paddleformers' PdArgumentParser over GRPOConfig, raising ConfigError where argparse would exit. Imported here, not
    at the top: paddleformers loads paddle and transformers (seconds), which help_text does without."""
    from paddleformers.trainer import PdArgumentParser

    class Parser(PdArgumentParser):
        def error(self, message):  # argparse would print usage and exit; we raise with its message instead
            raise ConfigError("command line: " + message.replace("argument --", "key "))

    return Parser(GRPOConfig, add_help=False)  # run_grpo.py answers -h with help_text(), which names the aliases too


def canonical_key(key: str, where: str) -> str:
    if key in KEYS:
        return key
    if key in ALIASES:
        return ALIASES[key]
    close = difflib.get_close_matches(key, sorted(KEYS | set(ALIASES)), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "; see run_grpo.py --help or docs/configuration.md"
    raise ConfigError(f"{where}: unknown key '{key}'{hint}")


@dataclass
class FileReading:
    """What a config file says: {canonical key: value of the key's type}; every problem found (an unknown key, a value
    of the wrong type, a PaddleNLP key's value this run cannot honour); the lines to print at start (PaddleNLP keys
    with no effect here); and the canonical keys whose values were refused (checks of them would judge defaults)."""

    values: dict
    problems: list
    notes: list
    unread: set


def read_json_config(path: str) -> dict:
    """CONFIG.json -> {canonical key: value of the key's type}. Mistakes raise one ConfigError naming each, with the
    file and the key as written (file:line:column where the text is not JSON)."""
    reading = read_config_file(path)
    if reading.problems:
        raise ConfigError(problems_message(path, reading.problems))
    return reading.values


def read_config_file(path: str, given_on_the_command_line: Optional[dict] = None) -> FileReading:
    """CONFIG.json -> its FileReading: every key is read, and each mistake noted, before any is reported. PaddleNLP's
    keys given on the command line ({key: value}) are read as if the file gave them."""
    raw = _json_object(path) | (given_on_the_command_line or {})
    reading, written, settings = FileReading({}, [], [], set()), {}, {}
    for key, value in raw.items():
        try:
            if key in PADDLENLP_KEYS and key not in PADDLENLP_ALIASES:
                settings |= {name: (setting, key) for name, setting in _paddlenlp_key(path, key, value, raw, reading.notes).items()}
                continue
            name = canonical_key(key, path)
            if name in reading.values:
                raise ConfigError(f"{path}: '{written[name]}' and '{key}' both set '{name}'; keep one")
            written[name] = key
            value = PADDLENLP_VALUES.get(name, lambda v: v)(value)
            reading.values[name] = _typed(name, value, f"{path}: key '{key}'" + (f" ({name})" if key != name else ""))
        except ConfigError as e:
            reading.problems.append(str(e))
            reading.unread.add(ALIASES.get(key, key))
    for name, (setting, key) in settings.items():
        given = reading.values.get(name, setting)
        if given != setting and not PADDLENLP_KEYS[key].wins:
            reading.problems.append(f"{path}: '{key}' sets {name} to {show(setting)} but '{written[name]}' is {show(given)}; keep one")
        reading.values[name] = setting
    return reading


def _paddlenlp_key(path: str, key: str, value, raw: dict, notes: list) -> dict:
    """PaddleNLP's key = value -> {canonical key: value} it sets; its note (no effect here) added to notes."""
    try:
        settings, note = read_key(key, value, raw)
    except Refusal as e:
        raise ConfigError(f"{path}: key '{key}' = {show(value)}: {e}") from None
    if note:
        notes.append(f"{key} = {show(value)} has no effect here: {note}")
    return {name: _typed(name, setting, f"{path}: key '{key}' sets {name}") for name, setting in settings.items()}


def problems_message(source: str, problems: list) -> str:
    """One problem: its message as it is; more: a count and one line each, the source's name said once."""
    if len(problems) == 1:
        return problems[0]
    lines = [p.removeprefix(f"{source}: ") for p in problems]
    return f"{source}: {len(problems)} problems, each to fix before the run can start:\n" + "\n".join(f"  - {line}" for line in lines)


def _json_object(path: str) -> dict:
    """CONFIG.json's text -> the JSON object it holds; ConfigError where it cannot be read or is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    body = data.removeprefix(codecs.BOM_UTF8)  # some Windows editors start UTF-8 files with one
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        start = e.start + len(data) - len(body)
        line, column = data.count(b"\n", 0, start) + 1, start - data.rfind(b"\n", 0, start)
        raise ConfigError(f"{path}:{line}:{column}: not valid UTF-8 ({e.reason})") from None
    try:
        raw = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, path))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid JSON for a config: arrays or objects nested too deeply") from None
    except ConfigError:
        raise
    except ValueError as e:  # an integer longer than int() converts (sys.get_int_max_str_digits())
        raise ConfigError(f"{path}: not valid JSON: {str(e).split(';')[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object of key: value pairs, got {show(raw)}")
    return raw


def _unique_keys(pairs: list, path: str) -> dict:
    keys = [key for key, _ in pairs]
    twice = next((key for i, key in enumerate(keys) if key in keys[:i]), None)
    if twice is not None:  # json.loads would keep the last silently
        raise ConfigError(f"{path}: key '{twice}' is given twice")
    return dict(pairs)


def _typed(key: str, value, where: str):
    """A JSON value for key -> the value, checked against the key's type. JSON's types are taken as written:
    "4" is not an integer nor 2 a boolean (0 and 1 are, as PaddleNLP writes them; text becomes a number on the command line
    only); numbers are finite."""
    kind, nullable = _value_type(key)
    if value is None:
        if nullable:
            return None
        raise ConfigError(f"{where} cannot be null")
    if isinstance(value, dict):
        raise ConfigError(f"{where} must not be an object")
    if typing.get_origin(kind) is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} takes a list, got {show(value)}")
        (item,) = typing.get_args(kind)
        return [_scalar(item, v, key, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, list):
        raise ConfigError(f"{where} takes one value, not a list")
    return _scalar(kind, value, key, where)


def _scalar(kind: type, value, key: str, where: str):
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok, expected = {
        bool: (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)), "true or false (or 0 or 1, PaddleNLP's)"),
        int: (number and isinstance(value, int), "an integer"),
        float: (number and _finite(value), "a finite number"),
        str: (isinstance(value, str), "a string"),
    }[kind]
    if not ok:
        raise ConfigError(f"{where} must be {expected}, got {show(value)}")
    _check_choice(key, value, where)
    return float(value) if kind is float else bool(value) if kind is bool else value


def _check_choice(key: str, value, where: str) -> None:
    choices = GRPOConfig.__dataclass_fields__[key].metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}: invalid choice {show(value)} (choose from {', '.join(map(json.dumps, choices))})")


def _finite(number) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer past float's range
        return False


HELP_FLAGS = ("-h", "--help")


def wants_help(argv: list) -> bool:
    """-h or --help anywhere asks for the option list, as with argparse (a value "-h" is given as --key=-h)."""
    return any(arg in HELP_FLAGS for arg in argv)


def help_topic(argv: list) -> Optional[str]:
    """The group asked for: the word after -h / --help (`--help rollout`, `--help all`); None: the overview."""
    after = next((argv[i + 1 : i + 2] for i, arg in enumerate(argv) if arg in HELP_FLAGS), [])
    return after[0] if after and not after[0].startswith("-") and not after[0].endswith(".json") else None


def help_text(width: Optional[int] = None, group: Optional[str] = None) -> str:
    """--help: the usage and each group's key names. group (a word of a group's title, a key, part of one, or "all";
    see _help_groups) -> those keys in full, each with its type, default, aliases and meaning, under their groups' titles
    as the dataclass's comments group them. A word that finds nothing raises ConfigError naming the words that work."""
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 120)
    lines = ["usage: run_grpo.py CONFIG.json [--key value ...]", "       run_grpo.py --help [GROUP | all]", ""] + _wrap(
        "CONFIG.json is one JSON object of the keys below. On the command line, --key value (or --key=value) "
        "overrides the file's value; a list key takes the values up to the next --key; a true/false key alone "
        "means true, --no_KEY false. An alias (another trainer's name: TRL, ms-swift, verl) works in place of its key, "
        "not beside it. docs/configuration.md explains the keys at more length.", width
    )
    groups = _groups()
    if group is None:
        for title, keys in groups:
            lines += ["", f"{title} ({len(keys)} keys):"] + _wrap(" ".join(keys), width, "  ", "  ")
        return "\n".join(lines + [""] + _wrap(
            "run_grpo.py --help GROUP prints a group's keys in full: each with its type, default, aliases and meaning. "
            "GROUP is a word of a group's title or its start, in any case (model, rollout, algorithm, tools, optim, eval, ...), "
            "a key's name or part of one (learning_rate, lr, clip), or all for every group.", width
        ))
    chosen = _help_groups(group.lower(), groups)
    if not chosen:
        words = sorted({word for title, _ in groups for word in _title_words(title)})
        raise ConfigError(
            f"--help {group}: no group's title and no key has that word; give a word of a title ({', '.join(words)}), "
            f"a key's name or part of one, or all"
        )
    whole = dict(groups)
    aliases = {}
    for alias, key in ALIASES.items():
        aliases.setdefault(key, []).append(f"--{alias}")
    for title, keys in chosen:
        lines += ["", f"{title}:" if keys == whole[title] else f"{title} ({len(keys)} of {len(whole[title])} keys):"]
        for key in keys:
            f = GRPOConfig.__dataclass_fields__[key]
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            also = f"; {'aliases' if len(aliases.get(key, [])) > 1 else 'alias'}: {', '.join(aliases[key])}" if key in aliases else ""
            lines += _wrap(f"--{key} {_type_name(key)}  (default: {json.dumps(default)}{also})", width, "  ", " " * 4)
            lines += _wrap(f.metadata["help"], width, " " * 6, " " * 6)
    return "\n".join(lines)


def _help_groups(word: str, groups: list) -> list:
    """--help WORD (lower case) -> [(title, keys)] to print: every group for all; the groups with WORD as a word of
    their title (rollout: Rollout alone), else those with a title word that starts with it (optim: Optimisation); else
    the key WORD names (a key or an alias: lr) or the keys whose name or alias holds it (clip), each under its group's
    title; else what WORD is a letter or two from (optimization, learning_rte)."""
    if word == "all":
        return groups
    for matches in (word.__eq__, lambda title_word: title_word.startswith(word)):
        if titled := [(title, keys) for title, keys in groups if any(map(matches, _title_words(title)))]:
            return titled
    named = ALIASES.get(word, word)
    holders = {key for key in KEYS if word in key} | {key for alias, key in ALIASES.items() if word in alias}
    picked = [(title, [k for k in keys if (k == named if named in KEYS else k in holders)]) for title, keys in groups]
    if any(keys for _, keys in picked):
        return [(title, keys) for title, keys in picked if keys]
    words = {w for title, _ in groups for w in _title_words(title)} | KEYS | set(ALIASES)
    close = difflib.get_close_matches(word, sorted(words), n=1, cutoff=0.8)
    return _help_groups(close[0], groups) if close else []


def _title_words(title: str) -> set:
    """"Multi-turn rollouts with tools" -> {"multi-turn", "multi", "turn", "rollouts", "tools"}: "with" and "and" name
    no group."""
    return (set(re.findall(r"\w+(?:-\w+)*", title.lower())) | set(re.findall(r"\w+", title.lower()))) - {"and", "with"}


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def _type_name(key: str) -> str:
    kind, _ = _value_type(key)
    choices = GRPOConfig.__dataclass_fields__[key].metadata.get("choices")
    one = "{" + ",".join(c or '""' for c in choices) + "}" if choices else None
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0].__name__.upper()
        return f"{one} [...]" if one else f"{item} [{item} ...]"
    if one:
        return one
    return "[true|false]" if kind is bool else kind.__name__.upper()


def _groups() -> list:
    """-> [(title, [key, ...])] in the dataclass's order, titled by its `# Title` comment lines."""
    groups = []
    for line in inspect.getsource(GRPOConfig).splitlines():
        if comment := re.fullmatch(r"    # (.+)", line):
            groups.append((comment[1], []))
        elif (declared := re.match(r"    (\w+): ", line)) and declared[1] in KEYS:
            groups[-1][1].append(declared[1])
    return groups


def _canonical_cli(args: list) -> tuple:
    """`--key value` overrides -> (argparse's tokens, {list key: values}). The tokens have canonical names,
    `--key=value` for one-value keys (so a value may start with '-') and `--key=false` for `--no_<bool key>`.
    A list key takes the values up to the next --key, converted here: argparse would take a value starting
    with '-' for an option. A value that follows no key, a key without its value or with one too many, is
    an error naming them. A key given twice keeps its last value, as in argparse; a key and its alias (or two
    aliases of one key) given together are refused, as in the file."""
    out, lists, spelled, i = [], {}, {}, 0
    while i < len(args):
        if not args[i].startswith("--"):
            raise ConfigError(
                f"command line: {args[i]!r} follows no --key (overrides are --key value; see run_grpo.py --help or docs/configuration.md)"
            )
        written, eq, attached = args[i][2:].partition("=")
        i += 1
        values = [attached] if eq else []
        while i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        negated = written.startswith("no_") and written[3:] in KEYS | set(ALIASES)
        name = canonical_key(written[3:] if negated else written, "command line")
        spelling = written[3:] if negated else written
        if spelled.setdefault(name, spelling) != spelling:
            raise ConfigError(f"command line: '--{spelled[name]}' and '--{spelling}' both set '{name}'; keep one")
        kind, _ = _value_type(name)
        shown = f"--{written}" + (f" ({name})" if written not in (name, f"no_{name}") else "")
        if negated and kind is not bool:
            raise ConfigError(f"command line: {shown}: only a true/false key can be negated with --no_")
        if negated or kind is bool:
            if len(values) > (0 if negated else 1):
                raise ConfigError(f"command line: {shown} takes {'no value' if negated else 'true or false at most'}; left over: {values}")
            out.append(f"--{name}=false" if negated else f"--{name}" + "".join(f"={v}" for v in values))
        elif typing.get_origin(kind) is list:
            if not values:
                raise ConfigError(f"command line: {shown} takes one or more values, got none")
            (item,) = typing.get_args(kind)
            lists[name] = [_from_text(item, v, f"command line: {shown}") for v in values]
            for value in lists[name]:  # argparse checks the choices of the keys it parses, not of these
                _check_choice(name, value, f"command line: {shown}")
        else:
            if len(values) != 1:
                raise ConfigError(f"command line: {shown} takes one value" + (f"; left over: {values[1:]}" if values else ", got none"))
            out.append(f"--{name}={values[0]}")
    return out, lists


def _paddlenlp_arguments(args: list) -> tuple:
    """The command line -> (its arguments but PaddleNLP's keys this trainer does not have, {such key: its value as a file
    would hold it}): `--use_flash_attention 1`, `--rl_algorithm grpo` work as in PaddleNLP's launchers."""
    rest, found, i = [], {}, 0
    while i < len(args):
        written, eq, attached = args[i][2:].partition("=") if args[i].startswith("--") else ("", "", "")
        end = next((j for j in range(i + 1, len(args)) if args[j].startswith("--")), len(args))
        if written in PADDLENLP_KEYS and written not in PADDLENLP_ALIASES:
            try:
                found[written] = from_text(written, [attached] * bool(eq) + args[i + 1 : end])
            except Refusal as e:
                raise Refusal(f"--{written}: {e}") from None
        else:
            rest += args[i:end]
        i = end
    return rest, found


def _from_text(kind: type, text: str, where: str):
    if kind is str:
        return text
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{where}: invalid {kind.__name__} value: {text!r}") from None


def load_config(argv: list) -> GRPOConfig:
    """argv = [CONFIG.json, --key, value, ...] -> validated, frozen config (no model is loaded). Mistakes raise one
    ConfigError naming each key and where it was given (the file, or the command line): every unknown key, value of the
    wrong type and failed value check at once. PaddleNLP's keys with no effect here are printed, one line each."""
    if not argv or not argv[0].endswith(".json"):
        raise ConfigError(
            "usage: run_grpo.py CONFIG.json [--key value ...] (the first argument must be a .json file; --help lists the keys)"
        )
    try:
        arguments, paddlenlp_values = _paddlenlp_arguments(argv[1:])
    except Refusal as e:
        raise ConfigError(f"command line: {e}") from None
    reading = read_config_file(argv[0], paddlenlp_values)
    try:
        overrides, lists = _canonical_cli(arguments)
        parser = _parser()
        parser.set_defaults(**{**reading.values, **lists})  # the file's values replace the defaults, the command line's replace those
        (config,) = parser.parse_args_into_dataclasses(args=overrides, look_for_args_file=False)
    except ConfigError as e:  # the file's problems too, in one message
        raise ConfigError(problems_message(argv[0], [*reading.problems, str(e)])) from None
    config = validate(config, reading, argv[0])
    if os.environ.get("PADDLE_TRAINER_ID", "0") == "0":  # the first process says it once
        for note in reading.notes:
            print(f"note: {note}", flush=True)
    return config


def validate(c: GRPOConfig, reading: Optional[FileReading] = None, source: str = "this config") -> GRPOConfig:
    """Checks values against each other and fills the derived ones; raises ConfigError naming the keys. Every value
    check runs, and the file's problems (reading) and theirs are reported together in one ConfigError before anything
    outside the config is looked at; then preflight's checks, in order, the first failure reported."""
    # preflight reads files, loads plugins and probes the machine: imported when a config is validated
    from alignment.run import preflight

    earlier = reading.problems if reading else []
    found = []
    derived = _checked_values(c, found)
    unread = reading.unread if reading else set()  # a check of a key whose value was refused would judge its default
    problems = earlier + [p for p in found if not any(re.search(rf"\b{re.escape(key)}\b", p) for key in unread)]
    if problems:
        raise ConfigError(problems_message(source, problems))
    preflight.check_model_files(c)
    for key in ("train_datasets", "eval_datasets"):
        preflight.check_dataset_files(c, key)
    preflight.check_lengths_fit_model(c)
    preflight.load_reward_functions(c)
    preflight.check_reward_model_folder(c)
    preflight.check_tools_registered(c)
    preflight.check_tool_isolation(c)
    preflight.check_resume(c)
    preflight.check_dashboards_installed(c)
    preflight.check_output_folders(c)
    system_prompt, chat_template = preflight.read_prompts(c)
    return dataclasses.replace(c, **derived, system_prompt=system_prompt, chat_template=chat_template)


def _checked_values(c: GRPOConfig, problems: list) -> dict:
    """Each section's value checks, every failure added to problems -> the derived values (meaningful only without any).
    A section whose input another one refused is not run: it would report the same mistake again."""
    from alignment.run import preflight

    collected(problems, _check_numbers_fit, c)
    for key in ("train_datasets", "eval_datasets"):
        collected(problems, _check_names_a_dataset, c, key)
    collected(problems, _check_calculation_steps, c)
    batches = collected(problems, _batch_sizes, c)
    collected(problems, _check_lengths, c)
    collected(problems, _check_sampling, c)
    objective = collected(problems, _objective, c)
    clip = collected(problems, _clip_range, c)
    collected(problems, _check_policy_update, c)
    if objective:
        collected(problems, _check_objective_variants, c, objective[0])
    collected(problems, _check_advantages_and_penalties, c)
    if batches:
        collected(problems, _check_rollout_processes, c, batches[0])
    collected(problems, _check_reward_functions_named, c)
    collected(problems, _check_reward_model_paired, c)
    shaping = collected(problems, _reward_shaping, c)
    for check_values in (_check_multi_turn, _check_reward_server, _check_optimizer_and_schedule, _check_memory_and_parallelism,
                         _check_lora, _check_precision, preflight.check_precision_hardware, _check_evaluation,
                         _check_logging_and_checkpoints):
        collected(problems, check_values, c)
    if problems:
        return {}
    (prompt_batch, accumulation, mini_batch), (surrogate, loss_type), (clip_low, clip_high), (reward_settings, weights) = (
        batches, objective, clip, shaping)
    return dict(
        per_device_prompt_batch_size=prompt_batch,
        gradient_accumulation_steps=accumulation,
        mini_batch_size=mini_batch,
        clip_range_ratio_low=clip_low,
        clip_range_ratio_high=clip_high,
        importance_sampling_mode=IMPORTANCE_SAMPLING_SYNONYMS.get(c.importance_sampling_mode, c.importance_sampling_mode),
        surrogate=surrogate,
        loss_type=loss_type,
        kl_estimator=KL_ESTIMATOR_SYNONYMS.get(c.kl_estimator, c.kl_estimator),
        kl_in_reward_estimator=KL_ESTIMATOR_SYNONYMS.get(c.kl_in_reward_estimator, c.kl_in_reward_estimator),
        cosine_max_len=reward_settings.cosine_max_len,
        soft_max_length=reward_settings.soft_max_length,
        reward_function_weights=[float(w) for w in weights],
    )


def validate_generation(c: GRPOConfig) -> GRPOConfig:
    """validate()'s checks and derived values for what generating and scoring read, for a config that trains nothing
    (python -m alignment.evaluate: a saved run's settings with flags applied): lengths, sampling, the reward functions
    and their weights, the tools and environment, the reward server, the system prompt and chat template as text."""
    from alignment.run import preflight

    _check_numbers_fit(c)
    _check_calculation_steps(c)
    _check_lengths(c)
    _check_sampling(c)
    _check_reward_functions_named(c)
    preflight.load_reward_functions(c)
    _check_reward_model_paired(c)
    preflight.check_reward_model_folder(c)
    reward_settings, weights = _reward_shaping(c)
    preflight.check_tools_registered(c)
    _check_multi_turn(c)
    preflight.check_tool_isolation(c)
    _check_reward_server(c)
    system_prompt, chat_template = preflight.read_prompts(c)
    return dataclasses.replace(
        c,
        cosine_max_len=reward_settings.cosine_max_len,
        soft_max_length=reward_settings.soft_max_length,
        reward_function_weights=[float(w) for w in weights],
        system_prompt=system_prompt,
        chat_template=chat_template,
    )


def _check_numbers_fit(c: GRPOConfig) -> None:
    """From the file or the command line: no key gives inf or NaN a meaning."""
    for f in dataclasses.fields(c):
        value = getattr(c, f.name)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float):
                check(math.isfinite(v), f"{f.name} = {v}: must be a finite number")
            elif isinstance(v, int) and not -INT64 <= v < INT64:
                raise ConfigError(f"{f.name} = {show(v)}: must fit in a 64-bit integer (magnitude below 2^63)")


def _check_names_a_dataset(c: GRPOConfig, key: str) -> None:
    paths = getattr(c, key) or ""
    check(key == "eval_datasets" and not paths or any(p.strip() for p in paths.split(",")), f"{key} = '{paths}' names no file")


def _check_calculation_steps(c: GRPOConfig) -> None:
    if c.calculation_steps is not None:
        try:
            parse_step_range(c.calculation_steps)
        except ValueError as e:
            raise ConfigError(f"calculation_steps = {e}") from None


def _batch_sizes(c: GRPOConfig) -> tuple:
    """-> (per_device_prompt_batch_size, gradient_accumulation_steps, mini_batch_size), each derived where not given."""
    check(c.rollout_n >= 2, f"rollout_n = {c.rollout_n}: a group needs at least 2 completions to compare")
    check(c.per_device_train_batch_size >= 1, "per_device_train_batch_size must be at least 1")
    for key in ("per_device_prompt_batch_size", "gradient_accumulation_steps", "mini_batch_size", "max_seq_len"):
        check(getattr(c, key) is None or getattr(c, key) >= 1, f"{key} = {getattr(c, key)}: must be at least 1 (or null: derived)")
    micro_batch, prompt_batch, accumulation = c.per_device_train_batch_size, c.per_device_prompt_batch_size, c.gradient_accumulation_steps
    if prompt_batch is None and accumulation is not None and c.mini_batch_size is None:
        sequences = accumulation * micro_batch
        check(
            sequences % c.rollout_n == 0,
            f"per_device_train_batch_size ({micro_batch}) x gradient_accumulation_steps "
            f"({accumulation}) = {sequences} sequences is not a whole number of groups of rollout_n ({c.rollout_n})",
        )
        prompt_batch = sequences // c.rollout_n
        derived = f", derived from gradient_accumulation_steps ({accumulation}) x per_device_train_batch_size ({micro_batch})"
    else:
        derived = ""
    prompt_batch = 8 if prompt_batch is None else prompt_batch
    check(prompt_batch >= 1, "per_device_prompt_batch_size must be at least 1")
    sequences = prompt_batch * c.rollout_n
    check(
        sequences < INT64,
        f"per_device_prompt_batch_size ({prompt_batch}{derived}) x rollout_n ({c.rollout_n}) = {sequences} sequences per step: too many",
    )
    check(
        sequences % micro_batch == 0,
        f"per_device_prompt_batch_size ({prompt_batch}) x rollout_n ({c.rollout_n}) = {sequences} sequences per step "
        f"does not divide into micro-batches of per_device_train_batch_size ({micro_batch})",
    )
    mini_batch = sequences if c.mini_batch_size is None else c.mini_batch_size
    check(
        sequences % mini_batch == 0 and mini_batch % micro_batch == 0,
        f"mini_batch_size ({mini_batch}) must divide the {sequences} sequences per step (per_device_prompt_batch_size "
        f"{prompt_batch} x rollout_n {c.rollout_n}) and be a multiple of per_device_train_batch_size ({micro_batch})",
    )
    per_step = f"per_device_prompt_batch_size ({prompt_batch}) x rollout_n ({c.rollout_n}) = {sequences}"
    check(
        accumulation is None or accumulation * micro_batch == mini_batch,
        f"gradient_accumulation_steps ({accumulation}) x per_device_train_batch_size ({micro_batch}) "
        f"must equal the sequences per optimizer step: " + (f"mini_batch_size ({mini_batch})" if c.mini_batch_size else per_step),
    )
    return prompt_batch, mini_batch // micro_batch, mini_batch


def _check_lengths(c: GRPOConfig) -> None:
    check(c.max_prompt_len >= 1 and c.max_dec_len >= 1, "max_prompt_len and max_dec_len must be at least 1")
    check(0 <= c.min_dec_len <= c.max_dec_len, f"min_dec_len ({c.min_dec_len}) must lie in [0, max_dec_len ({c.max_dec_len})]")


def _check_sampling(c: GRPOConfig) -> None:
    check(c.temperature > 0, f"temperature = {c.temperature}: must be > 0")
    check(0 < c.top_p <= 1, f"top_p = {c.top_p}: must lie in (0, 1]")
    check(c.top_k >= 0, f"top_k = {c.top_k}: must be >= 0 (0 turns it off)")
    check(c.repetition_penalty > 0, f"repetition_penalty = {c.repetition_penalty}: must be > 0")
    check(0 <= c.min_p < 1, f"min_p = {c.min_p}: must lie in [0, 1) (0 turns it off)")
    check(
        c.weight_sync_tolerance is None or c.weight_sync_tolerance > 0,
        f"weight_sync_tolerance = {c.weight_sync_tolerance}: must be > 0",
    )


def _clip_range(c: GRPOConfig) -> tuple:
    """-> (clip_range_ratio_low, clip_range_ratio_high), each clip_range_ratio where not given."""
    clip_low = c.clip_range_ratio if c.clip_range_ratio_low is None else c.clip_range_ratio_low
    clip_high = c.clip_range_ratio if c.clip_range_ratio_high is None else c.clip_range_ratio_high
    check(c.clip_range_ratio > 0, f"clip_range_ratio = {c.clip_range_ratio}: must be > 0")
    low_source = "clip_range_ratio_low"
    if c.clip_range_ratio_low is None:
        low_source = "clip_range_ratio (the lower clip, clip_range_ratio_low not given)"
    check(
        c.loss_type != "cispo",
        "loss_type = cispo is TRL's spelling: here it is surrogate: cispo (loss_type dapo aggregates as TRL's cispo does); "
        "TRL's epsilon_high is then the weight's cap itself, here the cap is 1 + clip_range_ratio_high (TRL's recommended 5.0 "
        "is clip_range_ratio_high 4.0)",
    )
    if c.surrogate == "cispo":  # a weight, not a trust region: 1 removes the lower bound (MiniMax-M1 uses none)
        check(0 < clip_low <= 1, f"{low_source} = {clip_low}: must lie in (0, 1] with surrogate cispo (the weight is kept above 1 - low)")
    else:
        check(0 < clip_low < 1, f"{low_source} = {clip_low}: must lie in (0, 1) (the ratio is kept above 1 - low)")
    check(clip_high > 0, f"clip_range_ratio_high = {clip_high}: must be > 0")
    check(c.dual_clip_ratio is None or c.dual_clip_ratio > 1, f"dual_clip_ratio = {c.dual_clip_ratio}: must be > 1 (or null: off)")
    return clip_low, clip_high


def _objective(c: GRPOConfig) -> tuple:
    """-> (surrogate, loss_type) as stored: verl's loss_mode names and TRL's loss_type sapo read as what they are."""
    surrogate = SURROGATE_SYNONYMS.get(c.surrogate, c.surrogate)
    if TRL_LOSS_TYPES.get(c.loss_type) is None:
        return surrogate, c.loss_type
    trl_surrogate, loss_type = TRL_LOSS_TYPES[c.loss_type]
    check(
        surrogate in ("clip", trl_surrogate),
        f"loss_type = {c.loss_type} is TRL's spelling of surrogate {trl_surrogate} with loss_type {loss_type}, but surrogate is "
        f"{c.surrogate}: give one of them",
    )
    return trl_surrogate, loss_type


def _check_objective_variants(c: GRPOConfig, surrogate: str) -> None:
    for key in ("sapo_temperature_pos", "sapo_temperature_neg"):
        check(getattr(c, key) > 0, f"{key} = {getattr(c, key)}: must be > 0")
    check(
        surrogate != "gmpo" or c.importance_sampling_level == "token",
        "surrogate gmpo makes its own geometric mean of each sequence's token ratios: importance_sampling_level must be token",
    )
    check(
        c.off_policy_mask_threshold is None or c.off_policy_mask_threshold >= 0,
        f"off_policy_mask_threshold = {c.off_policy_mask_threshold}: must be >= 0 (null: off)",
    )
    check(
        (c.rejection_sampling is None) == (c.rejection_sampling_threshold is None),
        f"rejection_sampling is {c.rejection_sampling or 'not set'} and rejection_sampling_threshold is "
        f"{c.rejection_sampling_threshold or 'not set'}: give both or neither",
    )
    if c.rejection_sampling is not None:
        try:
            rejection_rules(c.rejection_sampling, c.rejection_sampling_threshold)
        except ValueError as e:
            raise ConfigError(f"rejection_sampling = {c.rejection_sampling!r}, rejection_sampling_threshold = "
                              f"{c.rejection_sampling_threshold!r}: {e}") from None


def _check_policy_update(c: GRPOConfig) -> None:
    check(c.num_iterations >= 1, f"num_iterations = {c.num_iterations}: must be at least 1")
    check(c.importance_sampling_cap >= 1, f"importance_sampling_cap = {c.importance_sampling_cap}: must be >= 1")
    check(
        c.importance_sampling_min is None or 0 <= c.importance_sampling_min < 1,
        f"importance_sampling_min = {c.importance_sampling_min}: must lie in [0, 1) (null: no lower bound)",
    )
    check(0 <= c.top_entropy_quantile <= 1, f"top_entropy_quantile = {c.top_entropy_quantile}: must lie in [0, 1] (1.0: every token)")
    check(c.entropy_coeff >= 0, f"entropy_coeff = {c.entropy_coeff}: must be >= 0 (0: no entropy bonus)")


def _check_advantages_and_penalties(c: GRPOConfig) -> None:
    check(
        c.advantage_estimator == "grpo" or c.scale_rewards == "group" or (c.advantage_estimator, c.scale_rewards) == ("grpo_passk", "none"),
        f"scale_rewards = {c.scale_rewards} applies to advantage_estimator grpo (and none to grpo_passk); {c.advantage_estimator} "
        f"scales its own way",
    )
    check(c.kl_in_reward_coeff >= 0, f"kl_in_reward_coeff = {c.kl_in_reward_coeff}: must be >= 0")
    check(
        not (c.use_kl_in_reward and c.multi_objective_aggregation == "normalize_then_sum"),
        "use_kl_in_reward subtracts the KL from the summed reward, which multi_objective_aggregation normalize_then_sum does not "
        "use (it normalises each function's values): use sum_then_normalize, or the KL loss (kl_loss_coeff)",
    )
    if c.multi_objective_aggregation == "normalize_then_sum":
        check(
            c.advantage_estimator == "grpo",
            f"multi_objective_aggregation = normalize_then_sum is GDPO's group normalisation, for advantage_estimator grpo, "
            f"not {c.advantage_estimator}",
        )
        check(
            not (c.use_rm_server and c.reward_server_protocol == "paddlenlp"),
            "multi_objective_aggregation = normalize_then_sum needs each reward function's value, which a PaddleNLP-protocol "
            "reward server does not send (it answers totals); use reward_server_protocol v1",
        )
    check(c.kl_loss_coeff >= 0, f"kl_loss_coeff = {c.kl_loss_coeff}: must be >= 0")
    check(c.clip_range_score is None or c.clip_range_score > 0, f"clip_range_score = {c.clip_range_score}: must be > 0 (null: no clipping)")
    check(
        c.clip_range_score is None or c.multi_objective_aggregation == "sum_then_normalize",
        "clip_range_score clips the summed reward, which multi_objective_aggregation normalize_then_sum does not use",
    )
    check(c.dynamic_sampling_min_std >= 0, f"dynamic_sampling_min_std = {c.dynamic_sampling_min_std}: must be >= 0")


def _check_rollout_processes(c: GRPOConfig, prompt_batch: int) -> None:
    check(c.rollout_workers >= 0, f"rollout_workers = {c.rollout_workers}: must be >= 0")
    check(
        c.rollout_workers > 0 or not c.async_generate,
        "async_generate generates beside training: it needs rollout_workers >= 1 (processes that only generate)",
    )
    if c.rollout_workers:
        check(
            prompt_batch >= c.rollout_workers,
            f"rollout_workers = {c.rollout_workers} but a step has {prompt_batch} prompts (per_device_prompt_batch_size): "
            f"every rollout process needs at least one",
        )
        check(
            not c.dynamic_sampling,
            "dynamic_sampling with rollout_workers: refill rounds would have to ask the rollout processes for more groups "
            "mid-step, which they do not do yet; use one or the other",
        )
        check(
            not c.sharding,
            f"sharding = '{c.sharding}' with rollout_workers: the one training process holds the whole optimizer state; drop one of them",
        )
    check(c.max_resample_times >= 0, f"max_resample_times = {c.max_resample_times}: must be >= 0")


def _check_reward_functions_named(c: GRPOConfig) -> None:
    check(len(c.reward_functions) > 0, "reward_functions is empty: name at least one reward function")


def _check_reward_model_paired(c: GRPOConfig) -> None:
    from alignment.rewards import REWARD_MODEL

    check(
        (REWARD_MODEL in c.reward_functions) == (c.reward_model_name_or_path is not None),
        f"reward_functions {'names' if REWARD_MODEL in c.reward_functions else 'does not name'} {REWARD_MODEL} but "
        f"reward_model_name_or_path is {c.reward_model_name_or_path or 'not set'}: give both or neither",
    )


def _reward_shaping(c: GRPOConfig) -> tuple:
    """-> (RewardSettings with its lengths filled in, reward_function_weights filled in)."""
    from alignment.rewards import REWARD_MODEL

    check(not (c.use_rm_server and REWARD_MODEL in c.reward_functions and c.reward_server_protocol == "paddlenlp"),
           f"{REWARD_MODEL} cannot be combined with a paddlenlp-protocol reward server, which answers totals only")
    try:  # RewardSettings checks its own ranges; the two lengths default to max_dec_len
        reward_settings = dataclasses.replace(
            c,
            cosine_max_len=c.max_dec_len if c.cosine_max_len is None else c.cosine_max_len,
            soft_max_length=c.max_dec_len if c.soft_max_length is None else c.soft_max_length,
        ).reward_settings()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check(
        "soft_overlong" not in c.reward_functions or reward_settings.soft_cache_length is not None,
        "reward_functions names soft_overlong but soft_cache_length is not set (DAPO used 4096 of a 20480 soft_max_length)",
    )
    weights = [1.0] * len(c.reward_functions) if c.reward_function_weights is None else c.reward_function_weights
    check(
        len(weights) == len(c.reward_functions),
        f"reward_function_weights has {len(weights)} values but reward_functions names {len(c.reward_functions)} functions",
    )
    return reward_settings, weights


def _check_multi_turn(c: GRPOConfig) -> None:
    check(c.environment != "tools" or bool(c.tools), "environment is tools but tools is empty: name the tools the model may call")
    check(c.max_turns >= 1, f"max_turns = {c.max_turns}: must be at least 1")
    check(
        c.max_turn_tokens is None or 1 <= c.max_turn_tokens <= c.max_dec_len,
        f"max_turn_tokens = {c.max_turn_tokens}: must lie in [1, max_dec_len ({c.max_dec_len})], which bounds the whole trajectory",
    )
    check(c.tool_timeout > 0, f"tool_timeout = {c.tool_timeout}: must be > 0")
    check(c.tool_memory_mb >= 64 and c.tool_output_bytes >= 1 and c.tool_workers >= 1,
           "tool_memory_mb must be at least 64, tool_output_bytes and tool_workers at least 1")
    check(c.max_tool_calls_per_turn >= 1 and c.tool_disk_mb >= 1 and c.tool_processes >= 1,
           "max_tool_calls_per_turn, tool_disk_mb and tool_processes must be at least 1")


def _check_reward_server(c: GRPOConfig) -> None:
    if c.use_rm_server:
        check(bool(c.reward_server), "use_rm_server is true but reward_server (http://host:port) is not set")
        check(
            c.reward_server.startswith(("http://", "https://")),
            f"reward_server = '{c.reward_server}': expected an address like http://127.0.0.1:8731",
        )
    check(c.reward_server_timeout > 0 and c.reward_server_retries >= 0, "reward_server_timeout must be > 0 and reward_server_retries >= 0")
    check(c.reward_item_timeout > 0, f"reward_item_timeout = {c.reward_item_timeout}: must be > 0")


def _check_optimizer_and_schedule(c: GRPOConfig) -> None:
    check(c.learning_rate >= 0, f"learning_rate = {c.learning_rate}: must be >= 0")
    check(
        0 <= c.min_learning_rate <= c.learning_rate,
        f"min_learning_rate ({c.min_learning_rate}) must lie in [0, learning_rate ({c.learning_rate})]",
    )
    check(0 <= c.warmup_ratio < 1, f"warmup_ratio = {c.warmup_ratio}: must lie in [0, 1)")
    check(c.warmup_steps >= 0, f"warmup_steps = {c.warmup_steps}: must be >= 0")
    check(not (c.warmup_ratio > 0 and c.warmup_steps > 0), "give warmup_ratio or warmup_steps, not both")
    check(0 <= c.adam_beta1 < 1 and 0 <= c.adam_beta2 < 1, "adam_beta1 and adam_beta2 must lie in [0, 1)")
    check(c.adam_epsilon > 0, f"adam_epsilon = {c.adam_epsilon}: must be > 0 (AdamW divides by sqrt(v) + epsilon)")
    check(c.weight_decay >= 0 and c.max_grad_norm >= 0, "weight_decay and max_grad_norm must be >= 0")
    check(
        c.max_steps > 0 or (c.max_steps == -1 and c.num_train_epochs > 0),
        "set max_steps > 0, or max_steps = -1 with num_train_epochs > 0",
    )
    check(c.seed >= 0, f"seed = {c.seed}: must be >= 0")
    check(c.max_consecutive_skips >= 1, f"max_consecutive_skips = {c.max_consecutive_skips}: must be at least 1")
    check(c.logprob_chunk_tokens >= 1, f"logprob_chunk_tokens = {c.logprob_chunk_tokens}: must be at least 1")
    for key in ("micro_batch_token_budget", "logprob_token_budget"):
        value = getattr(c, key)
        check(value is None or value >= 0, f"{key} = {value}: must be at least 0 (0: no token budget) or null (derived from memory)")
    check(
        c.memory_limit_gb is None or c.memory_limit_gb >= 0,
        f"memory_limit_gb = {c.memory_limit_gb}: must be at least 0 (0: no check) or null (the memory available at start)",
    )


def _check_memory_and_parallelism(c: GRPOConfig) -> None:
    check(
        not c.recompute or c.recompute_granularity == "full",
        f"recompute_granularity = {c.recompute_granularity}: paddleformers 1.0.0 recomputes Qwen2, Qwen3 and Llama "
        f"layer by layer only (full); core_attn and full_attn exist only for its MoE models",
    )
    check(
        c.sharding not in ("stage2", "stage3"),
        f"sharding = '{c.sharding}': not supported; paddle's group-sharded stage2 and stage3 run only in its GPU builds "
        f"and this trainer has not been run on a GPU; stage1 shards the optimizer state (the largest part)",
    )
    check(
        c.sharding_parallel_degree == -1 or c.sharding_parallel_degree >= 1,
        f"sharding_parallel_degree = {c.sharding_parallel_degree}: must be -1 (all processes) or at least 1",
    )
    check(
        c.sharding or c.sharding_parallel_degree in (-1, 1),
        f"sharding_parallel_degree = {c.sharding_parallel_degree} without sharding: set sharding to stage1",
    )
    check(
        c.tensor_parallel_degree == 1,
        f"tensor_parallel_degree = {c.tensor_parallel_degree}: not supported; paddle's tensor-parallel layers run only in "
        f"its GPU builds and this trainer has not been run on a GPU; scale out with data parallel (and sharding: stage1)",
    )


def _check_lora(c: GRPOConfig) -> None:
    check(
        c.lora_rank >= 1 and c.lora_alpha > 0,
        f"lora_rank = {c.lora_rank}, lora_alpha = {c.lora_alpha}: the rank must be at least 1 and alpha > 0",
    )
    check(0 <= c.lora_dropout < 1, f"lora_dropout = {c.lora_dropout}: must lie in [0, 1)")
    check(not c.lora or len(c.target_modules) > 0, "lora is true but target_modules is empty")


def _check_precision(c: GRPOConfig) -> None:
    check(not (c.bf16 and c.fp16), "bf16 and fp16 are both true; choose one")
    check(
        c.kv_cache_dtype != "bfloat16" or c.use_fusemt,
        "kv_cache_dtype is bfloat16 but use_fusemt is false: the bf16 cache is the fused engine's (the eager engine keeps paddle's)",
    )
    if c.cpu_bf16_matmul == "on":
        check(
            c.use_fused_train_ops,
            "cpu_bf16_matmul is on but use_fused_train_ops is false: the bf16 matmuls run in the training operators",
        )
        check(
            not c.bf16,
            "cpu_bf16_matmul is on and bf16 is true: bf16 is the GPU's AMP, cpu_bf16_matmul the CPU's bf16 matmuls; set one",
        )


def _check_evaluation(c: GRPOConfig) -> None:
    check(c.per_device_eval_batch_size >= 1, "per_device_eval_batch_size must be at least 1")
    check(c.eval_rollout_n >= 0, f"eval_rollout_n = {c.eval_rollout_n}: must be >= 0 (0: greedy evaluation only)")
    check(
        c.max_evaluate_steps == -1 or c.max_evaluate_steps >= 1,
        f"max_evaluate_steps = {c.max_evaluate_steps}: must be -1 (all) or at least 1",
    )


def _check_logging_and_checkpoints(c: GRPOConfig) -> None:
    check(len(set(c.report_to)) == len(c.report_to), f"report_to = {show(c.report_to)} names a dashboard twice")
    check(
        NONE not in c.report_to or c.report_to == [NONE],
        f"report_to = {show(c.report_to)}: none means no dashboard, so it goes alone",
    )
    check(c.eval_steps >= 0 and c.save_steps >= 0, "eval_steps and save_steps must be >= 0")
    check(c.logging_steps >= 1, "logging_steps must be at least 1")
    check(c.log_completions_per_step >= 0, "log_completions_per_step must be >= 0")
    check(c.save_total_limit is None or c.save_total_limit >= 1, "save_total_limit must be at least 1 (or null: keep all)")
