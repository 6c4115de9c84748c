"""KV caches for decoding G samples per prompt (inference only).

After the P prompts are prefilled once, the cache must serve N = P*G decoding rows. Two layouts:

GroupedPrefixLayer (with LeanDecoder: a model whose decoder layers it can run and whose probe agrees, `decoder_probe`)
    the prompt keys/values stay as they are, (P, H, L, D), one copy per prompt; the generated tokens' keys/values
    go into a preallocated time-major (T, N, H, D) buffer, written in place. The scores against the prompt come from one
    batched matmul per prompt ((P, H, G, D) @ (P, H, D, L): the G rows of a prompt are G queries against its
    single copy), the scores against each row's own generated tokens from a per-row matmul; one softmax over
    both, and the same split for the values. The prompt is neither recomputed nor copied G times, and a
    decode step reads it once per group. A sliding-window layer (Gemma 2/3, Mistral: the model's own cache made it a
    DynamicSlidingWindowLayer, which keeps the prompt's last window - 1 positions) attends, as the model's mask
    does, to the keys less than `window` positions before the query (positions counted over the padded sequence).

BufferedLayer (any other model whose cache layers are plain DynamicLayers; decoding through `model(...)`)
    the prompt keys/values are copied G times into a (N, H, L+T, D) buffer with room for the T new tokens,
    written in place; attention is the model's own.

Either way a step appends in place instead of concatenating the whole cache (transformers' DynamicLayer
copies it every token). Finished rows leave with `Cache.batch_select_indices` like with any cache.
"""

from __future__ import annotations

import importlib
import inspect
import logging

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from grpo.models.forward import (PROBE_TOKENS, head_note, logits_difference, output_cache, plain_output_head,
                                 position_ids_from_mask, probe_once, probe_tolerance)

log = logging.getLogger("grpo.rollout")
# config fields whose attention or logits LeanDecoder does not compute: refused by name (a probe's small scores and
# logits could miss a softcap, c*tanh(x/c) being x where |x| << c)
_UNSUPPORTED_FIELDS = ("attn_logit_softcapping", "final_logit_softcapping", "logit_scale", "logits_scaling")
_LAYER_TYPES = {"full_attention", "sliding_attention"}  # of config.layer_types: the layers LeanDecoder attends as


def _buffer(x: torch.Tensor, repeats: int, capacity: int) -> torch.Tensor:
    """(B, H, S, D) -> (B*repeats, H, S+capacity, D) buffer whose first S positions hold x, rows repeated."""
    B, H, S, D = x.shape
    buf = x.new_empty((B, repeats, H, S + capacity, D))
    buf[:, :, :, :S] = x[:, None]
    return buf.view(B * repeats, H, S + capacity, D)


class BufferedLayer(DynamicLayer):
    """A prefilled DynamicLayer of P rows, each repeated `repeats` times into a buffer with room for `capacity`
    more tokens; `keys`/`values` are views of the filled part. DynamicLayer's protocol otherwise."""

    def __init__(self, layer: DynamicLayer, repeats: int, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.device = layer.keys.device
        keys, values = (layer.keys, layer.values) if dtype is None else (layer.keys.to(dtype), layer.values.to(dtype))
        self._k, self._v = _buffer(keys, repeats, capacity), _buffer(values, repeats, capacity)
        self._n = layer.keys.shape[-2]
        self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        n, q = self._n, key_states.shape[-2]
        if n + q > self._k.shape[-2]:  # out of room: grow (not reached when capacity covers the decode)
            self._k, self._v = (_buffer(x[:, :, :n], 1, max(q, 16)) for x in (self._k, self._v))
        self._k[:, :, n:n + q] = key_states
        self._v[:, :, n:n + q] = value_states
        self._n = n + q
        self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k.index_select(0, indices), self._v.index_select(0, indices)
        self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("BufferedLayer is built already repeated")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("BufferedLayer does not crop")


class GroupedPrefixLayer(DynamicLayer):
    """One copy of each prompt's keys/values (P, H, L, D) shared by its G rows, plus an in-place buffer for the
    generated tokens. `update` stores the new token and returns the generated part as (N, H, n, D) views;
    `attend` (called by LeanDecoder) adds the shared prompt part.

    The generated part is stored time-major, (capacity, N, H, D): a step writes one contiguous block, and the
    first n steps are one contiguous prefix of memory, which the per-row attention matmuls read about 30% faster
    here than a row-major (N, H, capacity, D) buffer with its unused capacity between rows.

    A DynamicSlidingWindowLayer gives a windowed layer: `window` = its sliding_window, and its keys are the prompt's
    last min(L, window - 1) positions (P, H, L', D); the query at sequence position q attends to the keys at positions
    k with q - k < window (transformers' sliding_window_overlay), over the padded sequence as the model's mask
    counts them."""

    def __init__(self, layer: DynamicLayer, prompt_mask: torch.Tensor, repeats: int, capacity: int,
                 dtype: torch.dtype | None = None):
        super().__init__()
        k = layer.keys if dtype is None else layer.keys.to(dtype)
        P, H, L, D = k.shape  # L: the prompt positions the layer kept (the last ones), prompt_mask's L or fewer
        self.window = layer.sliding_window if isinstance(layer, DynamicSlidingWindowLayer) else None
        self._length = prompt_mask.shape[1]
        prompt_mask = prompt_mask[:, self._length - L:]
        self.device = k.device
        # bf16 attention (dtype bfloat16: the sampler under bf16 compute) multiplies bf16 operands and accumulates in
        # float32, as torch's CPU kernel does: the prompt part, read G times a step, is kept as float32 copies of its
        # bf16 values, the generated part in bf16 and widened per step (rollout/decode.py attend)
        self.bf16 = k.dtype == torch.bfloat16
        values = layer.values if dtype is None else layer.values.to(dtype)
        self.prompt_keys, self.prompt_values = (k.float(), values.float()) if self.bf16 else (k, values)
        # additive bias over the prompt keys: 0 at real tokens, -inf at left padding; (P, 1, 1, L)
        self.prompt_bias = torch.zeros((P, 1, 1, L), dtype=torch.float32, device=k.device).masked_fill(
            prompt_mask[:, None, None, :].to(k.device) == 0, float("-inf"))
        self._bias_cache = None
        self.group_size = repeats
        self.rows: torch.Tensor | None = None  # batch row -> full-batch row; None while no row has left
        self._k = k.new_empty((capacity, P * repeats, H, D))
        self._v = values.new_empty((capacity, P * repeats, *values.shape[1::2]))
        self._L, self._n = L, 0  # the prompt positions kept, the generated ones
        self._views()
        self.is_initialized = True

    def _views(self) -> None:
        self.keys = self._k[:self._n].permute(1, 2, 0, 3)  # (N, H, n, D), no copy
        self.values = self._v[:self._n].permute(1, 2, 0, 3)

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states/value_states (N, H, q, D) of the newest q tokens; returns the (N, H, n, D) views."""
        n, q = self._n, key_states.shape[-2]
        if n + q > self._k.shape[0]:  # out of room: grow (not reached when capacity covers the decode)
            self._k, self._v = (torch.cat([x[:n], x.new_empty((max(q, 16), *x.shape[1:]))]) for x in (self._k, self._v))
        self._k[n:n + q] = key_states.permute(2, 0, 1, 3)
        self._v[n:n + q] = value_states.permute(2, 0, 1, 3)
        self._n = n + q
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length + self._n

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (finished rows leave); only the filled steps are copied."""
        def select(x):
            out = x.new_empty((x.shape[0], len(indices), *x.shape[2:]))
            out[:self._n] = x[:self._n].index_select(1, indices)
            return out

        self._k, self._v = select(self._k), select(self._v)
        self._views()
        self.rows = indices if self.rows is None else self.rows.index_select(0, indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("GroupedPrefixLayer is built already grouped")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("GroupedPrefixLayer does not crop")

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float):
        """query (B, Hq, 1, D) of the newest token of each row; keys/values (B, H, n, D) of its generated tokens
        (the newest included). Returns (B, 1, Hq, D), the attention over [its prompt, its generated tokens]."""
        B, Hq, S, D = query.shape
        if S != 1:
            raise ValueError("GroupedPrefixLayer decodes one token per row at a time")
        if self.bf16:  # bf16 operands, float32 products and softmax; autocast would round the scores to bf16
            with torch.autocast(query.device.type, enabled=False):
                return self._attend(query.to(torch.bfloat16).float(), keys.float(), values.float(), scaling,
                                    round_probs=True).to(query.dtype)  # bf16 weights take bf16 back
        return self._attend(query, keys, values, scaling)

    def _attend(self, query, keys, values, scaling: float, round_probs: bool = False):
        B, Hq, S, D = query.shape
        P, H, L, _ = self.prompt_keys.shape
        G, r, rows = self.group_size, Hq // H, self.rows
        prompt_keys, prompt_values, bias = self.prompt_keys, self.prompt_values, self._bias(G * r)
        if self.window is not None:  # the newest query is L + n - 1 positions after the first kept prompt key
            first = min(L, max(0, L + self._n - self.window))  # the first kept prompt key inside its window
            if first:
                prompt_keys, prompt_values, bias = prompt_keys[:, :, first:], prompt_values[:, :, first:], \
                    bias[..., first:]
                L -= first
            keys, values = keys[:, :, max(0, self._n - self.window):], values[:, :, max(0, self._n - self.window):]
        q = query.reshape(B, H, r, D) * scaling
        own = torch.matmul(q, keys.transpose(-1, -2)).to(self.prompt_keys.dtype)  # against the row's own tokens
        if L == 0:  # the window has moved past the whole prompt
            return torch.matmul(self._probs(own, query.dtype, round_probs), values).reshape(B, 1, Hq, D)
        # scores against the prompt: the G rows of prompt p are G*r queries against its one copy of the keys
        qg = q if rows is None else q.new_zeros((P * G, H, r, D)).index_copy_(0, rows, q)
        qg = qg.view(P, G, H, r, D).transpose(1, 2).reshape(P * H, G * r, D)
        s_prompt = torch.baddbmm(bias, qg, prompt_keys.reshape(P * H, L, D).transpose(1, 2))
        s_prompt = s_prompt.view(P, H, G, r, L).transpose(1, 2).reshape(P * G, H, r, L)
        if rows is not None:
            s_prompt = s_prompt.index_select(0, rows)
        p = self._probs(torch.cat([s_prompt, own], -1), query.dtype, round_probs)  # one softmax over both
        p_prompt = p[..., :L] if rows is None else p.new_zeros((P * G, H, r, L)).index_copy_(0, rows, p[..., :L])
        p_prompt = p_prompt.reshape(P, G, H, r, L).transpose(1, 2).reshape(P, H, G * r, L)
        out = torch.matmul(p_prompt, prompt_values).view(P, H, G, r, D).transpose(1, 2).reshape(P * G, H, r, D)
        if rows is not None:
            out = out.index_select(0, rows)
        out = out + torch.matmul(p[..., L:], values)
        return out.reshape(B, 1, Hq, D)

    @staticmethod
    def _probs(scores: torch.Tensor, dtype: torch.dtype, round_probs: bool) -> torch.Tensor:
        """softmax(scores) over the last dimension in `dtype`; round_probs: rounded to bf16 values, as the bf16
        operands that multiply the values."""
        p = torch.softmax(scores, -1).to(dtype)
        return p.to(torch.bfloat16).to(dtype) if round_probs else p

    def _bias(self, queries: int) -> torch.Tensor:
        """The prompt-padding bias expanded to (P*H, queries, L), cached."""
        if self._bias_cache is None or self._bias_cache.shape[1] != queries:
            P, H, L, _ = self.prompt_keys.shape
            self._bias_cache = self.prompt_bias.to(self.prompt_keys.dtype).expand(P, H, queries, L).reshape(
                P * H, queries, L)
        return self._bias_cache


def expand_cache(cache, prompt_mask: torch.Tensor, repeats: int, capacity: int, grouped: bool,
                 dtype: torch.dtype | None = None):
    """Serve N = P*repeats decoding rows from a cache prefilled with P prompts, with room for `capacity` new
    tokens: GroupedPrefixLayers when `grouped` (decoding through LeanDecoder; plain and sliding-window layers),
    else BufferedLayers, or the model's own layers repeated when they are not plain DynamicLayers (sliding windows,
    ...). dtype: the keys' and values' (bfloat16 under bf16 compute, whose attention takes them so; None: as the
    prefill left them). Returns (cache, grouped)."""
    layers = getattr(cache, "layers", None)
    kinds = (DynamicLayer, DynamicSlidingWindowLayer) if grouped else (DynamicLayer,)
    if not (bool(layers) and all(type(layer) in kinds and layer.is_initialized for layer in layers)):
        if repeats > 1:
            cache.batch_repeat_interleave(repeats)
        return cache, False
    if grouped:
        cache.layers = [GroupedPrefixLayer(layer, prompt_mask, repeats, capacity, dtype) for layer in layers]
    else:
        cache.layers = [BufferedLayer(layer, repeats, capacity, dtype) for layer in layers]
    return cache, grouped


class LeanDecoder:
    """One decode step (one new token per row) of a model with Llama's or Gemma 2/3's decoder layers, run from the
    model's own modules (embedding, norms, projections, rotary embedding, MLP, output head) in the order of its
    decoder layer, with the grouped-prefix attention of GroupedPrefixLayer. It skips what a full `model(...)` call
    does per token and a decode step does not need (mask construction, keyword plumbing, output objects).

    `for_model` takes it where the model has the modules it runs (per layer: self_attn with q/k/v/o_proj, optional
    q_norm/k_norm; input_layernorm, post_attention_layernorm, mlp, and for Gemma's four norms
    pre_/post_feedforward_layernorm; a rotary embedding, per layer type where it takes one) and where it agrees with
    the model's forward on a probe (`decoder_probe`, once per model); else None, and the model decodes through
    `model(...)`, with one log line saying why.
    """

    def __init__(self, base, inner, rotate, layer_types: list[str] | None):
        self.base, self.inner, self.rotate = base, inner, rotate
        self.layer_types = layer_types  # the rotary embedding's layer type per layer (Gemma 3), None: one for all
        self.sandwich = all(hasattr(layer, "pre_feedforward_layernorm") and hasattr(layer, "post_feedforward_layernorm")
                            for layer in inner.layers)  # Gemma 2/3: a norm after attention and around the MLP

    @classmethod
    def for_model(cls, model) -> LeanDecoder | None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: adapters stay in
        decoder, why = cls._build(base)
        if decoder is not None:
            verdict = probe_once(base, "_grpo_decoder_probe", lambda: decoder_probe(base, decoder), decoder_note)
            decoder, why = (decoder, None) if verdict[0] else (None, verdict[1])
        if decoder is None and not vars(base).get("_grpo_decoder_logged"):
            log.warning("generation decodes through the model's own forward (the generic path): %s", why)
            object.__setattr__(base, "_grpo_decoder_logged", True)
        return decoder

    @classmethod
    def _build(cls, base) -> tuple[LeanDecoder | None, str | None]:
        """(a LeanDecoder over base's modules, None) where it has the modules LeanDecoder runs, else (None, why)."""
        config = getattr(base, "config", None)
        inner = getattr(base, "model", None)
        for name in _UNSUPPORTED_FIELDS:
            if getattr(config, name, None) not in (None, 1, 1.0):
                return None, f"its config sets {name}={getattr(config, name)!r}, which LeanDecoder does not compute"
        if (inner is None or not hasattr(base, "lm_head")
                or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))):
            return None, "it is not laid out as model.embed_tokens/layers/norm/rotary_emb and lm_head"
        for layer in inner.layers:
            attn = getattr(layer, "self_attn", None)
            if attn is None or not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")):
                return None, "its attention is not self_attn with q_proj, k_proj, v_proj, o_proj"
            if not all(hasattr(layer, a) for a in ("input_layernorm", "post_attention_layernorm", "mlp")):
                return None, "its layers lack input_layernorm, post_attention_layernorm or mlp"
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None and not set(layer_types) <= _LAYER_TYPES:
            return None, f"its layer types {sorted(set(layer_types) - _LAYER_TYPES)} are not full or sliding attention"
        for module in base.modules():  # FSDP shards, accelerate offload hooks, user hooks: take the full path
            if (module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook")
                    or type(module).__name__.startswith("FSDP")):
                return None, f"its module {type(module).__name__} has hooks (FSDP, offloading or a user's)"
        rotate = getattr(importlib.import_module(type(inner.layers[0].self_attn).__module__), "apply_rotary_pos_emb",
                         None)
        if rotate is None:
            return None, "its modeling code has no apply_rotary_pos_emb"
        per_type = "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters
        if per_type and layer_types is None:
            return None, "its rotary embedding takes a layer type, and its config has no layer_types"
        return cls(base, inner, rotate, list(layer_types) if per_type else None), None

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """tokens (B,), positions (B, 1) -> next-token logits (B, V); appends to `cache` (GroupedPrefixLayers)."""
        inner, B = self.inner, tokens.shape[0]
        h = inner.embed_tokens(tokens[:, None])  # Gemma's embedding module scales by sqrt(hidden) itself
        if self.layer_types is None:
            rotary = [inner.rotary_emb(h, positions)] * len(inner.layers)
        else:  # Gemma 3: local and global layers rotate with their own base frequency
            angles = {t: inner.rotary_emb(h, positions, t) for t in set(self.layer_types)}
            rotary = [angles[t] for t in self.layer_types]
        for i, layer in enumerate(inner.layers):
            attn, residual = layer.self_attn, h
            x = layer.input_layernorm(h)
            shape = (B, 1, -1, attn.head_dim)
            q, k, v = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)
            if hasattr(attn, "q_norm"):  # Qwen3, Gemma 3: RMSNorm over each head
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rotate(q.transpose(1, 2), k.transpose(1, 2), *rotary[i])
            keys, values = cache.layers[i].update(k, v.transpose(1, 2))
            out = cache.layers[i].attend(q, keys, values, getattr(attn, "scaling", attn.head_dim ** -0.5))
            out = attn.o_proj(out.reshape(B, 1, -1))
            if self.sandwich:
                h = residual + layer.post_attention_layernorm(out)
                h = h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
            else:
                h = residual + out
                h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(inner.norm(h)[:, -1])

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, H) -> logits (B, V), rows contiguous: the sampler's softmax and block sums read them row by row.
        (W @ x^T, a (V, B) product returned as a transposed view, made the product alone a few percent faster at
        128 rows, and the sampler's passes over the strided view slower; grpo.bench.engines measures both,
        floor.head_ms.)"""
        return self.base.lm_head(x)


def decoder_note(model) -> str | None:
    """The line that says the lean decoder was checked and passed, with its evidence; None before the check or when
    it failed (then LeanDecoder.for_model's warning says why)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    verdict = vars(base).get("_grpo_decoder_probe")
    if not verdict or not verdict[0]:
        return None
    return f"lean decoder checked: {verdict[1]}; generation decodes through LeanDecoder"


def check_lean_paths(model, decoder: bool = True) -> list[str]:
    """Check `model`'s lean head and (decoder=True) its lean decoder now, against its own forward on a probe (what
    plain_output_head and LeanDecoder.for_model do on their first call), and return a line for each that passed,
    with its evidence; one that failed logged its warning, saying why its generic path is kept. Called at load."""
    notes = [head_note(model) if plain_output_head(model) is not None else None]
    if decoder:
        notes.append(decoder_note(model) if LeanDecoder.for_model(model) is not None else None)
    return [n for n in notes if n]


PROBE_ROWS, PROBE_GROUP, PROBE_STEPS = 2, 2, 4  # prompts (the second left-padded), rows per prompt, decode steps


@torch.no_grad()
def decoder_probe(base, decoder: LeanDecoder) -> tuple[bool, str]:
    """(agrees, what was seen): PROBE_ROWS prompts of PROBE_TOKENS random tokens (the second with 2 positions of left
    padding) prefilled by the model, expanded to PROBE_GROUP rows each (expand_cache, grouped), then PROBE_STEPS
    given tokens decoded by `decoder`; its logits (N, S, V) against the model's own uncached forward over the whole
    sequences, within probe_tolerance of the logits' scale. In the weights' dtype (autocast off), the model in eval
    mode. A window shorter than the probe's PROBE_TOKENS + PROBE_STEPS positions is exercised by it; a longer one
    by the tests (tests/rollout/test_lean_gemma.py). An exception is a disagreement naming it."""
    param = next(base.parameters())
    device, dtype = param.device, param.dtype
    was_training = base.training
    base.eval()
    try:
        g = torch.Generator().manual_seed(0)
        vocab = base.get_input_embeddings().num_embeddings
        P, G, S, L = PROBE_ROWS, PROBE_GROUP, PROBE_STEPS, PROBE_TOKENS
        prompt = torch.randint(0, vocab, (P, L), generator=g).to(device)
        mask = torch.ones((P, L), dtype=torch.long, device=device)
        mask[1:, :2] = 0
        given = torch.randint(0, vocab, (P * G, S), generator=g).to(device)
        positions = position_ids_from_mask(mask)
        with torch.autocast(device.type, enabled=False):
            out = base(input_ids=prompt, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
            cache, grouped = expand_cache(output_cache(out), mask, G, S, grouped=True)
            if not grouped:
                kinds = sorted({type(layer).__name__ for layer in getattr(output_cache(out), "layers", None) or []})
                return False, f"its KV cache layers are {kinds or 'not a layered cache'}, not ones LeanDecoder keeps"
            pos, lean = positions[:, -1:].repeat_interleave(G, 0), []
            for t in range(S):
                pos = pos + 1
                lean.append(decoder(given[:, t], pos, cache))
            ids = torch.cat([prompt.repeat_interleave(G, 0), given], 1)
            full_mask = torch.cat([mask.repeat_interleave(G, 0), torch.ones_like(given)], 1)
            want = base(input_ids=ids, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask),
                        use_cache=False, logits_to_keep=S).logits
    except Exception as e:  # any failure keeps the generic path: named, never raised
        return False, f"the check on a probe raised {type(e).__name__}: {e}"
    finally:
        base.train(was_training)
    worst, scale, tol = logits_difference(torch.stack(lean, 1), want, dtype)
    what = (f"{P * G} rows of {L} prompt + {S} decoded tokens: max |difference| of its logits from the model's "
            f"forward {worst:.2g}, tolerance {tol:.2g} ({probe_tolerance(dtype):g} of the logits' scale {scale:.3g})")
    return (True, f"on {what}") if worst <= tol else (False, f"it disagrees with the model's forward on {what}")
