"""The ``attnlab`` entry of transformers' attention and mask registries.

A converted model selects ``attn_implementation="attnlab"``. Each self-attention module then
calls :func:`attnlab_attention` with its own (projected, rotated, cached) q, k, v, and that
function runs the attnlab core attached to the module as ``module.attnlab_core``.

Masks. transformers builds a mask only through the mask function registered under the same
name; without one, ``attention_mask`` is always None and padding would be silently ignored.
:func:`attnlab_mask` returns a key-padding mask ``[B, Tk]`` (True = real token) or None, and
refuses patterns the cores cannot honour (sliding windows, packed sequences, static caches).
Causality is the core's own (``module.is_causal`` when converted), bottom-right aligned: the
queries are the last ``Tq`` of the ``Tk`` keys, which is how transformers' dynamic cache
calls attention.

Decoding states. Causal SEA (and Performer / Reformer) cores carry a state between calls in
eval mode. The state is kept with the KV cache it belongs to: a hook on the module that runs
the layers (``LlamaModel``, ``OPTDecoder``, ...) records, per forward, the cache it was given;
after the forward each layer's new state is filed under that cache object (weakly, so it dies
with the cache) together with a weak reference to the cache layer's key tensor it was computed
with. A later forward uses a state only if the cache layer still holds that very key tensor,
unmodified: transformers replaces the tensor whenever the cache grows, is cropped, reordered
(beam search) or re-batched, so a state is never applied to keys it did not see. Without a
matching state a core rebuilds what it can from the cached keys (exact for Performer; SEA's
estimator restarts from the new queries, so its estimates differ from a full pass; Reformer
raises).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, Cache
from transformers.masking_utils import (
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
)

from attnlab.layers.base import Aux, merge_aux

logger = logging.getLogger(__name__)

ATTN_IMPLEMENTATION = "attnlab"
CORE_ATTR = "attnlab_core"
COLLECTOR_ATTR = "_attnlab_collector"
HOOKED_ATTR = "_attnlab_hooked"


@dataclasses.dataclass
class Collected:
    """Auxiliary losses of the converted layers (e.g. SEA's ``sea_estimate`` in training
    mode), per layer index, summed over the forwards run inside :func:`attnlab.hf.collect`."""

    aux: dict[int, Aux] = dataclasses.field(default_factory=dict)

    def add(self, layer: int, aux: Aux) -> None:
        self.aux[layer] = merge_aux(self.aux.get(layer, {}), aux)

    def total(self) -> Tensor:
        """The sum of every collected loss (a scalar; 0 when none were collected)."""
        return sum((v for aux in self.aux.values() for v in aux.values()), torch.tensor(0.0))


@dataclasses.dataclass
class _Saved:
    """A core's decoding state and the cache key tensor (and its version) it was made with."""

    state: Any
    keys: weakref.ref
    version: int


# cache object -> {layer index: saved state}; entries die with their cache
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _matching_states(cache: Any) -> dict[int, Any]:
    """The saved states of ``cache`` whose layer still holds the keys they were made with."""
    try:
        saved = _STATES.get(cache, {}) if cache is not None else {}
    except TypeError:  # an unhashable cache type: it cannot carry states
        return {}
    layers = getattr(cache, "layers", [])
    valid = {
        layer: entry for layer, entry in saved.items()
        if layer < len(layers) and getattr(layers[layer], "keys", None) is entry.keys()
        and layers[layer].keys._version == entry.version
    }
    if saved:
        _STATES[cache] = valid  # drop stale states and their tensors
    return {layer: entry.state for layer, entry in valid.items()}


class _Call:
    """One forward of a converted model's layer stack: its cache, the states usable with it,
    the states produced, and the aux collector (if any)."""

    def __init__(self, cache: Any, collector: Collected | None) -> None:
        self.cache = cache
        self.states = _matching_states(cache)
        self.new_states: dict[int, _Saved] = {}
        self.collector = collector
        self.token: contextvars.Token | None = None


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("attnlab_hf_call",
                                                                      default=None)


def _before_forward(module: nn.Module, args: tuple, kwargs: dict) -> None:
    given = (kwargs.get("cache"), kwargs.get("past_key_values"))
    cache = next((v for v in given if isinstance(v, Cache)), None)
    call = _Call(cache, getattr(module, COLLECTOR_ATTR, None))
    call.token = _CALL.set(call)


def _after_forward(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    call = _CALL.get()
    if call is None or call.token is None:
        return
    _CALL.reset(call.token)
    cache = call.cache
    if cache is None and isinstance(output, Mapping):  # a cache the layer stack created
        cache = next((v for v in output.values() if isinstance(v, Cache)), None)
    if cache is not None and call.new_states:
        try:
            _STATES.setdefault(cache, {}).update(call.new_states)
        except TypeError:
            logger.warning("attnlab: a %s cannot carry decoding states; each cached step "
                           "restarts them", type(cache).__name__)


def _tensor_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of the tensor storages reachable from ``obj`` through dataclass fields, plain
    attributes and containers (each storage once; modules and callables not entered)."""
    if isinstance(obj, Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, nn.Module) or callable(obj):
        return 0
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(x, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(x, seen) for x in obj.values())
    if hasattr(obj, "__dict__"):
        return sum(_tensor_bytes(x, seen) for x in vars(obj).values())
    return 0


def decoding_state_bytes(cache: Any) -> int:
    """Bytes the cores' decoding states filed under ``cache`` hold (reserved room included):
    memory a converted model keeps beside the KV cache while it decodes."""
    seen: set[int] = set()
    return sum(_tensor_bytes(entry.state, seen) for entry in _STATES.get(cache, {}).values())


def attach_state_hooks(stack: nn.Module) -> None:
    """Hook the module that runs the layers and receives the cache (once)."""
    if getattr(stack, HOOKED_ATTR, False):
        return
    stack.register_forward_pre_hook(_before_forward, with_kwargs=True)
    stack.register_forward_hook(_after_forward, with_kwargs=True, always_call=True)
    setattr(stack, HOOKED_ATTR, True)


def _key_padding_mask(mask: Tensor | None, batch: int, n_keys: int) -> Tensor | None:
    if mask is None:
        return None
    if mask.dtype == torch.bool and tuple(mask.shape) == (batch, n_keys):
        return mask
    raise ValueError(
        f"attnlab attention takes a key-padding mask [batch, keys] = [{batch}, {n_keys}] (bool, "
        f"True = real token), got {tuple(mask.shape)} {mask.dtype}: pass a 2D attention_mask; "
        "custom 4D masks cannot be honoured by sparse or linear cores"
    )


_WARNED_RESTART: set[str] = set()


def _warn_restart(core: nn.Module, layer: int, n_cached: int) -> None:
    name = type(core).__name__
    if name not in _WARNED_RESTART:
        _WARNED_RESTART.add(name)
        logger.warning(
            "attnlab: layer %d got %d cached keys but no decoding state made with them (the "
            "cache was reordered, cropped or filled elsewhere); the %s rebuilt what it could "
            "from the cached keys (SEA's estimates then differ from a full pass)",
            layer, n_cached, name,
        )


def attnlab_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers attention function: q ``[B, H, Tq, D]``, k/v ``[B, Hk, Tk, D]`` (Hk
    divides H) -> (``[B, Tq, H, D]``, None).

    ``attention_mask``: what :func:`attnlab_mask` built (``[B, Tk]`` bool or None). The
    model's attention dropout is not applied; attention weights are not returned.
    """
    core = getattr(module, CORE_ATTR, None)
    layer = getattr(module, "layer_idx", None)
    if core is None:
        raise RuntimeError(
            f"{type(module).__name__} (layer {layer}) has no attnlab core, but the model's "
            f"attn_implementation is '{ATTN_IMPLEMENTATION}': convert it with attnlab.hf.convert"
        )
    is_causal = kwargs.get("is_causal")
    if is_causal is not None and bool(is_causal) != core.causal:
        raise ValueError(f"layer {layer}: called with is_causal={is_causal} but its core was "
                         f"built with causal={core.causal}")
    batch, t_q, t_k = query.shape[0], query.shape[-2], key.shape[-2]
    key_padding_mask = _key_padding_mask(attention_mask, batch, t_k)
    call = _CALL.get()
    state = call.states.get(layer) if call is not None else None
    out = core(query, key, value, scale=query.shape[-1] ** -0.5 if scaling is None else scaling,
               key_padding_mask=key_padding_mask, state=state)
    if out.state is not None:
        if state is None and t_k > t_q and not core.exact_restart:
            _warn_restart(core, layer, t_k - t_q)
        if call is not None:
            call.new_states[layer] = _Saved(out.state, weakref.ref(key), key._version)
    if out.aux and call is not None and call.collector is not None:
        call.collector.add(layer, out.aux)
    return out.out.transpose(1, 2).contiguous(), None


def attnlab_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = causal_mask_function,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> Tensor | None:
    """transformers mask function: the key-padding mask ``[B, kv_length]`` (True = real
    token) of the current keys, or None when there is no padding.

    Only plain causal or bidirectional patterns over a dynamic cache are accepted; anything
    else raises instead of being silently ignored.
    """
    if mask_function not in (causal_mask_function, bidirectional_mask_function):
        raise ValueError(
            "attnlab cores take plain causal or bidirectional attention with key padding; this "
            "call asks for another mask pattern (sliding window, chunks, packed sequences "
            "from position_ids, or a custom overlay)"
        )
    if int(q_offset) + q_length != kv_offset + kv_length:
        raise ValueError(
            f"attnlab cores need the queries to be the last of the keys (a dynamic cache); this "
            f"call has {kv_length} keys from position {kv_offset} for {q_length} queries from "
            f"position {int(q_offset)}: static and sliding-window caches are not supported"
        )
    if attention_mask is None:
        return None
    mask = attention_mask[:, kv_offset:kv_offset + kv_length]
    if mask.shape[-1] != kv_length:
        raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} positions, but "
                         f"the keys span {kv_offset + kv_length}")
    return None if bool(mask.all()) else mask


AttentionInterface.register(ATTN_IMPLEMENTATION, attnlab_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, attnlab_mask)
