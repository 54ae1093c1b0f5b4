"""The PyTorch side of tests/references/test_trl_verl.py, run with the interpreter named by GRPO_TORCH_PYTHON (make test-hf's
.venv-torch: TRL 1.16.0, verl 0.9.1).

    trl_verl_side.py BATCH.npz OUT.npz TOKENIZER_DIR

BATCH holds one fixed batch (B rows of T completion tokens, groups of G): logp, old, ref, rollout, entropy, mask,
is_weights, kl_logp, kl_ref (B, T), advantages (B,), rewards, passk_rewards (B,), columns (K, B), column_weights (K,),
group_size. For each
case below, OUT gets "<case>/loss" and the gradients "<case>/grad_logp" (and "<case>/grad_entropy") that TRL's
GRPOTrainer._compute_loss or verl's functions give, and "<case>/advantages" or "<case>/weights" for verl's
advantage estimators and rollout correction. TRL's loss runs in a real GRPOTrainer (a random two-layer Qwen2,
the bundled tokenizer) whose forward pass is the only thing replaced: _get_per_token_logps_and_entropies
returns the batch's log-probs and entropies as leaf tensors, so the gradients are those of TRL's loss code.
"""

import sys
import tempfile

import numpy as np
import torch
from datasets import Dataset
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import (
    compute_is_metrics,
    compute_offpolicy_metrics,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from verl.workers.config import ActorConfig

# case -> GRPOConfig keys (TRL's names); the test gives ours the same meaning
TRL_CASES = {
    "trl_dapo_delta_bias_corrected_kl_is": dict(
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, delta=3.0, beta=0.05, use_bias_correction_kl=True
    ),
    "trl_grpo_gspo": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    "trl_dr_grpo_kl": dict(loss_type="dr_grpo", epsilon=0.2, beta=0.05, use_bias_correction_kl=False),  # TRL 1.16's default: True
    "trl_cispo": dict(loss_type="cispo", epsilon_high=5.0),
    "trl_cispo_gspo": dict(loss_type="cispo", epsilon_high=5.0, importance_sampling_level="sequence"),
    "trl_dapo_entropy_selection_and_bonus": dict(loss_type="dapo", epsilon=0.2, top_entropy_quantile=0.5, entropy_coef=0.05),
    "trl_sapo": dict(loss_type="sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05),
    "trl_sapo_hot": dict(loss_type="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=3.0),
    "trl_bnpo_two_micro_batches": dict(loss_type="bnpo", epsilon=0.2),
    "trl_dapo_off_policy_mask": dict(loss_type="dapo", epsilon=0.2, off_policy_mask_threshold=0.0),
}
MICRO_BATCHES = {"trl_bnpo_two_micro_batches": 2}  # TRL's _compute_loss once per micro-batch, gradient accumulation over them
# verl's kl_penalty names, for the KL loss and the KL in the reward
VERL_KL_ESTIMATORS = ["kl", "k1", "mse", "k2", "k3", "low_var_kl", "abs", "k1+", "k3+", "low_var_kl+"]
# verl's rollout_rs options and thresholds
VERL_REJECTIONS = {
    "token_k1": "0.5_2.0", "token_k2": "0.1", "token_k3": "0.1", "seq_sum_k1": "0.3_3.0", "seq_sum_k3": "0.5", "seq_mean_k1": "0.8_1.25",
    "seq_mean_k2": "0.1", "seq_max_k2": "0.3", "seq_max_k3": "0.3", "token_k2,seq_mean_k3": "0.2,0.1",
}


def trl_loss(batch: dict, tokenizer_dir: str, keys: dict, importance: bool, micro_batches: int = 1) -> dict:
    B, T = batch["logp"].shape
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        )
    )
    with tempfile.TemporaryDirectory() as out:  # a folder, from which TRL loads the reference model too when beta > 0
        model.save_pretrained(f"{out}/model")
        args = GRPOConfig(
            output_dir=out, report_to=[], use_cpu=True, per_device_train_batch_size=B, num_generations=int(batch["group_size"]),
            max_completion_length=T, logging_steps=1, **keys,
        )
        trainer = GRPOTrainer(model=f"{out}/model", reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                              train_dataset=Dataset.from_dict({"prompt": ["1 + 1"] * B}), processing_class=tokenizer)
    logp = torch.tensor(batch["logp"], requires_grad=True)
    entropy = torch.tensor(batch["entropy"], requires_grad=True)
    trainer.current_gradient_accumulation_steps = micro_batches
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = importance
    trainer.model.train()
    mask = torch.tensor(batch["mask"])
    total = 0.0
    for rows in np.array_split(np.arange(B), micro_batches):
        rows = torch.tensor(rows)
        trainer._get_per_token_logps_and_entropies = lambda *args, rows=rows, **kwargs: (logp[rows], entropy[rows], None)
        inputs = {
            "prompt_ids": torch.zeros(len(rows), 1, dtype=torch.long), "prompt_mask": torch.ones(len(rows), 1, dtype=torch.long),
            "completion_ids": torch.zeros(len(rows), T, dtype=torch.long), "completion_mask": mask[rows],
            "advantages": torch.tensor(batch["advantages"])[rows], "old_per_token_logps": torch.tensor(batch["old"])[rows],
            "ref_per_token_logps": torch.tensor(batch["ref"])[rows], "importance_sampling_ratio": torch.tensor(batch["is_weights"])[rows],
            "sampling_per_token_logps": torch.tensor(batch["rollout"])[rows], "num_items_in_batch": mask.sum(),
        }
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        total += loss.item()
    return {
        "loss": np.array(total),
        "grad_logp": logp.grad.numpy(),
        "grad_entropy": entropy.grad.numpy() if entropy.grad is not None else np.zeros((B, T)),
    }


def verl_losses(batch: dict) -> dict:
    out = {}
    old, logp = torch.tensor(batch["old"]), torch.tensor(batch["logp"])
    mask, advantages = torch.tensor(batch["mask"]), torch.tensor(batch["advantages"])[:, None].expand(*batch["logp"].shape)
    for name, function, mode, low, high in [
        ("verl_gspo_seq_mean_token_mean", core_algos.compute_policy_loss_gspo, "seq-mean-token-mean", 3e-4, 4e-4),
        ("verl_gspo_token_mean", core_algos.compute_policy_loss_gspo, "token-mean", 3e-4, 4e-4),
        ("verl_cispo_token_mean", core_algos.compute_policy_loss_cispo, "token-mean", 0.2, 0.28),
        ("verl_cispo_seq_mean_token_mean", core_algos.compute_policy_loss_cispo, "seq-mean-token-mean", 0.2, 0.28),
        ("verl_sapo", core_algos.compute_policy_loss_sapo, "seq-mean-token-mean", 0.2, 0.2),
        ("verl_geo_mean", core_algos.compute_policy_loss_geo_mean, "token-mean", 0.4, 0.4),
        ("verl_geo_mean_narrow", core_algos.compute_policy_loss_geo_mean, "token-mean", 0.05, 0.1),
    ]:
        config = ActorConfig(
            strategy="fsdp", clip_ratio_low=low, clip_ratio_high=high, rollout_n=3, ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=6,
            tau_pos=1.0, tau_neg=1.05,
        )
        leaf = logp.clone().requires_grad_(True)
        loss, _ = function(old, leaf, advantages, mask, loss_agg_mode=mode, config=config)
        loss.backward()
        out[f"{name}/loss"], out[f"{name}/grad_logp"] = loss.detach().numpy(), leaf.grad.numpy()
    return out


def verl_advantages(batch: dict) -> dict:
    B, T = batch["logp"].shape
    size = int(batch["group_size"])
    index = np.repeat(np.arange(B // size), size)
    mask = torch.tensor(batch["mask"])
    lengths = mask.sum(-1).long()
    token_rewards = torch.zeros(B, T)
    token_rewards[torch.arange(B), lengths - 1] = torch.tensor(batch["rewards"])  # the outcome reward on the last token
    out = {}
    algo = AlgoConfig(gamma=1.0)
    for name, function in [
        ("verl_grpo", core_algos.compute_grpo_outcome_advantage),
        ("verl_rloo", core_algos.compute_rloo_outcome_advantage),
        ("verl_reinforce_plus_plus", core_algos.compute_reinforce_plus_plus_outcome_advantage),
        ("verl_reinforce_plus_plus_baseline", core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage),
    ]:
        advantages, _ = function(token_level_rewards=token_rewards, response_mask=mask, index=index, config=algo)
        out[f"{name}/advantages"] = advantages.numpy()  # (B, T), the sequence's value on its loss tokens
    # GDPO: one loss token per sequence, where verl's token whitening is TRL's per-sequence one
    one_token = torch.zeros(B, T)
    one_token[:, 0] = 1
    columns = {f"f{k}": batch["columns"][k] for k in range(len(batch["columns"]))}
    gdpo = AlgoConfig(gamma=1.0, gdpo_reward_keys=list(columns), gdpo_reward_weights=batch["column_weights"].tolist())
    advantages, _ = core_algos.compute_gdpo_outcome_advantage(
        token_level_rewards=torch.zeros(B, T), response_mask=one_token, index=index, config=gdpo, non_tensor_batch=columns,
        batch={"prompts": torch.zeros(B, 1), "attention_mask": torch.ones(B, 2, dtype=torch.long)},
    )
    out["verl_gdpo/advantages"] = advantages[:, 0].numpy()
    passk_rewards = torch.zeros(B, T)
    passk_rewards[torch.arange(B), lengths - 1] = torch.tensor(batch["passk_rewards"])
    for scaled in (True, False):
        advantages, _ = core_algos.compute_grpo_passk_outcome_advantage(
            token_level_rewards=passk_rewards, response_mask=mask, index=index, config=AlgoConfig(norm_adv_by_std_in_grpo=scaled)
        )
        out[f"verl_grpo_passk_{'group' if scaled else 'none'}/advantages"] = advantages.numpy()
    advantages, _ = core_algos.compute_opo_outcome_advantage(
        token_level_rewards=token_rewards, response_mask=mask, index=index, config=algo
    )
    out["verl_opo/advantages"] = advantages.numpy()
    return out


def verl_kl(batch: dict) -> dict:
    """kl_penalty's values and the gradients of their masked sum with respect to the log-probs; and the KL in the reward as
    ray_trainer.apply_kl_penalty makes it (token_level_scores - beta x kld x mask: imported, ray_trainer needs vLLM's
    stack) and compute_grpo_outcome_advantage then reads it."""
    out = {}
    mask, ref = torch.tensor(batch["mask"]), torch.tensor(batch["kl_ref"])
    for name in VERL_KL_ESTIMATORS:
        logp = torch.tensor(batch["kl_logp"], requires_grad=True)
        kl = core_algos.kl_penalty(logp, ref, kl_penalty=name)
        (kl * mask).sum().backward()
        out[f"verl_kl_{name}/values"], out[f"verl_kl_{name}/grad_logp"] = kl.detach().numpy(), logp.grad.numpy()
    B, T = mask.shape
    lengths = mask.sum(-1).long()
    scores = torch.zeros(B, T)
    scores[torch.arange(B), lengths - 1] = torch.tensor(batch["rewards"])
    index = np.repeat(np.arange(B // int(batch["group_size"])), int(batch["group_size"]))
    for name in ("kl", "low_var_kl"):
        kld = core_algos.kl_penalty(torch.tensor(batch["old"]), torch.tensor(batch["ref"]), kl_penalty=name) * mask
        token_level_rewards = scores - 0.1 * kld  # apply_kl_penalty with a FixedKLController(0.1)
        advantages, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards, response_mask=mask, index=index, config=AlgoConfig(gamma=1.0)
        )
        out[f"verl_kl_in_reward_{name}/advantages"] = advantages.numpy()
    return out


def verl_rejection(batch: dict) -> dict:
    log_ratio = torch.tensor(batch["old"] - batch["rollout"])
    mask = torch.tensor(batch["mask"])
    out = {}
    for options, thresholds in VERL_REJECTIONS.items():
        kept, metrics = compute_rollout_rejection_mask(log_ratio, mask, options, thresholds)
        out[f"verl_rs_{options}/mask"] = kept.numpy()
        out[f"verl_rs_{options}/masked_fraction"] = np.array(metrics["rollout_rs_masked_fraction"])
        out[f"verl_rs_{options}/seq_masked_fraction"] = np.array(metrics["rollout_rs_seq_masked_fraction"])
    diagnostics = compute_offpolicy_metrics(torch.tensor(batch["old"]), torch.tensor(batch["rollout"]), mask)
    for name in ("chi2_token", "chi2_seq"):
        out[f"verl_offpolicy/{name}"] = np.array(diagnostics[name])
    weights = torch.tensor(batch["is_weights"])
    is_metrics = compute_is_metrics(weights, weights, log_ratio, mask, "token", 2.0)
    out["verl_offpolicy/eff_sample_size"] = np.array(is_metrics["rollout_is_eff_sample_size"])
    return out


def verl_rollout_correction(batch: dict) -> dict:
    log_ratio = torch.tensor(batch["old"] - batch["rollout"])
    mask = torch.tensor(batch["mask"])
    out = {}
    for level in ("token", "sequence"):
        for name, threshold in (("truncate", 2.0), ("mask", "0.5_2.0")):
            weights, _ = compute_rollout_correction_weights(log_ratio, mask, level, threshold)
            out[f"verl_{level}_{name}/weights"] = weights.numpy()
    return out


def main() -> None:
    batch_path, out_path, tokenizer_dir = sys.argv[1:4]
    batch = dict(np.load(batch_path))
    out = {}
    for case, keys in TRL_CASES.items():
        for name, value in trl_loss(batch, tokenizer_dir, keys, case.endswith("_is"), MICRO_BATCHES.get(case, 1)).items():
            out[f"{case}/{name}"] = value
    out |= verl_losses(batch) | verl_advantages(batch) | verl_rollout_correction(batch) | verl_kl(batch) | verl_rejection(batch)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main()
