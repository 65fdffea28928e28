#!/usr/bin/env bash
# Issue 28's GPU figures on a lent one-GPU machine, in one call; everything lands in $OUT.
#
#   OUT=/some/dir bash benchmarks/device_gpu_figures.sh          # the GPU machine
#   OUT=/tmp/x bash benchmarks/device_gpu_figures.sh --cpu       # here: the same steps, tiny
#
# (a) benchmarks/gpu.py --runs 1 for every recipe (CIFAR full size on synthetic data, imagenet
#     tiny on generated JPEGs), then airbench94 with --compile --runs 2: tables and recipe.yaml
#     entries in $OUT/gpu_recipes.txt and $OUT/gpu_compile.txt.
# (c) tests/unit/test_imagenet_dali.py with DALI_TEST_DEVICE=0: the DALI tests (order,
#     sharding, resume, crop geometry, validation geometry against the PIL loader) with the
#     nvJPEG decoder and GPU operators, and the GPU pipeline against the CPU one:
#     $OUT/dali_tests.txt (first: cheap).
# (b) benchmarks/imagenet_gpu_feed.py: images/s per GPU of the PIL loader (and torchvision's
#     nvjpeg path, and DALI where it imports) at 128 and 224 px, and the data-wait share of a
#     ResNet-50 step, on generated JPEGs: $OUT/feed.txt and $OUT/feed.json.
# Each part runs under its own `timeout` (seconds: C_S, A1_S, A2_S, B_S; the defaults add up
# to 7.5 min with the unpacking), so one stuck part costs only its own figures; each log is in
# $OUT. PARTS picks and orders them (default "c a1 a2 b").
#
# The machine's python3 has torch, torchvision, click, pyyaml, rich, numpy, pillow (no boto3,
# paramiko or DALI; benchmarks/gpu.py imports cloudtrain.catalog, cloudtrain.recipes and
# cloudtrain.host only, which need none of them). DALI: if /tmp/dali/*.whl exist they are
# unpacked into /tmp/site (PYTHONPATH; as `pip install --no-deps --target` would): put there
# the nvidia_dali_cuda130 2.4.0 wheel (199 MB: ship it in chunks) and the dependencies its
# METADATA names that the image lacks. Checked in a bare venv here: `import nvidia.dali` and a
# CPU decode need optree, gast, astunparse and nvidia-nvimgcodec-cu13 (25 MB, the decoders);
# the GPU decode wants nvidia-nvjpeg (4 MB, CUDA 13's libnvjpeg) beside it; makefun, libcst,
# nvtx are for DALI's experimental/dynamic API (small: ship them). Not needed for JPEGs:
# nvidia-libnvcomp-cu13 (28 MB), nvidia-nvjpeg2k-cu13, nvidia-nvtiff-cu13. optree, libcst and
# nvtx are per-Python wheels: the lent H200's python3 is 3.12.3 (torch 2.11.0+cu130,
# torchvision 0.26.0, no optree; seen 2026-11), so cp312. six, packaging, numpy are there.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the figures}"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SMOKE=0
[ "${1:-}" = "--cpu" ] && SMOKE=1
C_S=${C_S:-60}
A1_S=${A1_S:-180}
A2_S=${A2_S:-130}
B_S=${B_S:-70}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

log "start on $(hostname); $($PY -c 'import torch; c = torch.cuda.is_available()
print(torch.__version__, torch.cuda.get_device_name(0) if c else "no GPU")' 2>&1)"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

# Wheels are zip files: unpacked into one folder they merge (pip --target, one wheel at a time,
# skips a wheel whose top folder, nvidia/, is already there). A *.tar.xz is such a folder packed.
if compgen -G "/tmp/dali/*.whl" > /dev/null || compgen -G "/tmp/dali/*.tar.xz" > /dev/null; then
  mkdir -p /tmp/site
  [ -d /tmp/site/nvidia/dali ] && log "DALI already unpacked in /tmp/site" || \
    log "unpacking /tmp/dali/ into /tmp/site"
  [ -d /tmp/site/nvidia/dali ] || for f in /tmp/dali/*.whl /tmp/dali/*.tar.xz; do
    [ -e "$f" ] || continue
    case "$f" in
      *.whl) "$PY" -m zipfile -e "$f" /tmp/site ;;
      *) "$PY" -c 'import sys, tarfile
tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$f" /tmp/site ;;
    esac >> "$OUT/dali_install.log" 2>&1 || log "not unpacked: $(basename "$f")"
  done
  # torch's CUDA wheels make nvidia/ a regular package; this one, first on the path, spans
  # every nvidia/ folder on it (DALI's and torch's), and DALI's decoder finds libnvjpeg.
  echo "__path__ = __import__('pkgutil').extend_path(__path__, __name__)" \
    > /tmp/site/nvidia/__init__.py
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  [ -d /tmp/site/nvidia/cu13/lib ] && \
    export LD_LIBRARY_PATH="/tmp/site/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
"$PY" -c 'import nvidia.dali as d; print("DALI", d.__version__, "from", d.__file__)' \
  > "$OUT/dali_import.log" 2>&1 && log "$(tail -1 "$OUT/dali_import.log")" \
  || log "DALI does not import here: dali_import.log"

if [ "$SMOKE" = 1 ]; then
  GPU_ARGS=(--cpu --recipe resnet9)
  COMPILE_ARGS=(--cpu --recipe airbench94 --runs 1)
  FEED_ARGS=(--cpu --images 24 --sizes 32,48 --batch 8 --steps 3 --arch resnet18)
  DALI_DEVICE=""
else
  GPU_ARGS=()
  COMPILE_ARGS=(--recipe airbench94 --compile --runs 2)
  FEED_ARGS=(--images 384 --batch 128 --steps 30)
  DALI_DEVICE=0
fi

part_c() {
  DALI_TEST_DEVICE=$DALI_DEVICE timeout -s TERM "$C_S" "$PY" -m pytest -q -p no:cacheprovider \
    -o addopts=-ra tests/unit/test_imagenet_dali.py > "$OUT/dali_tests.txt" 2>&1
}
part_a1() {
  timeout -s TERM "$A1_S" "$PY" benchmarks/gpu.py --runs 1 --yaml "${GPU_ARGS[@]}" \
    > "$OUT/gpu_recipes.txt" 2> "$OUT/gpu_recipes.err"
}
part_a2() {
  timeout -s TERM "$A2_S" "$PY" benchmarks/gpu.py --yaml "${COMPILE_ARGS[@]}" \
    > "$OUT/gpu_compile.txt" 2> "$OUT/gpu_compile.err"
}
part_b() {
  timeout -s TERM "$B_S" "$PY" benchmarks/imagenet_gpu_feed.py "${FEED_ARGS[@]}" \
    --json "$OUT/feed.json" > "$OUT/feed.txt" 2> "$OUT/feed.err"
}
# c: DALI against PIL; a1: gpu.py --runs 1, every recipe; a2: airbench94 --compile --runs 2;
# b: the data path's figures
for part in ${PARTS-c a1 a2 b}; do  # PARTS="" : the DALI unpacking alone
  log "($part) start"
  "part_$part"
  log "($part) rc $?"
done
log "done"
