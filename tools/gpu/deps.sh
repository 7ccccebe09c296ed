#!/usr/bin/env bash
# Makes .deps/ (git-ignored) for a GPU host without network: Debian's
# libjpeg-turbo, libpng, GoogleTest, CLI11 and Fashion-MNIST (for
# examples/mlp_amp's tests: on the host, copy
# .deps/usr/share/datasets/fashion-mnist to /usr/share/datasets/) unpacked
# with dpkg -x, PyPI's nvidia-nvjpeg under .deps/nvjpeg and the headers of
# PyPI's nvidia-cudnn-frontend under .deps/cudnn_frontend/include (lamp's
# cmake/FindCudnnFrontend.cmake looks there), and PyPI's torchao wheel under
# .deps/wheels (benchmarks/gpt2.py --precision fp8; tools/gpu/gpt2_bench.sh
# unpacks it on the host). Run on a
# machine with network, from the repository root; then pass carry [".deps"]
# with each device call (tools/gpu/build.sh uses it).
set -euo pipefail
D=$PWD/.deps
mkdir -p "$D/debs"
(
  cd "$D/debs"
  apt-get download libjpeg62-turbo libjpeg62-turbo-dev libjpeg-dev \
    libpng16-16 libpng-dev libgtest-dev libcli11-dev \
    dataset-fashion-mnist
  for f in *.deb; do dpkg -x "$f" "$D"; done
)
python3 -m pip install --quiet --no-deps --target "$D/nvjpeg" \
  "nvidia-nvjpeg==${NVJPEG_VERSION:-13.*}"
python3 -m pip download --quiet --no-deps --dest "$D/debs" \
  "nvidia-cudnn-frontend==${CUDNN_FRONTEND_VERSION:-1.32.0}"
rm -rf "$D/cudnn_frontend"
mkdir -p "$D/cudnn_frontend"
python3 -m zipfile -e "$D"/debs/nvidia_cudnn_frontend-*.whl "$D/debs/fe"
mv "$D/debs/fe/include" "$D/cudnn_frontend/include"
rm -rf "$D/debs"
# NOTE: the wheel (3 MB), not an install (26 MB): device calls carry at
# most 64 MiB.
mkdir -p "$D/wheels"
python3 -m pip download --quiet --no-deps --dest "$D/wheels" \
  "torchao==${TORCHAO_VERSION:-0.18.0}"
du -sh "$D"
