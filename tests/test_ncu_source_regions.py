"""tools/diag/ncu_source_regions.py: stall samples of Nsight Compute's SASS source page grouped
by how many times each instruction ran, on a page written here in ncu's CSV shape."""
from __future__ import annotations

import csv
import gzip
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "diag"))

import ncu_source_regions as regions  # noqa: E402

HEADER = ["Address", "Source", regions.SAMPLES, "Warp Stall Sampling (Not-issued Samples)",
          regions.EXECUTED, "stall_wait", "stall_barrier", "stall_long_sb",
          "stall_wait (Not Issued)"]


def write_page(path: Path, rows: list, compress: bool = False) -> None:
    """A source page as ncu writes it: the kernel's name on its own line above the header."""
    opener = gzip.open if compress else open
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "void kernel<int>(int)"])
        w.writerow(HEADER)
        for i, (text, samples, executed, wait, barrier, long_sb) in enumerate(rows):
            w.writerow([hex(16 * i), f"      {text}", samples, samples, executed, wait, barrier,
                        long_sb, 0])


def random_rows(rng: random.Random) -> list:
    rows = []
    for _ in range(rng.randint(5, 40)):
        executed = rng.choice([0, 1024, 4096, 12288])
        wait, barrier, long_sb = (rng.randint(0, 50) for _ in range(3))
        samples = wait + barrier + long_sb + rng.randint(0, 5)
        rows.append((f"FFMA R{rng.randint(0, 255)}", samples, executed, wait, barrier, long_sb))
    return rows


@pytest.mark.parametrize("compress", [False, True])
def test_groups_and_reasons_match_a_direct_count(tmp_path, compress):
    rng = random.Random()
    rows = random_rows(rng)
    path = tmp_path / ("page.csv.gz" if compress else "page.csv")
    write_page(path, rows, compress)
    rep = regions.summarize(regions.read_rows(str(path)), top=5)
    assert rep.total == sum(r[1] for r in rows)
    for executed in {r[2] for r in rows}:
        mine = [r for r in rows if r[2] == executed]
        assert rep.groups[executed] == [sum(r[1] for r in mine), len(mine), executed * len(mine)]
    assert rep.reasons["stall_wait"] == sum(r[3] for r in rows)
    assert rep.reasons["stall_long_sb"] == sum(r[5] for r in rows)
    assert "stall_wait (Not Issued)" not in rep.reasons
    assert [t[0] for t in rep.top] == sorted((r[1] for r in rows), reverse=True)[:5]


def test_main_reason_and_unnamed_samples(tmp_path):
    path = tmp_path / "page.csv"
    write_page(path, [("HGMMA.64x64x16", 100, 8, 3, 2, 0),   # most samples under no named reason
                      ("BRA 0x40", 40, 8, 1, 0, 30),
                      ("FMNMX R1, R2, R3", 20, 24, 15, 0, 0)])
    rep = regions.summarize(regions.read_rows(str(path)))
    assert [(t[2], t[3]) for t in rep.top] == [("HGMMA.64x64x16", "unnamed"),
                                              ("BRA 0x40", "stall_long_sb"),
                                              ("FMNMX R1, R2, R3", "stall_wait")]
    text = regions.format_report(rep)
    assert "160 stall samples" in text
    assert "87.5%" in text  # the instructions run 8 times: 140 of 160 samples


def test_a_page_without_the_columns_is_refused(tmp_path):
    path = tmp_path / "page.csv"
    path.write_text("Address,Source\n0x0,NOP\n")
    with pytest.raises(ValueError, match="no header"):
        regions.read_rows(str(path))
