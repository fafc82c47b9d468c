"""A binarized split of a data-bin as one token stream."""

from pathlib import Path
from typing import Optional, Union

import torch
from fairseq.data import data_utils

__all__ = ["split_stream"]


def split_stream(data_dir: Union[str, Path], split: str, dictionary, dataset_impl: Optional[str] = None) -> torch.Tensor:
    """The whole split as one token stream, in the order fairseq's ``--sample-break-mode none`` reads it
    (every sentence of the split, end-of-sentence symbols included, one after another).

    Args:
        data_dir: the data-bin directory (one directory, not fairseq's colon-separated list).
        split: the split's name (``train``, ``valid``, ``test``, ...), as in ``DATA_DIR/SPLIT.{bin,idx}``.
        dictionary: the fairseq ``Dictionary`` of the data-bin.
        dataset_impl: fairseq's ``--dataset-impl`` (``mmap``, ``lazy``, ``cached``, ``raw``); None infers it
            from the files.

    Returns:
        (T,) int64 tensor, T the number of tokens in the split (0 for an empty split).

    Raises:
        FileNotFoundError: the split is not in ``data_dir``.
    """
    dataset = data_utils.load_indexed_dataset(str(Path(data_dir) / split), dictionary, dataset_impl)
    if dataset is None:
        raise FileNotFoundError(f"split {split!r} not found in {data_dir}")
    if len(dataset) == 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([dataset[i].long() for i in range(len(dataset))])
