"""Multi-turn episodes, token in / token out (the contract is grpo.envs.base).

    turn 1      sampler.generate(prompts, G)        the single-turn path as it is: the prompt prefilled once per
                                                    group, shared by its G rows, LeanDecoder where its check passed
    env         env.step(decoded turn) -> EnvReply  its message tokenized ONCE (grpo.envs.chat) and appended
    turn k > 1  sampler.generate_from_ids(contexts) each live episode's whole context (prompt + every earlier turn)
                                                    is prefilled again, then decoded (no cache kept across turns)

The ids trained on are the ids sampled: the policy's turns as the sampler drew them, the environment's as
tokenized once. An episode's completion is all its turns after the prompt, (N, T) right-padded:
    completion_mask   1 at every real token (policy and environment): what attention sees
    loss_mask         1 at the policy's tokens only: the loss, the KL and the group advantage apply there
    logp              the sampler's log-probs at policy tokens, 0 at environment tokens

A policy turn ends at EOS or at a stop string (rollout.stop, the sampler's: rollout/stop.py; the environment steps
with the turn's text before it, the ids keep the token that completed it; the environment's own messages never stop
a turn: only the turn's new tokens are searched). An episode ends when
    - a policy turn ends without EOS or a stop string (its per-turn limit rollout.max_new_tokens): truncated
    - the environment answers done=True (its reward, if it gives one, replaces the task's reward functions)
    - env.max_turns policy turns were taken and the environment still answers (or, when it has `continues`, would
      answer: the last turn's tool calls are not run): truncated
    - the completion would pass env.max_tokens tokens (policy + environment): truncated, cut at the limit
    - env.step raises: the error text is recorded, counted as a tool error, and the episode ends (not truncated)
Without an environment factory the first turn is the whole episode: `run_episodes` returns generate's Rollouts
unchanged (single-turn tasks are the one-turn case of this function).

Cost of later turns: turn k prefills the whole context of each live episode (prompt + earlier turns), L_k tokens,
without the prompt sharing of turn 1, then decodes; for E live episodes that is E * L_k prefill tokens per turn
on top of the decode (docs/tasks.md "Tools and multi-turn episodes").
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from grpo.envs.base import EnvReply
from grpo.envs.chat import env_message_ids
from grpo.rollout.stop import cut_at_stop
from grpo.types import Prompt, Rollouts


@dataclass
class _Episode:
    """One episode as it is built: the completion's ids, which are the policy's, the policy's log-probs."""

    prompt: Prompt
    env: object
    ids: list[int] = field(default_factory=list)
    policy: list[bool] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    end: str = ""
    env_reward: float | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    policy_turns: int = 0

    def add(self, ids: list[int], logp: list[float] | None, role: str, text: str) -> None:
        self.ids += ids
        self.policy += [logp is not None] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)
        self.turns.append({"role": role, "text": text, "tokens": len(ids)})

    def finish(self, end: str, truncated: bool = False) -> None:
        self.done, self.end, self.truncated = True, end, truncated

    def record(self) -> dict:
        return {"turns": self.turns, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "env_reward": self.env_reward, "truncated": self.truncated, "end": self.end}


def _uniforms(rows: list[int], group_size: int, T: int, generator, device) -> torch.Tensor:
    """(len(rows), T) uniforms for the given episode rows: from each prompt's own generator when `generator` is a
    list (row r belongs to prompt r // group_size, so a group's draws do not depend on the batch), else one draw."""
    if isinstance(generator, (list, tuple)):
        parts, i = [], 0
        while i < len(rows):
            p, j = rows[i] // group_size, i
            while j < len(rows) and rows[j] // group_size == p:
                j += 1
            g = generator[p]
            parts.append(torch.rand((j - i, T), generator=g, device=g.device).to(device))
            i = j
        return torch.cat(parts)
    dev = generator.device if generator is not None else device
    return torch.rand((len(rows), T), generator=generator, device=dev).to(device)


def _step(ep: _Episode, turn_text: str) -> EnvReply:
    """env.step, never raising: an exception is recorded, counted as a tool error and ends the episode."""
    try:
        reply = ep.env.step(turn_text)
        if not isinstance(reply, EnvReply):
            raise TypeError(f"{type(ep.env).__name__}.step returned {type(reply).__name__}, not an EnvReply")
        return reply
    except Exception as e:  # noqa: BLE001 - an environment's bug must not stop training
        return EnvReply(message=None, done=True, tool_errors=1,
                        info={"error": f"{type(ep.env).__name__}.step raised {type(e).__name__}: {e}"})


def _continues(env, turn_text: str) -> bool:
    """The environment's optional `continues(turn)`: True when step(turn) would answer and go on (the turn calls
    tools) rather than end the episode. On the last allowed turn such a turn is cut without stepping, so its tools
    do not run for a reply nobody reads. Without the method, or when it raises, the environment is stepped."""
    check = getattr(env, "continues", None)
    try:
        return callable(check) and bool(check(turn_text))
    except Exception:  # noqa: BLE001 - step() then runs and reports whatever is wrong
        return False


def run_episodes(sampler, prompts: list[Prompt], n: int, env_factory=None, *, max_turns: int = 1,
                 max_tokens: int | None = None, step_workers: int | None = 1, generator=None,
                 temperature: float | None = None) -> Rollouts:
    """G = n episodes per prompt (prompt-major rows), each with its own environment `env_factory(prompt)`.
    step_workers > 1: the environments of a turn's episodes step in that many threads at once (env.step_workers;
    None: min(8, CPU cores)). An environment may be stepped on a different thread at each turn.
    Returns Rollouts with `loss_mask` (N, T) and `episodes` (one record per row: its turns, tool calls and
    errors, the environment's reward, how it ended); `texts` holds each episode's final policy turn.
    env_factory None: the single-turn case, generate's Rollouts as they are."""
    if env_factory is None:
        return sampler.generate(prompts, n, generator=generator, temperature=temperature)
    if max_turns < 1:
        raise ValueError(f"env.max_turns must be >= 1, got {max_turns}")
    if step_workers is None:
        step_workers = min(8, os.cpu_count() or 1)
    if step_workers < 1:
        raise ValueError(f"env.step_workers must be >= 1, got {step_workers}")
    if max_turns > 1 and not callable(getattr(sampler, "generate_from_ids", None)):
        raise ValueError(f"the rollout engine {type(sampler).__name__} cannot continue token contexts "
                         "(generate_from_ids), which multi-turn episodes need; use the native sampler or env.max_turns=1")
    budget = max_tokens if max_tokens is not None else 1 << 30
    # vLLM on CUDA sleeps after each generation, which drops its prefix cache: it stays awake for the whole episodes
    awake = getattr(sampler, "awake", None)
    pool = ThreadPoolExecutor(step_workers, thread_name_prefix="grpo-env") if step_workers > 1 else nullcontext()
    with (awake() if callable(awake) else nullcontext()), pool as pool:
        first = sampler.generate(prompts, n, generator=generator, temperature=temperature)
        episodes = [_Episode(p, env_factory(p)) for p in prompts for _ in range(n)]
        return _later_turns(sampler, first, episodes, n, max_turns, budget, generator, temperature, pool)


def _later_turns(sampler, first: Rollouts, episodes: list[_Episode], n: int, max_turns: int, budget: int, generator,
                 temperature, pool) -> Rollouts:
    """From turn 1's Rollouts on: step the environments, sample the next policy turn of the episodes still live,
    until none is; then the episodes as Rollouts."""
    tok = sampler.tokenizer
    device = first.completion_ids.device
    lengths = first.completion_mask.sum(-1).tolist()
    turn_ids = [first.completion_ids[i, :lengths[i]].tolist() for i in range(len(episodes))]
    turn_logp = [first.logp[i, :lengths[i]].tolist() for i in range(len(episodes))]
    turn_end = (~first.truncated).tolist()  # the turn ended at EOS or a stop string
    # each prompt's ids exactly as turn 1 saw them (its left padding dropped), not tokenized a second time
    prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(first.prompt_ids.cpu(), first.prompt_mask.cpu())]
    while True:
        live = _take_turns(episodes, turn_ids, turn_logp, turn_end, tok, getattr(sampler, "stop", ()), max_turns,
                           budget, pool)
        if not live:
            break
        T = min(sampler.max_new_tokens, max(budget - len(episodes[r].ids) for r in live))
        contexts = [prompt_ids[r // n] + episodes[r].ids for r in live]
        # drawn at the full turn width, then cut to T: T depends on the other episodes of the batch (their room
        # under env.max_tokens), and a row's draws must not (one generator per prompt: rollout.seed_per_prompt)
        uniforms = _uniforms(live, n, sampler.max_new_tokens, generator, device)[:, :T]
        ids, logp, ended = sampler.generate_from_ids(contexts, uniforms, temperature=temperature)
        turn_ids, turn_logp, turn_end = [None] * len(episodes), [None] * len(episodes), [False] * len(episodes)
        for r, i, lp, e in zip(live, ids, logp, ended):
            turn_ids[r], turn_logp[r], turn_end[r] = i, lp, e
    return _assemble(first, episodes, tok.pad_token_id)


def _take_turns(episodes, turn_ids, turn_logp, turn_end, tok, stop, max_turns: int, budget: int,
                pool=None) -> list[int]:
    """Append each live episode's new policy turn, step its environment, append its reply; returns the rows that
    go on to another policy turn. turn_end: whether the sampler ended each turn (EOS or a stop string); the
    environment gets the turn's text cut before its stop string (cut_at_stop). With a thread pool the environments
    of different episodes step concurrently (a sandboxed tool call waits on its own process); replies are applied
    in row order either way."""
    stepping = []
    for r, ep in enumerate(episodes):
        if ep.done or turn_ids[r] is None:
            continue
        ids, logp = turn_ids[r], turn_logp[r]
        room = budget - len(ep.ids)
        cut = len(ids) > room
        ids, logp = ids[:room], logp[:room]
        ended = bool(ids) and bool(turn_end[r]) and not cut
        text = cut_at_stop(tok.decode(ids, skip_special_tokens=True), stop)
        ep.add(ids, logp, "policy", text)
        ep.policy_turns += 1
        if not ended:
            ep.finish("max_tokens" if cut else "turn_limit", truncated=True)
            continue
        if ep.policy_turns >= max_turns and _continues(ep.env, text):  # its tools' results would never be read
            ep.finish("max_turns", truncated=True)
            continue
        stepping.append((r, ep, text))
    rows, eps, texts = zip(*stepping) if stepping else ((), (), ())
    replies = pool.map(_step, eps, texts) if pool is not None and len(eps) > 1 else map(_step, eps, texts)
    return [r for r, ep, reply in zip(rows, eps, replies) if _apply_reply(ep, reply, tok, max_turns, budget)]


def _apply_reply(ep: _Episode, reply: EnvReply, tok, max_turns: int, budget: int) -> bool:
    """Record the environment's reply in the episode; True when the policy takes another turn."""
    ep.tool_calls += reply.tool_calls
    ep.tool_errors += reply.tool_errors
    if reply.info.get("error"):
        ep.turns.append({"role": "error", "text": reply.info["error"], "tokens": 0})
    if reply.done:
        ep.env_reward = reply.reward
        if reply.message is not None:
            ep.turns.append({"role": reply.role, "text": reply.message, "tokens": 0})
        ep.finish("env_error" if reply.info.get("error") else "done")
        return False
    if ep.policy_turns >= max_turns:
        ep.finish("max_turns", truncated=True)
        return False
    try:
        env_ids = env_message_ids(tok, reply.message or "", reply.role, ep.prompt.templated, True)
    except ValueError as e:
        ep.tool_errors += 1
        ep.turns.append({"role": "error", "text": str(e), "tokens": 0})
        ep.finish("env_error")
        return False
    if len(ep.ids) + len(env_ids) >= budget:  # no room left for a policy token after the reply
        ep.finish("max_tokens", truncated=True)
        return False
    ep.add(env_ids, None, reply.role, reply.message or "")
    return True


def _assemble(first: Rollouts, episodes: list[_Episode], pad: int) -> Rollouts:
    """The episodes as Rollouts: (N, T) ids, attention mask, loss mask and log-probs, right-padded."""
    N, T = len(episodes), max(1, max(len(ep.ids) for ep in episodes))
    device = first.completion_ids.device
    ids = torch.full((N, T), pad, dtype=torch.long)
    mask = torch.zeros((N, T), dtype=torch.long)
    loss_mask = torch.zeros((N, T), dtype=torch.long)
    logp = torch.zeros((N, T))
    for i, ep in enumerate(episodes):
        k = len(ep.ids)
        ids[i, :k] = torch.tensor(ep.ids, dtype=torch.long)
        mask[i, :k] = 1
        loss_mask[i, :k] = torch.tensor(ep.policy, dtype=torch.long)
        logp[i, :k] = torch.tensor(ep.logp)
    texts = [next((t["text"] for t in reversed(ep.turns) if t["role"] == "policy"), "") for ep in episodes]
    return Rollouts(prompts=first.prompts, group_size=first.group_size, prompt_ids=first.prompt_ids,
                    prompt_mask=first.prompt_mask, completion_ids=ids.to(device), completion_mask=mask.to(device),
                    logp=logp.to(device), truncated=torch.tensor([ep.truncated for ep in episodes], device=device),
                    texts=texts, loss_mask=loss_mask.to(device), episodes=[ep.record() for ep in episodes])


def episode_messages(prompt: Prompt, record: dict) -> list[dict]:
    """An episode as chat messages (the `messages` column the task's reward functions get): the prompt as the user's
    message, policy turns as the assistant's, environment turns under their role."""
    msgs = [{"role": "user", "content": prompt.text}]
    for t in record["turns"]:
        if t["role"] != "error":
            msgs.append({"role": "assistant" if t["role"] == "policy" else t["role"], "content": t["text"]})
    return msgs
