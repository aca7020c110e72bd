#!/usr/bin/env bash
# Run tests under another torch than .venv's, e.g. torch 2.11, which the GPU machines here run (CI tests 2.13):
#
#   bash scripts/test_with_torch.sh 2.11.0 trainers_tests/distributed -n 2
#
# scripts/test_with.sh for one torch: a virtual environment .venv-torch<VERSION> (ignored by git), made once, holding
# only that torch (PyPI's wheel, a CUDA build that also runs on a CPU: about 3 GB with its nvidia-* wheels) over
# .venv's other packages; then `python -m pytest` there with the other arguments. The whole suite under torch 2.11
# took 18.5 minutes on 2 cores (2026-11-28).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:?usage: bash scripts/test_with_torch.sh TORCH_VERSION [pytest arguments]}
shift
VENV=.venv-torch$VERSION exec bash scripts/test_with.sh "torch==$VERSION" "$@"
