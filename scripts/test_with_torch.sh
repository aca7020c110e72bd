#!/usr/bin/env bash
# Run tests under another torch than .venv's, e.g. torch 2.11, which the GPU machines here run (CI tests 2.13):
#
#   bash scripts/test_with_torch.sh 2.11.0 trainers_tests/distributed -n 2
#
# Makes .venv-torch<VERSION> (ignored by git) once: a virtual environment holding only that torch (PyPI's wheel, a
# CUDA build that also runs on a CPU: about 3 GB with its nvidia-* wheels) over .venv's other packages (a .pth file
# adds .venv's site-packages after its own, so its torch comes first), with .venv's console scripts (accelerate,
# trl-variants, ...) pointed at its python and its compiled tools (ruff) linked. Then runs `python -m pytest` there
# with the other arguments, offline as the README's test command does. Run scripts/setup_env.sh first (it makes
# .venv). The whole suite under torch 2.11 took 18.5 minutes on 2 cores (2026-11-28).
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
    # the venv's own setuptools predates pyproject.toml's license field: .venv's builds the wheel tests' wheels
    "$VENV/bin/python" -m pip uninstall -y -q setuptools 2>/dev/null || true
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$(cd "$main_site" && pwd)')" > "$site/zz_main_venv.pth"
    for script in .venv/bin/*; do  # .venv's Python console scripts, on this venv's python
        name=$(basename "$script")
        [ -e "$VENV/bin/$name" ] && continue
        if head -1 "$script" | grep -q "^#!.*/\.venv/bin/python"; then
            { echo "#!$(pwd)/$VENV/bin/python"; tail -n +2 "$script"; } > "$VENV/bin/$name"
            chmod +x "$VENV/bin/$name"
        elif [ -f "$script" ] && [ -x "$script" ] && head -c 4 "$script" | grep -q "ELF"; then
            ln -s "$(pwd)/$script" "$VENV/bin/$name"  # a compiled tool (ruff)
        fi
    done
    touch "$VENV/.ready"
fi
"$VENV/bin/python" -c "import torch; print('test_with_torch: torch', torch.__version__, 'from', torch.__file__)"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
