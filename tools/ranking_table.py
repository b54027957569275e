#!/usr/bin/env python3
"""Markdown table of a ranking-grid run, as docs/performance.md keeps it, and where the rows
stand against the ranking issue's targets.

    python3 tools/bench_small_seq.py --ranking --json ranking.json   # on the GPU machine
    python3 tools/ranking_table.py ranking.json                      # anywhere
    python3 tools/ranking_table.py part1.json part2.json --summary   # a grid run in parts
    python3 tools/ranking_table.py docs/performance.md rows.json     # rows re-measured
    python3 tools/ranking_table.py "docs/performance.md#rows on H200" rows.json  # H200 table

One line per row: the path that served ours (forward / forward+backward where they differ),
then for the forward and for forward+backward: the byte floor, the matrix floor (the fewest
matrix products' FLOP over the matrix-product throughput of the same run; "-" for runs that
did not measure it), our device time, % of the byte floor, % of the roof (the larger floor),
the best anchor (eager) and our speed-up over it. Several files join in order, a later file's row
replacing an earlier one of the same case (a grid run in several --cases calls, or rows
re-measured later). --summary prints the targets' accounting instead: rows under the forward
and forward+backward floor targets (with % of the roof, and "matrix" where the matrix floor is
the larger), rows slower than the best anchor, rows under 3x an anchor that reaches less than
30% of the floor (with the % of the roof that 3x would need), and the ranges per kind of row. --base compares two
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


# Cells per mode in a table line (_cells), and the line's cells in all.
MODE_CELLS = 7
LINE_CELLS = 2 + 2 * MODE_CELLS
OLD_LINE_CELLS = 12  # tables written before the matrix floor: no matrix floor, no % roof


def roof_ms(m: dict):
    """The roof: the larger of the byte and matrix floors (ms), or None without a matrix
    floor."""
    if m.get("matrix_floor_ms") is None:
        return None
    return max(m["floor_ms"], m["matrix_floor_ms"])


def pct_roof(m: dict):
    """% of the roof our time reaches, or None without a matrix floor."""
    roof = roof_ms(m)
    return None if roof is None else 100 * roof / m["ms"]


def matrix_bound(m: dict) -> bool:
    return m.get("matrix_floor_ms") is not None and m["matrix_floor_ms"] > m["floor_ms"]


def _cells(m: dict) -> list:
    if not m:
        return ["-"] * MODE_CELLS
    timed = {name: a for name, a in m.get("anchors", {}).items() if "ms" in a}  # not: failed
    best = min(timed.items(), key=lambda kv: kv[1]["ms"], default=None)
    best_cell = f"{best[1]['ms'] * 1e3:.1f} ({best[0]})" if best else "-"
    ratio = f"{m['speedup_vs_best']:.2f}" if m.get("speedup_vs_best") else "-"
    matrix = m.get("matrix_floor_ms")
    roof = pct_roof(m)
    return [f"{m['floor_ms'] * 1e3:.1f}", f"{matrix * 1e3:.1f}" if matrix is not None else "-",
            f"{m['ms'] * 1e3:.1f}", m.get("pct_cell") or f"{m['pct_floor']:.0f}%",
            f"{roof:.0f}%" if roof is not None else "-", best_cell, ratio]


def _markdown_mode(path: str, cells: list) -> dict:
    """One mode's measurement from its cells of a table line (see _cells)."""
    if cells[2] == "-":
        return {}
    floor, ms = float(cells[0]) / 1e3, float(cells[2]) / 1e3
    # % of the floor from the times for the accounting (the cell, kept for the table, is
    # rounded to whole percents)
    m = {"path": path, "floor_ms": floor, "ms": ms, "pct_floor": 100 * floor / ms,
         "pct_cell": cells[3]}
    if cells[1] != "-":
        m["matrix_floor_ms"] = float(cells[1]) / 1e3
    best = re.fullmatch(r"([\d.]+) \((\w+)\)", cells[5])
    if best:
        m["best_anchor_ms"] = float(best.group(1)) / 1e3
        m["anchors"] = {best.group(2): {"ms": m["best_anchor_ms"]}}
        m["speedup_vs_best"] = float(cells[6])
    return m


def load_markdown(path: str) -> tuple:
    """(header, rows) of a ranking table a page keeps (docs/performance.md keeps one per
    device): the lines that table() writes, read back with the best anchor of each mode (the
    others are not kept). `page.md` is the page's first table; `page.md#TEXT` the first table
    after the first heading that contains TEXT."""
    path, _, section = path.partition("#")
    rows = []
    with open(path) as f:
        lines = f.read().splitlines()
    if section:
        starts = [i for i, line in enumerate(lines)
                  if line.startswith("#") and section in line]
        if not starts:
            raise SystemExit(f"{path}: no heading contains {section!r}")
        lines = lines[starts[0] + 1:]
    for line in lines:
        if rows and not line.startswith("|"):
            break  # the end of the first table
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == OLD_LINE_CELLS:  # a table from before the matrix floor
            cells = cells[:2] + [c for i in (2, 7) for c in
                                 cells[i:i + 1] + ["-"] + cells[i + 1:i + 3] + ["-"] +
                                 cells[i + 3:i + 5]]
        found = _ROW_NAME.fullmatch(cells[0]) if len(cells) == LINE_CELLS else None
        if not found:
            continue
        users, cands, hist, ragged, h_kv, d = found.groups()
        paths = cells[1].split(" / ") if " / " in cells[1] else [cells[1]] * 2
        rows.append({"case": cells[0], "users": int(users), "cands": int(cands),
                     "hist": int(hist), "ragged": ragged == "r", "h_kv": int(h_kv),
                     "d": int(d),
                     "fwd": _markdown_mode(paths[0], cells[2:2 + MODE_CELLS]),
                     "fwdbwd": _markdown_mode(paths[1], cells[2 + MODE_CELLS:])})
    if not rows:
        raise SystemExit(f"{path}: no ranking table line")
    return {"source": path}, rows


def load(paths) -> tuple:
    """(the files' headers, their rows joined: a later file's row replaces an earlier one of the
    same case, in the place of the first). A .md file is a page's table (load_markdown), so that
    re-measured rows can be joined into the table the docs keep."""
    headers, rows = [], OrderedDict()
    for path in paths:
        if path.partition("#")[0].endswith(".md"):
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


def _roof_note(m: dict) -> str:
    roof = pct_roof(m)
    if roof is None:
        return ""
    return f" (roof {roof:.0f}%{', matrix' if matrix_bound(m) else ''})"


def _weak_note(m: dict) -> str:
    """What the 3x target asks of a row: the % of the roof a kernel would need to run at a third
    of the best anchor's time (and ours), where the row has a matrix floor."""
    roof = roof_ms(m)
    if roof is None:
        return ""
    need = 100 * roof * WEAK_ANCHOR_SPEEDUP / m["best_anchor_ms"]
    return f" (3x needs {need:.0f}% of the roof, ours {pct_roof(m):.0f}%)"


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
                     (", ".join(f"{r['case']} {m['pct_floor']:.0f}%{_roof_note(m)}"
                                for r, m in under) or "none"))
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
                     (", ".join(f"{r['case']} {m['speedup_vs_best']:.2f}x{_weak_note(m)}"
                                for r, m in weak) or "none"))
    for mode, name in MODES:
        if not any((m := _measured(r, mode)) and "matrix_floor_ms" in m for r in rows):
            continue  # a run or page without the matrix floor
        bound = [(r, m) for r in rows if (m := _measured(r, mode)) and matrix_bound(m)]
        lines.append(f"{name} rows whose matrix floor exceeds the byte floor: {len(bound)}" +
                     (f", at {_range([pct_roof(m) for _, m in bound], '{:.0f}')}% of it"
                      if bound else ""))
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
            roofs = [v for m in ms if (v := pct_roof(m)) is not None]
            if roofs:
                pct += f", {_range(roofs, '{:.0f}')}% of the roof"
            cells.append(f"{name} {pct}, {_range(x, '{:.2f}')}x the best anchor")
        lines.append(f"{k} ({len(group)} rows): " + "; ".join(cells))
    return lines


def table(headers, rows) -> list:
    """Lines of the markdown table, under a line naming the device and each file's bandwidth."""
    runs = [h for h in headers if "device" in h]  # not the rows read back from a page
    bandwidths = ", ".join(f"{h['copy_bandwidth_GBps']:.0f}" for h in runs)
    matmul = ", ".join(f"{h['matmul_TFLOPs']:.0f}" for h in runs if "matmul_TFLOPs" in h)
    matmul = f", matrix products {matmul} TFLOP/s" if matmul else ""
    pages = "".join(f", joined into the rows of {h['source']}" for h in headers if "source" in h)
    first = runs[0] if runs else {"device": "rows", "torch": "-"}
    lines = [f"{first['device']}, torch {first['torch']}, copy bandwidth {bandwidths} GB/s"
             f"{matmul}{pages}",
             "",
             "| case | path (fwd / fwd+bwd) | floor us | matrix floor us | fwd us | % floor "
             "| % roof | best anchor us (which) | x best | fwd+bwd floor | matrix floor | "
             "fwd+bwd us | % floor | % roof | best anchor us (which) | x best |",
             "|" + "---|" * LINE_CELLS]
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
