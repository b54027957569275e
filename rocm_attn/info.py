"""`rocm-attn info`: what this install is and what it can run here.

torch and its GPU runtime, the device and its arch, what the build compiled (backend, arches,
kernel variants), and which backend each op family will use on this device, with the reason
when it is not the kernels.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

import torch

from . import _ext

_VARIANT = re.compile(r"small_seq_(fwd|bwd)_(\w+?)_d(\d+)_kv(\d+)$")


def device_arch(index: int = 0) -> Optional[str]:
    """``gfx942``-style name on ROCm, ``sm_90``-style on CUDA; None without a GPU."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip is not None:
        return props.gcnArchName.split(":")[0]  # drop feature flags such as :sramecc+:xnack-
    return f"sm_{props.major}{props.minor}"


def _normalize_arch(arch: str) -> str:
    """TORCH_CUDA_ARCH_LIST spellings ("9.0", "9.0a", "9.0+PTX") and build names ("sm_90a") ->
    "sm_90" (the arch-specific "a" code runs on that compute capability); gfx names as is."""
    arch = arch.strip().split(":")[0]  # gfx90a:xnack- -> gfx90a
    m = re.fullmatch(r"(\d+)\.(\d+)a?(\+PTX)?", arch)
    if m:
        return f"sm_{m.group(1)}{m.group(2)}"
    m = re.fullmatch(r"(sm_\d+)a", arch)
    return m.group(1) if m else arch


def arch_mismatch(arch: Optional[str], built: List[str]) -> Optional[str]:
    """Warning text when the kernels were not compiled for this device's arch."""
    if arch is None or not built:
        return None
    if arch in {_normalize_arch(a) for a in built}:
        return None
    var = "GPU_ARCHS" if arch.startswith("gfx") else "TORCH_CUDA_ARCH_LIST"
    value = arch if arch.startswith("gfx") else f"{arch[3:-1]}.{arch[-1]}"
    return (f"the kernels were built for {', '.join(built)}, not for this device ({arch}); "
            f"rebuild with {var}={value} python3 -m pip install --no-build-isolation -e .")


def kernel_summary(kernels: List[str]) -> str:
    """One line for the small-seq variants the build generated."""
    parts = [m.groups() for m in map(_VARIANT.match, kernels) if m]
    if not parts:
        return "none"
    dirs = sorted({p[0] for p in parts}, reverse=True)
    dtypes = sorted({p[1] for p in parts})
    dims = sorted({int(p[2]) for p in parts})
    kvs = sorted({int(p[3]) for p in parts})
    return (f"{len(parts)} small-seq variants ({'/'.join(dirs)} x {'/'.join(dtypes)} x head dim "
            f"{'/'.join(map(str, dims))} x kv bucket {'/'.join(map(str, kvs))})")


def op_backends(device: torch.device) -> Dict[str, str]:
    """Which backend each op family uses on ``device`` (fp16/bf16 inputs), and why."""
    from . import thd
    from .varlen.backends import flash_support_problem, resolve_backend

    gpu = device.type == "cuda"
    if gpu and _ext.HAS_EXTENSION:
        small = "kernels (fp16/bf16, head dim 64/128/256/512); torch path for other calls"
    elif gpu:
        small = f"torch path: {_ext.extension_error()}"
    else:
        small = "torch path (CPU; the kernels run on GPUs)"
    if gpu and thd.HAS_KERNELS:
        thd_line = "kernels; torch path for calls they do not serve"
    else:
        thd_line = "torch path" + ("" if gpu else " (CPU)")
    probe = torch.empty(0, 1, 128, device=device, dtype=torch.bfloat16)
    step = resolve_backend("auto", probe).name
    cp_line = (f"per-step {step} for fp16/bf16 up to head dim 256, reference otherwise"
               if step != "reference" else "per-step reference (pure torch)"
               + (f": {flash_support_problem(device, probe.dtype)}" if gpu else ""))
    return {"fused_attn_small_seq": small, "thd": thd_line, "attn_with_cp": cp_line}


def collect() -> dict:
    """Everything `rocm-attn info` prints, as a dict (also its --json output)."""
    from . import build_info

    info = build_info()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arch = device_arch()
    info.update({
        "torch_cuda": torch.version.cuda,
        "torch_hip": torch.version.hip,
        "device": info["gpu"] or "cpu",
        "device_arch": arch,
        "gpu_count": torch.cuda.device_count() if device.type == "cuda" else 0,
        "kernel_summary": kernel_summary(info["kernels"]),
        "arch_warning": arch_mismatch(arch, info["archs"]) if info["extension_loaded"] else None,
        "backends": op_backends(device),
    })
    return info


def format_text(info: dict) -> str:
    """Human-readable report of :func:`collect`."""
    runtime = (f"ROCm/HIP {info['torch_hip']}" if info["torch_hip"] else
               f"CUDA {info['torch_cuda']}" if info["torch_cuda"] else "CPU-only build")
    device = info["device"] + (f" ({info['device_arch']}, {info['gpu_count']} visible)"
                               if info["device_arch"] else "")
    lines = [
        f"rocm_attn {info['version']}",
        f"torch       {info['torch']} ({runtime})",
        f"device      {device}",
        f"build       backend {info['backend']}, arches {', '.join(info['archs']) or '-'}",
        f"kernels     {info['kernel_summary']}",
        f"extension   {'loaded' if info['extension_loaded'] else 'not loaded'}"
        + ("" if info["extension_loaded"] else f": {info['extension_error']}"),
    ]
    if info["arch_warning"]:
        lines.append(f"WARNING     {info['arch_warning']}")
    lines.append("backends on this device:")
    lines += [f"  {op:22s} {line}" for op, line in info["backends"].items()]
    return "\n".join(lines)
