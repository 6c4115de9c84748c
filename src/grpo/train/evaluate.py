"""Held-out evaluation: greedy pass@1 on the task's test split (problems never seen in training), and pass@k from
n sampled completions per problem with the Codex paper's unbiased estimator (`grpo eval --k K`).

The held-out pool is cut in two (split_held_out): test problems, the first eval.n, measured before and after
training and reported; validation problems, the next eval.val_n, evaluated during training and used to choose
checkpoints/best. Nothing is ever chosen on the test problems."""

from __future__ import annotations

from pathlib import Path

import torch

from grpo.rollout import Sampler


@torch.no_grad()
def evaluate_model(model, tokenizer, task, prompts, *, batch_size: int = 250, max_new_tokens: int = 24,
                   max_prompt_tokens: int | None = None, progress=None, max_turns: int = 4,
                   max_tokens: int | None = None, step_workers: int | None = None, compute: str = "weights",
                   stop: tuple[str, ...] = ()) -> dict:
    """{'accuracy': float, 'n': int, 'correct': list[bool], 'completions': list[str]} under greedy decoding.
    `progress(done, total)` is called after each batch (grpo.tracking.progress.Phase.update).
    A task with an environment (grpo.train.episodes) is evaluated on greedy episodes (run_episodes' limits
    max_turns, max_tokens, step_workers: cfg.env's, as grpo.train.episodes.env_limits gives them); each is judged
    by its final policy turn, or as a whole by a task with `is_correct_episode`, and the result adds
    'tool_use_frac' (episodes that called a tool) and 'episodes' (their records). compute: what the forwards compute
    in (models/compute.py; a run evaluates as its sampler samples); stop: rollout.stop (a completion ends at a stop
    string and is judged on the text before it, as in training)."""
    from grpo.rollout.episodes import run_episodes
    from grpo.train.episodes import task_environment

    sampler = Sampler(model, tokenizer, max_new_tokens=max_new_tokens, temperature=0.0,
                      max_prompt_tokens=max_prompt_tokens, compute=compute, stop=stop)
    env = task_environment(task, tokenizer)
    completions: list[str] = []
    episodes: list[dict] = []
    for i in range(0, len(prompts), batch_size):
        r = run_episodes(sampler, prompts[i:i + batch_size], 1, env, max_turns=max_turns, max_tokens=max_tokens,
                         step_workers=step_workers)
        completions += r.texts
        episodes += r.episodes or []
        if progress is not None:
            progress(len(completions), len(prompts))
    correct = _judge(task, prompts, completions, episodes or None)
    out = {"accuracy": sum(correct) / max(len(correct), 1), "n": len(correct), "correct": correct,
           "completions": completions}
    if env is not None:
        out |= {"tool_use_frac": sum(e["tool_calls"] > 0 for e in episodes) / max(len(episodes), 1),
                "episodes": episodes}
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of the Codex paper (Chen et al. 2021, eq. 1) for one problem:
    n samples of which c are correct -> 1 - C(n-c, k) / C(n, k), the chance that k samples drawn without replacement
    from the n include a correct one. Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) (no huge binomials). n >= k >= 1."""
    if not (1 <= k <= n) or not (0 <= c <= n):
        raise ValueError(f"pass_at_k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _judge(task, prompts, completions, episodes=None) -> list[bool]:
    """The task's verdict on each completion. A task that judges whole episodes (`is_correct_episode(prompt,
    record)`, e.g. a verifiers environment whose rubric reads the transcript) gets each episode's record, not only
    its final turn; `is_correct_batch` (e.g. the code task: programs run concurrently in the sandbox) judges the
    batch at once; else `is_correct` one by one."""
    if episodes is not None and hasattr(task, "is_correct_episode"):
        return [bool(task.is_correct_episode(p, e)) for p, e in zip(prompts, episodes, strict=True)]
    if hasattr(task, "is_correct_batch"):
        return [bool(x) for x in task.is_correct_batch(prompts, completions)]
    return [bool(task.is_correct(p, c)) for p, c in zip(prompts, completions)]


@torch.no_grad()
def sample_correct(model, tokenizer, task, prompts, *, n: int, temperature: float, top_p: float = 1.0,
                   max_new_tokens: int = 24, max_prompt_tokens: int | None = None, batch_size: int = 250,
                   seed: int = 0, max_turns: int = 4, max_tokens: int | None = None,
                   step_workers: int | None = None, compute: str = "weights", stop: tuple[str, ...] = ()) -> list[dict]:
    """n sampled completions per prompt at `temperature`, each judged by the task: [{uid, completions (n,), correct
    (n,)}] in prompt order. Each prompt's samples come from its own generator seeded by (seed, its index), so the
    result does not depend on batch_size."""
    sampler = Sampler(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                      max_prompt_tokens=max_prompt_tokens, compute=compute, stop=stop)
    from grpo.rollout.episodes import run_episodes
    from grpo.train.episodes import task_environment

    device = next(model.parameters()).device
    env = task_environment(task, tokenizer)
    out: list[dict] = []
    per_batch = max(1, batch_size // n)
    for i in range(0, len(prompts), per_batch):
        chunk = prompts[i:i + per_batch]
        gens = [torch.Generator(device=device).manual_seed(seed * 1_000_003 + i + j) for j in range(len(chunk))]
        r = run_episodes(sampler, chunk, n, env, generator=gens, max_turns=max_turns, max_tokens=max_tokens,
                         step_workers=step_workers)  # a task with tools: whole episodes, judged by their final
        texts = r.texts  # policy turn (or as a whole: is_correct_episode)
        correct = _judge(task, [p for p in chunk for _ in range(n)], texts, r.episodes)
        for j, p in enumerate(chunk):
            out.append({"uid": p.uid, "completions": texts[j * n:(j + 1) * n], "correct": correct[j * n:(j + 1) * n]})
    return out


def pass_at_k_report(samples: list[dict], ks: list[int]) -> dict[str, float]:
    """{'pass@k': mean over problems of pass_at_k(n, c, k)} for each k <= n (n: samples per problem)."""
    out = {}
    for k in ks:
        vals = [pass_at_k(len(s["correct"]), sum(s["correct"]), k) for s in samples]
        out[f"pass@{k}"] = sum(vals) / max(len(vals), 1)
    return out


def evaluate_problems(model, tokenizer, task, prompts, *, batch_size: int, max_new_tokens: int,
                      max_prompt_tokens: int | None, k: int | None = None, samples: int | None = None,
                      temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, max_turns: int = 4,
                      max_tokens: int | None = None, step_workers: int | None = None,
                      progress=None, compute: str = "weights", stop: tuple[str, ...] = ()) -> tuple[dict, list[dict]]:
    """`grpo eval`: greedy accuracy, and with k: pass@1..pass@k from `samples` (default k) sampled completions per
    problem. Returns (the JSON summary, one record per problem: uid, prompt, answer, greedy completion and verdict,
    and with k the sampled completions, their verdicts and c = how many are correct). `progress(done, total)` after
    each greedy batch. compute: what the forwards compute in (models/compute.py); stop: rollout.stop."""
    limits = {"max_turns": max_turns, "max_tokens": max_tokens, "step_workers": step_workers,  # cfg.env's
              "compute": compute, "stop": stop}
    greedy = evaluate_model(model, tokenizer, task, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                            max_prompt_tokens=max_prompt_tokens, progress=progress, **limits)
    summary = {"accuracy": greedy["accuracy"], "n": greedy["n"]}
    if "tool_use_frac" in greedy:
        summary["tool_use_frac"] = greedy["tool_use_frac"]
    rows = [{"uid": p.uid, "prompt": p.text, "answer": p.answer, "greedy": c, "greedy_correct": ok}
            for p, c, ok in zip(prompts, greedy["completions"], greedy["correct"])]
    for row, episode in zip(rows, greedy.get("episodes", [])):
        row["greedy_episode"] = episode
    if k is None:
        return summary, rows
    n = samples or k
    if not 1 <= k <= n:
        raise ValueError(f"--k must be between 1 and the number of samples per problem ({n}), got {k}")
    sampled = sample_correct(model, tokenizer, task, prompts, n=n, temperature=temperature, top_p=top_p,
                             max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                             batch_size=batch_size, seed=seed, **limits)
    ks = sorted({1, k} | {2 ** i for i in range(1, k.bit_length()) if 2 ** i < k})
    summary |= {"k": k, "samples": n, "temperature": temperature, **pass_at_k_report(sampled, ks)}
    for row, s in zip(rows, sampled, strict=True):
        row |= {"samples": s["completions"], "samples_correct": s["correct"], "c": sum(s["correct"])}
    return summary, rows


def heldout_accuracy(cfg, model_dir: Path, console=None) -> dict:
    """Greedy pass@1 of the model in `model_dir` on the first eval.n held-out problems of cfg's built-in task,
    with the settings a `grpo train` run of this config evaluates with."""
    from transformers import AutoModelForCausalLM

    from grpo.data import get_task
    from grpo.models.loading import load_tokenizer
    from grpo.tracking.progress import Phase
    from grpo.train.episodes import env_limits

    task = get_task(cfg.data.task, difficulty=cfg.data.difficulty)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    prompts = test_problems(task, cfg.eval.n, cfg.eval.val_n)
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    with Phase("evaluating", len(prompts), "problems", console=console) as ph:
        res = evaluate_model(model, tokenizer, task, prompts, batch_size=cfg.eval.batch_size, max_new_tokens=max_new,
                             max_prompt_tokens=cfg.data.max_prompt_tokens, progress=ph.update,
                             stop=tuple(cfg.rollout.stop), **env_limits(cfg))
    out = {"task": cfg.data.task, "difficulty": cfg.data.difficulty, "n": res["n"], "accuracy": res["accuracy"],
           "max_new_tokens": max_new, "batch_size": cfg.eval.batch_size, "metric": "greedy pass@1, float32, CPU"}
    if "tool_use_frac" in res:  # a task with tools: the share of greedy episodes that called one
        out["tool_use_frac"] = res["tool_use_frac"]
    return out


def split_held_out(pool: list, n: int, val_n: int) -> tuple[list, list]:
    """(test, validation) from the task's held-out pool (its "test" split, in its fixed order).

    test = pool[:n] and validation = pool[n:n + val_n] (fewer when the pool ends first). A pool of at most n
    problems (a short data file) keeps min(val_n, K // 2) of its K problems for validation, taken from its end, and
    tests on the rest. `grpo eval` of a run takes its test problems with the same rule (test_problems)."""
    if len(pool) > n or not val_n:
        return pool[:n], pool[n:n + val_n]
    keep = min(val_n, len(pool) // 2)
    return pool[:len(pool) - keep], pool[len(pool) - keep:]


def held_out_pool(task, n: int, val_n: int) -> list:
    """The first n + val_n problems of the task's held-out split, or as many as its pool has past the first n: a
    task whose pool is smaller and says so (the built-in tasks and reasoning-gym raise rather than return fewer)
    is asked for the most it can give (a bisection between n and n + val_n)."""
    try:
        return task.split("test", n + val_n)
    except ValueError:  # ConfigError is one: eval.n + eval.val_n past the pool
        if not val_n:
            raise
    lo, hi = n, n + val_n - 1  # split(lo) must work (else its error is the user's: eval.n past the pool)
    pool = task.split("test", lo)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            pool, lo = task.split("test", mid), mid
        except ValueError:
            hi = mid - 1
    return task.split("test", lo) if len(pool) != lo else pool


def test_problems(task, n: int, val_n: int) -> list:
    """The test problems of a run with eval.n = n and eval.val_n = val_n (split_held_out of the task's pool)."""
    return split_held_out(held_out_pool(task, n, val_n), n, val_n)[0]
