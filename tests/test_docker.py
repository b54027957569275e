"""The Dockerfiles promise pinned bases, the right arch lists, a build against the image's own
torch, a check that the kernels were built, and a self-test at build time; check each promise
by parsing the files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name, arch_marker, arches", [
    ("Dockerfile.rocm", "GPU_ARCHS", ["gfx942", "gfx90a"]),
    ("Dockerfile.cuda", "TORCH_CUDA_ARCH_LIST", ["9.0"]),
])
def test_dockerfile_promises(name, arch_marker, arches):
    ins = instructions(DOCKER / name)
    froms = [a for i, a in ins if i == "FROM"]
    assert len(froms) == 1 and ":" in froms[0] and not froms[0].endswith(":latest"), froms
    args = {a.split("=", 1)[0]: a.split("=", 1)[1].strip('"') for i, a in ins if i == "ARG"}
    assert all(arch in args[arch_marker].split(";") for arch in arches), args
    runs = " ".join(a for i, a in ins if i == "RUN")
    assert "--no-build-isolation" in runs and "--no-deps" in runs and "pip install" in runs
    assert "rocm_attn info --require-kernels" in runs  # the extension was built and loads
    assert "python3 -m rocm_attn selftest" in runs and "rocm-attn demo" in runs
    assert any(i == "COPY" for i, _ in ins)
    text = (DOCKER / name).read_text().lower()
    assert not re.search(r"(token|password|secret|api_key)\s*=", text)


def test_dockerignore_keeps_host_builds_out():
    patterns = (ROOT / ".dockerignore").read_text().split()
    for needed in ("build/", "**/*.so", "rocm_attn/_build_config.json", ".git"):
        assert needed in patterns, needed


def test_docker_readme_lists_both_images():
    text = (DOCKER / "README.md").read_text()
    for name in ("Dockerfile.rocm", "Dockerfile.cuda"):
        assert name in text
        base = [a for i, a in instructions(DOCKER / name) if i == "FROM"][0]
        assert base in text
