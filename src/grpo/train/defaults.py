"""Defaults by model: the settings tuned on the built-in model that a user's model (model.name a directory) gets
other values for, unless the user set them.

    cfg, notes = model_defaults(cfg)     # a copy with the resolved values; one printable note per change

| key              | built-in model | model directory, full fine-tuning | with LoRA (model.lora_rank > 0) |
|------------------|----------------|-----------------------------------|---------------------------------|
| optim.lr         | 1e-4           | 1e-6 (under 200M parameters: 1e-5) | 1e-5                           |
| algo.value_lr    | 1e-4           | 1e-5                              | 1e-5                            |
| eval.batch_size  | 250            | 64                                | 64                              |
| rollout.max_new_tokens | 32       | 256 (at most half the model's positions) | the same                  |

1e-4 suits the 0.9M-parameter built-in model and is far above published recipes for 0.5B-7B ones (not measured
here); 1e-6 is TRL's default and the low end of
published GRPO recipes for full fine-tuning (1e-6 to 3e-6), 1e-5 the low end of theirs for LoRA (1e-5 to 5e-5).
The critic's 1e-5 is OpenRLHF's critic learning rate (9e-6). Evaluation prompts do not share a KV cache the way a
group's do, so 250 distinct prompts at once can exceed the memory a training step needs; 64 stays under the
default step's 128 sampled rows. 32 new tokens fit the built-in model's bare answers ("47 + 38 = 85"); an instruct
model writes a sentence or a worked answer first, and 32 cut most of SmolLM2-135M-Instruct's completions off in a
user's run (issue 42: cut-off answers score 0), so a model directory gets 256, TRL's default completion length
(max_completion_length), at most half of its max_position_embeddings so that the prompt keeps the other half.
docs/scale.md lists the settings that stay the same, and why.

Which value wins, for each key:
  1. the user's: a command-line override, a key in the user's own YAML file (also one that `extends` a preset),
     or a field given to the Config in code (pydantic's `model_fields_set`). A run's saved config.yaml holds
     every resolved value, so `grpo train runs/x/config.yaml` and `--resume` reproduce them;
  2. a packaged preset's (grpo/presets/*.yaml), tuned on the built-in model: kept as is for the built-in model;
     for a model directory a learning rate is read as a ratio to the built-in default (the cispo preset's
     optim.lr 5e-5 is half of 1e-4, so full fine-tuning gets 5e-7), and any other key is kept;
  3. otherwise the table above.

The learning rate's note is printed once, when its value is final (lr_note, after the model is loaded: a small
model's rate depends on its size), with the rate it peaks at in a run shorter than its linear ramp (optim.warmup_steps).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger("grpo.train")

__all__ = ["USER_MODEL_DEFAULTS", "lr_note", "model_defaults", "report_defaults", "small_model_lr"]

# Full fine-tuning of a model under SMALL_MODEL_PARAMS parameters, with the table's learning rate, gets SMALL_MODEL_LR
# instead (small_model_lr, after the model is loaded). Measured: SmolLM2-135M-Instruct (a real instruct model) learned
# at 1e-5 and not at 1e-6 in the same CPU budget (bench/results/learning_vs_trl_smollm2.json: the lr sweep and 3
# seeds), and a 3.4M-parameter Llama learned 3.97x as much per completion at 1e-5 (bench/learning/README.md). Models
# of 0.5B and up keep 1e-6, the published recipes' value (not measured here).
SMALL_MODEL_PARAMS = 200_000_000
SMALL_MODEL_LR = 1e-5
# rollout.max_new_tokens of a model directory (the module docstring says why), unless the user or a preset set it
CHAT_MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class ModelDefault:
    key: str  # "section.field"
    full: float  # a model directory, full fine-tuning
    lora: float  # a model directory with LoRA
    why: str  # what the note says the value is the default for, e.g. "of a user model's critic"
    ratio: bool = False  # a packaged preset's value scales the default by (preset value / built-in default)
    used_by: str = ""  # 'gae': resolved always, but noted only when PPO's critic uses it


USER_MODEL_DEFAULTS = (
    ModelDefault("optim.lr", 1e-6, 1e-5, "{kind} of a user model", ratio=True),
    ModelDefault("algo.value_lr", 1e-5, 1e-5, "the critic of a user model", ratio=True, used_by="gae"),
    ModelDefault("eval.batch_size", 64, 64, "evaluation of a user model"),
)


def model_defaults(cfg) -> tuple[object, list[str]]:
    """(a copy of cfg with the model's defaults resolved, one note per value changed). The built-in model
    (`model.name` 'builtin:...') keeps every value; see the module docstring for the rule."""
    if cfg.model.name.startswith("builtin:"):
        return cfg, []
    out, notes = cfg.model_copy(deep=True), []
    lora = cfg.model.lora_rank > 0
    kind = "LoRA fine-tuning" if lora else "full fine-tuning"
    for d in USER_MODEL_DEFAULTS:
        section_name, field = d.key.split(".")
        section = getattr(out, section_name)
        if field in section.model_fields_set and d.key not in cfg.preset_keys:
            continue  # the user's own value
        base = d.lora if lora else d.full
        builtin = type(section).model_fields[field].default
        value, why = base, f"default for {d.why.format(kind=kind)}"
        if d.key in cfg.preset_keys and getattr(section, field) != builtin:
            current = getattr(section, field)
            if not d.ratio:
                continue  # a preset's non-learning-rate setting is kept
            value = base * current / builtin
            why += f", {_num(base)}, times the {cfg.preset} preset's {_num(current / builtin)} of the built-in " \
                   f"{_num(builtin)}"
        setattr(section, field, type(builtin)(value))  # validated; marks the field as set (saved, reproduced)
        if d.used_by in ("", cfg.algo.advantage):
            notes.append(f"{d.key}={_num(getattr(section, field))} ({why}; set {d.key} to change)")
    note = _max_new_tokens(out, cfg)
    if note is not None:
        notes.append(note)
    out._preset_keys = cfg.preset_keys - {d.key for d in USER_MODEL_DEFAULTS}  # resolved: a second call keeps them
    return out, notes


def _max_new_tokens(out, cfg) -> str | None:
    """Set out.rollout.max_new_tokens to CHAT_MAX_NEW_TOKENS (at most half the model's positions) unless the user or
    a packaged preset (the code preset's 64) set it; the note that says so, else None."""
    if "max_new_tokens" in cfg.rollout.model_fields_set or "rollout.max_new_tokens" in cfg.preset_keys:
        return None
    from grpo.train.budget import model_shape

    positions = (model_shape(cfg) or {}).get("max_position_embeddings")
    value, why = CHAT_MAX_NEW_TOKENS, ("default for a user model: an instruct model's answer runs past the built-in "
                                       "model's 32 tokens and a cut-off answer scores 0; 256 is TRL's default "
                                       "completion length")
    if isinstance(positions, int) and positions // 2 < value:
        value, why = max(positions // 2, 1), why + f", here half of the model's {positions} positions"
    out.rollout.max_new_tokens = value  # validated; marks the field as set (saved, reproduced)
    return f"rollout.max_new_tokens={value} ({why}; set rollout.max_new_tokens to change)"


def report_defaults(cfg, console=None) -> tuple[object, list[str]]:
    """model_defaults(cfg), its notes printed (console, else the log) by the first process, all but the learning
    rate's (lr_note prints it once its value is final); returns both."""
    cfg, notes = model_defaults(cfg)
    for note in notes:
        if not note.startswith("optim.lr="):
            print_note(note, console)
    return cfg, notes


def lr_note(cfg, notes: list[str], num_params: int) -> str | None:
    """The one note on the learning rate, once its value is final: small_model_lr's (which sets it, in place) or
    the table's from `notes`, and, when the run has fewer updates than optim.warmup_steps, the rate it peaks at
    instead; None for a rate the user set (or the built-in model's): nothing was announced."""
    note = small_model_lr(cfg, notes, num_params) or next((n for n in notes if n.startswith("optim.lr=")), None)
    updates, warm = cfg.train.steps * cfg.algo.epochs, cfg.optim.warmup_steps
    if note is not None and updates < warm:  # the linear ramp (train/optim.py): update k's factor is (k + 1) / warm
        note = (f"{note[:-1]}; its linear ramp (optim.warmup_steps={warm}) is longer than this run's {updates} "
                f"updates, so the rate peaks at {_num(cfg.optim.lr * updates / warm)}: lower optim.warmup_steps to "
                "reach it)")
    return note


def small_model_lr(cfg, notes: list[str], num_params: int) -> str | None:
    """Full fine-tuning of a model under SMALL_MODEL_PARAMS parameters whose optim.lr came from the table (a note
    says so): set cfg.optim.lr (in place) to SMALL_MODEL_LR, times a packaged preset's ratio, and return the note
    that says so; None (cfg unchanged) for LoRA, a larger model, or a learning rate the user set."""
    if cfg.model.lora_rank > 0 or num_params >= SMALL_MODEL_PARAMS or not any(n.startswith("optim.lr=") for n in notes):
        return None
    ratio = cfg.optim.lr / USER_MODEL_DEFAULTS[0].full
    cfg.optim.lr = SMALL_MODEL_LR * ratio  # keeps a preset's ratio (cispo: half)
    times = f", {_num(SMALL_MODEL_LR)} times the {cfg.preset} preset's {_num(ratio)}" if abs(ratio - 1) > 1e-9 else ""
    return (f"optim.lr={_num(cfg.optim.lr)} (default for full fine-tuning of a user model under "
            f"{SMALL_MODEL_PARAMS / 1e6:.0f}M parameters{times}: this one has {num_params / 1e6:.1f}M, and on "
            "SmolLM2-135M 1e-5 learned where 1e-6 did not in the measured budget, "
            "bench/results/learning_vs_trl_smollm2.json; set optim.lr to change)")


def print_note(note: str, console=None) -> None:
    """`[grpo] note` on the console (else the log), by the first process only."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if console is not None:
        console.print(f"[grpo] {note}", soft_wrap=True, markup=False, highlight=False)
    else:
        log.info(note)


def _num(x: float) -> str:
    """1e-06 -> '1e-6', 5e-05 -> '5e-5', 0.5 -> '0.5', 64 -> '64'."""
    if x == 0 or abs(x) >= 1e-3:
        return f"{x:g}"
    mantissa, exponent = f"{x:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


AUTO_TIS_CAP = 2.0  # TRL's vllm_importance_sampling_cap and verl's usual cap


def tis_cap_for(cfg, compute: str) -> tuple[object, str | None]:
    """(cfg with algo.tis_cap=auto resolved, the note that says so or None). auto is AUTO_TIS_CAP where the sampler's
    arithmetic is not the trainer's: bf16 compute (models/compute.py; the two round differently, by about 0.03
    nats a token on SmolLM2-135M, as the trainer's own bf16 forwards differ between two micro-batch layouts) or
    rollout.engine=vllm (other kernels), with rollout.top_p=1 (under top-p the engine's log-probs are of another
    distribution); else off (None). A number or null is the user's and is kept."""
    if cfg.algo.tis_cap != "auto":
        return cfg, None
    out = cfg.model_copy(deep=True)
    differs = compute != "weights" or cfg.rollout.engine == "vllm"
    out.algo.tis_cap = AUTO_TIS_CAP if differs and cfg.rollout.top_p == 1.0 else None
    if out.algo.tis_cap is None:
        return out, None
    why = "the vLLM engine's kernels" if cfg.rollout.engine == "vllm" else "bf16 compute, whose rounding differs"
    return out, (f"algo.tis_cap={AUTO_TIS_CAP:g} (auto: the sampler's log-probs are not the trainer's arithmetic, "
                 f"{why} between the two; truncated importance sampling corrects each token's policy gradient for "
                 "it, logged as policy/tis_weight_mean; algo.tis_cap=null turns it off)")
