#!/usr/bin/env bash
# The main job: prepare a real corpus, train lex_lm_tiny with fairseq-train on the CPU for a bounded
# budget, then one fairseq-eval-lm run that prints the length table on the test split (l .. 16l, full
# causal attention and BCA), writes it as JSON, and reports fairseq's own test perplexity at l; finally
# `lex plot` draws perplexity against length (PNG); the step times, validation perplexity and fairseq's own test
# perplexity go to WORK/demo_report.json with their provenance.
#
#   bash scripts/demo.sh [CORPUS_DIR]        (default: ../shared/data/pg, the 49 public-domain books)
#
# Knobs (environment): WORK (output dir, default work/demo), ARCH (lex_lm_tiny), L (tokens per sample,
# 256), MAX_UPDATE (600: ~14 minutes on 2 cores at ~3.0k tokens/s), BSZ (16 samples per update),
# LR (1.5e-3), EVAL_TOKENS (first 100000 test tokens for the length table; 0 = all),
# EXTRA_TRAIN_ARGS (appended to the fairseq-train command of lex train). Re-running resumes from
# WORK/checkpoints/checkpoint_last.pt and reuses the prepared data-bin.
# Every fairseq command is printed before it runs, so it can be copied and scaled (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

CORPUS=${1:-../shared/data/pg}
WORK=${WORK:-work/demo}
ARCH=${ARCH:-lex_lm_tiny}
L=${L:-256}
MAX_UPDATE=${MAX_UPDATE:-600}
EVAL_TOKENS=${EVAL_TOKENS:-100000}
BSZ=${BSZ:-16}
LR=${LR:-1.5e-3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}

DATA=$WORK/data-bin
CKPT=$WORK/checkpoints
mkdir -p "$WORK"
run() { printf '\n+ %s\n' "$*"; "$@"; }
start=$(date +%s)

if [ ! -f "$DATA/lex_prepare.json" ]; then
  run lex prepare "$CORPUS" "$DATA" --workers "$(nproc)"
else
  echo "data-bin already prepared: $DATA"
fi
prepared=$(date +%s)

# the project's fairseq-train recipe (lex_plugin/experiments/recipe.py); lex train prints the whole command first
run lex train "$DATA" "$CKPT" --arch "$ARCH" --tokens-per-sample "$L" --batch-size "$BSZ" --lr "$LR" \
  --max-update "$MAX_UPDATE" --warmup-updates 70 --save-interval-updates 100 --validate-interval-updates 300 \
  --log-file "$WORK/train.log" \
  ${EXTRA_TRAIN_ARGS:-}
trained=$(date +%s)

LENGTHS="$L,$((2 * L)),$((4 * L)),$((8 * L)),$((16 * L))"
run fairseq-eval-lm "$DATA" \
  --user-dir lex_plugin --task lex_language_modeling \
  --path "$CKPT/checkpoint_last.pt" --gen-subset test \
  --tokens-per-sample "$L" --sample-break-mode none --batch-size 16 --num-workers 0 \
  --eval-lengths "$LENGTHS" --eval-windows full,bca --eval-tokens "$EVAL_TOKENS" \
  --report-json "$WORK/length_report.json" \
  2>&1 | tee "$WORK/eval_test.log"

run lex plot "$WORK/length_report.json" -o "$WORK/ppl_vs_length.png" --title "$ARCH, l = $L: test perplexity vs length"

end=$(date +%s)
# what was measured besides the length table (step times, validation perplexity, fairseq's test perplexity), with
# its provenance: the walkthrough's "Measured" tables read the committed copy (scripts/results.py)
run python scripts/demo_report.py "$WORK/train.log" --step prepare=$((prepared - start)) \
  --step train=$((trained - prepared)) --step evaluate=$((end - trained)) --eval-log test="$WORK/eval_test.log" \
  -o "$WORK/demo_report.json"
echo
echo "demo finished in $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s (training + preparation: $(( (trained - start) / 60 )) min)"
echo "length table (first $EVAL_TOKENS test tokens): $WORK/length_report.json, plot: $WORK/ppl_vs_length.png"
sed -n '/^Length-stratified/,/^$/p' "$WORK/eval_test.log"
echo "fairseq-eval-lm on the whole test split at l = $L:"
grep -E "Evaluated|Loss \(base 2\)" "$WORK/eval_test.log" | sed 's/^.*| INFO | fairseq_cli.eval_lm | /  /'
