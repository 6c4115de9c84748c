"""A learned reward model as a reward function: a local AutoModelForSequenceClassification directory, batched.

    rm = RewardModel("path/to/rm", batch_size=16, device="cpu")
    rm(prompts, completions)          # -> [float, ...]: the classifier's logit for each prompt + completion

The text scored is prompt + completion, or, for conversational completions when the tokenizer has a chat template,
the template applied to the prompt messages followed by the completion messages. Tokenized by grpo.tokens' rule:
plain text with the tokenizer's special tokens (one BOS even when the prompt text begins with one), templated
text without (the template wrote them). It runs in the caller's process
(`in_process = True`: a torch model must not be forked mid-run) and serialises its own calls with a lock.
transformers is imported only when a RewardModel is built.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from grpo.rewards.base import completion_text, prompt_text, register_reward
from grpo.tokens import text_token_ids

__all__ = ["RewardModel"]


class RewardModel:
    """TRL-signature reward function backed by a sequence-classification model.

    path: local model directory (weights + tokenizer). score_index: which logit is the reward (models with
    num_labels > 1). max_length: truncate longer inputs (default: the tokenizer's limit, at most 4096 tokens).
    """

    in_process = True

    def __init__(
        self,
        path: str,
        *,
        batch_size: int = 16,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_length: int | None = None,
        score_index: int = 0,
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.__name__ = "reward_model"
        self.path, self.batch_size, self.device = str(path), batch_size, torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        kwargs = {"dtype": dtype} if dtype is not None else {}
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path, **kwargs).to(self.device).eval()
        if self.tokenizer.pad_token_id is None:
            if self.tokenizer.eos_token is None:
                raise ValueError(f"reward model tokenizer at {self.path} has neither a pad nor an eos token")
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side = "right"
        num_labels = self.model.config.num_labels
        if not 0 <= score_index < num_labels:
            raise ValueError(f"score_index {score_index} is out of range for a model with num_labels={num_labels}")
        self.score_index = score_index
        limit = getattr(self.tokenizer, "model_max_length", None) or 4096
        self.max_length = max_length or min(int(limit), 4096)
        self._lock = threading.Lock()

    def _text(self, prompt: Any, completion: Any) -> tuple[str, bool]:
        """-> (text, templated). Templated text already holds its special tokens."""
        conversational = isinstance(completion, (list, tuple))
        if conversational and getattr(self.tokenizer, "chat_template", None):
            msgs = list(prompt) if isinstance(prompt, (list, tuple)) else [{"role": "user", "content": str(prompt)}]
            return self.tokenizer.apply_chat_template(msgs + list(completion), tokenize=False), True
        return prompt_text(prompt) + completion_text(completion), False

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        items = [self._text(p, c) for p, c in zip(prompts, completions, strict=True)]
        scores: list[float] = []
        with self._lock, torch.inference_mode():
            for i in range(0, len(items), self.batch_size):
                chunk = items[i : i + self.batch_size]
                ids = text_token_ids(self.tokenizer, [t for t, _ in chunk], [f for _, f in chunk],
                                     for_generation=False, truncation=True, max_length=self.max_length)
                enc = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(self.device)
                logits = self.model(**enc).logits  # (B, num_labels)
                scores += logits[:, self.score_index].float().cpu().tolist()
        return scores


@register_reward("reward_model", factory=True)
def reward_model(path: str, *, batch_size: int = 16, device: str = "cpu", max_length: int | None = None) -> RewardModel:
    """Factory: RewardModel(path, ...) (see its docstring)."""
    return RewardModel(path, batch_size=batch_size, device=device, max_length=max_length)
