"""lex_plugin: a fairseq user-dir plugin for the LeX Transformer (xPos + blockwise causal attention).

Install with `make install` (see README.md), not with a bare `pip install .`:

* torch is *not* pinned here beyond a floor. Any CUDA build >= 2.1 on a GPU machine, or the local
  2.13.0 CPU wheel, is used as installed; scripts/install.sh pins the installed version as a pip
  constraint so nothing below can replace it.
* torchscale==0.3.0 is installed by scripts/install.sh with --no-deps: its own requirements
  (timm -> torchvision) would pull a torch of their choosing (a multi-GB CUDA build). Only
  torchscale.architecture.config and torchscale.component.* are used, which need nothing beyond torch.
* fairseq comes as fairseq-fixed==0.12.3.1 (fairseq 0.12.2 with Python 3.11 fixes); plain
  fairseq==0.12.2 does not import on Python 3.11.
* numpy<2: fairseq 0.12's --sample-break-mode eos crashes on numpy 2.
* tensorboardX is what fairseq's --tensorboard-logdir writes with (no TensorFlow, no torch pin).
* fairscale (extra ``fsdp``) is fairseq's FSDP implementation (--ddp-backend fully_sharded); optional.
  torchscale 0.3.0 pins fairscale==0.4.0, which pip reports as a conflict: only torchscale's config and
  components are used here, which do not import fairscale.
* apex is optional and never from PyPI (the PyPI "apex" is an unrelated package): build it from
  NVIDIA's source on GPU machines; fairseq then uses its fused Adam and LayerNorm.
"""

from setuptools import find_packages, setup

setup(
    name="lex_plugin",
    version="0.2.0",
    description="LeX Transformer (xPos, blockwise causal attention) for fairseq",
    packages=find_packages(include=["lex_plugin", "lex_plugin.*"]),
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.1",
        "fairseq-fixed==0.12.3.1",
        "numpy<2",
        "sacremoses",
        "sentencepiece",
        "click",
        "matplotlib",
        "tqdm",
        "tensorboardX",  # fairseq-train --tensorboard-logdir
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist"],
        # fairseq-train --ddp-backend fully_sharded (FSDP); scripts/install.sh installs it unless EXTRAS says otherwise
        "fsdp": ["fairscale==0.4.13"],
        # Hugging Face: lex export-hf, the exported model and tokenizer, the lm-evaluation-harness tasks (lm-eval's ruler
        # extra: nltk, wonderwords, scipy, for scripts/lm_eval_ruler.py); the RoPE
        # scalings are tested against transformers' own functions. pyarrow (datasets, under lm-eval) is held
        # below 22, whose wheels need numpy 2 (fairseq 0.12 needs numpy < 2); accelerate is lm-eval's hf model's;
        # longppl, the LongPPL authors' package, is what scripts/crosscheck_longppl.py compares against.
        "hf": ["transformers>=4.56,<5", "huggingface_hub", "safetensors", "lm-eval[ruler]>=0.4.5,<0.5", "accelerate", "pyarrow>=15,<22",
               "longppl==0.3.0"],
    },
    entry_points={"console_scripts": ["lex=lex_plugin.cli:main"]},
)
