"""Command line: python -m rocm_attn {info,selftest} (also the `rocm-attn` script)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rocm-attn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="torch, device, build backend and kernels present")
    sub.add_parser("selftest", help="run each op on random inputs against the float64 reference")
    args = parser.parse_args(argv)
    if args.command == "info":
        from . import build_info

        print(json.dumps(build_info(), indent=1))
        return 0
    from . import selftest

    return 0 if selftest.run() else 1


if __name__ == "__main__":
    sys.exit(main())
