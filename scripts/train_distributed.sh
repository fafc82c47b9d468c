#!/usr/bin/env bash
# Data-parallel fairseq-train, one process per rank, launched by torchrun:
#
#   torchrun --nproc_per_node 2 --no-python scripts/train_distributed.sh DATA-BIN [fairseq-train args ...]
#   torchrun --nnodes 4 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
#       --no-python scripts/train_distributed.sh DATA-BIN [args ...]          # several nodes
#
# torchrun sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; they go to fairseq's own
# distributed path (--distributed-init-method env://, --distributed-no-spawn). Backends: on CPU gloo +
# --ddp-backend legacy_ddp (fairseq's pytorch_ddp / c10d refuse CPU devices); on GPU nccl + pytorch_ddp.
# DIST_BACKEND and DDP_BACKEND override them (e.g. DDP_BACKEND=fully_sharded for FSDP on GPUs).
# The global batch is --batch-size (or --max-tokens) x WORLD_SIZE x --update-freq.
set -euo pipefail
: "${WORLD_SIZE:?run this under torchrun (see the header), which sets WORLD_SIZE, RANK and LOCAL_RANK}"
: "${RANK:?}"
PYTHON=${PYTHON:-python}
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  backend=nccl ddp=pytorch_ddp
else
  backend=gloo ddp=legacy_ddp
fi
exec fairseq-train "$@" \
  --distributed-world-size "$WORLD_SIZE" --distributed-rank "$RANK" --device-id "${LOCAL_RANK:-0}" \
  --distributed-init-method env:// --distributed-no-spawn \
  --distributed-backend "${DIST_BACKEND:-$backend}" --ddp-backend "${DDP_BACKEND:-$ddp}"
