"""Benchmarks of the package's ops on a GPU, run as ``rocm-attn bench <suite> [args]``.

Each suite module has ``main(argv) -> int`` and is also reachable through its historical path
``python3 tools/bench_<suite>.py`` (thin shims). Current results are in docs/performance.md.
"""

from __future__ import annotations

# suite name on the command line -> module under rocm_attn.bench
SUITES = {
    "small-seq": "small_seq",
    "thd": "thd",
    "cp": "cp",
}
