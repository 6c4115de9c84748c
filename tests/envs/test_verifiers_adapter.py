"""verifiers environments, defined here (no download), run by the adapter with the policy's turns given by hand:
episode rewards are their rubrics' scores, checked against values computed by hand; environment messages, tool
calls and a malformed call's error come back as EnvReply; splits never overlap; prompts go through the chat
template with the environment's messages."""

from __future__ import annotations


import pytest

vf = pytest.importorskip("verifiers")
if not hasattr(vf, "MultiTurnEnv"):
    pytest.skip("verifiers without the classic environment API (0.4+)", allow_module_level=True)
from datasets import Dataset  # noqa: E402  (a verifiers dependency)

from helpers.tiny_hf import CHAT_TEMPLATE, chat_tokenizer  # noqa: E402

from grpo.envs.base import Environment  # noqa: E402
from grpo.envs.verifiers_env import VerifiersTask, parse_tool_calls, policy_tool_calls  # noqa: E402

# a ChatML template that shows tools and asks for Hermes-style <tool_call> blocks (as Qwen 2.5's does)
HERMES_TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: "
                   "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}. "
                   "Call one as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>"
                   "<|im_end|>\n{% endif %}" + CHAT_TEMPLATE)


def hermes_tokenizer():
    tok = chat_tokenizer()
    tok.chat_template = HERMES_TEMPLATE
    return tok

SUMS = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(6) for b in range(5)]


def exact(completion, answer, **kwargs) -> float:
    return 1.0 if (completion[-1].content or "").strip() == answer else 0.0


def brief(completion, **kwargs) -> float:
    return 1.0 if len(completion[-1].content or "") <= 3 else 0.0


def single_turn_env():
    return vf.SingleTurnEnv(dataset=Dataset.from_list(SUMS), system_prompt="Answer with a number.",
                            rubric=vf.Rubric(funcs=[exact, brief], weights=[1.0, 0.5]))


class GuessEnv(vf.MultiTurnEnv):
    """Guess the answer: the environment says 'higher' or 'lower' (as the user) until the guess is right."""

    def __init__(self, **kwargs):
        super().__init__(max_turns=4, **kwargs)

    async def env_response(self, messages, state, **kwargs):
        guess = int(messages[-1].content.strip())
        return [vf.UserMessage(content="higher" if guess < int(state["answer"]) else "lower")]

    @vf.stop
    async def guessed(self, state, **kwargs) -> bool:
        traj = state["trajectory"]
        return bool(traj) and traj[-1]["completion"][-1].content.strip() == state["answer"]


def found_fast(completion, answer, **kwargs) -> float:
    """1 for a right last guess, minus 0.25 for each earlier guess."""
    guesses = [m for m in completion if m.role == "assistant"]
    return (1.0 - 0.25 * (len(guesses) - 1)) if guesses[-1].content.strip() == answer else 0.0


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def task_of(env, tok=None) -> VerifiersTask:
    return VerifiersTask(env, tokenizer=tok or chat_tokenizer())


def test_single_turn_rewards_are_the_rubric_weighted_sum():
    task = task_of(single_turn_env())
    p = task.split("train", 1)[0]
    make = task.environment_factory()
    right = p.answer
    cases = {right: 1.0 * 1 + 0.5 * 1,             # right and brief
             "no idea": 0.0,                         # wrong, long
             str(int(right) + 1): 0.5,               # wrong, brief
             f"It is {right}": 0.0}                  # long, and not exactly the answer
    for turn, want in cases.items():
        env = make(p)
        assert isinstance(env, Environment)
        reply = env.step(turn)
        assert reply.done and reply.message is None and reply.reward == pytest.approx(want), turn
        assert reply.info["metrics"]["exact"] == float(turn == right)


def test_multi_turn_feedback_then_the_rubric_at_the_end():
    env = GuessEnv(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[found_fast]))
    task = task_of(env)
    p = next(x for x in task.split("train", 40) if int(x.answer) >= 3)
    answer = int(p.answer)
    ep = task.environment_factory()(p)
    r1 = ep.step(str(answer - 2))
    assert (r1.done, r1.message, r1.role) == (False, "higher", "user")
    r2 = ep.step(str(answer + 5))
    assert (r2.done, r2.message, r2.role) == (False, "lower", "user")
    r3 = ep.step(str(answer))
    assert r3.done and r3.reward == pytest.approx(1.0 - 0.25 * 2)
    assert r3.info["stop_condition"] == "guessed"
    # an episode the environment ends at its own max_turns (4 wrong guesses) scores 0
    ep = task.environment_factory()(p)
    replies = [ep.step(str(answer + 10 + k)) for k in range(4)]
    assert [r.done for r in replies] == [False, False, False, True] and replies[-1].reward == 0.0


def tool_env():
    return vf.ToolEnv(dataset=Dataset.from_list(SUMS), tools=[add], max_turns=4, rubric=vf.Rubric(funcs=[exact]))


def operands(p) -> tuple[int, int]:
    a, b = p.text.split("What is ")[1].split("?")[0].split(" + ")
    return int(a), int(b)


def test_tool_env_in_the_templates_format_calls_tools_and_answers_a_malformed_call_with_an_error():
    tok = hermes_tokenizer()
    task = task_of(tool_env(), tok)
    assert task.call_format == "hermes"
    p = task.split("train", 3)[2]
    assert p.text.startswith("<|im_start|>system\nTools: add. Call one as <tool_call>")  # the template shows them
    a, b = operands(p)
    ep = task.environment_factory()(p)
    r = ep.step(f'Let me add. <tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>')
    assert (r.done, r.message, r.role, r.tool_calls, r.tool_errors) == (False, str(a + b), "tool", 1, 0)
    r = ep.step('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>')  # JSON cut short
    assert not r.done and r.tool_calls == 1 and r.tool_errors == 1 and r.role == "tool"
    assert "Expecting" in r.message  # the JSON error, as ToolEnv formats it, for the model to read
    r = ep.step('<tool_call>{"name": "multiply", "arguments": {"a": 1, "b": 2}}</tool_call>')  # no such tool
    assert not r.done and r.tool_errors == 1 and "multiply" in r.message
    r = ep.step(str(a + b))  # no call: ToolEnv ends the episode, the rubric scores the last message
    assert r.done and r.reward == 1.0 and r.info["metrics"]["total_tool_calls"] == 3.0


def test_tool_env_in_the_tag_format_where_the_template_shows_no_tools():
    tok = chat_tokenizer()  # its template has no tool support
    task = task_of(tool_env(), tok)
    assert task.call_format == "tags"
    p = task.split("train", 3)[2]
    system = p.text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou can call these tools") and '"name": "add"' in system
    a, b = operands(p)
    ep = task.environment_factory()(p)
    r = ep.step(f"Adding. <call>add({a}, b={b})</call>")  # positional arguments take the schema's order
    assert (r.done, r.message, r.role, r.tool_calls, r.tool_errors) == (False, str(a + b), "tool", 1, 0)
    r = ep.step("<call>add(1, 2, 3)</call> <call>add(1, </call>")  # too many arguments; not a call at all
    assert not r.done and (r.tool_calls, r.tool_errors) == (2, 2) and r.message.count("\n") == 1
    r = ep.step(str(a + b))
    assert r.done and r.reward == 1.0


def test_an_episode_dropped_unfinished_frees_its_loop_at_once():
    """grpo's rollout drops the environments of episodes it cut: no file descriptors may pile up until a GC."""
    import gc

    env = GuessEnv(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[found_fast]))
    task = task_of(env)
    p = task.split("train", 1)[0]
    gc.disable()
    try:
        ep = task.environment_factory()(p)
        ep.step("-1")
        loop = ep._loop
        assert not ep.done and not loop.is_closed()
        del ep
        assert loop.is_closed()
    finally:
        gc.enable()


def test_parse_tool_calls():
    params = {"f": ["x", "y"]}
    assert policy_tool_calls('go <call>f(1, y="a")</call>', "tags", params) == (
        "go", [{"id": "call_0", "name": "f", "arguments": '{"x": 1, "y": "a"}', "parsed": True}])
    content, calls = parse_tool_calls('hi <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> '
                                      '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert content == "hi"
    assert [(c["name"], c["arguments"], c["parsed"]) for c in calls] == [("f", '{"x": 1}', True),
                                                                         ("g", '{"y": 2}', True)]
    _, bad = parse_tool_calls('<tool_call>{"name": "f", "arguments": {</tool_call>')
    assert bad[0]["name"] == "f" and not bad[0]["parsed"]
    assert parse_tool_calls("no call <tool_call> unclosed") == ("no call <tool_call> unclosed", [])


def test_the_reward_function_scores_episodes_cut_short_by_replaying_their_turns():
    env = GuessEnv(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[found_fast]))
    task = task_of(env)
    p = next(x for x in task.split("train", 40) if int(x.answer) >= 3)
    answer = int(p.answer)
    (name, fn, weight), = task.reward_functions()
    assert (name, weight) == ("verifiers_rubric", 1.0)

    def transcript(*turns):
        return [{"role": "user", "content": p.text}] + [{"role": "assistant", "content": t} for t in turns]

    cols = {"vf_split": ["train"] * 3, "vf_index": [p.meta["vf_index"]] * 3}
    messages = [transcript(str(answer - 1)),                    # cut after one wrong guess: 0
                transcript(str(answer - 1), str(answer)),       # the replay ends it: right at the 2nd guess
                transcript(str(answer))]                        # right at once
    assert fn([p.text] * 3, ["", "", ""], messages=messages, **cols) == [0.0, 0.75, 1.0]
    # an episode that ran in the trainer is not replayed: its score was kept when it ended
    ep = task.environment_factory()(p)
    assert ep.step(str(answer)).reward == 1.0
    assert task._scores[(("train", p.meta["vf_index"]), (str(answer),))] == 1.0
    assert task.is_correct(p, str(answer)) and not task.is_correct(p, str(answer + 1))


def test_held_out_episodes_with_the_same_final_answer_are_judged_each_on_its_own_turns():
    """Evaluation judges a verifiers episode by all its policy turns: right at once scores 1.0 (passes the 0.5
    threshold); right after three wrong guesses 0.25 (fails), though both end with the same answer. Judged by the
    final turn alone, the two would get one verdict."""
    from grpo.train.evaluate import _judge

    env = GuessEnv(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[found_fast]))
    task = task_of(env)
    p = next(x for x in task.split("test", 40) if int(x.answer) >= 3)
    answer = int(p.answer)
    slow, fast = [str(answer - 3), str(answer - 2), str(answer - 1), str(answer)], [str(answer)]
    records = []
    for turns in (slow, fast):  # as the trainer's rollout runs them: each step, then the episode's record
        ep = task.environment_factory()(p)
        replies = [ep.step(t) for t in turns]
        assert replies[-1].done and [r.done for r in replies[:-1]] == [False] * (len(turns) - 1)
        records.append({"turns": [{"role": "policy", "text": t} for t in turns]})
    assert replies[-1].reward == 1.0
    assert _judge(task, [p, p], [str(answer)] * 2, records) == [False, True]
    # not from the kept scores only: a fresh task replays each episode's turns to the same verdicts
    assert _judge(task_of(GuessEnv(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[found_fast]))),
                  [p, p], [str(answer)] * 2, records) == [False, True]


class FailingEnv(vf.MultiTurnEnv):
    """Answers 'again' to the first turn and raises on the second (an environment's bug the policy can reach)."""

    def __init__(self, **kwargs):
        super().__init__(max_turns=3, **kwargs)

    async def env_response(self, messages, state, **kwargs):
        if sum(m.role == "assistant" for m in messages) >= 2:
            raise ValueError("env bug")
        return [vf.UserMessage(content="again")]


def test_an_episode_the_environment_raised_on_scores_zero_in_training_and_evaluation():
    """The rollout ends such an episode as env_error; scoring it replays its turns, which raise again: the reward
    function and the held-out judge give 0 / wrong instead of stopping the run."""
    from grpo.train.evaluate import _judge

    task = task_of(FailingEnv(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[exact])))
    p = task.split("test", 1)[0]
    ep = task.environment_factory()(p)
    assert ep.step(p.answer).message == "again"
    with pytest.raises(ValueError, match="env bug"):  # the rollout's _step catches this and ends the episode
        ep.step(p.answer)
    record = {"turns": [{"role": "policy", "text": p.answer}] * 2, "end": "env_error"}
    assert _judge(task, [p], [p.answer], [record]) == [False]
    (_, fn, _), = task.reward_functions()
    messages = [[{"role": "user", "content": p.text}] + [{"role": "assistant", "content": p.answer}] * 2]
    assert fn([p.text], [p.answer], messages=messages, vf_split=["test"], vf_index=[p.meta["vf_index"]]) == [0.0]


def test_splits_never_overlap_and_prompts_use_the_chat_template():
    tok = chat_tokenizer()
    task = task_of(single_turn_env(), tok)
    train, test = task.split("train", 100), task.split("test", 100)
    assert len(train) + len(test) == len(SUMS) and test  # a tenth or so held out by the prompt's hash
    assert not {p.text for p in train} & {p.text for p in test}
    row = task.row(train[0])
    assert train[0].templated and train[0].text == tok.apply_chat_template(
        [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": row["question"]}],
        tokenize=False, add_generation_prompt=True)
    both = vf.SingleTurnEnv(dataset=Dataset.from_list(SUMS), eval_dataset=Dataset.from_list(SUMS[:5]),
                            rubric=vf.Rubric(funcs=[exact]))
    t2 = task_of(both)
    held = {p.text for p in t2.split("test", 100)}
    kept = {p.text for p in t2.split("train", 100)}
    assert len(held) == 5 and len(kept) == len(SUMS) - 5 and not held & kept  # eval rows dropped from training


def test_data_task_names_an_installed_environment_module(tmp_path, monkeypatch):
    from grpo.config import load_config
    from grpo.data import task_from_config
    from grpo.errors import ConfigError

    (tmp_path / "grpo_test_sums_env.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n"
        "def load_environment(n=10):\n"
        "    ds = Dataset.from_list([{'question': f'{i}+1?', 'answer': str(i + 1)} for i in range(n)])\n"
        "    def exact(completion, answer, **kw):\n"
        "        return float(completion[-1].content.strip() == answer)\n"
        "    return vf.SingleTurnEnv(dataset=ds, rubric=vf.Rubric(funcs=[exact]))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["data.task=verifiers:grpo-test-sums-env", "data.task_options={n: 30}",
                             f"model.name={tmp_path}"])
    task = task_from_config(cfg, tokenizer=chat_tokenizer())
    assert isinstance(task, VerifiersTask) and task.name == "verifiers:grpo-test-sums-env"
    prompts = task.split("train", 100) + task.split("test", 100)
    assert len(prompts) == 30
    p = prompts[0]
    assert task.environment_factory()(p).step(p.answer).reward == 1.0
    with pytest.raises(ConfigError, match="built-in model"):
        task_from_config(load_config(None, ["data.task=verifiers:grpo-test-sums-env"]))


def test_group_rubrics_and_non_environments_are_refused():
    async def group_fn(completions, **kw):
        return [0.0] * len(completions)

    env = vf.SingleTurnEnv(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[group_fn]))
    with pytest.raises(ValueError, match="group-level"):
        VerifiersTask(env, tokenizer=chat_tokenizer())
    with pytest.raises(TypeError, match="verifiers Environment"):
        VerifiersTask(object())
