"""The PPO value model (critic): a `transformers` backbone with a scalar head, V(state) for every position.

    value = ValueModel.from_policy(policy)          # a deep copy of the policy's backbone + Linear(hidden, 1)
    value = ValueModel.from_pretrained(path, like=policy)   # from a given checkpoint (see below)
    v = value(input_ids, attention_mask, position_ids)      # (B, S): V of the state ending at each position
    v = value.completion_values(prompt_ids, prompt_mask, completion_ids, completion_mask, G)   # (N, T)

`completion_values` uses the alignment of `grpo.models.forward.completion_logits`: the last prompt position and
completion positions 0..T-2, so values[:, t] is V(state before completion token t), the value that GAE pairs with
the reward of token t. The backbone is copied, never shared: the critic's loss cannot reach the policy's weights.

The causal LM's output head is not copied (the critic needs hidden states, not logits), so with untied embeddings
the critic is smaller than the policy by the LM head; the built-in model ties them, so it is the same size.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from grpo.models.forward import position_ids_from_mask

__all__ = ["ValueModel", "backbone_of"]


def backbone_of(model) -> nn.Module:
    """The decoder stack of a causal LM (`model.model` for Llama/Qwen2), without its output head.

    For a PEFT (LoRA) policy it is the backbone of the underlying model, adapter layers included; the critic copied
    from it trains all of its parameters."""
    if hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None)):
        model = model.get_base_model()
    base = getattr(model, "base_model", None)
    if base is not None and base is not model:
        return base
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if decoder is not None and decoder is not model:
        return decoder
    raise ValueError(f"cannot find the backbone of {type(model).__name__}: it has neither `base_model` nor "
                     "`get_decoder()` distinct from the model itself")


class ValueModel(nn.Module):
    """backbone (a transformers base model) -> last hidden state (B, S, H) -> head Linear(H, 1) -> (B, S).

    The head is kept in float32 whatever the backbone's dtype (hidden states are cast up before it).
    """

    def __init__(self, backbone: nn.Module, *, head_init_std: float = 1e-3, seed: int = 0):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        device = next(backbone.parameters()).device
        # Built on the meta device and drawn from a private generator, so building a critic does not move the
        # global (sampling) RNG: PPO's first rollouts are then the same draws as GRPO's for the same seed.
        self.head = nn.Linear(hidden, 1, device="meta", dtype=torch.float32).to_empty(device=device)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn((1, hidden), generator=gen) * head_init_std)
            self.head.bias.zero_()

    @property
    def config(self):
        return self.backbone.config

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_policy(cls, policy, *, head_init_std: float = 1e-3, seed: int = 0) -> ValueModel:
        """A critic whose backbone is a deep copy (no shared tensors) of the policy's, trainable, in train mode
        (a LoRA base's linear layers held in bf16 come back as float32 ones: the critic trains every weight)."""
        from grpo.models.precision import float32_linears

        backbone = float32_linears(copy.deepcopy(backbone_of(policy)))
        backbone.requires_grad_(True)
        value = cls(backbone, head_init_std=head_init_std, seed=seed)
        value.train()
        return value

    @classmethod
    def from_pretrained(cls, path: str | Path, *, like=None, dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None) -> ValueModel:
        """A critic from a given checkpoint directory:

        - a Hugging Face model directory (config.json): its base model is the backbone. A sequence-classification
          checkpoint with one label (a reward model) also gives the head (`score`/`classifier` weights); otherwise the
          head is freshly initialised. A `value_head.safetensors` beside it overrides the head.
        - a directory of a saved critic (`model.safetensors` with `backbone.*` and `head.*` keys, as a training
          checkpoint stores it under `extra/value/`): needs `like=policy` to build the architecture.
        """
        from safetensors.torch import load_file

        path = Path(path).expanduser()
        if (path / "config.json").exists():
            value = cls._from_hf_dir(path, dtype)
        elif like is not None and any(path.glob("*.safetensors")):
            value = cls.from_policy(like)
            weights: dict[str, torch.Tensor] = {}
            for f in sorted(path.glob("*.safetensors")):
                weights.update(load_file(str(f)))
            missing, unexpected = value.load_state_dict(weights, strict=False)
            if missing or unexpected:
                raise ValueError(f"value model at {path} does not match the policy's architecture: missing "
                                 f"{missing[:10]}, unexpected {unexpected[:10]}")
        else:
            raise ValueError(f"value model path {str(path)!r} is neither a Hugging Face model directory (config.json) "
                             "nor a saved critic (*.safetensors; then pass like=policy)")
        if (path / "value_head.safetensors").exists():
            head = load_file(str(path / "value_head.safetensors"))
            value.head.load_state_dict({k.removeprefix("head."): v for k, v in head.items()})
        if device is not None:
            value.to(device)
        value.train()
        return value

    @classmethod
    def _from_hf_dir(cls, path: Path, dtype: torch.dtype | None) -> ValueModel:
        from transformers import (
            AutoConfig,
            AutoModel,
            AutoModelForSequenceClassification,
        )

        config = AutoConfig.from_pretrained(path)
        kwargs = {"dtype": dtype} if dtype is not None else {}
        archs = config.architectures or []
        if any(a.endswith("ForSequenceClassification") for a in archs) and getattr(config, "num_labels", 0) == 1:
            rm = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
            value = cls(backbone_of(rm))
            score = getattr(rm, "score", None) or getattr(rm, "classifier", None)
            if isinstance(score, nn.Linear) and score.out_features == 1:
                with torch.no_grad():
                    value.head.weight.copy_(score.weight.float())
                    if score.bias is not None:
                        value.head.bias.copy_(score.bias.float())
            return value
        return cls(AutoModel.from_pretrained(path, **kwargs))

    # ------------------------------------------------------------------ forward
    def hidden_states(self, input_ids, attention_mask, position_ids=None) -> torch.Tensor:
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def forward(self, input_ids, attention_mask, position_ids=None) -> torch.Tensor:
        """(B, S) values: entry s is V of the state made of tokens 0..s."""
        h = self.hidden_states(input_ids, attention_mask, position_ids)
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1)

    def completion_values(self, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int):
        """(N, T) values V(state before completion token t), aligned with `completion_logits`.

        prompt_ids/prompt_mask: (P, L) left-padded; completion_ids/completion_mask: (N, T), N = P*G.
        Only the T positions that precede completion tokens go through the head.
        """
        ids = torch.cat([prompt_ids.repeat_interleave(group_size, 0), completion_ids], dim=1)
        mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), completion_mask.to(prompt_mask.dtype)], dim=1)
        T = completion_ids.shape[1]
        h = self.hidden_states(ids, mask, position_ids_from_mask(mask))[:, -(T + 1):-1]
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1)
