"""Algorithm: the loss and its aggregation, advantages, the policy objective and its clips, the importance-sampling
correction, the KL terms, dynamic sampling, and the rewards: functions, their settings, the reward server."""

from dataclasses import dataclass
from typing import Optional

from alignment.algo.advantages import ADVANTAGE_ESTIMATORS, REWARD_AGGREGATIONS, REWARD_SCALES
from alignment.algo.aggregation import LOSS_AGGREGATIONS
from alignment.algo.corrections import ROLLOUT_CORRECTIONS, rejection_rules
from alignment.algo.kl import KL_ESTIMATOR_SYNONYMS, KL_ESTIMATORS
from alignment.algo.objectives import IMPORTANCE_RATIOS, OBJECTIVES
from alignment.config.aliases import SURROGATE_SYNONYMS, TRL_LOSS_TYPES
from alignment.config.checks import check
from alignment.config.sections import _key
from alignment.basics.errors import ConfigError


@dataclass(frozen=True)
class Algorithm:
    TITLE = "Algorithm"

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
    use_rollout_logprobs: bool = _key(
        False,
        "The old policy's log-probs in the clipped ratio are the rollout engine's, as it sampled, so the trainer's extra pass that "
        "recomputes them before several optimizer steps (num_iterations > 1 or mini_batch_size below the step's sequences) is "
        "skipped: one forward pass over the batch less a step. The ratio then also holds the engine's numerical gap to the trainer "
        "(importance_sampling_correction's weights are 1). Not with rejection_sampling or top_entropy_quantile < 1, which need the "
        "trainer's pass (slime's --use-rollout-logprobs, verl's rollout_correction bypass_mode).",
    )
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


def clip_range(c: Algorithm) -> tuple:
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


def stored_objective(c: Algorithm) -> tuple:
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


def check_objective_variants(c: Algorithm, surrogate: str) -> None:
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


def check_policy_update(c: Algorithm) -> None:
    check(c.num_iterations >= 1, f"num_iterations = {c.num_iterations}: must be at least 1")
    check(c.importance_sampling_cap >= 1, f"importance_sampling_cap = {c.importance_sampling_cap}: must be >= 1")
    check(
        c.importance_sampling_min is None or 0 <= c.importance_sampling_min < 1,
        f"importance_sampling_min = {c.importance_sampling_min}: must lie in [0, 1) (null: no lower bound)",
    )
    check(0 <= c.top_entropy_quantile <= 1, f"top_entropy_quantile = {c.top_entropy_quantile}: must lie in [0, 1] (1.0: every token)")
    check(c.entropy_coeff >= 0, f"entropy_coeff = {c.entropy_coeff}: must be >= 0 (0: no entropy bonus)")
    check(
        not (c.use_rollout_logprobs and (c.rejection_sampling or c.top_entropy_quantile < 1)),
        f"use_rollout_logprobs skips the trainer's pass over the batch that "
        f"{'rejection_sampling' if c.rejection_sampling else 'top_entropy_quantile < 1'} needs: give one of the two",
    )


def check_advantages_and_penalties(c: Algorithm) -> None:
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


def check_reward_functions_named(c: Algorithm) -> None:
    check(len(c.reward_functions) > 0, "reward_functions is empty: name at least one reward function")


def check_reward_model_paired(c: Algorithm) -> None:
    from alignment.rewards import REWARD_MODEL

    check(
        (REWARD_MODEL in c.reward_functions) == (c.reward_model_name_or_path is not None),
        f"reward_functions {'names' if REWARD_MODEL in c.reward_functions else 'does not name'} {REWARD_MODEL} but "
        f"reward_model_name_or_path is {c.reward_model_name_or_path or 'not set'}: give both or neither",
    )


def check_reward_server(c: Algorithm) -> None:
    if c.use_rm_server:
        check(bool(c.reward_server), "use_rm_server is true but reward_server (http://host:port) is not set")
        check(
            c.reward_server.startswith(("http://", "https://")),
            f"reward_server = '{c.reward_server}': expected an address like http://127.0.0.1:8731",
        )
    check(c.reward_server_timeout > 0 and c.reward_server_retries >= 0, "reward_server_timeout must be > 0 and reward_server_retries >= 0")
    check(c.reward_item_timeout > 0, f"reward_item_timeout = {c.reward_item_timeout}: must be > 0")
