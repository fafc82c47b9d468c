"""TorchScale's own attention as an independent reference, for the tests and the benchmark: its
``MultiheadAttention`` (bmm + softmax over an L x L mask, its ``XPOS``) loaded with a ``LexSelfAttention``'s
weights (the parameter names are TorchScale's)."""

import argparse

import torch
from torch import Tensor

__all__ = ["torchscale_attention", "use_reference_attention"]


def torchscale_attention(ours, scale_base: float = 512.0):
    """TorchScale's ``MultiheadAttention`` with the weights of ``ours`` (a ``LexSelfAttention``), in eval mode.

    Raises:
        ValueError: the weights do not map one to one (anything but TorchScale's recomputed ``xpos.scale``).
    """
    from torchscale.component.multihead_attention import MultiheadAttention

    args = argparse.Namespace(multiway=False, layernorm_eps=1e-5, xpos_rel_pos=True, xpos_scale_base=scale_base)
    ref = MultiheadAttention(args, ours.embed_dim, ours.num_heads, self_attention=True, subln=ours.inner_attn_ln is not None)
    loaded = ref.load_state_dict(ours.state_dict(), strict=False)
    if set(loaded.missing_keys) != {"xpos.scale"} or loaded.unexpected_keys:
        raise ValueError(f"TorchScale's attention does not take these weights: missing {loaded.missing_keys}, "
                         f"unexpected {loaded.unexpected_keys}.")
    return ref.eval()


def use_reference_attention(model) -> None:
    """Run every layer of a lex_lm ``model`` through :func:`torchscale_attention` (same weights), called as
    TorchScale's ``Decoder`` calls it: a causal L x L float mask. For the benchmark's reference rows: the
    model is changed in place (its layers' ``forward``), so use a model built for it."""
    for layer in model.decoder.layers:
        ref = torchscale_attention(layer.self_attn, model.decoder.positions[0].scale_base)

        def forward(x: Tensor, *args, _ref=ref, **kwargs) -> Tensor:
            length = x.size(1)
            mask = torch.triu(torch.full((length, length), float("-inf"), dtype=x.dtype), 1)
            return _ref(x, x, x, attn_mask=mask)[0]

        layer.self_attn.forward = forward
