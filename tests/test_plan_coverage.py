"""tools/plan_coverage.py: which kernel instances the plan picks for the benchmark rows, per arch,
and the plan section of docs/kernels_resources.md it writes (no GPU, no compiler)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import plan_coverage  # noqa: E402

from rocm_attn import small_seq_plan as sp  # noqa: E402

DOC = ROOT / "docs" / "kernels_resources.md"


@pytest.fixture(scope="module")
def cov():
    return plan_coverage.coverage()


def test_doc_plan_section_is_current(cov):
    """docs/kernels_resources.md holds the plan section of today's plan (regenerate it with
    `python3 tools/plan_coverage.py --doc docs/kernels_resources.md`)."""
    text = DOC.read_text()
    begin, end = text.index(plan_coverage.DOC_BEGIN), text.index(plan_coverage.DOC_END)
    want = plan_coverage.doc_section({a: cov[a] for a in plan_coverage.DOC_ARCHS})
    assert text[begin:end + len(plan_coverage.DOC_END) + 1] == want, \
        "stale: python3 tools/plan_coverage.py --doc docs/kernels_resources.md"
    assert text.endswith(plan_coverage.DOC_END + "\n")


def test_picked_instances_are_in_the_resource_tables(cov):
    """Every instance the plan picks on an AMD arch is one the compiler report lists for it (the
    plan's names are the compiled template instances)."""
    text = DOC.read_text()
    for arch in plan_coverage.DOC_ARCHS:
        part = text.split(f"\n## {arch}\n", 1)[1].split("\n## ", 1)[0]
        listed = set(re.findall(r"^\| [^|]+ \| `([^`]+)`", part, re.M))
        picked = {inst for inst in cov[arch] if "<" in inst}
        assert picked and picked <= listed, (arch, sorted(picked - listed))


def test_every_row_gets_a_plan_on_every_arch(cov):
    rows = plan_coverage.benchmark_rows()
    names = [name for name, _ in rows]
    assert len(names) == len(set(names))
    assert {"h8_d128_kv16", "u4096_c512_kv256f_hkv8_d128"} <= set(names)
    assert any(name.startswith("u256_czipf") for name in names)  # the ragged rows
    for arch in plan_coverage.COVERAGE_ARCHS:
        runs = {run for who in cov[arch].values() for run in who}
        for name in names:
            assert f"{name} (fwd)" in runs and f"{name} (bwd)" in runs, (arch, name)


def test_instance_and_variant_names():
    launch = sp.Launch("tiled_fwd_block", (("D", 128), ("THREADS", 256), ("CP_ASYNC", False),
                                           ("grid_factor", 4), ("ROW_MAX", True)))
    assert plan_coverage.instance(launch, "bfloat16") == \
        "small_seq_tiled_fwd_block_kernel<ra_bf16, 128, 256, false, true>"
    assert plan_coverage.instance(launch, "float16").startswith(
        "small_seq_tiled_fwd_block_kernel<ra_fp16")
    assert plan_coverage.variant(launch) == \
        "tiled_fwd_block(THREADS=256, CP_ASYNC=false, ROW_MAX=true)"
    assert plan_coverage.instance(sp.Launch("flash"), "bfloat16") == "flash"


def test_splice_replaces_only_the_section():
    section = plan_coverage.DOC_BEGIN + "\nnew\n" + plan_coverage.DOC_END + "\n"
    old = "head\n\n" + plan_coverage.DOC_BEGIN + "\nold\n" + plan_coverage.DOC_END + "\n"
    assert plan_coverage.splice(old, section) == "head\n\n" + section
    assert plan_coverage.splice("head\n", section) == "head\n\n" + section


def test_every_row_picked_variant_has_a_table_entry(cov):
    """Each variant (kernel and schedule parameters) some benchmark row gets on some arch is
    one that an entry of the variant table (tests/helpers/small_seq_variants.py) makes the plan
    pick on a listed arch, so that the GPU and emulation tests run it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import small_seq_variants as V

    tabled = {plan_coverage.variant(launch) for case in V.VARIANT_CASES for arch in case.archs
              for launch in case.plan(sp.ARCHS[arch]).launches}
    picked = plan_coverage.picked_variants(cov)
    assert set(picked) <= tabled, f"add table entries for {sorted(set(picked) - tabled)}"
