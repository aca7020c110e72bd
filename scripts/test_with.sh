#!/usr/bin/env bash
# Run tests with some packages at other versions than .venv's, over .venv's others. What vLLM users install
# (`pip install "trl-variants[vllm]"` resolves transformers 5.17.0 and huggingface-hub 1.33.0, results/install/vllm.txt):
#
#   bash scripts/test_with.sh transformers==5.17.0,huggingface-hub==1.33.0 trainers_tests -n 2
#
# The first argument is a comma-separated list of pip requirements. Makes a virtual environment for them once
# (.venv-with-<the list>, ignored by git; VENV=<path> names another): those packages, with whatever they need that
# pip picks, over .venv's site-packages (a .pth file adds them after the venv's own, so the venv's come first), with
# .venv's console scripts (accelerate, trl-variants, ...) pointed at its python and its compiled tools (ruff) linked.
# Then runs `python -m pytest` there with the other arguments, offline as the README's test command does, after
# printing the versions that import. Run scripts/setup_env.sh first (it makes .venv). scripts/test_with_torch.sh is
# this script for one torch version.
set -euo pipefail
cd "$(dirname "$0")/.."
SPECS=${1:?usage: bash scripts/test_with.sh REQUIREMENT[,REQUIREMENT...] [pytest arguments]}
shift
[ -x .venv/bin/python ] || { echo "test_with: no .venv here: run bash scripts/setup_env.sh first" >&2; exit 1; }
IFS=, read -r -a REQUIREMENTS <<< "$SPECS"
VENV=${VENV:-.venv-with-$(echo "$SPECS" | tr -c 'A-Za-z0-9.=_-' '_' | sed 's/==/-/g; s/_*$//')}
if [ ! -f "$VENV/.ready" ]; then
    rm -rf "$VENV"
    .venv/bin/python -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "${REQUIREMENTS[@]}"
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
    echo "$SPECS" > "$VENV/.ready"
fi
"$VENV/bin/python" - "${REQUIREMENTS[@]}" <<'PY'
import importlib, re, sys
for requirement in sys.argv[1:]:
    name = re.split(r"[<>=!~ \[]", requirement, maxsplit=1)[0]
    module = importlib.import_module(name.replace("-", "_"))  # torch.__version__ names the build (2.11.0+cu130)
    print(f"test_with: {name} {module.__version__} from {module.__file__}")
PY
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
