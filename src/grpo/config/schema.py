"""The typed configuration's sections and their validation (presets, YAML and overrides: load.py).

A config is built in three layers, each validated field by field:
    defaults (the classes below)  <-  a preset or YAML file  <-  `section.key=value` overrides.
Unknown keys and bad values raise `ConfigError` naming the field and, for choices, the allowed values.
The resolved config is saved as `config.yaml` in the run directory and loads back to the same object.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from grpo.config.limits import COUNT_LIMITS, MAX_COUNT, MAX_STOP_CHARS, MAX_STOP_STRINGS, SMALLEST_LIMIT, stop_strings


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _sane_count(cls, v, info):
        """An int past its bound (count_limit) is refused naming the bound; NaN/inf floats are refused by
        allow_inf_nan=False above (load.py words it)."""
        if type(v) is int and info.field_name is not None and abs(v) > SMALLEST_LIMIT:
            limit, why = COUNT_LIMITS.get(f"{_section_name(cls)}.{info.field_name}", (MAX_COUNT, ""))
            if abs(v) > limit:
                bound = f"at most {limit:,}" if v > 0 else f"at least {-limit:,}"
                raise ValueError(f"must be {bound} ({why or 'no run means a count past 10^9'}), got {v}")
        return v


class ModelConfig(_Section):
    name: str = Field("builtin:tiny", description="'builtin:tiny' (built offline) or a local HF model directory")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ...")
    frozen_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="dtype of weights that never train: LoRA's base and the reference copy (kl.coef > 0); "
        "auto = bfloat16 on CUDA and on a CPU with native bf16 (AVX512-BF16 or AMX in /proc/cpuinfo), else "
        "model.dtype; bfloat16 on a CPU without native bf16 holds their linear layers in bf16 (half the bytes) and "
        "computes in float32")
    compute_dtype: Literal["auto", "float32", "bfloat16", "bfloat16_emulated"] = Field(
        "auto", description="what the training forwards and backwards compute in (generation: the weights' dtype); "
        "bfloat16 = float32 master weights, bf16 products (torch.autocast), float32 log-softmax and loss; auto = "
        "bfloat16 for model.dtype=auto's float32 weights on a CPU with native bf16 (AVX512-BF16 or AMX), else the "
        "weights' dtype; bfloat16_emulated = bf16's roundings with float32 products (slower: to check how a run "
        "learns with bf16 compute on a CPU without native bf16)")
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto", description="keep only each layer's input for the backward and recompute the layer there (less memory, "
        "about a third more update time); auto = only when the memory plan finds that not even one completion's "
        "activations fit train.memory_limit without it")
    lora_rank: int = Field(0, ge=0, description="LoRA rank r (peft); 0 = full fine-tuning")
    lora_alpha: float | None = Field(None, gt=0.0, description="LoRA alpha; None = 2 * lora_rank")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    lora_target_modules: list[str] | str = Field("all-linear", description="module names, or 'all-linear'")
    save_merged: bool = Field(False, description="with LoRA: final/ holds merged weights (default: the adapter)")


class DataConfig(_Section):
    task: str = Field("arithmetic", description="built-in task: arithmetic, code or tools; reasoning_gym:<name>; "
                      "verifiers:<environment id> (an installed verifiers environment); ignored when data.path is set")
    difficulty: str = Field("default", description="task difficulty level, e.g. arithmetic: easy|default|hard")
    path: str | None = Field(None, description="local JSONL/Parquet/CSV file of training prompts")
    train_size: int = Field(20000, ge=1)
    test_size: int = Field(500, ge=1, description="reasoning_gym:<name>: the held-out pool (eval.n at most)")
    max_prompt_tokens: int = Field(256, ge=1)
    prompt_column: str = Field("prompt", description="data.path column with the prompt: text or a list of messages")
    plain_prompts: Literal["auto", "template", "raw"] = Field(
        "auto", description="text prompts of data.path: template = one user message through the chat template, raw = "
        "as is (a base model's continuation); auto = template when the tokenizer has a chat template, else raw")
    answer_column: str | None = Field("answer", description="column passed to rewards as `answer`; None = none")
    test_path: str | None = Field(None, description="held-out file; None = a hash split of data.path's rows")
    test_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="share of rows held out when no test_path")
    subset: str | None = Field(None, description="Hub data sets: the configuration name")
    split: str = Field("train", description="Hub data sets or saved DatasetDicts: the split to train on")
    test_split: str | None = Field(None, description="Hub data sets: a held-out split (instead of the hash split)")
    filter_long_prompts: bool = Field(False, description="drop over-long and empty prompts (counted, logged) "
                                      "instead of failing at start with an error naming the row")
    # data.task=reasoning_gym:<name> (grpo.data.reasoning_gym; pip install 'grpo[gym]') or verifiers:<id>
    task_options: dict[str, Any] = Field(default_factory=dict, description="reasoning_gym:<name>: the generator's "
                                         "config fields, e.g. {min_terms: 2, max_terms: 3} (not seed/size); "
                                         "verifiers:<id>: load_environment's arguments")
    task_seed: int = Field(0, ge=0, description="reasoning_gym:<name>: seed the splits' generator seeds derive from")
    task_system_prompt: str | None = Field("default", description="reasoning_gym:<name>: a name in reasoning_gym."
                                           "utils.SYSTEM_PROMPTS (default, DeepSeekZero, simple, direct, ...), any "
                                           "other text as is, or null for none")




class RolloutConfig(_Section):
    group_size: int = Field(8, ge=2, description="G: completions sampled per prompt")
    prompts_per_step: int = Field(16, ge=1, description="P: prompts per training step (N = P*G completions)")
    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed_per_prompt: bool = Field(False, description="sample each prompt's group with its own generator seeded by "
                                  "(train.seed, step, uid): rollouts independent of batching and world size")
    engine: Literal["native", "vllm"] = Field("native", description="what generates the rollouts: native = our "
                                             "KV-cached decoder on the training model; vllm = a vLLM engine in the "
                                             "trainer's process, weights synced every step (pip install 'grpo[vllm]')")
    mode: Literal["sync", "async"] = Field("sync", description="sync: each step samples with the current policy, "
                                          "then updates; async: a worker process samples the next batches while "
                                          "the trainer updates (at most rollout.max_staleness steps behind; pi_old "
                                          "is the sampler's log-probs)")
    max_staleness: int = Field(1, ge=0, description="rollout.mode=async: K, how many optimizer steps the sampling "
                               "policy may lag the one it updates (0: the sync schedule in another process)")
    worker_threads: int | None = Field(None, ge=1, description="rollout.mode=async: CPU threads of the rollout "
                                       "worker (None: half of torch's; the trainer keeps the rest)")
    worker_timeout_s: float = Field(900.0, gt=0.0, description="rollout.mode=async: stop the run (with a checkpoint) "
                                    "when the worker produces no batch for this long")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0.0, lt=1.0, description="rollout.engine=vllm on CUDA: the "
                                               "fraction of GPU memory vLLM may take (weights + KV cache), the rest "
                                               "is the trainer's")
    vllm_probe_tolerance: float | None = Field(None, gt=0.0, description="rollout.engine=vllm: the largest "
                                               "|engine - trainer| log-prob on the probe sequence after a weight "
                                               "sync before StaleWeightsError (another model); None = by dtype (1e-3 "
                                               "fp32, 0.5 bf16, 0.25 fp16). A stale engine is also caught below it: "
                                               "its log-probs must move with the trainer's")
    stop: list[str] = Field(default_factory=list, description="stop strings (vLLM's SamplingParams.stop): a "
                            "completion ends at the first one in its decoded text, keeps the token that completes "
                            "it, counts as finished, and its rewards see the text before it; e.g. "
                            "'rollout.stop=[\"\\n\"]' for a base model whose answer is the first line. At most "
                            f"{MAX_STOP_STRINGS} strings of 1 to {MAX_STOP_CHARS} characters")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, v: Any) -> Any:
        return stop_strings(v)


MAX_REWARD_WEIGHT = 1e6  # |reward.weights[k]|: with reward.max_abs 1e6 a total's square stays far inside float32


class RewardConfig(_Section):
    functions: list[str] | None = Field(None, description="reward function names; None = the task's defaults")
    weights: list[float] | None = Field(None, description=f"one per function, each within +-{MAX_REWARD_WEIGHT:g} "
                                        "(larger weights overflow the advantages' float32 variance)")
    timeout_s: float = Field(10.0, gt=0.0)
    max_failure_frac: float = Field(0.5, ge=0.0, le=1.0)
    max_abs: float = Field(1e6, gt=0.0, le=3.4e38, description="the largest |reward| a function may return; a value "
                           "past it (or NaN/inf, or past float32) gives that sample no value from the function "
                           "(missing), counted in reward/<fn>/invalid_frac")
    max_missing_steps: int = Field(3, ge=1, description="stop the run (exit 3) when a weighted reward function "
                                   "gives no value for any sample (None, timeout, error) this many steps in a row")
    sandbox: Literal["auto", "bwrap", "unsafe_local"] = Field(
        "auto", description="where code rewards run model-written programs: auto/bwrap = bubblewrap only (refuse "
                            "without it); unsafe_local = also the unshare/rlimit fallbacks, without filesystem "
                            "isolation (a warning each run; docs/rewards.md)")

    @field_validator("weights")
    @classmethod
    def _sane_weights(cls, weights: list[float] | None) -> list[float] | None:
        for k, w in enumerate(weights or []):
            if not abs(w) <= MAX_REWARD_WEIGHT:  # NaN too
                raise ValueError(f"reward.weights[{k}] = {w:g} is outside +-{MAX_REWARD_WEIGHT:g}: the advantages' "
                                 "float32 variance would overflow (every advantage of a step 0); scale the reward "
                                 "function instead")
        return weights


class AlgoConfig(_Section):
    advantage: str = Field("grpo", description="a registered group estimator (grpo.algo.registry) or gae (PPO's "
                           "critic)")
    std: Literal["population", "sample"] = "population"
    scale: Literal["group", "batch", "none"] = "group"
    eps: float = Field(1e-6, ge=0.0)
    ratio_level: Literal["token", "sequence"] = "token"
    policy_loss: str = Field("clip", description="a registered policy loss (grpo.algo.registry); clip: PPO's "
                             "clipped surrogate; cispo: the detached clipped importance weight times log pi")
    clip_low: float = Field(0.2, gt=0.0, le=1.0, description="ratio band [1 - clip_low, 1 + clip_high]; 1.0 (no lower "
                                                        "bound) only with policy_loss=cispo")
    clip_high: float = Field(0.2, gt=0.0)
    dual_clip: float | None = Field(None, gt=1.0)
    aggregate: Literal["seq_mean_token_mean", "token_mean", "seq_sum_norm"] = "seq_mean_token_mean"
    epochs: int = Field(1, ge=1, description="mu: policy updates per rollout batch")
    drop_zero_std_groups: bool = False
    top_entropy_quantile: float = Field(1.0, gt=0.0, le=1.0,
                                        description="train only on the tokens whose entropy is in the top fraction "
                                                    "of their micro-batch ('80/20', TRL's top_entropy_quantile); "
                                                    "1.0 = every token")
    mask_truncated: bool = Field(False, description="DAPO's overlong filtering: completions cut at max_new_tokens "
                                                   "without EOS add no token to the loss (they still count in their "
                                                   "group's reward statistics and in the 1/G of the aggregation)")
    max_resample_batches: int = Field(4, ge=1, description="dynamic sampling: generation rounds per step at most")
    tis_cap: float | Literal["auto"] | None = Field(
        "auto", description="truncated importance sampling (Yao et al. 2025): the policy-gradient term of each token "
        "times min(pi_train/pi_engine, tis_cap), correcting the rollout engine's drift from the trainer's policy; None "
        "= off; auto = 2 (verl's and TRL's usual cap) where the sampler's arithmetic is not the trainer's (bf16 "
        "compute, rollout.engine=vllm) and rollout.top_p=1, else off")
    # PPO (advantage = gae)
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(1.0, ge=0.0, le=1.0)
    value_clip: float = Field(0.2, gt=0.0)
    value_coef: float = Field(1.0, gt=0.0)
    value_lr: float = Field(1e-4, gt=0.0, description="the critic's; 1e-4 is the built-in model's, a model "
                            "directory gets 1e-5 unless set (grpo.train.defaults)")
    value_model: str | None = Field(None, description="critic init: a checkpoint dir; None = a copy of the policy")

    @field_validator("tis_cap", mode="before")
    @classmethod
    def _tis_cap(cls, v):
        if v is None or (isinstance(v, str) and v.strip().lower() == "auto"):
            return "auto" if v is not None else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v!r}: no setting takes inf or NaN")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"must be a positive cap (2 is the usual), auto, or null (off), got {v!r}")
        return float(v)

    @field_validator("advantage")
    @classmethod
    def _registered_advantage(cls, name: str) -> str:
        from grpo.algo.registry import advantage_estimator

        if name != "gae":  # GAE needs a critic: its own path (train/ppo.py), not a group estimator
            advantage_estimator(name)  # ValueError listing the known ones
        return name

    @field_validator("policy_loss")
    @classmethod
    def _registered_policy_loss(cls, name: str) -> str:
        from grpo.algo.registry import policy_loss

        policy_loss(name)
        return name


class KLConfig(_Section):
    coef: float = Field(0.0, ge=0.0, description="beta; 0 loads no reference model at all")
    estimator: Literal["k1", "k2", "k3"] = "k3"


class OptimConfig(_Section):
    name: Literal["adamw", "adamw_8bit"] = Field(
        "adamw", description="adamw: torch's AdamW (two float32 moments, 8 bytes a trained parameter); adamw_8bit: "
        "torchao's AdamW8bit, the moments in 8 bits with a scale per 256 values (about 2 bytes a parameter: 3 GB less "
        "at 0.5B), for full fine-tuning where the moments do not fit (PPO's critic gets it too); each step costs more "
        "time, and the first compiles it once per parameter shape (torch.compile; on CPU a C++ compiler, $CXX or "
        "g++). pip install 'grpo[torchao]'; docs/memory.md")
    lr: float = Field(1e-4, gt=0.0, description="1e-4 is the built-in model's; a model directory gets 1e-6 (full "
                      "fine-tuning) or 1e-5 (LoRA) unless set (grpo.train.defaults, docs/scale.md)")
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = Field(5, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    max_grad_norm: float = Field(1.0, gt=0.0)
    micro_batch_tokens: int | None = Field(None, ge=1, description="token budget of one forward/backward "
                                           "micro-batch (whole groups, or parts of one); None = from the memory "
                                           "plan printed at start (grpo.train.memory_plan)")
    logprob_chunk_tokens: int = Field(256, ge=1, description="completion positions whose logits exist at once when "
                                      "log-probs are computed from the hidden states (memory: about 3 x this x "
                                      "vocab x 4 bytes); see docs/scale.md")


class EnvConfig(_Section):
    """Multi-turn episodes (tasks with an environment, e.g. `tools`; grpo.rollout.episodes). Ignored otherwise."""

    max_turns: int = Field(4, ge=1, description="policy turns per episode; an episode the environment would continue "
                           "past them is cut (truncated)")
    max_tokens: int | None = Field(None, ge=1, description="tokens per episode after the prompt, policy and "
                                   "environment together; a longer one is cut (truncated). None: no limit but "
                                   "max_turns x rollout.max_new_tokens plus the environment's messages")
    step_workers: int | None = Field(None, ge=1, description="threads that step the environments of a turn's "
                                     "episodes at once (a sandboxed tool call waits on its own process); None: "
                                     "min(8, CPU cores), as the code rewards. An environment is stepped on any of "
                                     "these threads: 1 for environments that are not thread-safe or hold "
                                     "thread-bound state (e.g. an sqlite connection)")


class TrainConfig(_Section):
    steps: int = Field(150, description="RL steps of the run, at least 1 and at most 100,000,000 (3 years at one "
                       "step a second); a run that would draw each train prompt more than 1,000 times is warned about")
    seed: int = 0
    save_every: int = Field(0, ge=0, description="checkpoint every K steps (0 = only at the end)")
    keep_checkpoints: int = Field(2, ge=0)
    eval_every: int = Field(25, ge=0)
    output_dir: str | None = Field(None, description="run directory; default runs/<preset>-<time>")
    max_nan_steps: int = Field(3, ge=1, description="abort after this many consecutive non-finite steps")
    on_save_error: Literal["abort", "continue"] = Field(
        "abort", description="a failed periodic checkpoint save (e.g. disk full): abort the run, or warn and keep "
        "training; the final and the preemption save always abort")
    preflight: Literal["stop", "warn", "off"] = Field(
        "stop", description="before step 1, sample a few groups with the starting model and check that the run can "
        "learn (truncation, zero-spread groups, rewards, log-prob gap): stop ends a run that cannot learn (exit 3), "
        "warn prints the verdicts and trains anyway, off skips it; `grpo train --preflight` runs the check alone")
    preflight_groups: int = Field(4, ge=1, description="prompts (groups of rollout.group_size) the preflight samples")
    preflight_batches: int = Field(16, ge=1, description="while fewer than two sampled prompts show any reward "
                                   "spread, the preflight samples more batches of train.preflight_groups other "
                                   "prompts, up to this many, before it calls the run unable to learn (a model right "
                                   "2% of the time is then stopped by chance < 0.1% of the time at G=8)")
    memory_limit: float | Literal["auto"] = Field(
        "auto", description="GiB the run may use (the peak of its process tree); the memory plan printed at start "
        "picks the fastest layout within it (grpo.train.memory_plan); auto = what this process can have at start "
        "(the machine's available memory, or its cgroup's room, plus what it holds) less 10% (at least 1 GiB)")
    memory_check: bool = Field(True, description="refuse a run whose planned peak memory (printed at start, "
                               "grpo.train.memory_plan) exceeds what this machine has available; false: warn and run")
    zero_spread_steps: int = Field(20, ge=0, description="stop the run (checkpoint, exit 3) after this many "
                                   "consecutive steps in which every group had zero reward spread and every reward "
                                   "was the same: nothing is learned; 0 = never")

    @field_validator("steps")
    @classmethod
    def _at_least_one_step(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1, got {v}: a run of no steps would only evaluate the starting model "
                             "(twice); `grpo eval MODEL_DIR` does that")
        return v

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _memory_limit(cls, v):
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"must be a number of GiB (e.g. 11.0) or auto, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v!r}: no setting takes inf or NaN")
        if v <= 0:
            raise ValueError(f"must be a positive number of GiB (or auto), got {v!r}")
        return float(v)

    @field_validator("preflight", mode="before")
    @classmethod
    def _preflight_bool(cls, v):  # YAML reads `off` as false: accept the booleans too
        return {False: "off", True: "stop"}.get(v, v) if isinstance(v, bool) else v


class EvalConfig(_Section):
    n: int = Field(300, ge=1, description="test problems: greedy pass@1 measured before and after training (and "
                   "for checkpoints/best), the reported result; the first eval.n of the held-out pool")
    val_n: int = Field(200, ge=0, description="validation problems, the next eval.val_n of the held-out pool "
                       "(disjoint from the test problems): the evaluations every train.eval_every steps and the "
                       "choice of checkpoints/best; 0 = none (test before and after only, no best/)")
    test_every: int = Field(0, ge=0, description="also measure the test problems every this many steps (a "
                            "learning curve for a benchmark; never used to choose anything); 0 = before and after "
                            "training only")
    batch_size: int = Field(250, ge=1, description="problems per greedy generate call; a model directory gets 64 "
                            "unless set (grpo.train.defaults)")
    max_new_tokens: int | None = Field(None, description="tokens per held-out completion, at least 1; None = "
                                       "rollout.max_new_tokens")

    @field_validator("max_new_tokens")
    @classmethod
    def _some_tokens(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"must be at least 1 (or null for rollout.max_new_tokens), got {v}: no tokens means no "
                             "answer, and every held-out problem would count as wrong")
        return v


class WarmupConfig(_Section):
    """Supervised warm-up that builds the built-in model (before RL; its data is the train split only)."""

    steps: int = Field(1000, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(3e-3, gt=0.0)
    seed: int = Field(0, ge=0, description="seed of the built-in model's initialisation and warm-up; independent of "
                                           "train.seed, as a downloaded checkpoint is the same for every RL seed")


class LogConfig(_Section):
    sample_groups: int = Field(2, ge=0, description="whole groups written to samples.jsonl per logged step")
    print_group_every: int = Field(0, ge=0, description="print one group like the seed's example every N steps")
    progress: bool = True
    tensorboard: bool = False
    trackers: list[Literal["tensorboard", "wandb", "trackio", "mlflow"]] = Field(
        default_factory=list, description="experiment trackers that get every metrics.jsonl row, the config and the "
        "summary: tensorboard, wandb (offline unless WANDB_MODE says otherwise), trackio, mlflow (./mlruns unless "
        "MLFLOW_TRACKING_URI is set); each needs its extra, e.g. pip install 'grpo[wandb]'")
    project: str = Field("grpo", description="project (W&B, trackio) or experiment (MLflow) name for log.trackers")
    plots: bool = True


class ParallelConfig(_Section):
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    strategy: Literal["ddp", "fsdp"] = "ddp"


def _section_name(cls) -> str:
    """'train' for TrainConfig: the key of the Config field that holds a section of this class."""
    for name, info in Config.model_fields.items():
        if info.annotation is cls:
            return name
    return cls.__name__


class Config(_Section):
    preset: str = "grpo"
    # 'section.key's whose value came from a packaged preset only (load_config); not saved, not validated
    _preset_keys: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @property
    def preset_keys(self) -> frozenset[str]:
        return self._preset_keys

    def __eq__(self, other: object) -> bool:  # the values; where they came from (_preset_keys) does not count
        return isinstance(other, Config) and self.__dict__ == other.__dict__
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    algo: AlgoConfig = AlgoConfig()
    kl: KLConfig = KLConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    warmup: WarmupConfig = WarmupConfig()
    env: EnvConfig = EnvConfig()
    log: LogConfig = LogConfig()
    parallel: ParallelConfig = ParallelConfig()

    @model_validator(mode="after")
    def _check_combinations(self) -> "Config":
        if self.reward.weights is not None and self.reward.functions is not None:
            if len(self.reward.weights) != len(self.reward.functions):
                raise ValueError(
                    f"reward.weights has {len(self.reward.weights)} entries but reward.functions has "
                    f"{len(self.reward.functions)}"
                )
        if self.algo.aggregate == "seq_sum_norm" and self.algo.ratio_level == "sequence":
            raise ValueError("algo.ratio_level=sequence (GSPO) needs a per-sequence aggregate, not seq_sum_norm")
        if self.algo.policy_loss == "clip" and self.algo.clip_low >= 1.0:
            raise ValueError("algo.clip_low must be < 1 with algo.policy_loss=clip (1.0, no lower bound, is for cispo)")
        if self.algo.policy_loss == "cispo" and (self.algo.ratio_level == "sequence" or self.algo.dual_clip):
            raise ValueError("algo.policy_loss=cispo clips a per-token weight: it takes neither "
                             "algo.ratio_level=sequence nor algo.dual_clip")
        if isinstance(self.algo.tis_cap, float) and self.rollout.top_p < 1.0:
            raise ValueError("algo.tis_cap needs rollout.top_p=1: under top-p the engine's log-probs are of the "
                             "truncated distribution, not comparable with the trainer's")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
