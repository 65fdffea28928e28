#!/bin/bash
# cloudtrain: the GPU software a Volta instance (p3, p3dn) installs at boot on Ubuntu 24.04,
# which no current Deep Learning AMI runs. user-data runs this as root after it has armed the
# power-off timers, and says it is done only after this ends; the job starts after that.
#
# THIS FILE IS A TEMPLATE, rendered by cloudtrain's AWS provider (providers/aws/images.py)
# with plain str.replace() of these names, each wrapped in two at-signs on both sides:
#   DRIVER_BRANCH   NVIDIA's driver branch (580: the last that runs Volta)
#   TORCH_INDEX     PyTorch's package index of the CUDA build (12.6: still has sm_70)
#   TORCH_PACKAGES  the pinned torch and torchvision
#   VENV            where they go (the job's Python is VENV/bin/python)
#
# - The driver: Ubuntu's signed, prebuilt kernel modules for the running kernel (no DKMS
#   build, nothing for Secure Boot to refuse) and the headless user-space driver with
#   nvidia-smi, from Ubuntu's restricted archive; then the module is loaded, so no reboot.
# - torch: a virtual environment of the image's python3 (24.04: 3.12), from PyTorch's index.
# Each step is bounded (25 min in all, inside the 30 min the power-off timers leave before
# a job's runtime starts) and an exit code says which failed:
#   11 apt-get update   12 the driver's packages   13 loading the module
#   14 the virtual environment   15 torch
#
# Test-only environment overrides (cloud-init sets none of them):
#   CLOUDTRAIN_UD_TORCH_INDEX   the index torch comes from   (default TORCH_INDEX)
#   CLOUDTRAIN_UD_TORCH_VENV    where the environment goes   (default VENV)
set -u
BRANCH=@@DRIVER_BRANCH@@
INDEX=${CLOUDTRAIN_UD_TORCH_INDEX:-@@TORCH_INDEX@@}
VENV=${CLOUDTRAIN_UD_TORCH_VENV:-@@VENV@@}
# shellcheck disable=SC2206  # the pinned packages are words
PACKAGES=(@@TORCH_PACKAGES@@)
KERNEL=$(uname -r)
step() { printf '%s cloudtrain-software: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

export DEBIAN_FRONTEND=noninteractive
step "NVIDIA driver $BRANCH-server for kernel $KERNEL"
timeout 300 apt-get -q -o DPkg::Lock::Timeout=240 update || exit 11
timeout 600 apt-get -q -y -o DPkg::Lock::Timeout=240 install --no-install-recommends \
    "linux-modules-nvidia-$BRANCH-server-$KERNEL" "nvidia-headless-no-dkms-$BRANCH-server" \
    "nvidia-utils-$BRANCH-server" python3-venv || exit 12
modprobe nvidia || exit 13
nvidia-smi -L || step "nvidia-smi lists no GPU"

step "${PACKAGES[*]} from $INDEX into $VENV"
python3 -m venv "$VENV" || exit 14
timeout 600 "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --index-url "$INDEX" "${PACKAGES[@]}" || exit 15
step "installed"
exit 0
