"""An endless, epoch-shuffled stream of training prompts whose position is saved for an exact resume."""

from __future__ import annotations

import random

from grpo.types import Prompt


class PromptStream:
    def __init__(self, prompts: list[Prompt], seed: int):
        if not prompts:
            raise ValueError("the training split is empty: no prompts to train on")
        self.prompts = prompts
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def next(self, n: int) -> list[Prompt]:
        out = []
        while len(out) < n:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            out.append(self.prompts[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "size": len(self.prompts)}

    def load_state_dict(self, state: dict) -> None:
        if state["size"] != len(self.prompts):
            raise ValueError(f"resume: the training split has {len(self.prompts)} prompts, the checkpoint "
                             f"was taken with {state['size']}; data.* settings changed")
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffled(self.epoch)
