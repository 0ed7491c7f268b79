"""Llama-style blocks (RMSNorm, SwiGLU, grouped-query attention, RoPE) against transformers'
own Llama with the same weights; the MLP and norm against plain formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import from_dict
from attnlab.models import DecoderLM, ModelConfig
from attnlab.utils.testing import assert_close

F64 = torch.float64
LLAMA = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "d_ff": 48, "max_seq_len": 64,
         "norm": "rmsnorm", "norm_eps": 1e-5, "mlp": "swiglu", "tie_embeddings": False,
         "attention": {"n_heads": 4, "projections": {"name": "dense", "n_kv_heads": 2},
                       "positions": {"name": "rope", "base": 100000.0}, "core": "sdpa"}}


def llama_model(**overrides):
    cfg = from_dict(ModelConfig, {**LLAMA, **overrides}, "model")
    cfg.validate()
    torch.manual_seed(0)
    return DecoderLM(cfg).double().eval()


def copy_into_transformers(model: DecoderLM):
    """transformers' LlamaForCausalLM of the same shape holding ``model``'s weights."""
    transformers = pytest.importorskip("transformers")
    cfg = model.cfg
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.attention.n_heads,
        num_key_value_heads=cfg.attention.projections.options["n_kv_heads"],
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.attention.positions.options["base"],
        tie_word_embeddings=cfg.tie_embeddings)).double().eval()
    state = {"model.embed_tokens.weight": model.embed.weight,
             "model.norm.weight": model.ln_f.weight, "lm_head.weight": model.lm_head.weight}
    for i, block in enumerate(model.blocks):
        prefix, proj = f"model.layers.{i}.", block.attn.projections
        state.update({
            prefix + "input_layernorm.weight": block.ln_attn.weight,
            prefix + "post_attention_layernorm.weight": block.ln_mlp.weight,
            **{prefix + f"self_attn.{n}_proj.weight": getattr(proj, f"{n}_proj").weight
               for n in "qkvo"},
            **{prefix + f"mlp.{n}_proj.weight": getattr(block.mlp, n).weight
               for n in ("gate", "up", "down")}})
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in name for name in missing)
    return hf


@pytest.mark.parametrize("tied", [False, True])
def test_dense_llama_blocks_give_transformers_llama_logits(tied):
    model = llama_model(tie_embeddings=tied)
    hf = copy_into_transformers(model)
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids).logits, hf(input_ids=ids).logits
    # transformers computes RoPE's angles in float32 even in a float64 model: its rounding
    assert_close("logits", theirs, ours, 10 * torch.finfo(torch.float32).eps)


def test_swiglu_and_rmsnorm_are_the_plain_formulas():
    model = llama_model()
    block = model.blocks[0]
    x = torch.randn(2, 5, 32, dtype=F64)
    mlp = block.mlp
    expected = (F.silu(x @ mlp.gate.weight.T) * (x @ mlp.up.weight.T)) @ mlp.down.weight.T
    assert_close("swiglu", expected, mlp(x)[0], 1e-14)
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * block.ln_attn.weight
    assert_close("rmsnorm", rms, block.ln_attn(x), 1e-14)


def test_llama_blocks_decode_with_the_cache_as_the_full_pass():
    model = llama_model()
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :7], use_cache=True)
        step = model(ids[:, 7:], cache=out.cache, use_cache=True)
    assert_close("cached", full[:, 7:], step.logits, 1e-12)


def test_a_norm_the_model_cannot_take_is_refused():
    with pytest.raises(ValueError, match=r"norm must be one of \['layernorm', 'rmsnorm'\]"):
        llama_model(norm="batchnorm")
    with pytest.raises(ValueError, match="norm_eps must be > 0"):
        llama_model(norm_eps=0.0)


LLAMA_CONFIGS = {"smollm2-135m-dense": 134_515_008, "smollm2-135m-switchhead": 134_515_008,
                 "small-dense": 4_222_208, "small-switchhead": 4_220_672}


@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
def test_llama_configs_have_their_parameters(name):
    """configs/llama/: SmolLM2-135M's shape (134,515,008 parameters, its published count)
    and a small one, each dense and SwitchHead with the same parameters (attnlab match)."""
    from attnlab.cli.args import resolve_config_path
    from attnlab.metrics import attention_cost
    from attnlab.train import load_run_config

    cfg = load_run_config(resolve_config_path(f"llama/{name}"))
    cfg.model.vocab_size = cfg.model.vocab_size or 256  # the small ones: byte-level
    with torch.device("meta"):
        model = DecoderLM(cfg.model)
    assert sum(p.numel() for p in model.parameters()) == LLAMA_CONFIGS[name]
    blocks = model.blocks[0]
    assert isinstance(blocks.ln_attn, torch.nn.RMSNorm) and hasattr(blocks.mlp, "gate")
    cost = attention_cost(cfg)
    assert cost["params"] == LLAMA_CONFIGS[name] and cost["attention_macs"] > 0
