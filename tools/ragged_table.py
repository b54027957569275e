#!/usr/bin/env python3
"""Markdown tables of a ragged-request run (`rocm-attn bench small-seq --ranking --ragged`),
where its rows stand against the ranking issue's targets, and the tables written into
docs/performance.md under its "Ragged requests" heading.

    python3 tools/bench_small_seq.py --ranking --ragged --json ragged.json   # on the GPU machine
    python3 tools/ragged_table.py ragged.json                  # the tables
    python3 tools/ragged_table.py ragged.json --summary        # the targets' accounting
    python3 tools/ragged_table.py ragged.json --write docs/performance.md

Two tables, forward and forward+backward: per row what it is, our path, the clock every column
of the row was timed on, the floor (the larger of the byte and matrix floors; b / m says
which), our time, % of the floor, our speed-up over each anchor (its time / ours; n/a where it
did not run, "!" after a column whose float64 check failed), the backend SDPA picks by itself
for the padded inputs, the best anchor and the speed-up over it. Several
files join in order, a later file's row replacing an earlier one of the same case. --write puts
the tables between the page's markers under the heading (markers added at the end of the
section where the page has none yet); the prose around them is the page's own.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path

HEADING = "Ragged requests"
BEGIN = "<!-- ragged-table: written by tools/ragged_table.py --write -->"
END = "<!-- /ragged-table -->"
MODES = (("fwd", "Forward", ("flash_varlen", "varlen_attn", "sdpa_cudnn", "sdpa_efficient")),
         ("fwdbwd", "Forward+backward", ("varlen_attn", "sdpa_cudnn", "sdpa_efficient")))

# The ranking issue's targets on ragged rows.
FWD_PCT, FWD_PCT_MIN_FLOOR_US = 60.0, 50.0  # forward % of the floor where the floor > 50 us
WEAK_FLASH_PCT, FLASH_SPEEDUP = 40.0, 1.5  # 1.5x flash varlen where it is under 40% of floor
FB_VARLEN_SPEEDUP, FB_PCT = 1.2, 45.0  # forward+backward: 1.2x varlen_attn, 45% of the floor


def load(paths):
    """(the runs' headers, their rows joined: a later row replaces an earlier one of the same
    case, in the place of the first)."""
    headers, rows = [], OrderedDict()
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        headers.append(run)
        for row in run["rows"]:
            rows[row["case"]] = row
    return headers, list(rows.values())


def _failed(c: dict) -> bool:
    return "check" in c and not c["check"]["ok"]


def _x_cell(m: dict, name: str) -> str:
    c = m["columns"].get(name, {})
    if name in m.get("speedup", {}):
        return f"{m['speedup'][name]:.2f}" + ("!" if _failed(c) else "")
    return "skip" if str(c.get("error", "")).startswith("skipped") else "n/a"


# SDPA's own pick for the padded inputs, as the table spells it.
_SDPA_SHORT = {"CUDNN_ATTENTION": "cudnn", "EFFICIENT_ATTENTION": "efficient",
               "FLASH_ATTENTION": "flash", "MATH": "math"}


def _line(row: dict, mode: str, anchors) -> str:
    m = row[mode]
    ours = m["columns"].get("ours", {})
    cells = [row["case"], row.get("label", ""), m.get("path", "-"), m["clock"],
             f"{m['floor_ms'] * 1e3:.1f} {m['bound'][0]}",
             f"{m['ms'] * 1e3:.1f}" + ("!" if _failed(ours) else "") if "ms" in m else "error",
             f"{m['pct_floor']:.0f}%" if "pct_floor" in m else "-"]
    cells += [_x_cell(m, a) if "ms" in m else "-" for a in anchors]
    cells.append(_SDPA_SHORT.get(m.get("sdpa_default"), m.get("sdpa_default", "-")))
    if m.get("best_anchor"):
        cells += [f"{m['best_anchor_ms'] * 1e3:.1f} ({m['best_anchor']})",
                  f"{m['speedup_vs_best']:.2f}"]
    else:
        cells += ["-", "-"]
    return "| " + " | ".join(cells) + " |"


def header_line(headers) -> str:
    first = headers[0]
    bw = ", ".join(f"{h['copy_bandwidth_GBps']:.0f}" for h in headers)
    mm = "; ".join(", ".join(f"{k} {v:.0f}" for k, v in h["matmul_TFLOPs"].items())
                   for h in headers)
    line = (f"{first['device']}, torch {first['torch']}, copy bandwidth {bw} GB/s, matrix "
            f"products {mm} TFLOP/s, seed {first.get('seed', 0)}")
    runs = "; ".join(f"{h['date']}: `{h['command']}`" for h in headers if "command" in h)
    return line + (f"; {runs}" if runs else "")


def table(headers, rows) -> list:
    """The page's lines: the run line, then a table per mode."""
    lines = [header_line(headers)]
    for mode, title, anchors in MODES:
        measured = [r for r in rows if r.get(mode)]
        if not measured:
            continue
        lines += ["", f"{title} (x NAME: NAME's time / ours):", "",
                  "| row | what | path | clock | floor us | ours us | % floor | " +
                  " | ".join(f"x {a}" for a in anchors) +
                  " | SDPA picks | best anchor us (which) | x best |",
                  "|" + "---|" * (10 + len(anchors))]
        lines += [_line(r, mode, anchors) for r in measured]
    failed = [f"{r['case']} {mode}/{name}" for r in rows for mode, _, _ in MODES
              for name, c in (r.get(mode) or {}).get("columns", {}).items() if _failed(c)]
    if failed:
        lines += ["", "Failed float64 checks: " + ", ".join(failed) + "."]
    broken = [f"{r['case']} ({r['error']})" for r in rows if "error" in r]
    if broken:
        lines += ["", "Rows that did not run: " + ", ".join(broken) + "."]
    return lines


def summary(rows) -> list:
    """Lines of the issue's targets on the ragged rows (a row of equal lengths is left out):
    the rows that miss each one (none: "none")."""
    def miss(rule, items):
        return rule + ": " + (", ".join(items) or "none")

    ragged = [r for r in rows if r.get("ragged", True)]
    fwd = [(r, r["fwd"]) for r in ragged if "ms" in (r.get("fwd") or {})]
    fb = [(r, r["fwdbwd"]) for r in ragged if "ms" in (r.get("fwdbwd") or {})]
    lines = [miss("forward slower than the best anchor",
                  [f"{r['case']} {m['speedup_vs_best']:.2f}x ({m['best_anchor']})"
                   for r, m in fwd if m.get("speedup_vs_best") and m["speedup_vs_best"] < 1.0])]
    weak = []
    for r, m in fwd:
        flash = m["columns"].get("flash_varlen", {})
        if "ms" in flash and 100 * m["floor_ms"] / flash["ms"] < WEAK_FLASH_PCT \
                and m["speedup"]["flash_varlen"] < FLASH_SPEEDUP:
            weak.append(f"{r['case']} {m['speedup']['flash_varlen']:.2f}x (flash varlen at "
                        f"{100 * m['floor_ms'] / flash['ms']:.0f}% of the floor)")
    lines.append(miss(f"forward under {FLASH_SPEEDUP}x flash varlen where it is under "
                      f"{WEAK_FLASH_PCT:.0f}% of the floor", weak))
    lines.append(miss(f"forward under {FWD_PCT:.0f}% of a floor over {FWD_PCT_MIN_FLOOR_US:.0f} us",
                      [f"{r['case']} {m['pct_floor']:.0f}% ({m['bound']})" for r, m in fwd
                       if m["floor_ms"] * 1e3 > FWD_PCT_MIN_FLOOR_US
                       and m["pct_floor"] < FWD_PCT]))
    lines.append(miss(f"forward+backward under {FB_VARLEN_SPEEDUP}x varlen_attn",
                      [f"{r['case']} {m['speedup']['varlen_attn']:.2f}x" for r, m in fb
                       if "varlen_attn" in m.get("speedup", {})
                       and m["speedup"]["varlen_attn"] < FB_VARLEN_SPEEDUP]))
    lines.append(miss(f"forward+backward under {FB_PCT:.0f}% of the floor",
                      [f"{r['case']} {m['pct_floor']:.0f}% ({m['bound']})" for r, m in fb
                       if m["pct_floor"] < FB_PCT]))
    clocks = sorted({m["clock"] for _, m in fwd + fb})
    lines.append(f"clocks: {', '.join(clocks) or 'none'}; rows {len(rows)}, of them "
                 f"{len(ragged)} ragged")
    return lines


def write_page(page: Path, lines: list) -> None:
    """Puts ``lines`` between the markers under the page's HEADING (adding the markers at the
    end of that section where there are none)."""
    text = page.read_text().splitlines()
    heads = [i for i, line in enumerate(text)
             if re.match(r"#+ ", line) and line.lstrip("#").strip() == HEADING]
    if not heads:
        raise SystemExit(f"{page}: no heading '{HEADING}' (add it where the table belongs)")
    start = heads[0]
    level = len(text[start]) - len(text[start].lstrip("#"))
    end = next((i for i in range(start + 1, len(text))
                if re.match(rf"#{{1,{level}}} ", text[i])), len(text))
    block = [BEGIN] + lines + [END]
    inside = range(start + 1, end)
    begins = [i for i in inside if text[i] == BEGIN]
    ends = [i for i in inside if text[i] == END]
    if begins and ends and begins[0] < ends[0]:
        text[begins[0]:ends[0] + 1] = block
    else:
        tail = end
        while tail > start + 1 and not text[tail - 1].strip():
            tail -= 1
        text[tail:tail] = [""] + block + ([""] if tail < len(text) else [])
    page.write_text("\n".join(text) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="--json files of --ranking --ragged runs, joined in "
                    "order")
    ap.add_argument("--summary", action="store_true", help="the targets' accounting instead")
    ap.add_argument("--write", type=Path, metavar="PAGE",
                    help=f"write the tables into PAGE under its '{HEADING}' heading")
    args = ap.parse_args(argv)
    headers, rows = load(args.json)
    if args.summary:
        print("\n".join(summary(rows)))
        return 0
    lines = table(headers, rows)
    if args.write:
        write_page(args.write, lines)
        print(f"wrote {len(rows)} rows into {args.write} under '{HEADING}'")
        return 0
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
