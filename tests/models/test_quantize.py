"""Weight-only int8 models: every linear layer swapped, logits equal to the same model with
the dequantized weights (so the int8 path adds nothing beyond the quantization), close to the
float model's, in float32 and bfloat16, for attnlab's models and a Hugging Face one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnlab.models import DecoderLM, ModelConfig
from attnlab.models.quantize import Int8Linear, quantize_linears
from attnlab.utils.testing import rel_rms_error


def dequantized(model: nn.Module) -> nn.Module:
    """A copy of an int8 ``model`` with every :class:`Int8Linear` back as an ``nn.Linear``
    holding ``q * scale``."""
    out = copy.deepcopy(model)
    for name, module in list(out.named_modules()):
        if isinstance(module, Int8Linear):
            linear = nn.Linear(module.in_features, module.out_features,
                               bias=module.bias is not None, dtype=module.scale.dtype)
            with torch.no_grad():
                linear.weight.copy_(module.q.to(module.scale.dtype) * module.scale[:, None])
                if module.bias is not None:
                    linear.bias.copy_(module.bias)
            parent, _, child = name.rpartition(".")
            setattr(out.get_submodule(parent), child, linear)
    return out


def small_lm() -> DecoderLM:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=97, d_model=64, n_layers=2, d_ff=128, max_seq_len=64,
                         attention={"n_heads": 4})
    return DecoderLM(config).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int8_model_is_its_dequantized_self(dtype):
    model = small_lm().to(dtype)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    int8 = copy.deepcopy(model)
    assert quantize_linears(int8) == linears > 0
    assert not any(isinstance(m, nn.Linear) for m in int8.modules())
    ids = torch.randint(0, 97, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, float_logits = int8(ids).logits, model(ids).logits
        reference = dequantized(int8)(ids).logits
    assert logits.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
    assert rel_rms_error(reference, logits) < tolerance
    assert rel_rms_error(float_logits, logits) < 0.05  # 8 bits per (random) weight
    if dtype == torch.float32:  # bfloat16's own rounding is as coarse as int8's
        assert rel_rms_error(float_logits, logits) > 100 * tolerance  # it is quantized


def test_quantize_keeps_what_it_is_told_and_refuses_a_bare_linear():
    model = small_lm()
    kept = quantize_linears(model, keep=lambda name, linear: linear.out_features == 97)
    heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert kept > 0 and len(heads) == 1 and heads[0].out_features == 97
    with pytest.raises(ValueError, match="bare nn.Linear"):
        quantize_linears(nn.Linear(4, 4))


def test_a_hugging_face_model_quantized():
    pytest.importorskip("transformers")
    from attnlab.bench.hf import tiny_llama

    model = tiny_llama()
    int8 = copy.deepcopy(model)
    assert quantize_linears(int8) == 4 * 7 + 1  # q, k, v, o, gate, up, down; the head
    ids = torch.randint(0, 2048, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel_rms_error(model(ids).logits, int8(ids).logits) < 0.05
        assert rel_rms_error(dequantized(int8)(ids).logits, int8(ids).logits) < 1e-5
