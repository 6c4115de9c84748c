"""KV caches for decoding G samples per prompt (inference only).

After the P prompts are prefilled once, the cache must serve N = P*G decoding rows. Two layouts:

GroupedPrefixLayer (with LeanDecoder: Llama, Qwen2/3, Mistral without sliding windows)
    the prompt keys/values stay as they are, (P, H, L, D), one copy per prompt; the generated tokens' keys/values
    go into a preallocated time-major (T, N, H, D) buffer, written in place. The scores against the prompt come from one
    batched matmul per prompt ((P, H, G, D) @ (P, H, D, L): the G rows of a prompt are G queries against its
    single copy), the scores against each row's own generated tokens from a per-row matmul; one softmax over
    both, and the same split for the values. The prompt is neither recomputed nor copied G times, and a
    decode step reads it once per group.

BufferedLayer (any other model whose cache layers are plain DynamicLayers; decoding through `model(...)`)
    the prompt keys/values are copied G times into a (N, H, L+T, D) buffer with room for the T new tokens,
    written in place; attention is the model's own.

Either way a step appends in place instead of concatenating the whole cache (transformers' DynamicLayer
copies it every token). Finished rows leave with `Cache.batch_select_indices` like with any cache.
"""

from __future__ import annotations

import importlib

import torch
from transformers.cache_utils import DynamicLayer

# model types whose decoder layer is Llama's (pre-norm; q/k/v/o projections, optionally with biases and q/k
# norms; rotary positions; plain scaled dot-product attention; gated MLP), which LeanDecoder runs
LEAN_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


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
    here than a row-major (N, H, capacity, D) buffer with its unused capacity between rows."""

    def __init__(self, layer: DynamicLayer, prompt_mask: torch.Tensor, repeats: int, capacity: int,
                 dtype: torch.dtype | None = None):
        super().__init__()
        k = layer.keys if dtype is None else layer.keys.to(dtype)
        P, H, L, D = k.shape
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
        self._L, self._n = L, 0
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
        return self._L + self._n

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
        q = query.reshape(B, H, r, D) * scaling
        # scores against the prompt: the G rows of prompt p are G*r queries against its one copy of the keys
        qg = q if rows is None else q.new_zeros((P * G, H, r, D)).index_copy_(0, rows, q)
        qg = qg.view(P, G, H, r, D).transpose(1, 2).reshape(P * H, G * r, D)
        s_prompt = torch.baddbmm(self._bias(G * r), qg, self.prompt_keys.reshape(P * H, L, D).transpose(1, 2))
        s_prompt = s_prompt.view(P, H, G, r, L).transpose(1, 2).reshape(P * G, H, r, L)
        if rows is not None:
            s_prompt = s_prompt.index_select(0, rows)
        # scores against the row's own generated tokens, then one softmax over both
        s = torch.cat([s_prompt, torch.matmul(q, keys.transpose(-1, -2)).to(s_prompt.dtype)], -1)
        p = torch.softmax(s, -1).to(query.dtype)
        if round_probs:  # the probabilities multiply the values as bf16 operands
            p = p.to(torch.bfloat16).to(query.dtype)
        p_prompt = p[..., :L] if rows is None else p.new_zeros((P * G, H, r, L)).index_copy_(0, rows, p[..., :L])
        p_prompt = p_prompt.reshape(P, G, H, r, L).transpose(1, 2).reshape(P, H, G * r, L)
        out = torch.matmul(p_prompt, self.prompt_values).view(P, H, G, r, D).transpose(1, 2).reshape(P * G, H, r, D)
        if rows is not None:
            out = out.index_select(0, rows)
        out = out + torch.matmul(p[..., L:], values)
        return out.reshape(B, 1, Hq, D)

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
    tokens: GroupedPrefixLayers when `grouped` (decoding through LeanDecoder), else BufferedLayers, or the
    model's own layers repeated when they are not plain DynamicLayers (sliding windows, ...). dtype: the keys'
    and values' (bfloat16 under bf16 compute, whose attention takes them so; None: as the prefill left them).
    Returns (cache, grouped)."""
    layers = getattr(cache, "layers", None)
    if not (bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)):
        if repeats > 1:
            cache.batch_repeat_interleave(repeats)
        return cache, False
    if grouped:
        cache.layers = [GroupedPrefixLayer(layer, prompt_mask, repeats, capacity, dtype) for layer in layers]
    else:
        cache.layers = [BufferedLayer(layer, repeats, capacity, dtype) for layer in layers]
    return cache, grouped


class LeanDecoder:
    """One decode step (one new token per row) of a Llama-family model, run from the model's own modules
    (embedding, norms, projections, rotary embedding, MLP, output head) in the order of its decoder layer, with
    the grouped-prefix attention of GroupedPrefixLayer. It skips what a full `model(...)` call does per token
    and a decode step does not need (mask construction, keyword plumbing, output objects). `for_model` returns
    None for anything else (other architectures, sharded or offloaded modules, hooks), which then decodes
    through `model(...)`.
    """

    def __init__(self, base, inner, rotate):
        self.base, self.inner, self.rotate = base, inner, rotate

    @classmethod
    def for_model(cls, model) -> LeanDecoder | None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: adapters stay in
        config = getattr(base, "config", None)
        inner = getattr(base, "model", None)
        if (getattr(config, "model_type", None) not in LEAN_MODEL_TYPES or inner is None
                or getattr(config, "use_sliding_window", False) or getattr(config, "sliding_window", None)
                or not hasattr(base, "lm_head")
                or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))):
            return None
        for layer in inner.layers:
            attn = getattr(layer, "self_attn", None)
            if attn is None or not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")):
                return None
            if not all(hasattr(layer, a) for a in ("input_layernorm", "post_attention_layernorm", "mlp")):
                return None
        for module in base.modules():  # FSDP shards, accelerate offload hooks, user hooks: take the full path
            if (module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook")
                    or type(module).__name__.startswith("FSDP")):
                return None
        rotate = getattr(importlib.import_module(type(inner.layers[0].self_attn).__module__), "apply_rotary_pos_emb",
                         None)
        return None if rotate is None else cls(base, inner, rotate)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """tokens (B,), positions (B, 1) -> next-token logits (B, V); appends to `cache` (GroupedPrefixLayers)."""
        inner, B = self.inner, tokens.shape[0]
        h = inner.embed_tokens(tokens[:, None])
        cos, sin = inner.rotary_emb(h, positions)
        for i, layer in enumerate(inner.layers):
            attn, residual = layer.self_attn, h
            x = layer.input_layernorm(h)
            shape = (B, 1, -1, attn.head_dim)
            q, k, v = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            keys, values = cache.layers[i].update(k, v.transpose(1, 2))
            out = cache.layers[i].attend(q, keys, values, getattr(attn, "scaling", attn.head_dim ** -0.5))
            h = residual + attn.o_proj(out.reshape(B, 1, -1))
            residual = h
            h = residual + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(inner.norm(h)[:, -1])

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, H) -> logits (B, V). A plain linear head is computed as W @ x^T, a (V, B) product returned
        transposed (a view): on the CPU that orientation of the same product was the faster one at 128 rows
        (bench/results/engines_model.json, floor.head_ms; docs/performance.md); the sampler reads the view as it is."""
        head = self.base.lm_head
        if type(head) is not torch.nn.Linear:
            return head(x)
        logits = (head.weight @ x.t()).t()
        return logits if head.bias is None else logits + head.bias
