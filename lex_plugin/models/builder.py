"""A randomly initialised lex_lm built the way fairseq-train builds it (for tests and benchmarks)."""

import argparse
from typing import Optional, Tuple

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY

from .lex_lm import LexLanguageModel

__all__ = ["build_random_lm"]


def build_random_lm(
    arch: str = "lex_lm_tiny",
    dictionary: Optional[Dictionary] = None,
    vocab_size: int = 100,
    tokens_per_sample: int = 32,
    seed: int = 0,
    **overrides,
) -> Tuple[LexLanguageModel, Dictionary]:
    """Build a lex_lm with random weights as fairseq-train would: an argparse Namespace of the options,
    the registered architecture's defaults filled in (``ARCH_CONFIG_REGISTRY[arch]``), then
    ``LexLanguageModel.build_model(args, task)`` with a task that holds only the dictionary.

    Args:
        arch: a registered ``lex_lm_*`` architecture.
        dictionary: the vocabulary; when None, a fairseq ``Dictionary`` with fairseq's special symbols and
            ``vocab_size`` more symbols ``w0 .. w{vocab_size - 1}``.
        vocab_size: the number of ordinary symbols of that dictionary (ignored when ``dictionary`` is given).
        tokens_per_sample: ``--tokens-per-sample``, the training length l.
        seed: the ``torch.manual_seed`` set just before the weights are initialised (same seed, same weights).
        **overrides: any other model option, as its argparse destination (``pos_emb="rope"``,
            ``share_decoder_input_output_embed=True``, ``decoder_layers=2``, ...); the architecture fills in
            only what is not given.

    Returns:
        (model, dictionary): the model in eval mode, fp32, on the CPU, and its dictionary.

    Raises:
        KeyError: ``arch`` is not a registered architecture.
    """
    if dictionary is None:
        dictionary = Dictionary()
        for i in range(vocab_size):
            dictionary.add_symbol(f"w{i}")
    args = argparse.Namespace(arch=arch, tokens_per_sample=tokens_per_sample, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(seed)
    model = LexLanguageModel.build_model(args, task)
    model.eval()
    return model, dictionary
