"""Shim kept for scripts and docs: the benchmark is rocm_attn/bench/cp.py.

Same flags; also `rocm-attn bench cp [args]` once the package is installed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this source tree's package

from rocm_attn.bench.cp import main  # noqa: E402

if __name__ == "__main__":  # guard: bench_cp re-imports this file in its spawned workers
    sys.exit(main())
