#!/usr/bin/env python3
"""Markdown table of a ranking-grid run, as docs/performance.md keeps it.

    python3 tools/bench_small_seq.py --ranking --json ranking.json   # on the GPU machine
    python3 tools/ranking_table.py ranking.json                      # anywhere

One line per row: the path that served ours (forward / forward+backward where they differ),
the floor, our device time, % of the floor, the best anchor (eager) and our speed-up over it,
for the forward and for forward+backward.
"""
import argparse
import json

# Path names the bench records, as the docs' table spells them.
_PATHS = {"one-query kernels": "one-query", "tiled kernels": "tiled", "flash route": "flash route"}


def _path(name: str) -> str:
    for key, short in _PATHS.items():
        if name.startswith(key):
            return short
    return name


def _cells(m: dict) -> list:
    if not m:
        return ["-"] * 5
    timed = {name: a for name, a in m.get("anchors", {}).items() if "ms" in a}  # not: failed
    best = min(timed.items(), key=lambda kv: kv[1]["ms"], default=None)
    best_cell = f"{best[1]['ms'] * 1e3:.1f} ({best[0]})" if best else "-"
    ratio = f"{m['speedup_vs_best']:.2f}" if m.get("speedup_vs_best") else "-"
    return [f"{m['floor_ms'] * 1e3:.1f}", f"{m['ms'] * 1e3:.1f}", f"{m['pct_floor']:.0f}%",
            best_cell, ratio]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="the --json file of a --ranking run")
    data = json.load(open(ap.parse_args().json))
    print(f"{data['device']}, torch {data['torch']}, copy bandwidth "
          f"{data['copy_bandwidth_GBps']:.0f} GB/s\n")
    print("| case | path (fwd / fwd+bwd) | floor us | fwd us | % floor | best anchor us (which) "
          "| x best | fwd+bwd floor | fwd+bwd us | % floor | best anchor us (which) | x best |")
    print("|" + "---|" * 12)
    for row in data["rows"]:
        fwd, both = row.get("fwd") or {}, row.get("fwdbwd") or {}
        paths = [_path(m["path"]) for m in (fwd, both) if m]
        path = paths[0] if len(set(paths)) == 1 else " / ".join(paths)
        print("| " + " | ".join([row["case"], path] + _cells(fwd) + _cells(both)) + " |")


if __name__ == "__main__":
    main()
