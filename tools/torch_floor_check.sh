#!/usr/bin/env bash
# The oldest torch the package claims (pyproject.toml: "torch>=X.Y"), on the CPU: a virtual
# environment with torch==X.Y.0 from PyPI, the package installed into it from a wheel built
# there without kernels, the installed wheel's `rocm-attn --version` and self-test (every
# public op against the float64 reference), then a subset of the CPU test suite that calls
# every public op (FLOOR_TESTS). CI runs it after the main suite (.ci/run).
# PyPI's Linux torch wheels are CUDA builds: with their CUDA libraries this is ~3.5 GB of
# downloads; BUILD_TARGET=cpu keeps setup.py from building kernels against the machine's nvcc.
# Usage: bash tools/torch_floor_check.sh      (env FLOOR_VENV: where the venv goes)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
start=$(date +%s)
FLOOR=$(python3 - <<'EOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(d for d in deps if re.match(r"torch\b", d))
print(re.fullmatch(r"torch\s*>=\s*(\d+\.\d+)", spec).group(1))
EOF
)
VENV=${FLOOR_VENV:-$REPO/build/torch_floor_venv}
echo "== torch floor: torch==$FLOOR.0 in $VENV"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY=$VENV/bin/python
"$PY" -m pip install -q --no-compile "torch==$FLOOR.0" numpy pytest "setuptools>=77" wheel 2>&1 | grep -v "^WARNING: Location" || true
"$PY" -c "import torch; print('torch', torch.__version__)"
echo "   installed in $(( $(date +%s) - start )) s"

# built from a clean copy: an in-tree build would rewrite this checkout's build config
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | (mkdir -p "$WHEELS/src" && tar -xf - -C "$WHEELS/src")
BUILD_TARGET=cpu "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$WHEELS" "$WHEELS/src" 2>&1 \
  | grep -v "^WARNING: Location" || true
"$PY" -m pip install -q --no-deps --force-reinstall "$WHEELS"/rocm_attn-*.whl 2>&1 \
  | grep -v "^WARNING: Location" || true
# the installed wheel, from outside the source tree
(cd "$WHEELS" && "$VENV/bin/rocm-attn" --version && "$VENV/bin/rocm-attn" selftest | tail -1)

# Every public op: fused_attn_small_seq, check_errors (test_small_seq), nn.TargetAttention
# (test_nn), thd.* (test_thd), reference (test_reference), attention and the torch_flash logic
# on the flash emulator (test_attention, test_flash_support), attn_with_cp / shard_for_cp /
# gather_from_cp on one rank and on 2 gloo ranks (test_cp), the CLI (test_cli).
FLOOR_TESTS=${FLOOR_TESTS:-"tests/test_small_seq.py tests/test_nn.py tests/test_thd.py
  tests/test_reference.py tests/test_attention.py tests/test_flash_support.py tests/test_cli.py
  tests/test_cp.py tests/test_small_seq_contract.py"}
# shellcheck disable=SC2086
"$PY" -m pytest -q -p no:cacheprovider $FLOOR_TESTS -k "not cp_matches_reference or cp2"
echo "torch floor check done in $(( $(date +%s) - start )) s"
