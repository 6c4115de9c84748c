"""Hints for an unknown config key: the other trainers' names for our settings, and the closest of our keys.

Users arrive with TRL's, verl's and OpenRLHF's names. `hint("beta", keys)` says "`beta` (TRL) is `kl.coef`
here"; a key that is no one's name gets the closest of our dotted keys (difflib), e.g. `optim.learning_rate` ->
`optim.lr`, `algo.clip_hgih` -> `algo.clip_high`, `algo.beta_kl` -> `kl.coef` (close to TRL's `beta`).
Lookups try the whole dotted key first, then shorter and shorter tails (`actor_rollout_ref.rollout.n`,
`rollout.n`), so a name is found whatever section the user put it in.
"""

from __future__ import annotations

import difflib

# other trainer's name -> (our key, whose name, note); a tail of a dotted name is enough to match
ALIASES: dict[str, tuple[str, str, str]] = {
    # TRL (GRPOConfig)
    "beta": ("kl.coef", "TRL", ""),
    "num_generations": ("rollout.group_size", "TRL", ""),
    "max_completion_length": ("rollout.max_new_tokens", "TRL", ""),
    "max_prompt_length": ("data.max_prompt_tokens", "TRL", ""),
    "epsilon": ("algo.clip_low", "TRL", "and algo.clip_high, which TRL sets to the same value unless epsilon_high "
                "is given"),
    "epsilon_high": ("algo.clip_high", "TRL", ""),
    "loss_type": ("algo.aggregate", "TRL", "loss_type=grpo is seq_mean_token_mean, dapo/bnpo token_mean, dr_grpo "
                  "seq_sum_norm (with algo.advantage=dr_grpo); see the dr_grpo and dapo presets"),
    "scale_rewards": ("algo.scale", "TRL", "true/group is group, batch is batch, false/none is none"),
    "num_iterations": ("algo.epochs", "TRL", ""),
    "learning_rate": ("optim.lr", "TRL/transformers", ""),
    "lr_scheduler_type": ("optim.schedule", "transformers", ""),
    "max_steps": ("train.steps", "transformers", ""),
    "save_steps": ("train.save_every", "transformers", ""),
    "eval_steps": ("train.eval_every", "transformers", ""),
    "output_dir": ("train.output_dir", "transformers", ""),
    "model_name_or_path": ("model.name", "TRL", ""),
    "mask_truncated_completions": ("algo.mask_truncated", "TRL", ""),
    "stop_strings": ("rollout.stop", "transformers generate, TRL's generation_kwargs", ""),
    "importance_sampling_level": ("algo.ratio_level", "TRL", ""),
    "reward_weights": ("reward.weights", "TRL", ""),
    "reward_funcs": ("reward.functions", "TRL", ""),
    "lora_r": ("model.lora_rank", "TRL/peft", ""),
    "use_peft": ("model.lora_rank", "TRL", "set a rank > 0, e.g. model.lora_rank=16"),
    "use_vllm": ("rollout.engine", "TRL", "rollout.engine=vllm (colocated in this process; docs/vllm.md)"),
    "vllm_gpu_memory_utilization": ("rollout.vllm_gpu_memory_utilization", "TRL", ""),
    "vllm_importance_sampling_cap": ("algo.tis_cap", "TRL", "truncated importance sampling on the engine's drift"),
    "torch_dtype": ("model.dtype", "transformers", ""),
    # verl (dotted)
    "actor_rollout_ref.rollout.n": ("rollout.group_size", "verl", ""),
    "actor_rollout_ref.actor.optim.lr": ("optim.lr", "verl", ""),
    "actor_rollout_ref.actor.clip_ratio": ("algo.clip_low", "verl", "and algo.clip_high"),
    "actor_rollout_ref.actor.clip_ratio_low": ("algo.clip_low", "verl", ""),
    "actor_rollout_ref.actor.clip_ratio_high": ("algo.clip_high", "verl", ""),
    "actor_rollout_ref.actor.clip_ratio_c": ("algo.dual_clip", "verl", ""),
    "actor_rollout_ref.actor.loss_agg_mode": ("algo.aggregate", "verl", "token-mean is token_mean, "
                                              "seq-mean-token-mean is seq_mean_token_mean, seq-mean-token-sum-norm "
                                              "is seq_sum_norm"),
    "actor_rollout_ref.actor.kl_loss_coef": ("kl.coef", "verl", ""),
    "actor_rollout_ref.actor.kl_loss_type": ("kl.estimator", "verl", "kl is k1, mse k2, low_var_kl k3"),
    "actor_rollout_ref.actor.use_kl_loss": ("kl.coef", "verl", "a coefficient > 0 turns the KL term on"),
    "actor_rollout_ref.actor.ppo_epochs": ("algo.epochs", "verl", ""),
    "actor_rollout_ref.rollout.temperature": ("rollout.temperature", "verl", ""),
    "actor_rollout_ref.rollout.top_p": ("rollout.top_p", "verl", ""),
    "actor_rollout_ref.model.path": ("model.name", "verl", ""),
    "algorithm.adv_estimator": ("algo.advantage", "verl", ""),
    "algorithm.norm_adv_by_std_in_grpo": ("algo.advantage", "verl", "false is algo.advantage=dr_grpo"),
    "data.max_response_length": ("rollout.max_new_tokens", "verl", ""),
    "data.train_batch_size": ("rollout.prompts_per_step", "verl", ""),
    "data.train_files": ("data.path", "verl", ""),
    "data.val_files": ("data.test_path", "verl", ""),
    "trainer.total_training_steps": ("train.steps", "verl", ""),
    "trainer.save_freq": ("train.save_every", "verl", ""),
    "trainer.test_freq": ("train.eval_every", "verl", ""),
    "trainer.default_local_dir": ("train.output_dir", "verl", ""),
    # OpenRLHF
    "n_samples_per_prompt": ("rollout.group_size", "OpenRLHF", ""),
    "init_kl_coef": ("kl.coef", "OpenRLHF", ""),
    "actor_learning_rate": ("optim.lr", "OpenRLHF", ""),
    "generate_max_len": ("rollout.max_new_tokens", "OpenRLHF", ""),
    "eps_clip": ("algo.clip_low", "OpenRLHF", "and algo.clip_high"),
    "advantage_estimator": ("algo.advantage", "OpenRLHF", ""),
    "rollout_batch_size": ("rollout.prompts_per_step", "OpenRLHF", ""),
}


def _tails(dotted: str) -> list[str]:
    """'a.b.c' -> ['a.b.c', 'b.c', 'c']."""
    parts = dotted.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def alias_of(dotted: str) -> tuple[str, str, str] | None:
    """(our key, whose name, note) when `dotted` (or a tail of it) is another trainer's name for one of ours."""
    for tail in _tails(dotted):
        if tail in ALIASES:
            return ALIASES[tail]
    return None


def closest_keys(dotted: str, keys: list[str], n: int = 3) -> list[str]:
    """Our dotted keys closest to `dotted`: by the whole key, by its last part against our keys' last parts, and
    through the other trainers' names."""
    found: dict[str, None] = {}
    found.update(dict.fromkeys(difflib.get_close_matches(dotted, keys, n=n, cutoff=0.75)))
    leaf = dotted.split(".")[-1]
    by_leaf: dict[str, list[str]] = {}
    for k in keys:
        by_leaf.setdefault(k.split(".")[-1], []).append(k)
    for match in difflib.get_close_matches(leaf, list(by_leaf), n=n, cutoff=0.7):
        found.update(dict.fromkeys(by_leaf[match]))
    for match in difflib.get_close_matches(leaf, [a.split(".")[-1] for a in ALIASES], n=1, cutoff=0.7):
        found.update(dict.fromkeys(a[0] for name, a in ALIASES.items() if name.split(".")[-1] == match))
    return list(found)[:n]


def hint(dotted: str, keys: list[str]) -> str:
    """The text after 'unknown key': what the key is here, or the closest keys, or '' when nothing is close."""
    alias = alias_of(dotted)
    if alias is not None:
        ours, whose, note = alias
        name = next(t for t in _tails(dotted) if t in ALIASES)
        return f"`{name}` ({whose}) is `{ours}` here" + (f"; {note}" if note else "")
    close = closest_keys(dotted, keys)
    if close:
        return "did you mean " + " or ".join(f"`{k}`" for k in close) + "?"
    return ""
