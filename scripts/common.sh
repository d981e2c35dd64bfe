# Shared by scripts/run, scripts/test, scripts/gpu-check. Source it; don't run it.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The interpreter first on PATH (or $PYTHON). scripts/test and scripts/run switch $PY to the
# project's own virtual environment (use_venv below) before they install anything; gpu-check,
# ncu-compare and sm90-ab keep this one: on the GPU machines torch lives in a venv of its own.
PY=${PYTHON:-python3}
VENV=${FLASHATTN_VENV:-$root/.venv}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }
has_nvcc() { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }

# Configure + build the C++ library, tests and bench into $1 with extra CMake args, from the
# sources at $SRC (default: this checkout; an A/B of a copied tree must set it, or it builds this one).
build_cpp() {
  local dir=$1; shift
  export PATH="$PATH:/usr/local/cuda/bin"
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  cmake -S "${SRC:-$root}" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

# Create (once) and switch to the project-local virtual environment $VENV (.venv/, git-ignored):
# whatever scripts/test and scripts/run install goes there, never into the global interpreter.
# It is made with --system-site-packages so that a torch already installed for that interpreter
# (1-2 GB with its CUDA libraries) is reused rather than downloaded again; what the venv itself
# installs takes precedence. A venv's packages are not "system" ones to a venv made from it, so
# when $PYTHON/python3 is itself a venv (a GPU machine's torch venv), a .pth file adds its
# site-packages the same way.
use_venv() {
  local base=${PYTHON:-python3}
  if ! "$VENV/bin/python" -c "" 2>/dev/null; then
    echo "[venv] creating $VENV from $(command -v "$base") (reuses its packages, e.g. torch)"
    rm -rf "$VENV"
    if ! "$base" -m venv --system-site-packages "$VENV" >/dev/null 2>&1; then
      # Debian/Ubuntu's own python3 ships without ensurepip: that is the python3-venv package.
      rm -rf "$VENV"
      command -v apt-get >/dev/null || { echo "[venv] $base -m venv failed: install its venv module" >&2; return 1; }
      echo "[venv] installing python3-venv"
      (apt-get update -qq && apt-get install -y -qq python3-venv) >/dev/null
      "$base" -m venv --system-site-packages "$VENV"
    fi
    local outer own
    outer=$("$base" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
    if [ -n "$outer" ]; then
      own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      printf '%s\n' "$outer" > "$own/_flashattn_base_venv.pth"
    fi
  fi
  PY=$VENV/bin/python
}

# torch into the venv unless it is there already (or reused from the base interpreter): the CPU
# wheel when there is no GPU (~200 MB instead of ~3 GB with the CUDA libraries; falls back to PyPI
# where download.pytorch.org can't be reached), PyPI's CUDA wheel otherwise.
venv_torch() {
  "$PY" -c "import torch" 2>/dev/null && return 0
  if has_gpu; then
    echo "[venv] installing torch (CUDA wheel from PyPI) into $VENV"
    "$PY" -m pip install -q torch
  else
    echo "[venv] installing torch (CPU wheel) into $VENV"
    "$PY" -m pip install -q --timeout 15 --retries 1 --index-url https://download.pytorch.org/whl/cpu torch \
      2>/dev/null || { echo "[venv] download.pytorch.org unreachable: torch from PyPI"; "$PY" -m pip install -q torch; }
  fi
}
