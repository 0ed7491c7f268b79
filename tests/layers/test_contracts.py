"""The contract every attention core and position scheme keeps, run over the registries.

Every registered core x position scheme (parts registered later, your own included, are
covered by registering them) is built into a float64 layer; a combination the registry
refuses must be refused at config time with a message naming what would work. A core whose
options take a score ``activation`` runs once per activation it accepts (``sdpa:sigmoid``).
Each built layer is then checked for causality, cached decoding = full pass, padding
invariance, gradients against finite differences, and bad input.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab.config import ConfigError, PartSpec
from attnlab.layers import CORES, POSITIONS, Attention, AttentionConfig, LayerContext
from attnlab.ops.attention.activations import ACTIVATIONS

F64 = torch.float64
D_MODEL, HEADS, T = 32, 4, 12

SMALL_OPTIONS = {
    "sea": {"k": 2, "predictor_length": 8},
    "oracle": {"k": 3},
    "quest": {"budget": 6, "page": 2},
    "block": {"budget": 6, "page": 2},
    "sea_pages": {"budget": 6, "page": 2},
    "window": {"sinks": 1, "window": 4},
    "reformer": {"bucket_size": 4},
}
"""Options that make each sparse core really sparse at ``T`` tokens (others: defaults)."""


def core_spec(core: str) -> dict:
    """``"name"`` or ``"name:activation"`` -> the core's config."""
    name, _, activation = core.partition(":")
    return {"name": name, **SMALL_OPTIONS.get(name, {}),
            **({"activation": activation} if activation else {})}


def core_variants() -> list[str]:
    """Every core, and each non-default score activation its options accept."""
    variants = []
    for name in CORES.names():
        variants.append(name)
        if "activation" not in {f.name for f in dataclasses.fields(CORES.get(name).options)}:
            continue
        for activation in ACTIVATIONS[1:]:
            try:
                CORES.options(PartSpec(name, {"activation": activation}))
            except ConfigError:  # e.g. flex has no sigmoid form
                continue
            variants.append(f"{name}:{activation}")
    return variants


def combinations() -> list[tuple[str, str]]:
    return [(core, pos) for core in core_variants() for pos in POSITIONS.names()]


def build(core: str, positions: str, causal: bool = True, projections: str = "dense"):
    """A float64 eval-mode layer of ``core`` (see :func:`core_spec`), or None when the
    registry refuses the combination (after checking that the refusal names what would
    work)."""
    try:
        cfg = AttentionConfig(n_heads=HEADS, projections=projections, positions=positions,
                              core=core_spec(core))
        ctx = LayerContext(d_model=D_MODEL, n_heads=HEADS, causal=causal, max_seq_len=64)
        torch.manual_seed(0)
        layer = Attention(ctx, cfg)
    except ConfigError as err:
        assert "that can" in str(err) or "use it in" in str(err), err
        return None
    return layer.double().eval()


def layer_or_skip(core: str, positions: str, **kw):
    layer = build(core, positions, **kw)
    if layer is None:
        pytest.skip(f"{core} x {positions}: refused at config time")
    return layer


def tokens(b: int = 2, t: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, t, D_MODEL, dtype=F64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("core", "positions"), combinations())
def test_refusals_happen_at_config_time_and_name_alternatives(core, positions):
    if build(core, positions) is not None:  # built: it must also run
        assert build(core, positions)(tokens()).hidden.shape == (2, T, D_MODEL)


@pytest.mark.parametrize(("core", "positions"), combinations())
def test_causality(core, positions):
    layer = layer_or_skip(core, positions)
    x = tokens()
    changed = x.clone()
    changed[:, 7:] = tokens(seed=1)[:, 7:]
    torch.testing.assert_close(layer(x).hidden[:, :7], layer(changed).hidden[:, :7],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize(("core", "positions"), combinations())
def test_cached_decoding_equals_the_full_pass(core, positions):
    layer = layer_or_skip(core, positions)
    x = tokens()
    full = layer(x).hidden
    out = layer(x[:, :5], use_cache=True)
    pieces, cache = [out.hidden], out.cache
    for start in range(5, T, 3):  # then 3 tokens at a time
        out = layer(x[:, start:start + 3], cache=cache, use_cache=True)
        pieces.append(out.hidden)
        cache = out.cache
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("core", "positions"), combinations())
def test_left_padding_does_not_change_real_tokens(core, positions):
    layer = layer_or_skip(core, positions)
    x = tokens(b=1)
    mask = torch.ones(1, T + 3, dtype=torch.bool)
    mask[:, :3] = False
    outputs = [layer(torch.cat((tokens(b=1, t=3, seed=seed), x), dim=1),
                     key_padding_mask=mask).hidden[:, 3:] for seed in (2, 3)]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=1e-12)  # nothing leaks
    relative = positions in ("rope", "xl", "alibi")
    if relative and not CORES.trait(core_spec(core)["name"], "approximate"):
        # exact functions of the relative scores: a shift by the padding changes nothing
        torch.testing.assert_close(outputs[0], layer(x).hidden, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("core", "positions"), combinations())
def test_gradients_match_finite_differences(core, positions):
    layer = layer_or_skip(core, positions)
    x = tokens(b=1, t=6).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: layer(t).hidden, (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("core", CORES.names())
def test_bad_input_is_refused(core):
    layer = layer_or_skip(core, "rope")
    with pytest.raises(ValueError, match="d_model=32"):
        layer(torch.randn(1, 4, 16, dtype=F64))
    with pytest.raises(TypeError, match="key_padding_mask must be bool"):
        layer(tokens(b=1), key_padding_mask=torch.ones(1, T))


def test_capabilities_are_declared_once_and_checked_at_config_time():
    with pytest.raises(ValueError, match=r"unknown trait\(s\) \['fast'\]; known: "):
        CORES.register("test-fast", fast=True)
    assert CORES.names(dropout=True) == ["eager", "sdpa"]
    with pytest.raises(ConfigError, match=r"core 'sea' applies no attention dropout.*"
                                          r"\['eager', 'sdpa'\]"):
        AttentionConfig(core="sea", dropout=0.1)
    with pytest.raises(ConfigError, match=r"cores that can: \[.*'window'\]; position schemes "
                                          r"core 'performer' can take: \['learned', 'none'"):
        AttentionConfig(core="performer", positions="alibi")


@pytest.mark.parametrize("projections", ["switchhead", "moa"])
@pytest.mark.parametrize("positions", POSITIONS.names(score_bias=True))
@pytest.mark.parametrize("core", CORES.names(score_bias=True))
def test_score_biases_work_with_expert_projections(projections, positions, core):
    """The same decoding contract with SwitchHead and MoA projections (their q/k prescale
    and expert selection must not disturb the bias)."""
    layer = build(core, positions, projections=projections)
    x = tokens()
    full = layer(x).hidden
    prefix = layer(x[:, :7], use_cache=True)
    rest = layer(x[:, 7:], cache=prefix.cache).hidden
    torch.testing.assert_close(torch.cat((prefix.hidden, rest), dim=1), full, rtol=0,
                               atol=1e-10)


@pytest.mark.parametrize("core", CORES.names())
def test_a_built_core_carries_its_declared_traits(core):
    layer = layer_or_skip(core, "none")
    assert layer.core.traits == {t: CORES.trait(core, t) for t in CORES.known_traits}
    assert CORES.trait("sea", "tunable_inference") and CORES.trait("sea", "learns_attention")
