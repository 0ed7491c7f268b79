"""The ``flex`` core's compiled FlexAttention path against the explicit reference.

(The contract suite covers its reference path: at its 12 tokens every call is below
``COMPILE_MIN_QUERIES``.) Each case compiles one kernel, a few seconds on CPU."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.ops.sparse_attention.executors import COMPILE_MIN_QUERIES

T = COMPILE_MIN_QUERIES + 66  # a partial block of 128 at the end


def pair(positions, causal=True, activation="softmax", n_kv_heads=None):
    ctx = LayerContext(d_model=32, n_heads=4, causal=causal, max_seq_len=256)
    projections = {"name": "dense", "n_kv_heads": n_kv_heads}
    layers = [Attention(ctx, AttentionConfig(n_heads=4, positions=positions,
                                             projections=projections,
                                             core={"name": name, "activation": activation}))
              for name in ("flex", "eager")]
    layers[1].load_state_dict(layers[0].state_dict())
    return [layer.eval() for layer in layers]


@pytest.mark.parametrize(("positions", "causal", "activation", "padded", "n_kv_heads"), [
    ("alibi", True, "softmax", False, None),
    ("xl", True, "softmax", True, None),
    ("alibi", False, "softmax1", True, 2),
    ("rope", True, "softmax1", False, None),
])
def test_compiled_kernel_equals_the_reference(positions, causal, activation, padded,
                                              n_kv_heads):
    flex, eager = pair(positions, causal, activation, n_kv_heads)
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(0))
    mask = None
    if padded:
        mask = torch.ones(2, T, dtype=torch.bool)
        mask[1, :9] = False
    with torch.no_grad():
        assert flex.core._fused(x[:, None])  # the compiled path, not the reference
        out = flex(x, key_padding_mask=mask).hidden
        ref = eager(x, key_padding_mask=mask).hidden
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6)  # float32 sums in other orders


def test_cpu_training_runs_the_reference_with_the_same_gradients():
    flex, eager = pair("alibi")
    x = torch.randn(1, T, 32, requires_grad=True)
    grads = [torch.autograd.grad(layer(x).hidden.square().sum(), x)[0] for layer in (flex, eager)]
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_sigmoid_is_refused_with_the_cores_that_compute_it():
    with pytest.raises(ConfigError, match="'sigmoid' needs core 'sdpa' or 'eager'"):
        AttentionConfig(core={"name": "flex", "activation": "sigmoid"})
