"""``--optimizer torch_adamw``: fairseq's ``adam`` semantics on ``torch.optim.AdamW``'s multi-tensor kernels.

fairseq's ``adam`` runs apex's FusedAdam when apex is installed and a GPU is present; otherwise a
Python loop over parameters (``fairseq.optim.adam.Adam``). This optimizer takes the same options
(``--adam-betas --adam-eps --weight-decay --lr``) and the same update, decoupled weight decay included
(fairseq's Adam is AdamW: p <- p - lr * wd * p, then the Adam step; Loshchilov & Hutter 2019), on
``torch.optim.AdamW`` with ``fused=True`` when every parameter is on CUDA and ``foreach=True``
otherwise. The one difference is where eps enters: torch divides by sqrt(v_hat) + eps, fairseq by
sqrt(v) + eps with the bias correction folded into the step size, i.e. fairseq's eps is torch's
eps * sqrt(1 - beta2^t); both are negligible next to sqrt(v) after a few steps (tested: 20 updates on
real text track fairseq's adam).

With ``--fp16`` fairseq keeps fp32 master weights and this optimizer steps those. It does not support
``--memory-efficient-fp16`` (AdamW would keep its moments in fp16); fairseq says so and names the
option to change.
"""

import ast
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

__all__ = ["TorchAdamW", "TorchAdamWConfig"]


@dataclass
class TorchAdamWConfig(FairseqDataclass):
    """The options of fairseq's ``adam``, so switching is one flag."""

    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay (as fairseq's adam)"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("torch_adamw", dataclass=TorchAdamWConfig)
class TorchAdamW(FairseqOptimizer):
    """fairseq wrapper of ``torch.optim.AdamW`` (fused on CUDA, foreach on CPU).

    Raises:
        ValueError: betas that are not two numbers in [0, 1).
    """

    def __init__(self, cfg: TorchAdamWConfig, params):
        super().__init__(cfg)
        params = list(params)
        tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
        on_cuda = bool(tensors) and all(p.is_cuda for p in tensors)
        kwargs = self.optimizer_config
        betas = kwargs["betas"]
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"--adam-betas takes two numbers in [0, 1), e.g. '(0.9, 0.98)'; got {cfg.adam_betas!r}.")
        self._optimizer = torch.optim.AdamW(params, fused=on_cuda or None, foreach=None if on_cuda else True, **kwargs)

    @property
    def optimizer_config(self):
        """lr, betas, eps, weight_decay: the kwargs that override those stored in a checkpoint on resume."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        betas = self.cfg.adam_betas
        if isinstance(betas, str):
            betas = ast.literal_eval(betas)
        elif not isinstance(betas, (tuple, list)):
            betas = OmegaConf.to_container(betas)
        return {"lr": lr, "betas": tuple(float(b) for b in betas), "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay}

    @property
    def supports_flat_params(self):
        """fairseq's --fp16 may hand one flat fp32 master tensor."""
        return True

    @property
    def supports_memory_efficient_fp16(self):
        """False: moments would be kept in the parameters' fp16."""
        return False
