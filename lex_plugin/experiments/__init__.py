"""Experiments around the library: the one fairseq-train recipe (:mod:`.recipe`), the papers' tables at CPU scale
(:mod:`.reproduce`), the benchmark harness (:mod:`.benchmark`), fairseq-train logs read back and compared
(:mod:`.train_log`), and TorchScale's own attention as a reference (:mod:`.torchscale_reference`)."""
