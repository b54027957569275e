"""Run the attn_with_cp CPU suites (tests/test_cp.py core matrix, tests/test_cp_masks.py mask
matrix) at any world size on gloo, outside pytest: e.g. 8 ranks, which CI (2 cores) does not
run. Each case compares output, LSE and gradients with single-process float64 reference
attention, exactly as the pytest cases at 2 and 4 ranks do.

Usage: python tools/run_cp_gloo.py --world 8 [--suite core,masks] [--deadline 3000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--suite", default="core,masks")
    parser.add_argument("--deadline", type=int, default=3000, help="seconds per suite")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    import test_cp
    import test_cp_masks
    from helpers.cp_spawn import run_world

    failed = 0
    for suite in args.suite.split(","):
        mod = {"core": test_cp, "masks": test_cp_masks}[suite]
        t0 = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            res = run_world(mod._worker, args.world, str(Path(tmp) / "results.json"),
                            args.deadline, f"{suite} suite at {args.world} ranks")
        results = res["results"]
        bad = {name: msg for name, msg in results.items() if msg is not None}
        failed += len(bad)
        print(f"{suite}: world {args.world}: {len(results) - len(bad)} of {len(results)} cases "
              f"passed in {time.time() - t0:.0f} s")
        for name, msg in bad.items():
            print(f"FAIL {name}\n{msg}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
