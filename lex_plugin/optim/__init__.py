"""Registered fairseq optimizers of the plugin."""

from .torch_adamw import TorchAdamW, TorchAdamWConfig

__all__ = ["TorchAdamW", "TorchAdamWConfig"]
