"""The contract between an environment and the multi-turn rollout.

An episode, for one of the G samples of a prompt:

    prompt tokens -> policy turn 1 (sampled ids, kept as sampled, ends at EOS or the turn's token limit)
                  -> env.step(turn text) -> EnvReply(message="...", done=False)
                  -> message tokenized ONCE and appended (masked out of the loss: no gradient, no KL)
                  -> policy turn 2 ...                    -> EnvReply(done=True[, reward=...])

The trainer never decodes an episode and re-tokenizes it: the ids it trains on are the ids that were sampled
(plus the environment's ids, which carry no loss). Single-turn tasks are the one-turn case: no environment, the
first turn ends the episode.

An environment is made once per episode by its factory (`make(prompt)`), so it may keep per-episode state.
Its methods must not raise for anything the model wrote: a malformed tool call is answered with an error
message as the reply (the rollout catches an exception anyway, counts it in `env/tool_errors_frac` and ends
the episode with the error text as the reply, but an environment that raises is a bug).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from grpo.types import Prompt


@dataclass
class EnvReply:
    """The environment's answer to one policy turn.

    message: text appended as the environment's turn (a tool result), or None when the episode ends.
    role: the chat role the message is rendered under when the prompt came out of a chat template ("tool" for a
        tool result, "user" for feedback); a plain-text prompt gets the message's text as it is.
    done: True ends the episode after this turn.
    reward: the episode's reward, when the environment scores it itself (only read when done); None means the
        task's reward functions score the final policy turn.
    tool_calls / tool_errors: how many tool calls this turn made and how many of them failed (for env/ metrics).
    info: anything else, kept in the episode's record (samples.jsonl).
    """

    message: str | None = None
    role: str = "tool"
    done: bool = False
    reward: float | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode's environment. `step` receives the decoded text of the policy's latest turn (EOS removed)."""

    def step(self, turn: str) -> EnvReply: ...

    # optional: `continues(turn) -> bool`, True when step(turn) would answer and go on (e.g. the turn calls tools)
    # rather than end the episode, without doing anything. The rollout asks it on the last allowed turn
    # (env.max_turns) and cuts such a turn without stepping, so tools are not run for a reply nobody reads.


class EnvironmentFactory(Protocol):
    """Makes the environment of one episode from its prompt (the data row: text, answer, meta)."""

    def __call__(self, prompt: Prompt) -> Environment: ...
