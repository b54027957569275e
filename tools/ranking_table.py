#!/usr/bin/env python3
"""Markdown table of a ranking-grid run, as docs/performance.md keeps it, and where the rows
stand against the ranking issue's targets.

    python3 tools/bench_small_seq.py --ranking --json ranking.json   # on the GPU machine
    python3 tools/ranking_table.py ranking.json                      # anywhere
    python3 tools/ranking_table.py part1.json part2.json --summary   # a grid run in parts
    python3 tools/ranking_table.py docs/performance.md rows.json     # rows re-measured

One line per row: the path that served ours (forward / forward+backward where they differ),
the floor, our device time, % of the floor, the best anchor (eager) and our speed-up over it,
for the forward and for forward+backward. Several files join in order, a later file's row
replacing an earlier one of the same case (a grid run in several --cases calls, or rows
re-measured later). --summary prints the targets' accounting instead: rows under the forward
and forward+backward floor targets, rows slower than the best anchor, rows under 3x an anchor
that reaches less than 30% of the floor, and the ranges per kind of row. --base compares two
builds timed in one run (tools/ab_builds.sh): the files given with --base are the base build's
repeats, the others the new build's; one line per row and mode with every repeat's time and
the base / new ratio of their means (above 1: the new build is faster).

    python3 tools/ranking_table.py --base base1.json base2.json -- new1.json new2.json
"""
import argparse
import json
import re
from collections import OrderedDict

# A row's name (rocm_attn/bench/small_seq_ranking.py: row_name).
_ROW_NAME = re.compile(r"u(\d+)_c(\d+)_kv(\d+)([fr])_hkv(\d+)_d(\d+)")

# Path names the bench records, as the docs' table spells them.
_PATHS = {"one-query kernels": "one-query", "tiled kernels": "tiled", "flash route": "flash route"}

# The ranking issue's targets: % of the floor on rows whose floor exceeds FLOOR_MIN_US, and 3x
# the best anchor where that anchor reaches less than WEAK_ANCHOR_PCT of the floor.
FLOOR_MIN_US = 50.0
TARGET_PCT = {"fwd": 85.0, "fwdbwd": 70.0}
WEAK_ANCHOR_PCT = 30.0
WEAK_ANCHOR_SPEEDUP = 3.0
MODES = (("fwd", "forward"), ("fwdbwd", "forward+backward"))


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
    return [f"{m['floor_ms'] * 1e3:.1f}", f"{m['ms'] * 1e3:.1f}",
            m.get("pct_cell") or f"{m['pct_floor']:.0f}%",
            best_cell, ratio]


def _markdown_mode(path: str, cells: list) -> dict:
    """One mode's measurement from its five cells of a table line (see _cells)."""
    if cells[1] == "-":
        return {}
    floor, ms = float(cells[0]) / 1e3, float(cells[1]) / 1e3
    # % of the floor from the times for the accounting (the cell, kept for the table, is
    # rounded to whole percents)
    m = {"path": path, "floor_ms": floor, "ms": ms, "pct_floor": 100 * floor / ms,
         "pct_cell": cells[2]}
    best = re.fullmatch(r"([\d.]+) \((\w+)\)", cells[3])
    if best:
        m["best_anchor_ms"] = float(best.group(1)) / 1e3
        m["anchors"] = {best.group(2): {"ms": m["best_anchor_ms"]}}
        m["speedup_vs_best"] = float(cells[4])
    return m


def load_markdown(path: str) -> tuple:
    """(header, rows) of the ranking table a page keeps (docs/performance.md): the lines that
    table() writes, read back with the best anchor of each mode (the others are not kept)."""
    rows = []
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            found = _ROW_NAME.fullmatch(cells[0]) if len(cells) == 12 else None
            if not found:
                continue
            users, cands, hist, ragged, h_kv, d = found.groups()
            paths = cells[1].split(" / ") if " / " in cells[1] else [cells[1]] * 2
            rows.append({"case": cells[0], "users": int(users), "cands": int(cands),
                         "hist": int(hist), "ragged": ragged == "r", "h_kv": int(h_kv),
                         "d": int(d), "fwd": _markdown_mode(paths[0], cells[2:7]),
                         "fwdbwd": _markdown_mode(paths[1], cells[7:12])})
    if not rows:
        raise SystemExit(f"{path}: no ranking table line")
    return {"source": path}, rows


def load(paths) -> tuple:
    """(the files' headers, their rows joined: a later file's row replaces an earlier one of the
    same case, in the place of the first). A .md file is a page's table (load_markdown), so that
    re-measured rows can be joined into the table the docs keep."""
    headers, rows = [], OrderedDict()
    for path in paths:
        if path.endswith(".md"):
            header, file_rows = load_markdown(path)
        else:
            with open(path) as f:
                header = json.load(f)
            file_rows = header["rows"]
        headers.append(header)
        for row in file_rows:
            rows[row["case"]] = row
    return headers, list(rows.values())


def kind(row: dict) -> str:
    """The kind of a row, as the performance page's bullets group them."""
    if row["d"] != 128:
        return f"d {row['d']}"
    if row["cands"] == 1:
        return "1 query, <= 16 keys" if row["hist"] <= 16 else "1 query, 64+ keys"
    if row["cands"] == 16:
        return f"16 candidates, {row['h_kv']} kv heads"
    return f"128-512 candidates, {row['hist']} keys"


def _measured(row: dict, mode: str):
    m = row.get(mode) or {}
    return m if "ms" in m else None


def _range(values, fmt: str) -> str:
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}" if values else "-"


def summary(rows) -> list:
    """Lines of the targets' accounting (see the module's docstring)."""
    lines = []
    for mode, name in MODES:
        big = [(r, m) for r in rows if (m := _measured(r, mode)) and
               m["floor_ms"] * 1e3 > FLOOR_MIN_US]
        under = [(r, m) for r, m in big if m["pct_floor"] < TARGET_PCT[mode]]
        lines.append(f"{name}: {len(big) - len(under)} of {len(big)} rows whose floor exceeds "
                     f"{FLOOR_MIN_US:.0f} us reach {TARGET_PCT[mode]:.0f}% of it; under it: " +
                     (", ".join(f"{r['case']} {m['pct_floor']:.0f}%" for r, m in under) or "none"))
    for mode, name in MODES:
        slow = [(r, m) for r in rows if (m := _measured(r, mode)) and
                m.get("speedup_vs_best") is not None and m["speedup_vs_best"] < 1.0]
        lines.append(f"{name} slower than the best anchor: " +
                     (", ".join(f"{r['case']} {m['speedup_vs_best']:.2f}x" for r, m in slow)
                      or "none"))
    for mode, name in MODES:
        weak = [(r, m) for r in rows if (m := _measured(r, mode)) and m.get("best_anchor_ms")
                and 100 * m["floor_ms"] / m["best_anchor_ms"] < WEAK_ANCHOR_PCT
                and m["speedup_vs_best"] < WEAK_ANCHOR_SPEEDUP]
        lines.append(f"{name} under {WEAK_ANCHOR_SPEEDUP:.0f}x a best anchor below "
                     f"{WEAK_ANCHOR_PCT:.0f}% of the floor: " +
                     (", ".join(f"{r['case']} {m['speedup_vs_best']:.2f}x" for r, m in weak)
                      or "none"))
    kinds = OrderedDict()
    for r in rows:
        kinds.setdefault(kind(r), []).append(r)
    for k, group in kinds.items():
        cells = []
        for mode, name in MODES:
            ms = [m for r in group if (m := _measured(r, mode))]
            big = [m["pct_floor"] for m in ms if m["floor_ms"] * 1e3 > FLOOR_MIN_US]
            x = [m["speedup_vs_best"] for m in ms if m.get("speedup_vs_best") is not None]
            pct = (f"{_range(big, '{:.0f}')}% of the floor (floor over {FLOOR_MIN_US:.0f} us)"
                   if big else f"no floor over {FLOOR_MIN_US:.0f} us")
            cells.append(f"{name} {pct}, {_range(x, '{:.2f}')}x the best anchor")
        lines.append(f"{k} ({len(group)} rows): " + "; ".join(cells))
    return lines


def table(headers, rows) -> list:
    """Lines of the markdown table, under a line naming the device and each file's bandwidth."""
    runs = [h for h in headers if "device" in h]  # not the rows read back from a page
    bandwidths = ", ".join(f"{h['copy_bandwidth_GBps']:.0f}" for h in runs)
    pages = "".join(f", joined into the rows of {h['source']}" for h in headers if "source" in h)
    first = runs[0] if runs else {"device": "rows", "torch": "-"}
    lines = [f"{first['device']}, torch {first['torch']}, copy bandwidth {bandwidths} GB/s{pages}",
             "",
             "| case | path (fwd / fwd+bwd) | floor us | fwd us | % floor | best anchor us "
             "(which) | x best | fwd+bwd floor | fwd+bwd us | % floor | best anchor us (which) "
             "| x best |",
             "|" + "---|" * 12]
    for row in rows:
        fwd, both = row.get("fwd") or {}, row.get("fwdbwd") or {}
        paths = [_path(m["path"]) for m in (fwd, both) if m]
        path = paths[0] if len(set(paths)) == 1 else " / ".join(paths)
        lines.append("| " + " | ".join([row["case"], path] + _cells(fwd) + _cells(both)) + " |")
    return lines


def compare(base_runs, new_runs) -> list:
    """Lines comparing our times per row and mode: each argument a list of runs (dicts of case ->
    row), every repeat of one build timed in the same run as the other's."""
    lines = [f"{'case':34s} {'mode':6s} {'floor':>8s}  base us / new us (each repeat)  base/new"]
    for case in base_runs[0]:
        for mode, _ in MODES:
            base = [m for m in (_measured(r.get(case, {}), mode) for r in base_runs) if m]
            new = [m for m in (_measured(r.get(case, {}), mode) for r in new_runs) if m]
            if not base or not new:
                continue
            times = " ".join(f"{m['ms'] * 1e3:.0f}" for m in base) + " / " + " ".join(
                f"{m['ms'] * 1e3:.0f}" for m in new)
            ratio = sum(m["ms"] for m in base) / len(base) / (sum(m["ms"] for m in new) / len(new))
            lines.append(f"{case:34s} {mode:6s} {base[0]['floor_ms'] * 1e3:8.0f}  "
                         f"{times}  {ratio:.3f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="--json files of --ranking runs (or a page's table, "
                    ".md), joined in order")
    ap.add_argument("--summary", action="store_true",
                    help="the targets' accounting instead of the table")
    ap.add_argument("--base", nargs="+", metavar="JSON",
                    help="the base build's repeats: compare them with the files given last")
    args = ap.parse_args()
    if args.base:
        runs = [[{row["case"]: row for row in load([path])[1]} for path in paths]
                for paths in (args.base, args.json)]
        print("\n".join(compare(*runs)))
        return
    headers, rows = load(args.json)
    print("\n".join(summary(rows) if args.summary else table(headers, rows)))


if __name__ == "__main__":
    main()
