#!/usr/bin/env bash
# Run tests under another torch than .venv's, e.g. torch 2.11, which the GPU machines here run (CI tests 2.13):
#
#   bash scripts/test_with_torch.sh 2.11.0 trainers_tests/distributed -n 2
#
# Makes .venv-torch<VERSION> (ignored by git) once: a virtual environment holding only that torch (PyPI's wheel, a
# CUDA build that also runs on a CPU: about 3 GB with its nvidia-* wheels) over .venv's other packages (a .pth file
# adds .venv's site-packages after its own, so its torch comes first), with .venv's console scripts (accelerate,
# trl-variants, ...) pointed at its python. Then runs `python -m pytest` there with the other arguments, offline as
# the README's test command does. Run scripts/setup_env.sh first (it makes .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:?usage: bash scripts/test_with_torch.sh TORCH_VERSION [pytest arguments]}
shift
[ -x .venv/bin/python ] || { echo "test_with_torch: no .venv here: run bash scripts/setup_env.sh first" >&2; exit 1; }
VENV=.venv-torch$VERSION
if [ ! -f "$VENV/.ready" ]; then
    rm -rf "$VENV"
    .venv/bin/python -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "torch==$VERSION"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$(cd "$main_site" && pwd)')" > "$site/zz_main_venv.pth"
    for script in .venv/bin/*; do  # .venv's Python console scripts, on this venv's python
        name=$(basename "$script")
        [ -e "$VENV/bin/$name" ] && continue
        head -1 "$script" | grep -q "^#!.*/\.venv/bin/python" || continue
        { echo "#!$(pwd)/$VENV/bin/python"; tail -n +2 "$script"; } > "$VENV/bin/$name"
        chmod +x "$VENV/bin/$name"
    done
    touch "$VENV/.ready"
fi
"$VENV/bin/python" -c "import torch; print('test_with_torch: torch', torch.__version__, 'from', torch.__file__)"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
