"""Compare the device code of every kernel between a git ref and the working tree.

For a change that only moves kernel code (files split, launchers regrouped, comments edited),
the generated device code must not change. This builds the device code of both trees the way
the extension does and compares it function by function:

  sm_90   hipified sources (tools/hipify.py) -> nvcc PTX (-O3 --use_fast_math, setup.py's
          device flags), or SASS with --sass (nvcc -cubin, cuobjdump -sass)
  sm_90a  the same for an sm_90a build (RA_WGMMA_BUILD: the Hopper warpgroup and tile-copy
          kernels, empty in the sm_90 pass); not in the default targets
  gfx942  HIP sources -> clang-19 device-only assembly (tools/check_kernels.py's gfx942 flags)

Each tree is taken with its own tools (hipify, kernel generator): the ref from `git archive`,
the working tree as it is. A translation unit present in both trees whose own text and every
header it includes (quoted includes, followed recursively) are the same up to comments and
blank space is identical by construction (same compiler, same flags; nothing under hip_src/
reads __LINE__, which a moved line would change) and is not compiled unless --compile-all;
every other unit is compiled in both trees. Functions (kernels and non-inlined device functions) are then matched by mangled
name across all compiled units, whichever file they came from, and compared after stripping
comments, debug/line directives and function-local label numbering.

A change that drops a template parameter made constant renames the kernels (their mangled
names); --rename 'REGEX=REPLACEMENT' (repeatable) rewrites the base's device code (its function
names and every reference to them: parameters, function-local shared arrays) with re.sub before
the comparison, so that each kept kernel meets its renamed self and its body is compared, e.g.
  --rename '(small_seq_tiled_fwd_warpgroup_kernelI\w+?Li\d+E)Li1ELi16ELb1E=\1'
drops the <WARPGROUPS=1, KEYS=16, CAPPED=true> arguments of that kernel's instances. Base
functions the rename does not reach are compared (or reported) under their own names.

Usage: python tools/compare_device_code.py [--base REF] [--targets sm_90,gfx942] [--sass]
       [--only SUBSTR,...] [--rename REGEX=REPLACEMENT ...] [--compile-all] [--jobs N]
       [--show-diff] [--keep DIR]
Prints one line per function (identical / DIFFERENT / only in base / only in tree) and exits
non-zero when any function differs or exists on one side only.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import difflib
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("sm_90", "gfx942")
EXTRA_TARGETS = ("sm_90a",)
CUOBJDUMP = "cuobjdump"  # --cuobjdump: where the CUDA toolkit's copy is not on PATH
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}")
    return proc


def prepare_tree(src: Path, out: Path) -> dict:
    """Generated instantiations and hipified sources of the tree at `src` (its own tools)."""
    gen = out / "gen"
    cuda = out / "cuda_src"
    run([sys.executable, src / "tools" / "generate_kernels.py", gen])
    run([sys.executable, src / "tools" / "hipify.py", src / "hip_src", cuda])
    run([sys.executable, src / "tools" / "hipify.py", gen, cuda / "gen"])
    hip_units = sorted((src / "hip_src").rglob("*.hip")) + sorted(gen.glob("*.hip"))
    return {
        "sm_90": (cuda, {str(p.relative_to(cuda)): p for p in sorted(cuda.rglob("*.cu"))}),
        "sm_90a": (cuda, {str(p.relative_to(cuda)): p for p in sorted(cuda.rglob("*.cu"))}),
        "gfx942": (src / "hip_src", {
            (str(p.relative_to(src / "hip_src")) if p.is_relative_to(src / "hip_src")
             else "gen/" + p.name): p for p in hip_units}),
    }


def code_text(data: str) -> str:
    """`data` without comments, each line's blank space collapsed, blank lines dropped: what the
    preprocessor sees, but for line numbers (string and character literals kept as written)."""
    out, i, n = [], 0, len(data)
    while i < n:
        c = data[i]
        if data.startswith("//", i):
            j = data.find("\n", i)
            i = n if j < 0 else j
        elif data.startswith("/*", i):
            j = data.find("*/", i + 2)
            out.append(" ")
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and data[j] != c:
                j += 2 if data[j] == "\\" else 1
            out.append(data[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = (" ".join(ln.split()) for ln in "".join(out).splitlines())
    return "\n".join(ln for ln in lines if ln)


def include_closure(unit: Path, include_dir: Path) -> dict:
    """{path relative to include_dir or the unit's folder: sha256 of its code_text} of the unit
    and its quoted includes, recursively (system headers are the same on both sides)."""
    seen: dict = {}
    todo = [unit]
    while todo:
        path = todo.pop()
        key = str(path.resolve())
        if key in seen:
            continue
        data = path.read_bytes()
        seen[key] = hashlib.sha256(code_text(data.decode()).encode()).hexdigest()
        for name in _INCLUDE_RE.findall(data.decode(errors="replace")):
            for base in (path.parent, include_dir):
                cand = base / name
                if cand.exists():
                    todo.append(cand)
                    break
    roots = (include_dir.resolve(), unit.parent.resolve())
    out = {}
    for key, digest in seen.items():
        p = Path(key)
        rel = next((str(p.relative_to(r)) for r in roots if p.is_relative_to(r)), p.name)
        out[rel] = digest
    return out


def compile_unit(target: str, unit: Path, include_dir: Path, out: Path, sass: bool) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    if target.startswith("sm_"):
        flags = ["-O3", "-std=c++17", "--use_fast_math", "-I", include_dir]
        if target == "sm_90a":  # what setup.py defines for a build with sm_90a code
            flags.append("-DRA_WGMMA_BUILD=1")
        arch = f"-arch={target}"
        if sass:
            run(["nvcc", arch, *flags, "-cubin", unit, "-o", out.with_suffix(".cubin")])
            return run([CUOBJDUMP, "-sass", out.with_suffix(".cubin")]).stdout
        run(["nvcc", arch, *flags, "-ptx", unit, "-o", out])
    else:
        run(["clang++-19", "-x", "hip", "--offload-arch=gfx942", "--rocm-path=/usr", "-O3",
             "-std=c++17", "-I", include_dir, "--cuda-device-only", "-nogpulib", "-S", unit,
             "-o", out])
    return out.read_text()


def _renumber(text: str, pattern: str) -> str:
    """Function-local labels renumbered in order of appearance (their absolute numbers depend
    on the function's position in its unit)."""
    names: dict = {}
    return re.sub(pattern, lambda m: names.setdefault(m.group(0), f"L{len(names)}"), text)


def split_ptx(text: str) -> dict:
    funcs = {}
    lines = [ln for ln in text.splitlines()
             if not re.match(r"\s*(\.loc|\.file|//|$)", ln)]
    text = "\n".join(re.sub(r"\s*//.*$", "", ln) for ln in lines)
    for m in re.finditer(r"^(?:\.visible |\.weak |)(?:\.entry|\.func)\s+(?:\([^)]*\)\s*)?(\w+)",
                         text, re.M):
        start = m.start()
        brace = text.find("{", m.end())
        depth, i = 0, brace
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        body = text[start:i + 1]
        if body.rstrip().endswith(";") and "{" not in body[:80]:  # a declaration
            continue
        # $L__ labels are the compiler's; RA_*_N ones come from inline asm's %= (hip_src/common/
        # tma.h), which numbers asm statements across the whole unit
        funcs[m.group(1)] = _renumber(body, r"\$L__\w+|\bRA_[A-Z_]+_\d+\b")
    return funcs


def _without_register_names(body: str) -> str:
    """A PTX body with every virtual register (and the register declarations) named by its class
    alone: two bodies equal under this differ only in how the compiler numbered registers, which
    still changes what ptxas allocates, so such a pair stays DIFFERENT, with a note."""
    body = re.sub(r"\.reg \.\w+\s+%\w+<\d+>;", "", body)
    return re.sub(r"%(rd|rs|r|fd|f|p)\d+\b", r"%\1", body)


def split_sass(text: str) -> dict:
    funcs = {}
    for chunk in re.split(r"\n\s*Function : ", text)[1:]:
        name, _, body = chunk.partition("\n")
        code = []
        for ln in body.splitlines():
            ln = re.sub(r"/\*[0-9a-f]{4,}\*/", "", ln)  # addresses
            ln = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", ln)  # encodings
            if ln.strip() and not ln.strip().startswith(("..........", ".section")):
                code.append(ln.rstrip())
        funcs[name.strip()] = "\n".join(code)
    return funcs


def split_amdgcn(text: str) -> dict:
    funcs = {}
    clean = []
    for ln in text.splitlines():
        ln = re.sub(r"\s*;.*$", "", ln)
        if not ln.strip() or re.match(r"\s*\.(loc|file|cfi_\w+)\b", ln):
            continue
        clean.append(ln)
    text = "\n".join(clean)
    for m in re.finditer(r"^\s*\.type\s+([\w.$]+),@function\s*$", text, re.M):
        name = m.group(1)
        end = re.search(r"^\.Lfunc_end\d+:", text[m.end():], re.M)
        stop = m.end() + (end.end() if end else len(text) - m.end())
        funcs[name] = _renumber(text[m.start():stop], r"\.L(?:BB|func_end|tmp)\d+(?:_\d+)?")
    for m in re.finditer(r"^\s*\.amdhsa_kernel\s+(\S+)\s*\n(.*?)^\s*\.end_amdhsa_kernel", text,
                         re.M | re.S):
        funcs[m.group(1) + " [kernel descriptor]"] = m.group(2)
    return funcs


def device_functions(target: str, text: str, sass: bool) -> dict:
    if target.startswith("sm_"):
        # nvcc names anonymous-namespace symbols after a hash of the source's path
        text = re.sub(r"_GLOBAL__N__[0-9a-f]{8}_", "_GLOBAL__N__path_", text)
        return split_sass(text) if sass else split_ptx(text)
    return split_amdgcn(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="main", help="git ref of the baseline (default main)")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--sass", action="store_true", help="sm_90: compare SASS, not PTX")
    parser.add_argument("--cuobjdump", default="cuobjdump", help="cuobjdump for --sass")
    parser.add_argument("--only", default="", help="comma-separated unit-name substrings to keep")
    parser.add_argument("--rename", action="append", default=[], metavar="REGEX=REPLACEMENT",
                        help="rewrite the base's device code with re.sub before matching "
                             "(renamed kernels; repeatable)")
    parser.add_argument("--compile-all", action="store_true",
                        help="compile units whose sources match too")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--show-diff", action="store_true", help="print a diff per difference")
    parser.add_argument("--keep", type=Path, help="keep the build products in this folder")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    renames = []
    for spec in args.rename:
        old, sep, new = spec.partition("=")
        if not sep or not old:
            parser.error(f"--rename {spec!r}: expected REGEX=REPLACEMENT")
        try:
            renames.append((re.compile(old), new))
        except re.error as exc:
            parser.error(f"--rename {spec!r}: {exc}")
    global CUOBJDUMP
    CUOBJDUMP = args.cuobjdump
    bad = set(targets) - set(TARGETS) - set(EXTRA_TARGETS)
    if bad:
        parser.error(f"unknown targets {sorted(bad)}; choose from {TARGETS + EXTRA_TARGETS}")
    sha = run(["git", "-C", ROOT, "rev-parse", "--verify", args.base + "^{commit}"]).stdout.strip()
    work = args.keep or Path(tempfile.mkdtemp(prefix="device_code_"))
    base_src = work / "base_src"
    if base_src.exists():
        shutil.rmtree(base_src)
    base_src.mkdir(parents=True)
    # rocm_attn: tools/generate_kernels.py reads the kernel plan (rocm_attn/small_seq_plan.py)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "hip_src", "tools",
                              "rocm_attn"],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(base_src)], input=archive.stdout, check=True)
    trees = {"base": prepare_tree(base_src, work / "base"), "tree": prepare_tree(ROOT, work / "tree")}
    only = [o for o in args.only.split(",") if o]
    status = 0
    print(f"device code: base {args.base} ({sha[:10]}) against the working tree {ROOT}")
    for target in targets:
        units = {side: trees[side][target] for side in trees}
        names = sorted(set(units["base"][1]) | set(units["tree"][1]))
        if only:
            names = [n for n in names if any(o in n for o in only)]
        jobs, same_units = [], []
        for name in names:
            present = {s: units[s][1].get(name) for s in units}
            if not args.compile_all and all(present.values()) and (include_closure(present["base"], units["base"][0]) ==
                                          include_closure(present["tree"], units["tree"][0])):
                same_units.append(name)
                continue
            for side, path in present.items():
                if path is not None:
                    out = work / "out" / target / side / (name.replace("/", "__") + ".s")
                    jobs.append((side, name, path, units[side][0], out))
        with cf.ThreadPoolExecutor(args.jobs) as pool:
            texts = list(pool.map(
                lambda j: (j[0], j[1], compile_unit(target, j[2], j[3], j[4], args.sass)), jobs))
        funcs: dict = {"base": {}, "tree": {}}
        renamed = 0
        for side, unit, text in texts:
            if side == "base":
                for pattern, new in renames:
                    text, n = pattern.subn(new, text)
                    renamed += n
            for fname, body in device_functions(target, text, args.sass).items():
                funcs[side].setdefault(fname, {})[unit] = body
        print(f"\n[{target}] {len(same_units)} units whose sources and includes match up to "
              f"comments (not compiled); {len(jobs)} compiles of "
              f"{len({j[1] for j in jobs})} units: " + ", ".join(sorted({j[1] for j in jobs})))
        if renames:
            print(f"[{target}] --rename: {renamed} replacements in the base's device code")
        counts = {"identical": 0, "DIFFERENT": 0, "only in base": 0, "only in tree": 0}
        for fname in sorted(set(funcs["base"]) | set(funcs["tree"])):
            b, t = funcs["base"].get(fname), funcs["tree"].get(fname)
            where = ""
            if b is None or t is None:
                verdict = "only in tree" if b is None else "only in base"
            else:
                bodies_b, bodies_t = set(b.values()), set(t.values())
                verdict = "identical" if len(bodies_b | bodies_t) == 1 else "DIFFERENT"
                moved = sorted(b) != sorted(t)
                where = f"  ({','.join(sorted(b))} -> {','.join(sorted(t))})" if moved else \
                    f"  ({','.join(sorted(t))})"
                if (verdict == "DIFFERENT" and target.startswith("sm_") and not args.sass
                        and len({_without_register_names(x) for x in bodies_b | bodies_t}) == 1):
                    where += "  [the same instructions; only virtual register numbers differ]"
                if verdict == "DIFFERENT" and args.show_diff:
                    diff = difflib.unified_diff(sorted(bodies_b)[0].splitlines(),
                                                sorted(bodies_t)[0].splitlines(), "base", "tree",
                                                lineterm="", n=1)
                    where += "\n" + "\n".join(list(diff)[:80])
            counts[verdict] += 1
            print(f"  {verdict:12s} {fname}{where}")
        print(f"[{target}] " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        if counts["DIFFERENT"] or counts["only in base"] or counts["only in tree"]:
            status = 1
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
