#!/usr/bin/env bash
# What this project needs on a GPU machine that has CUDA, Python 3.12 and its own CUDA build of torch but no route to
# PyPI and no corpus: the Python packages as wheels and a prepared data-bin, put together here in .gpu/ (ignored by
# git; about 49 MB), copied there with the checkout, and installed beside the machine's torch (never replacing it).
#
#   bash scripts/gpu_env.sh download                # here, with PyPI: .gpu/whl/ (about 40 MB)
#   bash scripts/gpu_env.sh pack data-bin/pg        # here: .gpu/data-bin.tar.xz (train and test splits, 8.6 MB for pg)
#   source scripts/gpu_env.sh install               # there, from the repository root: /tmp/site on PYTHONPATH and
#                                                   # PATH, the data-bin unpacked at /tmp/data-bin
#
# What `install` does, and why (examples/lex_lm/GPU.md, runs 1 and 2):
#   - fairseq-fixed 0.12.3.1 (its cp312 wheel), hydra-core, omegaconf, antlr4 (built here from its sdist), bitarray, torchscale 0.3.0
#     and sacremoses go to /tmp/site with --no-deps: the machine's torch, torchaudio, sentencepiece, regex, tqdm,
#     sacrebleu and click are used as they are.
#   - numpy 1.26.4 goes first on the path: fairseq 0.12 needs numpy < 2 (the machine's is 2.x).
#   - scikit-learn and SciPy on such an image are built for numpy 2 and fail to import under numpy 1.26; fairseq
#     imports them at start-up for tasks this project never runs, so empty stand-ins (/tmp/site-stubs) take their place.
# It ends by importing fairseq and lex_plugin and printing the versions; a failure stops there with the error.


WHEELS=(fairseq-fixed==0.12.3.1 numpy==1.26.4 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 torchscale==0.3.0
        sacremoses==0.2.0)
SDISTS=(antlr4-python3-runtime==4.9.3)

gpu_env_exclude() {
  mkdir -p .gpu
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
}

gpu_env_download() {
  gpu_env_exclude
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .gpu/whl "${WHEELS[@]}"
  # antlr4's runtime comes as an sdist only: built into a pure-Python wheel here, so nothing is built there
  python3 -m pip wheel -q --no-deps -w .gpu/whl "${SDISTS[@]}"
  du -sh .gpu/whl
}

gpu_env_pack() {  # the data-bin's dictionary, tokenizer, train and test splits (valid is not read: no validation)
  local bin=${1:?usage: bash scripts/gpu_env.sh pack DATA_BIN} name
  name=$(basename "$bin")
  for f in dict.txt train.bin train.idx test.bin test.idx; do
    [ -f "$bin/$f" ] || { echo "[gpu_env] $bin/$f is missing: give a data-bin made by lex prepare" >&2; return 1; }
  done
  gpu_env_exclude
  (cd "$(dirname "$bin")" && set -o pipefail && shopt -s nullglob &&
   tar --transform "s|^$name|data-bin|" -cf - "$name"/{dict.txt,lex_prepare.json,spm.model,spm.vocab} "$name"/train.* \
     "$name"/test.* | xz -T0 -6) > .gpu/data-bin.tar.xz || { rm -f .gpu/data-bin.tar.xz; return 1; }
  du -sh .gpu/data-bin.tar.xz
}

gpu_env_install() {
  local site=/tmp/site stubs=/tmp/site-stubs
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    .gpu/whl/*.whl || return 1
  if [ -f .gpu/data-bin.tar.xz ]; then tar -C /tmp -xJf .gpu/data-bin.tar.xz || return 1; fi
  mkdir -p "$stubs/sklearn" "$stubs/scipy"
  : > "$stubs/sklearn/__init__.py"
  : > "$stubs/scipy/__init__.py"
  export PYTHONPATH="$site:$stubs:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"
  python3 - <<'EOF' || return 1
import numpy, torch, fairseq, lex_plugin, torchscale
print(f"[gpu_env] torch {torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}), "
      f"numpy {numpy.__version__}, fairseq {fairseq.__version__}, lex_plugin from {lex_plugin.__file__}")
EOF
  for tool in fairseq-train fairseq-eval-lm; do
    command -v "$tool" >/dev/null || { echo "[gpu_env] $tool is not on PATH"; return 1; }
  done
}

case "${1:-}" in
  download) gpu_env_download ;;
  pack) gpu_env_pack "${2:-}" ;;
  install) gpu_env_install ;;
  *) echo "usage: bash scripts/gpu_env.sh download | pack DATA_BIN; source scripts/gpu_env.sh install" >&2 ;;
esac
