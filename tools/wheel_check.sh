#!/usr/bin/env bash
# On a GPU machine (CUDA or ROCm torch and its compiler installed): build a wheel from a clean
# copy of this checkout, install it into a fresh virtual environment that reuses the machine's
# torch (--system-site-packages), and run, from outside the source tree so that the installed
# wheel is what gets imported: rocm-attn --version, info --require-kernels, selftest, and the
# small-seq GPU tests. On a CPU machine it builds and checks the pure-Python wheel (no kernels:
# pass --cpu to skip the kernel and GPU steps).
# Prints one line per step; logs under $OUT when set (else build/wheel_check).
# Usage: bash tools/wheel_check.sh [--cpu] [--tests "pytest args"]
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/build/wheel_check}
CPU=0; TESTS="-m gpu $REPO/tests/test_small_seq_gpu.py -x"
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --tests) TESTS="$2"; shift ;;
    *) echo "wheel_check: unknown argument $1"; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL $1 (log: $2)"; tail -15 "$2"; exit 1; }
step() {  # step NAME LOG CMD...: run, print one line with the time, stop on failure
  local name=$1 log=$2; shift 2
  local t0=$(date +%s)
  "$@" > "$log" 2>&1 || fail "$name" "$log"
  echo "ok   $name ($(( $(date +%s) - t0 )) s)"
}

python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', \
torch.version.hip, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"

# A clean copy (tracked and untracked, not ignored files): no stale build/ or _C*.so from an
# earlier in-place build can end up in the wheel.
# Outside a git checkout (a copied tree), everything but build outputs.
mkdir -p "$WORK/src"
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  git ls-files -z -co --exclude-standard | tar --null -T - --ignore-failed-read -cf - \
    | tar -xf - -C "$WORK/src"
else
  tar --exclude=./build --exclude=./dist --exclude='*.so' --exclude='*.egg-info' \
      --exclude=__pycache__ --exclude=./.git -cf - . | tar -xf - -C "$WORK/src"
fi
step "wheel build (pip wheel --no-build-isolation --no-deps)" "$OUT/build.log" \
  python3 -m pip wheel --no-build-isolation --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/rocm_attn-*.whl)
cp "$WHEEL" "$OUT/"
echo "     $(basename "$WHEEL"): $(python3 -m zipfile -l "$WHEEL" | grep -c '_C\..*so') compiled extension file(s)"

step "fresh venv (--system-site-packages: the machine's torch)" "$OUT/venv.log" \
  python3 -m venv --system-site-packages "$WORK/venv"
PY=$WORK/venv/bin/python
# Where python3 is itself a virtual environment (as on the GPU machines), --system-site-packages
# reaches the base interpreter's packages, not that environment's: a .pth file adds them.
python3 -c "import site, sys; sys.prefix != sys.base_prefix and print('\n'.join(site.getsitepackages()))" \
  > "$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_machine_site.pth"
# the checkout must not shadow the installed wheel
unset PYTHONPATH
step "install the wheel" "$OUT/install.log" "$PY" -m pip install --no-deps --no-index "$WHEEL"

# From an empty directory: the source tree is not on sys.path, the installed wheel is imported.
mkdir -p "$WORK/run" && cd "$WORK/run"
step "import from the wheel" "$OUT/where.log" "$PY" -c "import rocm_attn, sys; \
print(rocm_attn.__file__); sys.exit('$REPO' in rocm_attn.__file__)"
echo "     imported from $(head -1 "$OUT/where.log")"
step "rocm-attn --version" "$OUT/version.log" "$WORK/venv/bin/rocm-attn" --version
echo "     $(cat "$OUT/version.log")"
if [ $CPU -eq 0 ]; then
  step "rocm-attn info --require-kernels" "$OUT/info.log" "$WORK/venv/bin/rocm-attn" info --require-kernels
  grep -E "^(build|kernels|extension|device)" "$OUT/info.log" | sed 's/^/     /'
fi
step "rocm-attn selftest" "$OUT/selftest.log" "$WORK/venv/bin/rocm-attn" selftest
tail -1 "$OUT/selftest.log" | sed 's/^/     /'
if [ $CPU -eq 0 ]; then
  # --noconftest: tests/conftest.py would put the source tree first on sys.path
  # shellcheck disable=SC2086
  step "pytest $TESTS" "$OUT/pytest.log" "$PY" -m pytest -q -p no:cacheprovider --noconftest $TESTS
  grep -E "passed|failed|error" "$OUT/pytest.log" | tail -1 | sed 's/^/     /'
fi
echo "wheel_check: all steps passed"
