"""verifiers' environments (PrimeIntellect's library) inside grpo's rollout: our policy is its model, its rubric
the reward (pip install 'grpo[verifiers]').

Which verifiers: the classic environment API (`SingleTurnEnv`, `MultiTurnEnv`, `ToolEnv`, `Rubric`: an environment
object with `env_response`, stop conditions and a rubric), which verifiers 0.3 ships as `verifiers.legacy` and
answers at `import verifiers as vf`. verifiers 0.4 removed it: its `verifiers.v1` runs agent harness programs
against an HTTP model endpoint, not an environment object a trainer can step, so it is refused with a clear error.

How an episode runs. The environment's own `rollout(input, client, model)` runs, unchanged, on an event loop that
this module drives; its `client` is `_PolicyClient`, which does not call a model: when the rollout asks for the
model's turn, the loop stops there and grpo's rollout samples the turn with the policy (token ids kept as sampled,
grpo.rollout.episodes); `step(turn)` hands the turn's text back as the model's response and runs the loop until
the rollout asks again or ends. So verifiers' own stop conditions (`is_completed`, `max_turns`, `final_env_response`),
`setup_state`, `env_response` (tool calls for ToolEnv) and cleanup all run as verifiers runs them.

    dataset row   {prompt: [messages], answer, info, task, example_id}
                    -> Prompt(text = the messages (and the environment's tools) through the chat template)
    rollout asks for the model's turn again
                    -> EnvReply(message = the messages verifiers appended after the policy's turn, role = theirs)
    rollout ends    -> rubric.score_rollout(state) -> EnvReply(done=True, reward=state["reward"])

An environment's messages after a turn (several tool results, say) become one EnvReply: their texts joined by a
newline, under their role when they share it, else "user". An environment whose `get_prompt_messages` rewrites
earlier messages (context editing) cannot run token-in/token-out: the adapter raises ValueError naming it.

Tool calls. The policy calls an environment's tools in grpo.envs.tools' formats: the chat template's own
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes / Qwen) where the template writes such blocks
(then it shows the tools itself, `apply_chat_template(..., tools=...)`), else the tag format
`<call>name(argument=value, ...)</call>` (Python literals; positional arguments take the schema's parameter order),
with the tools listed in a system message. A call that does not parse reaches verifiers with arguments that are not
JSON, which ToolEnv answers with an error message (never an exception); it counts in `tool_errors`, as does a call
to a tool the environment does not have.

An episode grpo's rollout cuts before verifiers ends it (env.max_turns, env.max_tokens, a turn without EOS) gets no
reward from the environment; the task's reward function `verifiers_rubric` then scores it: it replays the
episode's policy turns through a fresh rollout and scores the state the rollout reaches (the rubric on the
conversation so far, as verifiers scores an episode its own max_turns ends). Episodes the environment ended are
not replayed: their rubric score is kept when they end. Group-level rubric functions are not supported.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any

from grpo.envs.base import EnvReply
from grpo.envs.render import render_messages, tool_listing
from grpo.envs.tools import call_format_for
from grpo.envs.verifiers_client import _openai_tools, _plain, _policy_client_class, _tool_params, _vf, MODEL_NAME, parse_tool_calls, policy_tool_calls  # noqa: F401 (parse_tool_calls, policy_tool_calls: re-exported)
from grpo.types import Prompt

log = logging.getLogger("grpo.envs")
_KEEP = 20_000  # finished episodes whose rubric score is kept for the reward function and evaluation


# ---------------------------------------------------------------------------------------------- one episode
class VerifiersEpisode:
    """One episode of a verifiers environment (grpo.envs.base.Environment): `step(turn)` answers each policy turn.

    fmt: the tool-call format of the policy's turns ('hermes' or 'tags', grpo.envs.tools.call_format_for);
    `on_end(turns, reward)` is called once when verifiers ends the episode (the task keeps the score)."""

    def __init__(self, env, row: dict, on_end=None, fmt: str = "hermes"):
        self._env, self._on_end = env, on_end
        self._loop = asyncio.new_event_loop()
        self._tools = _tool_names(env)
        self._client = _policy_client_class()(fmt if self._tools else None, _tool_params(env))
        self._client.request = self._loop.create_future()
        # the coroutine holds no reference to this object, so an episode the rollout drops unfinished is freed (and
        # its loop closed, by __del__) at once, not at the next garbage collection
        self._task = self._loop.create_task(_rollout_and_score(env, self._client, row))
        self._turns: list[str] = []
        self._seen: list[dict] = []
        self.state: dict | None = None
        self.reward: float | None = None
        self._advance()
        if not self._task.done():
            messages, self.state = self._client.request.result()
            self._seen = _plain(messages)

    def _advance(self) -> None:
        """Run verifiers' rollout until it asks for the model's next turn or ends."""
        self._loop.run_until_complete(asyncio.wait([self._task, self._client.request],
                                                   return_when=asyncio.FIRST_COMPLETED))

    @property
    def done(self) -> bool:
        return self._task.done()

    def step(self, turn: str) -> EnvReply:
        if self.done:
            return self._end(0, 0)
        self._turns.append(turn)
        self._client.request = self._loop.create_future()
        self._client.reply.set_result(turn)
        self._advance()
        calls = policy_tool_calls(turn, self._client.fmt, self._client.params)[1] if self._tools else []
        errors = sum(1 for c in calls if not c["parsed"] or c["name"] not in self._tools)  # answered with an error
        calls = len(calls)
        if self.done:
            return self._end(calls, errors)
        messages, self.state = self._client.request.result()
        new = _plain(messages)
        prefix = len(self._seen) + 1  # what the policy saw, then its own turn
        if [m["content"] for m in new[:len(self._seen)]] != [m["content"] for m in self._seen]:
            raise ValueError(f"verifiers environment {type(self._env).__name__} rewrote earlier messages in "
                             "get_prompt_messages: a token-in/token-out episode can only append to its context")
        added, self._seen = new[prefix:], new
        roles = {m["role"] for m in added}
        role = roles.pop() if len(roles) == 1 else "user"
        return EnvReply(message="\n".join(m["content"] for m in added), role=role, tool_calls=calls,
                        tool_errors=errors, info={"roles": [m["role"] for m in added]})

    def _end(self, calls: int, errors: int) -> EnvReply:
        state = self._task.result()  # a bug in the environment or its rubric raises here
        self.state, self.reward = state, float(state["reward"])
        self._close()
        if self._on_end is not None:
            self._on_end(tuple(self._turns), self.reward)
        err = state.get("error")
        info = {"metrics": dict(state.get("metrics") or {}), "stop_condition": state.get("stop_condition")}
        if err is not None:
            info["error"] = repr(err)
        final = state.get("final_env_response")
        if final:
            info["final_env_response"] = _plain(final if isinstance(final, list) else [final])
        return EnvReply(message=None, done=True, reward=self.reward, tool_calls=calls, tool_errors=errors, info=info)

    def score_now(self) -> float:
        """The rubric's score of the episode as it stands: verifiers' rollout is stopped where it waits for the
        model (its cleanup renders the completion so far) and the state is scored."""
        if self.done:
            return self._end(0, 0).reward
        self._task.cancel()
        self._loop.run_until_complete(asyncio.gather(self._task, return_exceptions=True))
        state = self.state
        self._loop.run_until_complete(self._env.rubric.score_rollout(state))
        self._loop.run_until_complete(self._env.rubric.cleanup(state))
        self.reward = float(state["reward"])
        self._close()
        return self.reward

    def _close(self) -> None:
        if not self._loop.is_closed():
            self._loop.close()

    def close(self) -> None:
        """Stop verifiers' rollout where it waits (an episode grpo's rollout cut short) and free its loop."""
        if self._loop.is_closed():
            return
        if not self._task.done():
            self._task.cancel()
            if asyncio._get_running_loop() is None:  # (a loop running in this thread cannot run another)
                self._loop.run_until_complete(asyncio.gather(self._task, return_exceptions=True))
        self._loop.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


async def _rollout_and_score(env, client, row: dict):
    """verifiers' own rollout of `row` with `client` as the model, then its rubric's score (as its
    `run_rollout` does)."""
    state = await env.rollout(row, client, MODEL_NAME, None)
    await env.rubric.score_rollout(state)
    await env.rubric.cleanup(state)
    return state


def _has_group_funcs(rubric) -> bool:
    """Whether a rubric (or a RubricGroup's rubrics) has group-level reward functions."""
    subs = getattr(rubric, "rubrics", None)
    if subs:
        return any(_has_group_funcs(r) for r in subs)
    return bool(rubric._get_group_reward_funcs())


def _tool_names(env) -> set[str]:
    return set(getattr(env, "tool_map", None) or {}) or {t.name if hasattr(t, "name") else t["name"]
                                                         for t in (getattr(env, "tool_defs", None) or [])}


# ---------------------------------------------------------------------------------------------- the task
def _bucket(text: str) -> int:
    return hashlib.sha1(text.encode()).digest()[0] % 10


class VerifiersTask:
    """A verifiers environment as a grpo task (grpo.data.base.Task) with an environment per episode.

    Splits: the environment's `dataset` for training and its `eval_dataset` held out (training rows whose prompt
    equals a held-out one are dropped); with only one of them, a tenth of its rows (by a hash of the prompt text)
    is held out. Prompts are rendered with the policy's tokenizer: pass `tokenizer`, or `tokenizer_loader` (called
    when first needed; the trainer's data.task=verifiers:<id> passes model.name's)."""

    has_demonstrations = False

    def __init__(self, env, *, tokenizer=None, tokenizer_loader=None, name: str | None = None):
        vf = _vf()
        if not isinstance(env, vf.Environment):
            raise TypeError(f"VerifiersTask needs a verifiers Environment, got {type(env).__name__}")
        if _has_group_funcs(env.rubric):
            raise ValueError(f"verifiers environment {type(env).__name__}: its rubric has group-level reward "
                             "functions; grpo scores each episode on its own (individual reward functions only)")
        self.env, self.name = env, name or f"verifiers:{env.env_id or type(env).__name__}"
        self._tokenizer, self._tokenizer_loader = tokenizer, tokenizer_loader
        self._rows: dict[str, list[dict]] | None = None
        self._prompts: dict[str, list[Prompt]] = {}
        self._scores: OrderedDict[tuple, float] = OrderedDict()

    @property
    def tokenizer(self):
        if self._tokenizer is None and self._tokenizer_loader is not None:
            self._tokenizer = self._tokenizer_loader()
        return self._tokenizer

    # ------------------------------------------------------------------ splits
    def _render(self, row: dict) -> tuple[str, bool]:
        info = row.get("info")
        if isinstance(info, str):
            info = json.loads(info or "{}")
        tools = _openai_tools(((info or {}).get("tool_defs") if isinstance(info, dict) else None) or self.env.tool_defs)
        messages = _plain(row["prompt"])
        if tools and self.call_format == "tags":  # the template shows no tools: list them, in the tag format
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{tool_listing(tools)}"}
            else:
                messages.insert(0, {"role": "system", "content": tool_listing(tools)})
            tools = []
        return render_messages(self.tokenizer, messages, tools)

    @property
    def call_format(self) -> str:
        """'hermes' when the policy's chat template writes <tool_call> blocks (it shows the tools itself), else
        'tags' (grpo.envs.tools.call_format_for)."""
        return call_format_for(self.tokenizer)

    def _split_rows(self) -> dict[str, list[dict]]:
        if self._rows is None:
            env = self.env
            train = list(env.get_dataset()) if (env.dataset is not None or env.dataset_source) else []
            test = list(env.get_eval_dataset()) if (env.eval_dataset is not None or env.eval_dataset_source) else []
            if not train or not test:  # one data set: hold out a tenth, by the prompt's text
                rows = train or test
                key = [json.dumps(_plain(r["prompt"]), sort_keys=True) for r in rows]
                train = [r for r, k in zip(rows, key) if _bucket(k) != 0]
                test = [r for r, k in zip(rows, key) if _bucket(k) == 0]
            else:
                held = {json.dumps(_plain(r["prompt"]), sort_keys=True) for r in test}
                train = [r for r in train if json.dumps(_plain(r["prompt"]), sort_keys=True) not in held]
            self._rows = {"train": train, "test": test}
        return self._rows

    def split(self, name: str, n: int) -> list[Prompt]:
        if name not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {name!r}")
        rows = self._split_rows()[name]
        if not rows:
            raise ValueError(f"{self.name}: no {name} rows (the environment's dataset/eval_dataset)")
        prompts = self._prompts.setdefault(name, [])
        for i in range(len(prompts), min(n, len(rows))):
            text, templated = self._render(rows[i])
            answer = rows[i].get("answer")
            prompts.append(Prompt(uid=f"{name}-{i}", text=text, answer=None if answer is None else str(answer),
                                  meta={"vf_split": name, "vf_index": i}, templated=templated))
        return prompts[:n]

    def row(self, prompt: Prompt) -> dict:
        """The verifiers dataset row behind a prompt of this task."""
        return self._split_rows()[prompt.meta["vf_split"]][int(prompt.meta["vf_index"])]

    # ------------------------------------------------------------------ episodes and rewards
    def environment_factory(self, tokenizer=None):
        """prompt -> a VerifiersEpisode on its row (grpo.train.episodes calls this with the policy's tokenizer)."""
        if tokenizer is not None and self._tokenizer is None:
            self._tokenizer = tokenizer

        def make(prompt: Prompt) -> VerifiersEpisode:
            key = (prompt.meta["vf_split"], int(prompt.meta["vf_index"]))
            return VerifiersEpisode(self.env, self.row(prompt), on_end=lambda turns, r: self._keep(key, turns, r),
                                    fmt=self.call_format)

        return make

    def _keep(self, key: tuple, turns: tuple[str, ...], reward: float) -> None:
        self._scores[(key, turns)] = reward
        while len(self._scores) > _KEEP:
            self._scores.popitem(last=False)

    def episode_score(self, split: str, index: int, turns: list[str]) -> float:
        """The rubric's score of an episode with these policy turns: the score kept when verifiers ended it, else
        a replay of the turns through a fresh rollout, scored where it stops; 0 when the environment raises on
        them (the rollout ended that episode as env_error)."""
        key = ((split, int(index)), tuple(turns))
        if key in self._scores:
            return self._scores[key]
        ep = VerifiersEpisode(self.env, self._split_rows()[split][int(index)], fmt=self.call_format)
        try:
            for t in turns:
                if ep.done:
                    break
                ep.step(t)
            return ep.score_now()
        except Exception as e:  # noqa: BLE001 - the environment raised on these turns, as it did in the rollout
            log.warning("%s: the environment raised while its episode was scored (%s: %s); the episode scores 0 "
                        "(the rollout counted it in env/tool_errors_frac)", self.name, type(e).__name__, e)
            return 0.0

    def reward_functions(self):
        task = self

        def verifiers_rubric(prompts, completions, vf_split, vf_index, messages=None, **columns) -> list[float]:
            """The environment's rubric on each episode (TRL signature; `messages`: the episode's transcript)."""
            out = []
            for i, (c, s, k) in enumerate(zip(completions, vf_split, vf_index)):
                turns = [m["content"] for m in messages[i] if m["role"] == "assistant"] \
                    if messages is not None and messages[i] is not None else [_text(c)]
                out.append(task.episode_score(s, k, turns))
            return out

        return [("verifiers_rubric", verifiers_rubric, 1.0)]

    def is_correct_episode(self, prompt: Prompt, record: dict) -> bool:
        """Held-out accuracy (grpo.train.evaluate): the rubric's score of the episode, all its policy turns, reaches
        the environment's pass_threshold. Two episodes that end with the same answer after different turns (tool
        calls, feedback) are scored each on its own."""
        turns = [t["text"] for t in record["turns"] if t["role"] == "policy"]
        return self._passes(self.episode_score(prompt.meta["vf_split"], prompt.meta["vf_index"], turns))

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        """A single reply judged as a whole episode: the rubric's score of the rollout with `completion` as its
        only policy turn (a multi-turn episode is judged by is_correct_episode)."""
        return self._passes(self.episode_score(prompt.meta["vf_split"], prompt.meta["vf_index"], [completion]))

    def _passes(self, score: float) -> bool:
        return score >= float(getattr(self.env, "pass_threshold", 0.5))

    def demonstration(self, prompt: Prompt, rng=None) -> str:
        raise ValueError(f"{self.name} has no demonstrations: the built-in model cannot be warmed up on it")


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def load_task(env_id: str, env_args: dict[str, Any] | None = None, *, tokenizer=None,
              tokenizer_loader=None) -> VerifiersTask:
    """`verifiers.load_environment(env_id, **env_args)` (an installed environment module) as a VerifiersTask."""
    vf = _vf()
    from grpo.errors import ConfigError

    try:
        env = vf.load_environment(env_id, **(env_args or {}))
    except ValueError as e:
        raise ConfigError(f"data.task=verifiers:{env_id}: {e}") from e
    return VerifiersTask(env, tokenizer=tokenizer, tokenizer_loader=tokenizer_loader, name=f"verifiers:{env_id}")
