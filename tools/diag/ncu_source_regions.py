"""Where a kernel's warp stall samples fall, from Nsight Compute's SASS source page.

Usage (on the GPU machine, then anywhere):

    ncu --section WarpStateStats --section SourceCounters -k regex:<kernel> \\
        --launch-skip 2 --launch-count 1 -o rep python3 tools/diag/ranking_row_call.py <row>
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 tools/diag/ncu_source_regions.py sass.csv [--top 20]

The page has one line per SASS instruction: its text, the stall samples that landed on it (with
the reason of each) and how many times warps executed it. Instructions that ran the same number
of times belong to the same part of the kernel (per item, per tile, per loop step), so this
groups them by that count and prints, per group, the share of all samples, the static
instruction count and the warp instructions executed; then the stall reasons over the whole
kernel, and the instructions with the most samples with their main reason ("unnamed" where the
page names the reason of less than half of them). A CSV compressed with gzip is read as is.
"""
import argparse
import csv
import gzip
import sys
from collections import Counter
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
SOURCE = "Source"


@dataclass
class Report:
    total: int = 0
    # execution count -> [samples, static instructions, executed warp instructions]
    groups: dict = field(default_factory=dict)
    reasons: Counter = field(default_factory=Counter)
    top: list = field(default_factory=list)  # (samples, executed, text, main reason)


def _int(text: str) -> int:
    text = text.replace(",", "").strip()
    return int(float(text)) if text else 0


def read_rows(path: str) -> list:
    """The page's rows as dicts keyed by its header (the line naming SAMPLES; ncu puts the
    kernel's name above it)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        lines = list(csv.reader(f))
    for i, row in enumerate(lines):
        if SAMPLES in row and EXECUTED in row:
            header = row
            return [dict(zip(header, r)) for r in lines[i + 1:] if len(r) == len(header)]
    raise ValueError(f"{path}: no header with '{SAMPLES}' and '{EXECUTED}' (ncu --page source --csv)")


def summarize(rows: list, top: int = 20) -> Report:
    rep = Report()
    reasons = [k for k in (rows[0] if rows else {}) if k.startswith("stall_") and "Not Issued" not in k]
    for r in rows:
        samples = _int(r[SAMPLES])
        executed = _int(r[EXECUTED])
        rep.total += samples
        g = rep.groups.setdefault(executed, [0, 0, 0])
        g[0] += samples
        g[1] += 1
        g[2] += executed
        counts = {k: _int(r[k]) for k in reasons}
        rep.reasons.update(counts)
        # The page names no reason for some samples (a warpgroup product's waits among them):
        # where the named reasons hold less than half of an instruction's samples, say so.
        named = sum(counts.values())
        main = max(counts, key=counts.get) if named > 0 else "-"
        if samples and 2 * named < samples:
            main = "unnamed"
        rep.top.append((samples, executed, r[SOURCE].strip(), main))
    rep.top = sorted(rep.top, key=lambda t: -t[0])[:top]
    return rep


def format_report(rep: Report, groups: int = 12) -> str:
    total = max(rep.total, 1)
    out = [f"{rep.total} stall samples", "",
           "executed per instruction | samples | static instructions | warp instructions"]
    ranked = sorted(rep.groups.items(), key=lambda kv: -kv[1][0])
    for executed, (samples, static, warp_insts) in ranked[:groups]:
        out.append(f"{executed:>24d} | {100 * samples / total:6.1f}% | {static:19d} | {warp_insts:>17d}")
    if len(ranked) > groups:
        rest = sum(v[0] for _, v in ranked[groups:])
        out.append(f"{'(other counts)':>24s} | {100 * rest / total:6.1f}% |")
    out += ["", "stall reasons over the kernel:"]
    for reason, n in rep.reasons.most_common():
        if n:
            out.append(f"  {reason:28s} {100 * n / total:6.1f}%")
    out += ["", "instructions with the most samples (samples, executed, main reason):"]
    for samples, executed, text, main in rep.top:
        out.append(f"  {100 * samples / total:5.1f}% {executed:>12d}  {text[:64]:64s} {main}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu -i REPORT --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=20, help="instructions listed by samples")
    ap.add_argument("--groups", type=int, default=12, help="execution-count groups listed")
    args = ap.parse_args(argv)
    print(format_report(summarize(read_rows(args.csv), args.top), args.groups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
