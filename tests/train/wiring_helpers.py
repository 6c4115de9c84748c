"""Helpers of the trainer-level wiring tests (test_wiring_*.py): a fixed rollout batch, a naive reference of one
update's gradient, and a spy on the optimizer that records what the trainer would apply.

The reference is written independently of `grpo.algo` and `grpo.models.forward`: each completion's per-token
log-probabilities come from a plain forward of the model over that row's own unpadded tokens
(prompt + completion), and the advantages, ratios, clipping, KL estimators, masks and aggregation are plain Python
loops over groups, rows and tokens, following the formulas of docs/math.md and DESIGN.md.

A test states its settings once as a `Setting`; `Setting.overrides()` turns the non-default fields into config
overrides for the Trainer, and `reference_grad` computes the gradient those settings define. Comparing the trainer's
gradient (recorded at `optimizer.step`, before the optimizer uses it) with the reference for the setting, and
checking that the reference for the default setting is far from it, makes every test fail when its setting is
ignored.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields, replace

import pytest
import torch

from helpers.precision import BF16_UNIT, bf16_compute

from grpo.types import Rollouts


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and on a shared machine torch's spinning worker threads cost ~30x
    (measured on 2 busy cores: 0.3 s vs 11 s of CPU for the same three steps). Imported by the test modules."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -------------------------------------------------------------------------------------------------- the precision

@dataclass(frozen=True)
class Precision:
    """What a wiring test's trainer computes in, and how close to the float32 reference its gradient must come.

    float32: the trainer and the reference compute the same function in float32 (only summation order differs).
    bf16: the trainer's forwards and backwards run bf16 products (model.compute_dtype=bfloat16 where the CPU has
    native bf16, bfloat16_emulated elsewhere: helpers/precision.py), the reference stays float32, so the gradient may
    differ by bf16's rounding carried through the model: BF16_GRAD_TOL. The default setting's gradient must stay
    twice that far from the reference, so a setting the trainer ignored still fails the test."""

    name: str
    compute: str  # model.compute_dtype
    tol: float  # the largest relative gradient difference ||got - want|| / ||want|| accepted
    apart: float  # the least relative distance between the setting's gradient and the default's
    edge_band: float = 0.0  # how far (relatively) every ratio must stay from a clip edge for the test to be posed
    entropy_band: float = 2e-5  # how far (nats) every token's entropy must stay from a top_entropy_quantile threshold

    def overrides(self) -> list[str]:
        return [f"model.compute_dtype={self.compute}"]


# the relative gradient error of bf16 compute on these models, measured at 0.3-1.8 BF16_UNIT over the wiring tests
# (a product rounds each operand and its result to 8 significant bits; a gradient carries several such roundings)
BF16_GRAD_TOL = 4 * BF16_UNIT
FLOAT32_WIRING = Precision("float32", "float32", tol=1e-4, apart=5e-2)


def wiring_precision(name: str) -> Precision:
    """"float32" or "bf16" (the `precision` fixture of conftest.py gives the wiring tests that matter both)."""
    if name == "float32":
        return FLOAT32_WIRING
    # bf16 moves a log-prob by about 1e-3 here, a ratio by twice that: one within BF16_UNIT / 2 of a clip edge could
    # be clipped on one side and not on the other, a different gradient by design (the test is then ill-posed)
    # bf16 moves a token's entropy by up to 0.006 nats here (measured against bf16 autocast), and the quantile
    # threshold as much: a token within 0.012 of it could be kept on one side and masked on the other
    return Precision("bf16", bf16_compute(), tol=BF16_GRAD_TOL, apart=2 * BF16_GRAD_TOL, edge_band=BF16_UNIT / 2,
                     entropy_band=0.012)


# -------------------------------------------------------------------------------------------------- the batch

# Completions of the fixed batch: (text, ended). ended=True appends EOS; ended=False with len(text) == T is a
# completion cut at max_new_tokens (truncated). Texts are unique so the reward can be a lookup table.
T = 6  # rollout.max_new_tokens of the wiring tests
GROUPS = [
    [("12", True), ("7 + 1", True), ("abcdef", False), ("9", True)],
    [("x = 4", True), ("42", True), ("1234", True), ("zzzzzz", False)],
]
REWARDS = {"12": 1.0, "7 + 1": 0.0, "abcdef": 0.5, "9": 0.0,
           "x = 4": 0.2, "42": 0.9, "1234": 0.7, "zzzzzz": 0.1}
# two more groups for dynamic sampling: one with equal rewards (dropped), one informative
FLAT_GROUP = [("aa", True), ("bb", True), ("cc", True), ("dd", True)]
EXTRA_GROUP = [("5", True), ("55", True), ("555", True), ("5555", True)]
REWARDS |= {"aa": 0.3, "bb": 0.3, "cc": 0.3, "dd": 0.3, "5": 0.0, "55": 1.0, "555": 0.25, "5555": 0.0}


def table_reward(prompts, completions, **columns):
    """The reward of each known completion (REWARDS)."""
    return [REWARDS[c] for c in completions]


table_reward.in_process = True
TABLE = [("table", table_reward, 1.0)]


def wiring_overrides(*extra: str) -> list[str]:
    """Overrides shared by the wiring tests: P=2, G=4, T=6, raw gradients (no clipping), one micro-batch."""
    return ["rollout.prompts_per_step=2", "rollout.group_size=4", f"rollout.max_new_tokens={T}",
            "optim.max_grad_norm=1e9", "optim.warmup_steps=0",
            "algo.tis_cap=null",  # the fixed batch was not sampled (its log-probs are 0): no engine drift to correct
            *extra]


class FixedSampler:
    """Stands in for `trainer.sampler`: each `generate` call returns the next list of groups of `batches` as
    Rollouts for the prompts it is given (one group per prompt), and keeps them in `calls`."""

    def __init__(self, tokenizer, batches: list[list[list[tuple[str, bool]]]], max_new_tokens: int = T):
        self.tok, self.batches, self.T = tokenizer, list(batches), max_new_tokens
        self.calls: list[Rollouts] = []

    def generate(self, prompts, n, *, generator=None, temperature=None) -> Rollouts:
        groups = self.batches[len(self.calls)]
        assert len(groups) == len(prompts) and all(len(g) == n for g in groups)
        tok, T = self.tok, self.T
        enc = [tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
        L = max(map(len, enc))
        prompt_ids = torch.full((len(enc), L), tok.pad_token_id)
        prompt_mask = torch.zeros((len(enc), L), dtype=torch.long)
        for i, ids in enumerate(enc):
            prompt_ids[i, L - len(ids):], prompt_mask[i, L - len(ids):] = torch.tensor(ids), 1
        rows = [c for g in groups for c in g]
        ids = torch.full((len(rows), T), tok.pad_token_id)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for i, (text, ended) in enumerate(rows):
            toks = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if ended else [])
            assert len(toks) <= T and (ended or len(toks) == T), text
            ids[i, :len(toks)], mask[i, :len(toks)] = torch.tensor(toks), 1
        out = Rollouts(prompts=list(prompts), group_size=n, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                       completion_ids=ids, completion_mask=mask, logp=torch.zeros((len(rows), T)),
                       truncated=torch.tensor([not e for _, e in rows]), texts=[t for t, _ in rows])
        self.calls.append(out)
        return out

    def sync_weights(self, model) -> None:
        """The RolloutEngine contract (rollout/engine.py): fixed rollouts follow no weights."""


@dataclass
class Row:
    """One completion of the batch as the reference sees it: unpadded prompt and completion token ids."""

    prompt: list[int]
    completion: list[int]  # the real tokens (EOS included when sampled)
    truncated: bool
    reward: float


def rows_of(rollouts: Rollouts) -> list[Row]:
    G = rollouts.group_size
    out = []
    for i in range(rollouts.num_completions):
        g = i // G
        prompt = rollouts.prompt_ids[g][rollouts.prompt_mask[g] == 1].tolist()
        completion = rollouts.completion_ids[i][rollouts.completion_mask[i] == 1].tolist()
        out.append(Row(prompt, completion, bool(rollouts.truncated[i]), REWARDS[rollouts.texts[i]]))
    return out


# -------------------------------------------------------------------------------------------------- the spy

class StepSpy:
    """A pre-hook on `optimizer.step`: before each step, records a copy of every gradient and parameter of `model`
    (by name), i.e. exactly what the optimizer is about to apply (after any gradient clipping)."""

    def __init__(self, optimizer, model):
        self.grads: list[dict[str, torch.Tensor]] = []
        self.params: list[dict[str, torch.Tensor]] = []
        self.metrics: dict[str, float] = {}  # fixed_step: the step's metrics
        named = dict(model.named_parameters())

        def spy(optimizer, args, kwargs):
            self.grads.append({k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                               for k, p in named.items()})
            self.params.append({k: p.detach().clone() for k, p in named.items()})

        optimizer.register_step_pre_hook(spy)


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([grads[k].reshape(-1).double() for k in sorted(grads)])


def rel(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over all parameters."""
    fa, fb = flat(a), flat(b)
    return float((fa - fb).norm() / fb.norm())


def assert_matches(got: dict, want: dict, default: dict, precision: Precision = FLOAT32_WIRING) -> None:
    """The trainer's gradient equals the reference for the setting, within `precision`'s tolerance, and the
    reference for the default setting is far from both (so the test would fail if the setting were ignored)."""
    tol, apart = precision.tol, precision.apart
    err, gap = rel(got, want), rel(default, want)
    assert gap > apart, f"the setting does not change the reference gradient enough to be tested ({gap:.2e})"
    assert err < tol, f"trainer gradient differs from the reference by {err:.2e} (the default's is {gap:.2e} away)"
    assert rel(got, default) > apart


@torch.no_grad()
def perturb_(model, scale: float, seed: int = 1) -> None:
    """Add Gaussian noise of std `scale` to every weight matrix of `model`, in place (a fixed seed)."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.ndim >= 2:
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


def load_params(model, params: dict[str, torch.Tensor]):
    """A copy of `model` holding `params` (named as model.named_parameters())."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for k, p in out.named_parameters():
            p.copy_(params[k])
    return out


# -------------------------------------------------------------------------------------------------- the reference

@dataclass(frozen=True)
class Setting:
    """The settings that shape one update, with the config's defaults; `overrides()` names the config keys."""

    advantage: str = "grpo"
    std: str = "population"
    scale: str = "group"
    eps: float = 1e-6
    aggregate: str = "seq_mean_token_mean"
    ratio_level: str = "token"
    policy_loss: str = "clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    epochs: int = 1
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    mask_truncated: bool = False
    top_entropy_quantile: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int = T

    KEYS = {"kl_coef": "kl.coef", "kl_estimator": "kl.estimator", "temperature": "rollout.temperature",
            "max_new_tokens": "rollout.max_new_tokens"}

    def overrides(self) -> list[str]:
        default = Setting()
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                out.append(f"{self.KEYS.get(f.name, 'algo.' + f.name)}={'null' if value is None else value}")
        return out

    def but(self, **changes) -> "Setting":
        return replace(self, **changes)


def naive_advantages(rewards: list[float], G: int, s: Setting) -> list[float]:
    """Group-relative advantages, one group at a time (population or sample std; group, batch or no scale)."""
    def std(values):
        m = sum(values) / len(values)
        ddof = 1 if s.std == "sample" else 0
        return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - ddof))

    out = []
    for g in range(0, len(rewards), G):
        r = rewards[g:g + G]
        mean = sum(r) / G
        if max(r) == min(r):
            out += [0.0] * G
        elif s.advantage == "dr_grpo":
            out += [x - mean for x in r]
        elif s.advantage == "rloo":
            out += [x - (sum(r) - x) / (G - 1) for x in r]
        else:
            denom = {"group": std(r) + s.eps, "batch": std(rewards) + s.eps, "none": 1.0}[s.scale]
            out += [(x - mean) / denom for x in r]
    return out


def row_logprobs(model, row: Row, temperature: float):
    """(logp (n,), entropy (n,)) of the row's completion tokens: one plain forward over prompt + completion."""
    ids = torch.tensor([row.prompt + row.completion])
    L, n = len(row.prompt), len(row.completion)
    logits = model(input_ids=ids).logits[0, L - 1:L - 1 + n].float() / temperature
    logsm = torch.log_softmax(logits, -1)
    logp = torch.stack([logsm[t, row.completion[t]] for t in range(n)]) if n else logits.new_zeros(0)
    entropy = -(logsm.exp() * logsm).sum(-1).detach()
    return logp, entropy


def quantile(values: list[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def kl_term(logp: torch.Tensor, ref: float, kind: str) -> torch.Tensor:
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    d = ref - logp
    return torch.exp(d) - d - 1


def reference_loss(model, rows: list[Row], s: Setting, *, G: int, old_model=None, ref_model=None,
                   adv: list | None = None, edge_band: float = 0.0, entropy_band: float = 2e-5) -> torch.Tensor:
    """The scalar loss of one update under setting `s`, by loops over rows and tokens.

    old_model: pi_old (None: the ratio's denominator is the current log-prob, detached: ratio 1).
    ref_model: pi_ref for the KL term.  adv: per-row floats or per-row lists of per-token floats (default: the
    group advantages of the rows' rewards under `s`). edge_band: assert that every ratio lies at least this far,
    relatively, from each clip edge (a bf16 trainer's ratio may fall on the other side of an edge that close);
    entropy_band: the same for token entropies and the top_entropy_quantile threshold, in nats.
    """
    if adv is None:
        adv = naive_advantages([r.reward for r in rows], G, s)
    per_row = []
    for row in rows:
        logp, entropy = row_logprobs(model, row, s.temperature)
        with torch.no_grad():
            old = row_logprobs(old_model, row, s.temperature)[0] if old_model is not None else logp.detach()
            ref = row_logprobs(ref_model, row, s.temperature)[0] if ref_model is not None else None
        present = not (s.mask_truncated and row.truncated)
        per_row.append((logp, entropy, old, ref, present))
    keep_all = None
    if s.top_entropy_quantile < 1.0:
        ents = [float(e) for logp, ent, _, _, present in per_row if present for e in ent]
        threshold = quantile(ents, 1.0 - s.top_entropy_quantile)
        assert min(abs(e - threshold) for e in ents) > entropy_band, "a token is near the threshold: ill-posed"
        keep_all = threshold
    N, num_tokens = len(rows), sum(len(r.completion) for r, x in zip(rows, per_row) if x[4])
    policy_sums, kl_sums, counts = [], [], []
    for i, (logp, entropy, old, ref, present) in enumerate(per_row):
        n = len(logp) if present else 0
        a_row = adv[i]
        seq_ratio = None
        if s.ratio_level == "sequence" and n:
            seq_ratio = torch.exp(sum(logp[t] - old[t] for t in range(n)) / n)
        p_sum, k_sum = logp.new_zeros(()), logp.new_zeros(())
        for t in range(n):
            a = a_row[t] if isinstance(a_row, list) else a_row
            if s.policy_loss == "cispo":
                w = min(max(math.exp(float(logp[t].detach() - old[t])), 1 - s.clip_low), 1 + s.clip_high)
                term = -w * a * logp[t]
            else:
                r = seq_ratio if seq_ratio is not None else torch.exp(logp[t] - old[t])
                edges = [1 - s.clip_low, 1 + s.clip_high] + ([s.dual_clip] if s.dual_clip is not None else [])
                near = min(abs(float(r) / e - 1) for e in edges)
                assert near >= edge_band, f"a ratio {float(r):.4f} lies on a clip edge: the test is ill-posed"
                obj = torch.minimum(r * a, r.clamp(1 - s.clip_low, 1 + s.clip_high) * a)
                if s.dual_clip is not None and a < 0:
                    obj = torch.maximum(obj, torch.tensor(s.dual_clip * a))
                term = -obj
            if keep_all is not None and not float(entropy[t]) >= keep_all:
                term = term * 0.0
            p_sum = p_sum + term
            if ref is not None and s.kl_coef > 0:
                k_sum = k_sum + kl_term(logp[t], float(ref[t]), s.kl_estimator)
        policy_sums.append(p_sum)
        kl_sums.append(k_sum)
        counts.append(n)

    def agg(sums):
        if s.aggregate == "token_mean":
            return sum(sums) / max(num_tokens, 1)
        if s.aggregate == "seq_sum_norm":
            return sum(sums) / (N * s.max_new_tokens)
        return sum(x / max(n, 1) for x, n in zip(sums, counts)) / N

    return agg(policy_sums) + s.kl_coef * agg(kl_sums)


def reference_grad(model, rows: list[Row], s: Setting, *, G: int, **kwargs) -> dict[str, torch.Tensor]:
    """The gradient of reference_loss (its keyword arguments: `kwargs`) with respect to the parameters of a copy of
    `model`, by name."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    reference_loss(model, rows, s, G=G, **kwargs).backward()
    return {k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for k, p in model.named_parameters()}


def fixed_step(make_trainer, s: Setting, *extra: str, batches=None, before=None,
               precision: Precision = FLOAT32_WIRING):
    """A trainer with setting `s` (plus `extra` overrides) computing in `precision`, whose sampler returns `batches`
    (default: GROUPS once), run for one step with the optimizer spied on (spy.metrics: the step's metrics).
    `before(trainer)` runs first (e.g. to move the policy away from the reference). Returns (trainer, spy, rollouts of
    each generate call, the policy as it was before the step)."""
    trainer = make_trainer(*wiring_overrides(*s.overrides(), *precision.overrides(), *extra), reward_functions=TABLE)
    if before is not None:
        before(trainer)
    sampler = FixedSampler(trainer.tokenizer, batches or [GROUPS])
    trainer.sampler = sampler
    initial = copy.deepcopy(trainer.policy)
    spy = StepSpy(trainer.optimizer, trainer.policy)
    spy.metrics = trainer.step().metrics
    return trainer, spy, sampler.calls, initial
