#!/usr/bin/env bash
# Idempotent set-up of the project's virtual environment (used by `make install`).
#   VENV=.venv            where the environment lives
#   TORCH_SPEC=torch==2.13.0   what to install when the venv has no torch yet (a GPU user may point
#                         this at a CUDA build, or pre-install torch in the venv: it is kept as is)
#   EXTRAS=test,fsdp,hf   setup.py extras to install (test: pytest; fsdp: fairscale for
#                         --ddp-backend fully_sharded; hf: transformers and safetensors, against which
#                         the RoPE scalings are tested); EXTRAS=test leaves the others out
# The installed torch is pinned as a pip constraint for every later step and checked at the end:
# an install must never change it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PY=${PYTHON:-python3}
EXTRAS=${EXTRAS-test,fsdp,hf}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
torch_version() { "$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null; }

if ! before=$(torch_version); then
  echo "[install] installing $TORCH_SPEC"
  pip install -q "$TORCH_SPEC"
  before=$(torch_version)
fi
constraints="$VENV/torch-constraint.txt"
echo "torch==$before" > "$constraints"
echo "[install] torch $before (pinned: $constraints)"

pip install -q -c "$constraints" -e ".[$EXTRAS]"
# torchscale's own pins (timm -> torchvision) would replace torch: take the package alone.
pip install -q --no-deps torchscale==0.3.0

after=$(torch_version)
if [ "$after" != "$before" ]; then
  echo "[install] ERROR: torch changed from $before to $after during the install" >&2
  exit 1
fi
"$VENV/bin/python" -c 'import fairseq, torchscale.architecture.config, sacremoses, sentencepiece, click, matplotlib, tensorboardX, lex_plugin' 2>/dev/null
echo "[install] ok: torch $after, $("$VENV/bin/python" -c 'import fairseq; print("fairseq", fairseq.__version__)' 2>/dev/null)"
