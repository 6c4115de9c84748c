"""Forward passes shared by rollout, training and evaluation.

Sequences are left-padded prompts followed by right-padded completions. Hugging Face models derive
positions from the cache length, not from the attention mask, so with left padding the position ids are
passed explicitly (cumulative sum of the mask), which keeps a prompt's positions identical whatever its
padding.

`completion_logits` computes each prompt once per group of G completions (shared prefix):

    prompts minus their last token  (P, L-1)  -> one forward, KV cache of P rows (with gradients)
    repeat each cache row G times             -> N = P*G rows; autograd sums the G gradients back
    [last prompt token, completion[:T-1]]     (N, T) -> one forward on top of that cache -> (N, T, V)

so prompt tokens cost once per group in the forward and in the backward pass, and the output head runs
only at the T positions that predict completion tokens. The result equals the unshared computation over
the N full sequences (tests/rollout/test_shared_prefix.py checks logits and gradients in fp32).

`completion_token_logprobs` is what training uses: log p(completion token) (and the entropy) without the
(N, T, V) logits. For a model whose output head is a plain linear layer (`plain_output_head`), the head's forward
is replaced, for the one forward that covers the completion positions, by `grpo.algo.hidden_token_logprobs`
on the final hidden states (chunks of rows, logits recomputed in the backward pass). The replacement runs inside
the head module's own call, where DDP, FSDP2 (which gathers the head's weight around that call) and peft expect
the weight to be used. Whether a model's head is plain is decided by evidence, once per model (`head_probe`): on an
8-token probe its own forward's logits must equal its final hidden states x its head's weight (within PROBE_TOLERANCE
of the logits' scale), and what its head returns must come out of the forward unchanged. Any other head (a softcap or
scale after it, set in the config or seen by the probe; a bias, a LoRA-wrapped or quantised head, forward hooks on the
head) takes the full-logits path, with one log line per model; the check's result is logged once either way.
"""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger("grpo.models")

# config fields that post-process the logits in some architectures; set to anything but None/1, not plain. Refused by
# name rather than left to the probe: a softcap c*tanh(x/c) is x where |x| << c, as a probe's logits may be
_HEAD_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale",
                        "lm_head_multiplier")
DEFAULT_CHUNK_TOKENS = 256
PROBE_TOKENS = 8  # the length of the sequence a lean path is checked on (head_probe; rollout/decode.py decoder_probe)


def probe_tolerance(dtype: torch.dtype) -> float:
    """The largest |difference| a lean path's logits may have from the model's own forward on a probe, as a fraction
    of the probe logits' scale max(1, max |logit|): 1e-4 for float32/float64 weights (the same products summed in
    another order differ by about 1e-6 of the scale; a wrong formula is off by O(1)), 2^-4 for 16-bit ones (a few
    roundings of 8 significant bits through the layers)."""
    return 1e-4 if torch.finfo(dtype).bits >= 32 else 2.0 ** -4


def logits_difference(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> tuple[float, float, float]:
    """(max |got - want|, the scale max(1, max |want|), probe_tolerance(dtype) x the scale) of two logits tensors of
    the same shape, for weights of `dtype`; the difference is inf where either is not finite."""
    diff = (got.double() - want.double()).abs()
    worst = float(diff.max()) if bool(torch.isfinite(diff).all()) else float("inf")
    scale = max(1.0, float(want.double().abs().max()))
    return worst, scale, probe_tolerance(dtype) * scale


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 0/1 mask -> (B, S) positions 0, 1, ... over the real tokens (0 at left padding)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_kwargs(model, cache) -> dict:
    """The keyword for passing a KV cache: `cache` in recent transformers, `past_key_values` before."""
    name = getattr(model, "_grpo_cache_kw", None)
    if name is None:
        import inspect

        name, inner = "past_key_values", model
        for _ in range(4):  # look through wrappers that forward **kwargs (DDP's .module, PEFT's base model)
            params = inspect.signature(inner.forward).parameters
            if "cache" in params or "past_key_values" in params:
                name = "cache" if "cache" in params else "past_key_values"
                break
            inner = getattr(inner, "module", None) or getattr(inner, "base_model", None)
            if inner is None or not hasattr(inner, "forward"):
                break
        model._grpo_cache_kw = name
    return {name: cache}


def output_cache(out):
    """The KV cache returned by a forward pass (attribute name differs across transformers versions)."""
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None)


def _shareable(cache) -> bool:
    """True when every layer of `cache` is a growing (concatenating) cache layer that repeats differentiably: a
    plain one, or a sliding-window one (Gemma 2/3, Mistral, Qwen2 with a window), which keeps the prompt's last
    window - 1 positions, exactly the keys a completion's queries can still see, and returns them with the new ones
    while the mask (its get_mask_sizes offset) hides what lies outside each query's window; anything else (quantised,
    static or offloaded layers, no cache) takes the unshared path. (transformers maps Llama 4's chunked attention to
    the sliding layer too.) A window of 1 is refused: the layer's `keys[-(W - 1):]` then keeps every position while
    its mask sizes assume none. tests/rollout/test_shared_prefix.py compares both paths with windows shorter than the
    prompt, between the prompt and the whole sequence, and longer than it."""
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return False
    try:
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    except ImportError:  # older transformers: legacy caches; stay on the simple path
        return False
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer or (type(layer) is DynamicSlidingWindowLayer
                                                                 and layer.sliding_window > 1) for layer in layers)


def config_shares_prompt(config) -> bool:
    """Whether the KV cache a model of `config` builds can share a prompt across its group (`_shareable`, read from
    the cache layers the config makes, before any forward): the memory plan's question (train/memory_plan.py)."""
    try:
        from transformers.cache_utils import DynamicCache

        return _shareable(DynamicCache(config=config))
    except Exception:  # noqa: BLE001 - a config transformers' DynamicCache cannot read: the plain path's cost
        return False


def shares_prompt(model, training: bool | None = None) -> bool:
    """Whether `completion_logits` computes each prompt once for its group on `model`: its cache layers shareable
    and, in a training forward (train mode, gradients on; `training`: None = as the model and autograd are now),
    no gradient checkpointing, whose layers keep no cache. The update packs its micro-batches by the cost this
    implies (train/update.py PolicyBatch.group_chunks), so both must agree."""
    base = _base_model(model)  # DDP, torch.compile and peft wrappers: the transformers model's own settings
    if training is None:
        training = model.training and torch.is_grad_enabled()
    if training and _checkpointing(base):
        return False
    config = getattr(base, "config", None)
    return config is not None and config_shares_prompt(config)


def _checkpointing(model) -> bool:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # the name changed in transformers 5
        if hasattr(type(model), name) or hasattr(model, name):
            return bool(getattr(model, name))
    return False


def unshared_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int,
                               head=None):
    """The straightforward computation: every prompt repeated G times, one forward over N full sequences.
    head: see `completion_logits`."""
    ids = torch.cat([prompt_ids.repeat_interleave(group_size, 0), completion_ids], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), completion_mask.to(prompt_mask.dtype)], dim=1)
    T = completion_ids.shape[1]
    fn = (lambda hidden: head(hidden[:, :-1])) if head is not None else None  # the head sees T+1 positions
    with replaced_head(model, fn):
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                    use_cache=False, logits_to_keep=T + 1)
    return out.logits if head is not None else out.logits[:, :-1]


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int,
                      head=None):
    """Logits predicting each completion token. Returns (N, T, V); [:, t] predicts completion token t.
    head: None, or a function of the final hidden states (N, T, H) that replaces the model's plain output head
    (`plain_output_head`) for the forward over the completion positions; its output is returned instead.

    prompt_ids/prompt_mask: (P, L) left-padded; completion_ids/completion_mask: (N, T) right-padded with
    N = P*G (row i belongs to prompt i // G). Each prompt is computed once for its G completions (see the
    module docstring); models or caches that cannot share fall back to `unshared_completion_logits`.
    """
    P, L = prompt_ids.shape
    N, T = completion_ids.shape
    G = group_size
    if N != P * G:
        raise ValueError(f"completion rows ({N}) must be prompts ({P}) x group_size ({G})")
    if G == 1 or L == 1 or not shares_prompt(model):  # nothing to share; a cache that cannot; checkpointed layers
        return unshared_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, G, head)
    prompt_mask = prompt_mask.long()
    positions = position_ids_from_mask(prompt_mask)
    out = model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1], position_ids=positions[:, :-1],
                use_cache=True, logits_to_keep=1)
    cache = output_cache(out)
    if not _shareable(cache):  # the cache the forward built is not the one its config promised
        return unshared_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, G, head)
    cache.batch_repeat_interleave(G)  # keys = keys.repeat_interleave(G): autograd sums the G gradients
    ids = torch.cat([prompt_ids[:, -1:].repeat_interleave(G, 0), completion_ids[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask[:, :-1].long()], dim=1)
    start = positions[:, -1:]  # position of the last prompt token (the last column is always a real token)
    pos = (start + torch.arange(T, device=start.device)).repeat_interleave(G, 0)
    with replaced_head(model, head):
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    **cache_kwargs(model, cache))
    return out.logits


# ------------------------------------------------------------------ log-probs without the (N, T, V) logits
def _base_model(model):
    """The transformers model under DDP (.module), torch.compile (._orig_mod) and peft (.get_base_model())."""
    for _ in range(4):
        inner = getattr(model, "module", None) if isinstance(model, torch.nn.parallel.DistributedDataParallel) \
            else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _head_problem(model) -> tuple[torch.nn.Module | None, str | None]:
    """(the output head, None) when it is a plain bias-free linear layer whose output the model returns unchanged;
    else (None, why not)."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    for name in _HEAD_POSTPROCESSING:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return None, f"its config sets {name}={getattr(config, name)!r} (logits post-processed)"
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return None, f"its output head is a {type(head).__name__}, not a torch.nn.Linear"
    if head.bias is not None:
        return None, "its output head has a bias"
    if "forward" in vars(head):  # e.g. accelerate's offload hooks wrap forward on the instance
        return None, "its output head's forward is already replaced on the module (hooks such as accelerate's)"
    if head._forward_hooks:  # a hook may rewrite the logits (e.g. ban a token): it must see them
        return None, "its output head has forward hooks (they would not see logits)"
    w = head.weight
    if not w.is_floating_point() or tuple(w.shape) != (head.out_features, head.in_features):
        return None, f"its output head's weight is {w.dtype} {tuple(w.shape)} (quantised or packed)"
    verdict = probe_once(base, "_grpo_head_probe", lambda: head_probe(base, head), head_note)
    return (head, None) if verdict[0] else (None, verdict[1])


def probe_once(base, attr: str, probe, note) -> tuple[bool, str]:
    """The (agrees, what was seen) of `probe()` for the model `base`, gathered once per model and kept on it as
    `attr` (a lean path's evidence); on the first call `note(base)` is logged when it agrees."""
    verdict = vars(base).get(attr)
    if verdict is None:
        verdict = probe()
        object.__setattr__(base, attr, verdict)
        if verdict[0]:
            log.info(note(base))
    return verdict


def head_note(model) -> str | None:
    """The line that says the lean head was checked and passed, with its evidence; None before the check or when it
    failed (then plain_output_head's warning says why)."""
    verdict = vars(_base_model(model)).get("_grpo_head_probe")
    if not verdict or not verdict[0]:
        return None
    return f"lean head checked: {verdict[1]}; log-probs come from the final hidden states, in chunks"


@torch.no_grad()
def head_probe(base, head) -> tuple[bool, str]:
    """(agrees, what was seen): whether `base`'s forward on a PROBE_TOKENS-token sequence returns its final hidden
    states h (1, S, H) x its head's weight W (V, H), h @ W^T, within probe_tolerance of the logits' scale, and
    returns what its head returns unchanged (a (1, S) tensor of values from -1000 to 1000 in its place comes out as
    it went in: no softcap, scale or bias after the head). Both are read inside the head's own call. An exception
    is a disagreement naming it (the model then keeps the full-logits path)."""
    import torch.nn.functional as F

    seen: dict = {}

    def recorded(hidden):  # the head's call: the lean product beside the head's own output
        seen["lean"] = hidden.float() @ head.weight.float().t()
        return F.linear(hidden, head.weight)

    def marked(hidden):
        seen["marker"] = torch.linspace(-1e3, 1e3, hidden.shape[:-1].numel(), device=hidden.device,
                                        dtype=hidden.dtype).view(hidden.shape[:-1])
        return seen["marker"]

    try:
        vocab = getattr(base.get_input_embeddings(), "num_embeddings", None) or head.out_features
        ids = torch.randint(0, vocab, (1, PROBE_TOKENS), generator=torch.Generator().manual_seed(0))
        ids = ids.to(head.weight.device)
        with torch.autocast(ids.device.type, enabled=False):
            logits = _with_head(base, head, recorded, ids)
            marker_out = _with_head(base, head, marked, ids)
    except Exception as e:  # any failure keeps the full-logits path: named, never raised
        return False, f"its forward with the head's output replaced raised {type(e).__name__}: {e}"
    if "lean" not in seen:
        return False, "its forward does not call its output head"
    if logits is None or logits.shape != seen["lean"].shape:
        return False, "its forward does not return its head's logits"
    worst, scale, tol = logits_difference(seen["lean"], logits, head.weight.dtype)
    if not worst <= tol:
        return False, (f"its logits on a probe of {PROBE_TOKENS} tokens differ from its final hidden states x its "
                       f"head's weight by {worst:.3g} (tolerance {tol:.3g}): it post-processes them")
    if marker_out is None or marker_out.shape != seen["marker"].shape or not torch.equal(
            marker_out.float(), seen["marker"].float()):
        return False, "its forward changes what its output head returns (a softcap, scale or bias after the head)"
    return True, (f"on a probe of {PROBE_TOKENS} tokens its logits are its final hidden states x its head's weight "
                  f"(max |difference| {worst:.2g}, tolerance {tol:.2g}: {probe_tolerance(head.weight.dtype):g} of "
                  f"the logits' scale {scale:.3g}) and it returns its head's output unchanged")


def _with_head(base, head, fn, ids):
    """base's logits for `ids` with the head's forward replaced by `fn` (the model in eval mode for the call)."""
    was_training = base.training
    head.forward = fn
    base.eval()
    try:
        return getattr(base(input_ids=ids, use_cache=False), "logits", None)
    finally:
        del head.forward
        base.train(was_training)


def plain_output_head(model) -> torch.nn.Module | None:
    """The model's output head when log-probs can be computed from hidden states and its weight (a plain bias-free
    linear layer without hooks, no logit post-processing in its config, and `head_probe`'s evidence, gathered on the
    first call), else None (with one log line per model saying why the full-logits path is taken)."""
    head, why = _head_problem(model)
    if head is None and not getattr(model, "_grpo_head_logged", False):
        log.warning("log-probs take the full (N, T, V) logits path for this model: %s", why)
        object.__setattr__(model, "_grpo_head_logged", True)
    return head


@contextlib.contextmanager
def replaced_head(model, fn):
    """Within the block, the output head's forward is `fn(hidden) -> tensor` (the module's hooks still run, so
    FSDP2 gathers its weight around it). fn None: nothing replaced."""
    head = plain_output_head(model) if fn is not None else None
    if head is None:
        yield
        return
    head.forward = fn  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        del head.forward


@contextlib.contextmanager
def lean_head_gradients(model, enabled: bool):
    """Within the block (the forward; the backward may come after it), backward() builds no (V, H) temporary for the
    vocabulary-sized gradients. The output head's goes straight into its weight's .grad
    (`hidden_token_logprobs(weight_grad_in_place=True)`, which the caller passes when this yields True), and the
    input embedding gives the sparse gradient of the rows it looked up, which autograd adds into its dense .grad in
    place (made here as zeros when None, so .grad stays dense for the optimizer). Plain autograd builds a dense
    (V, H) tensor per embedding lookup (the prompt's and the completions' in a shared-prefix forward) and one for
    the head, each then added to .grad: up to three beside .grad with tied weights, 1.6 GiB at 0.5B.
    Changes nothing unless `enabled` (one process: DDP's and FSDP's hooks must see every gradient); the head part
    needs a plain head (`plain_output_head`), each part a trainable leaf tensor. Yields whether the head part applies.
    A tensor hook on the embedding's weight sees the sparse gradient of the lookup, one on the head's sees none.
    """
    head = plain_output_head(model) if enabled else None
    head_applies = _trainable_leaf(getattr(head, "weight", None))
    embedding = model.get_input_embeddings() if enabled and hasattr(model, "get_input_embeddings") else None
    sparse = (isinstance(embedding, torch.nn.Embedding) and _trainable_leaf(embedding.weight)
              and not embedding.sparse)
    if sparse:
        if embedding.weight.grad is None:
            embedding.weight.grad = torch.zeros_like(embedding.weight)
        embedding.sparse = True
    try:
        yield head_applies
    finally:
        if sparse:
            embedding.sparse = False


def _trainable_leaf(weight) -> bool:
    """A parameter that takes its gradient in .grad as a plain tensor (not FSDP's DTensor)."""
    return (isinstance(weight, torch.Tensor) and weight.requires_grad and weight.is_leaf
            and type(weight.data) is torch.Tensor)


def completion_token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int, *,
                              temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_TOKENS,
                              with_entropy: bool = False, forward_fn=None,
                              head_grad_in_place: bool = False):
    """(logp (N, T), entropy (N, T) or None) of the completion tokens; logp differentiable, entropy not.

    Shapes as `completion_logits`. forward_fn: `completion_logits` (default) or `unshared_completion_logits`; it
    gets `head=` (the chunked log-prob computation on the hidden states) for a plain head, or computes the full
    logits otherwise (then `token_logprobs` / `entropy_from_logits`, as before). head_grad_in_place: inside
    `lean_head_gradients` when it yielded True.
    """
    from grpo.algo import entropy_from_logits, hidden_token_logprobs, token_logprobs
    from grpo.models.compute import head_products

    forward_fn = forward_fn or completion_logits
    head = plain_output_head(model)
    if head is None:
        logits = forward_fn(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size)
        logp = token_logprobs(logits, completion_ids, temperature=temperature)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach(), temperature=temperature)
        return logp, entropy
    box = {}
    product_dtype, emulated = head_products()  # bf16 compute (models/compute.py): the head's products in bf16

    def head_fn(hidden):  # (N, T, H) final hidden states -> (N, T) log-probs; runs inside the head's call
        if hidden.dtype != head.weight.dtype and product_dtype is not None:  # a bf16 stream under autocast
            hidden = hidden.to(head.weight.dtype)
        logp, box["entropy"] = hidden_token_logprobs(hidden, head.weight, completion_ids, temperature=temperature,
                                                     chunk_size=chunk_size, with_entropy=with_entropy,
                                                     weight_grad_in_place=head_grad_in_place,
                                                     product_dtype=product_dtype, emulated=emulated)
        return logp

    logp = forward_fn(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size, head=head_fn)
    return logp, box.get("entropy")
