"""Stochastic depth (Huang et al. 2016), as TorchScale's ``DropPath`` (which needs timm, not installed)."""

from torch import Tensor, nn

__all__ = ["DropPath"]


class DropPath(nn.Module):
    """Zero a residual branch for a random subset of samples during training, rescaling the rest.

    Args:
        drop_prob: probability of dropping the branch for one sample, in [0, 1).

    Input and output: (B, ...) of any float dtype; identity at evaluation or with drop_prob 0.
    """

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"drop path probability must be in [0, 1), got {drop_prob} (--drop-path-rate).")
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.size(0),) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.drop_prob}"
