#!/usr/bin/env bash
# The prepared call of a GPU session (examples/lex_lm/GPU.md, "Prepared for the next GPU session"), from the repository
# root with .gpu/ beside it (scripts/gpu_env.sh download, pack): install, the paper's Table 2 at l = 1,024
# (scripts/paper_table2.py), then, in the time left, the owed checks of scripts/gpu_checks.py (the generation step's
# paths timed, and token by token against parallel on each of them).
#
#   bash scripts/gpu_call.sh OUTDIR [SECONDS]     # SECONDS: this script's whole budget (default 480)
#
# OUTDIR receives table2.md, table2.json, table2.log, gpu_checks.json and gpu_checks.log, each written as it grows.
# CHECKS_S (default 90) is the time kept for the checks; with less than 60 s left they are skipped.
out=${1:?usage: bash scripts/gpu_call.sh OUTDIR [SECONDS]}
budget=${2:-480}
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
mkdir -p "$out"
source scripts/gpu_env.sh install || { echo "[gpu_call] install failed"; exit 1; }
export PYTHONUNBUFFERED=1
python3 scripts/paper_table2.py --data-bin /tmp/data-bin --work /tmp/table2 --out "$out" \
  --deadline-s $(( $(left) - ${CHECKS_S:-90} )) 2>&1 | tee "$out/table2.log"
rest=$(left)
if [ "$rest" -ge 60 ]; then
  python3 scripts/gpu_checks.py --out "$out" --sections env,generation,equality --budget-s $(( rest - 10 )) \
    > "$out/gpu_checks.log" 2>&1
  tail -3 "$out/gpu_checks.log"
else
  echo "[gpu_call] $rest s left: the checks are skipped"
fi
echo "[gpu_call] done after $(( $(date +%s) - start )) s"
