"""Packaging metadata: the license is declared as an SPDX string (PEP 639) with its full text
shipped, the build floor of setuptools is one that reads that form, and the torchrec extra pins
the versions CI installs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (CI's Python is 3.11)
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_string_with_its_text():
    project = PYPROJECT["project"]
    # the table form ({text = ...}) is deprecated by setuptools and warns at every build
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a notice


def test_setuptools_floor_reads_the_spdx_form():
    # PEP 639 license expressions are read by setuptools 77 and later
    requires = PYPROJECT["build-system"]["requires"]
    spec = next(r for r in requires if r.startswith("setuptools"))
    major = int(re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", spec).group(1))
    assert major >= 77, spec


def _pins(lines):
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", p).groups() for p in lines)


def test_torchrec_extra_pins_what_ci_installs():
    """pyproject's torchrec extra and .ci/run's install line name the same torchrec and FBGEMM
    versions (CI installs FBGEMM's CPU build, fbgemm-gpu-cpu, of the version the extra pins)."""
    extra = _pins(PYPROJECT["project"]["optional-dependencies"]["torchrec"])
    assert set(extra) == {"torchrec", "fbgemm-gpu"}, extra
    ci = (ROOT / ".ci" / "run").read_text()
    installed = dict(re.findall(r"\b(torchrec|fbgemm-gpu-cpu)==(\S+)", ci))
    assert installed.get("torchrec") == extra["torchrec"], installed
    assert installed.get("fbgemm-gpu-cpu") == extra["fbgemm-gpu"], installed
