#!/usr/bin/env bash
# Makes .deps/ (git-ignored) for a GPU host without network: Debian's
# libjpeg-turbo, libpng, GoogleTest, CLI11 and Fashion-MNIST (for
# examples/mlp_amp's tests: on the host, copy
# .deps/usr/share/datasets/fashion-mnist to /usr/share/datasets/) unpacked
# with dpkg -x, and PyPI's nvidia-nvjpeg under .deps/nvjpeg. Run on a
# machine with network, from the repository root; then pass carry [".deps"]
# with each device call (tools/gpu/issue25.sh uses it).
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
rm -rf "$D/debs"
du -sh "$D"
