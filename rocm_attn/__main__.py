"""Command line of rocm_attn: `rocm-attn <command>` (or `python3 -m rocm_attn <command>`).

  info       torch, device and arch, what was built, which backend each op uses here
  selftest   every op on small random inputs against a float64 reference, on this device
  demo       recommendation-model inference through TargetAttention, a batch of pairs and a
             ranking request: throughput and the check against float64 (kernels on a GPU, the
             CPU path otherwise)
  bench      the GPU benchmarks: bench small-seq | thd | cp [their flags; --help for each]
  plan       which small-seq kernels serve a call on an arch, and their parameters (no GPU
             needed): plan --arch gfx942 --max-seqlen-q 64 --max-seqlen-kv 256 --head-dim 128
             --heads 8/2 [--backward]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import List, Optional

from . import __version__
from ._logging import LEVELS


def _positive_int(text: str) -> int:
    """argparse type: an int >= 1 (0 is an error, never "the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _device(text: str) -> str:
    """argparse type: cpu, cuda or cuda:N (ROCm builds of torch call their GPUs cuda too)."""
    head, sep, index = text.partition(":")
    if head in ("cpu", "cuda") and (not sep or (head == "cuda" and index.isdigit())):
        return text
    raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")


def _heads(text: str):
    """argparse type: HQ/HKV with HQ a positive multiple of HKV."""
    q, sep, kv = text.partition("/")
    if sep and q.isdigit() and kv.isdigit() and int(kv) >= 1 and int(q) % int(kv) == 0 \
            and int(q) >= 1:
        return int(q), int(kv)
    raise argparse.ArgumentTypeError(f"expected HQ/HKV with HQ a multiple of HKV >= 1, got "
                                     f"{text!r}")


def _plan_archs() -> List[str]:
    from .small_seq_plan import ARCHS

    return list(ARCHS)


def _plan(args) -> int:
    from . import small_seq_plan as sp

    tuning = sp.current_tuning()
    for item in args.tuning:
        name, sep, value = item.partition("=")
        if not sep or name not in sp.DEFAULT_TUNING or not value.lstrip("-").isdigit():
            print(f"rocm-attn plan: --tuning takes NAME=INT with a small-seq tuning name "
                  f"({', '.join(sp.DEFAULT_TUNING)}), got {item!r}", file=sys.stderr)
            return 2
        tuning[name] = int(value)
    call = sp.Call(args.head_dim, args.heads[0], args.heads[1], args.max_seqlen_q,
                   args.max_seqlen_kv, dtype=args.dtype, layout=args.layout,
                   int32_offsets=not args.int64_offsets, return_softmax=args.return_softmax,
                   return_lse=args.return_lse, backward=args.backward,
                   max_logit=args.max_logit)
    device = sp.ARCHS[args.arch]
    if args.json:
        plans = sp.plan_call(call, device, tuning)
        print(json.dumps({"arch": args.arch, "plans": [
            {"direction": p.direction, "path": p.path, "reason": p.reason,
             "launches": [{"kernel": launch.kernel, "template": sp.VARIANTS[launch.kernel][0],
                           "params": dict(launch.params)} for launch in p.launches]}
            for p in plans]}, indent=1))
    else:
        print(sp.describe(call, device, tuning))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocm-attn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rocm_attn {__version__}",
                        help="print the package version and exit")
    parser.add_argument("--log-level", type=str.upper, choices=LEVELS,
                        help="show rocm_attn's log at this level on stderr (INFO: which backend "
                             "serves each op and why); same as env ROCM_ATTN_LOG_LEVEL")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    info = sub.add_parser("info", help="torch, device, arch, kernels built, backends usable")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument("--require-kernels", action="store_true",
                      help="exit 1 unless the compiled kernels are loaded (image and CI checks)")
    sub.add_parser("selftest", help="each op on random inputs against the float64 reference")
    demo = sub.add_parser("demo", help="TargetAttention inference, a batch and a ranking "
                                       "request: throughput and check")
    demo.add_argument("--device", type=_device,
                      help="cpu, cuda or cuda:N (default: cuda when present)")
    demo.add_argument("--batch", type=_positive_int,
                      help="candidates (default 30720 on GPU, 2048 on CPU)")
    demo.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                      help="default bfloat16 on GPU, float32 on CPU")
    demo.add_argument("--iters", type=_positive_int,
                      help="timed batches (default 20 on GPU, 5 on CPU)")
    demo.add_argument("--users", type=_positive_int,
                      help="users of the ranking request (default 64 on GPU, 8 on CPU)")
    demo.add_argument("--candidates", type=_positive_int,
                      help="candidates per user of the request (default 512 on GPU, 64 on CPU)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--backend", choices=["auto", "kernel", "torch"], default="auto",
                      help="attention backend (auto: kernels where this install has them)")
    plan = sub.add_parser("plan", help="the small-seq kernels and parameters a call gets on an "
                                       "arch (rocm_attn/small_seq_plan.py; no GPU needed)")
    plan.add_argument("--arch", required=True, choices=_plan_archs(),
                      help="the device (its wave width, multiprocessors, shared memory and "
                           "kernels; sm_90a: an sm_90a build on Hopper)")
    plan.add_argument("--max-seqlen-q", type=_positive_int, required=True)
    plan.add_argument("--max-seqlen-kv", type=_positive_int, required=True)
    plan.add_argument("--head-dim", type=_positive_int, required=True)
    plan.add_argument("--heads", type=_heads, required=True, metavar="HQ/HKV",
                      help="q heads / kv heads, HQ a multiple of HKV (e.g. 8/2)")
    plan.add_argument("--dtype", choices=["bfloat16", "float16", "float32", "float64"],
                      default="bfloat16")
    plan.add_argument("--layout", choices=["thd", "bshd"], default="thd")
    plan.add_argument("--int64-offsets", action="store_true",
                      help="int64 cu_seqlens / seqlens_kv (the one-query kernels take int32)")
    plan.add_argument("--return-softmax", action="store_true")
    plan.add_argument("--return-lse", action="store_true")
    plan.add_argument("--max-logit", action="store_true",
                      help="return_max_logit: the tiled forward's ROW_MAX instances")
    plan.add_argument("--backward", action="store_true",
                      help="the call is differentiated: plan the backward too")
    plan.add_argument("--tuning", action="append", default=[], metavar="NAME=VALUE",
                      help="a small-seq tuning value for this plan (repeatable; default: this "
                           "process's values)")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    # bench's own flags belong to each suite; they are forwarded untouched (see _bench)
    sub.add_parser("bench", add_help=False, help="GPU benchmarks: bench {small-seq,thd,cp} "
                   "[flags]; `rocm-attn bench SUITE --help` lists a suite's flags")
    return parser


def _bench(argv: List[str]) -> int:
    from .bench import SUITES

    usage = (f"usage: rocm-attn bench {{{','.join(SUITES)}}} [flags]\n"
             "  runs the benchmark suite on this machine's GPU(s); flags are the suite's own "
             "(--json, --cases, --plot out.png, ...): rocm-attn bench SUITE --help")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] not in SUITES:
        print(f"rocm-attn bench: unknown suite {argv[0]!r}\n{usage}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__package__}.bench.{SUITES[argv[0]]}")
    # the suites' argparse names itself after sys.argv[0]: show the command that was typed
    saved = list(sys.argv)
    sys.argv[:1] = [f"rocm-attn bench {argv[0]}"]
    try:
        return module.main(argv[1:])
    finally:
        sys.argv[:] = saved


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    # `bench` forwards everything after the suite name, --help included, so it is split off
    # before argparse sees it (argparse would claim the suite's flags as its own).
    split = argv.index("bench") if "bench" in argv else len(argv)
    args = parser.parse_args(argv[:split + 1])
    if args.log_level:
        from ._logging import set_level

        set_level(args.log_level)
    if args.command == "bench":
        return _bench(argv[split + 1:])
    if args.command == "info":
        from .info import collect, format_text

        report = collect()
        print(json.dumps(report, indent=1) if args.json else format_text(report))
        if args.require_kernels and not report["extension_loaded"]:
            print(f"rocm-attn info: the compiled kernels are required but not loaded: "
                  f"{report['extension_error']}", file=sys.stderr)
            return 1
        return 0
    if args.command == "plan":
        return _plan(args)
    if args.command == "selftest":
        from . import selftest

        return 0 if selftest.run() else 1
    from . import demo

    cfg = demo.default_config(args.device, args.batch, args.dtype, args.iters, args.seed,
                              args.backend, args.users, args.candidates)
    # What this machine cannot run, as one line (exit 1), not a traceback from inside the run.
    problem = demo.cannot_run(cfg)
    if problem:
        print(f"rocm-attn demo: {problem}", file=sys.stderr)
        return 1
    return demo.run_and_report(cfg)


if __name__ == "__main__":
    sys.exit(main())
