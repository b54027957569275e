"""A ranking model on torchrec inputs, end to end: KeyedJaggedTensor -> EmbeddingCollection ->
rocm_attn.nn.TargetAttention -> a scoring head.

A request holds, per user, the ids of the user's recent items ("history") and of the items to
rank ("candidates"), as one torchrec KeyedJaggedTensor: values (all ids) and lengths (per
feature, per user), as the input pipeline hands them over. The EmbeddingCollection looks the
ids up in one item table and returns a JaggedTensor per feature; TargetAttention takes both
JaggedTensors as they come (values with their lengths, no conversion), every candidate
attending to its user's history; an MLP scores each candidate from its embedding and its
"interest" vector.

The same model runs in each mode this machine supports, and every mode's scores are compared
with eager mode's (and eager mode's with a float64 per-user loop):

  eager    the module as written, under torch.inference_mode
  compile  torch.compile (inductor; on a CPU it needs a C++ compiler)
  aoti     torch.export (non-strict, a dynamic number of ids) -> AOTInductor package, loaded
           and run on a second request of another size (CPU)
  onnx     torch.onnx.export -> onnxruntime, when onnx, onnxscript and onnxruntime are
           installed (else reported as skipped)

Needs torchrec and FBGEMM (pip install "rocm_attn[torchrec]"; on a CPU-only machine the CPU
build of FBGEMM, as .ci/run installs it). Exits 1 when a mode fails or disagrees.

Usage:
  python3 examples/torchrec_ranking.py                       # every mode, a small request
  python3 examples/torchrec_ranking.py --modes eager,compile --users 64 --candidates 256
  python3 examples/torchrec_ranking.py --threads 1   # steadier times on a busy machine
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from rocm_attn.nn import TargetAttention

FEATURES = ["history", "candidates"]  # the KeyedJaggedTensor's keys, in order
MODES = ["eager", "compile", "aoti", "onnx"]
TOLERANCE = 1e-4  # float32 scores; the modes differ only in the order of float32 operations
REPEATS = 5  # timed passes over the requests (median)


def _torchrec():
    """torchrec's classes, or a SystemExit naming the install line."""
    try:
        from torchrec.modules.embedding_configs import EmbeddingConfig
        from torchrec.modules.embedding_modules import EmbeddingCollection
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    except ImportError as exc:
        raise SystemExit(f"this example needs torchrec and FBGEMM ({exc}): "
                         "pip install 'rocm_attn[torchrec]' (CPU-only: see .ci/run)") from None
    return EmbeddingConfig, EmbeddingCollection, KeyedJaggedTensor


class Ranker(nn.Module):
    """Item embeddings -> target attention over the user's history -> MLP -> one score per
    candidate."""

    def __init__(self, num_items: int, embed_dim: int, max_history: int,
                 max_candidates: int) -> None:
        super().__init__()
        EmbeddingConfig, EmbeddingCollection, _ = _torchrec()
        self.embeddings = EmbeddingCollection(
            tables=[EmbeddingConfig(name="item_table", embedding_dim=embed_dim,
                                    num_embeddings=num_items, feature_names=FEATURES)],
            device=torch.device("cpu"))
        self.attention = TargetAttention(embed_dim, num_heads=4, num_kv_heads=2,
                                         max_seqlen_kv=max_history)
        self.max_candidates = max_candidates
        self.head = nn.Sequential(nn.Linear(3 * embed_dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """values: item ids [nnz] int64; lengths [2 * users]: the history lengths of every user,
        then the candidate counts (the KeyedJaggedTensor's layout) -> scores [n_candidates]."""
        _, _, KeyedJaggedTensor = _torchrec()
        features = KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths)
        return self.score(features)

    def score(self, features) -> torch.Tensor:
        """Scores of a KeyedJaggedTensor request."""
        embedded = self.embeddings(features)  # {feature: JaggedTensor of [rows, embed_dim]}
        history, candidates = embedded["history"], embedded["candidates"]
        interest = self.attention(candidates, history, max_candidates=self.max_candidates)
        cand = candidates.values()
        return self.head(torch.cat([cand, interest, cand * interest], dim=-1)).squeeze(-1)


def make_request(users: int, candidates: int, max_history: int, num_items: int,
                 seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values, lengths) of a request: histories of 0..max_history items, 1..candidates
    candidates per user (user 0 without history: its candidates get the empty interest)."""
    gen = torch.Generator().manual_seed(seed)
    hist = torch.randint(0, max_history + 1, (users,), generator=gen)
    hist[0] = 0
    cands = torch.randint(1, candidates + 1, (users,), generator=gen)
    lengths = torch.cat([hist, cands])
    values = torch.randint(0, num_items, (int(lengths.sum()),), generator=gen)
    return values, lengths


def reference_scores(model: Ranker, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The model's scores computed in float64, one user at a time, with no rocm_attn call."""
    users = lengths.numel() // 2
    table = model.embeddings.embeddings["item_table"].weight.double()
    att = model.attention
    h, hk, d = att.num_heads, att.num_kv_heads, att.head_dim
    lin = lambda x, m: F.linear(x, m.weight.double(), m.bias.double())  # noqa: E731
    ids = values.split(lengths.tolist())
    scores = []
    for u in range(users):
        hist, cand = table[ids[u]], table[ids[users + u]]
        q = lin(cand, att.q_proj).view(-1, h, d)
        kv = lin(hist, att.kv_proj).view(-1, 2, hk, d)
        k, v = (kv[:, i].repeat_interleave(h // hk, dim=1) for i in (0, 1))
        if k.shape[0]:
            w = torch.einsum("qhd,khd->hqk", q, k).mul(d ** -0.5).softmax(-1)
            mixed = torch.einsum("hqk,khd->qhd", w, v)
        else:
            mixed = q.new_zeros(q.shape)
        interest = lin(mixed.reshape(-1, h * d), att.out_proj)
        x = torch.cat([cand, interest, cand * interest], dim=-1)
        scores.append(lin(torch.relu(lin(x, model.head[0])), model.head[2]).squeeze(-1))
    return torch.cat(scores)


def _export(model: Ranker, request) -> "torch.export.ExportedProgram":
    """Non-strict export with the number of ids dynamic (a serving model takes any request
    of the same user count)."""
    nnz = torch.export.Dim("nnz", min=2, max=2**31 - 1)
    with warnings.catch_warnings():
        # the torch path's warning on a CPU (no kernels to export), and torchrec's note that
        # its feature split is slow under non-strict export
        warnings.simplefilter("ignore")
        return torch.export.export(model, request, dynamic_shapes=({0: nnz}, None),
                                   strict=False)


def _run_eager(model, requests, workdir):
    return lambda *r: model(*r)


def _run_compile(model, requests, workdir):
    compiled = torch.compile(model, dynamic=True)

    def run(*request):
        # torchrec's KeyedJaggedTensor reads its per-feature sizes as Python ints: captured as
        # symbolic sizes, the whole model is one graph (else dynamo breaks the graph there)
        with torch._dynamo.config.patch(capture_scalar_outputs=True,
                                        capture_dynamic_output_shape_ops=True):
            return compiled(*request)

    return run


def _run_aoti(model, requests, workdir):
    import torch._inductor as inductor

    program = _export(model, requests[0])
    path = inductor.aoti_compile_and_package(program,
                                             package_path=str(workdir / "ranker.pt2"))
    return inductor.aoti_load_package(path)


def _onnx_missing() -> Optional[str]:
    missing = [m for m in ("onnx", "onnxscript", "onnxruntime")
               if importlib.util.find_spec(m) is None]
    return f"skipped: needs {', '.join(missing)}" if missing else None


def _run_onnx(model, requests, workdir):
    import onnxruntime

    path = workdir / "ranker.onnx"
    program = _export(model, requests[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(program, requests[0], str(path), dynamo=True,
                          input_names=["values", "lengths"], output_names=["scores"])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(values, lengths):
        out = session.run(None, {"values": values.numpy(), "lengths": lengths.numpy()})[0]
        return torch.from_numpy(out)

    return run


RUNNERS: Dict[str, Callable] = {"eager": _run_eager, "compile": _run_compile,
                                "aoti": _run_aoti, "onnx": _run_onnx}


def run_mode(mode: str, model: Ranker, requests, workdir: Path):
    """(seconds to prepare, median ms per request, scores of each request, note); scores None
    when the mode was skipped or failed (the note says which). Preparing is what a mode does
    before its first call (export, AOTInductor's C++ build, ONNX export); torch.compile
    compiles in its first call, which is not timed."""
    if mode == "onnx" and _onnx_missing():
        return None, None, None, _onnx_missing()
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            run = RUNNERS[mode](model, requests, workdir)
            prepared = time.perf_counter() - start
            scores = [run(*r) for r in requests]  # the first call of compile also compiles
            times = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                for r in requests:
                    run(*r)
                times.append((time.perf_counter() - start) * 1e3 / len(requests))
            ms = statistics.median(times)
        return prepared, ms, scores, ""
    except Exception as exc:  # reported with the mode's row; the run then fails
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return None, None, None, f"failed: {type(exc).__name__}: {first}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--users", type=int, default=8, help="users per request (default 8)")
    parser.add_argument("--candidates", type=int, default=32,
                        help="at most this many candidates per user (default 32)")
    parser.add_argument("--max-history", type=int, default=64,
                        help="history items per user, at most (default 64)")
    parser.add_argument("--items", type=int, default=1000, help="item table rows")
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--threads", type=int,
                        help="torch intra-op threads (default torch's; 1 gives steadier times "
                             "on a machine shared with other work)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown or "eager" not in modes:
        parser.error(f"--modes: {unknown} not among {MODES}" if unknown
                     else "--modes must include eager (every mode is compared with it)")
    for name in ("users", "candidates", "max_history", "items", "embed_dim", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    _torchrec()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = Ranker(args.items, args.embed_dim, args.max_history, args.candidates).eval()
    # two requests of different sizes: an exported program must serve both
    requests = [make_request(args.users, args.candidates, args.max_history, args.items, seed)
                for seed in (1, 2)]
    print(f"ranker: torchrec EmbeddingCollection ({args.items} items x {args.embed_dim}) -> "
          f"TargetAttention (4 heads / 2 kv heads) -> MLP, on the CPU; requests of "
          f"{args.users} users, 1..{args.candidates} candidates, 0..{args.max_history} "
          f"history items each ({[int(r[1][args.users:].sum()) for r in requests]} candidates)")
    ok = True
    with torch.no_grad():
        want = [reference_scores(model, *r) for r in requests]
    with tempfile.TemporaryDirectory() as tmp:
        eager = None
        print(f"{'mode':8s} {'prepare s':>10s} {'ms/request':>11s} {'max |diff|':>11s}  vs")
        for mode in modes:
            prepared, ms, scores, note = run_mode(mode, model, requests, Path(tmp))
            if scores is None:
                ok = ok and note.startswith("skipped")
                print(f"{mode:8s} {'-':>10s} {'-':>11s} {'-':>11s}  {note}")
                continue
            base, against = (want, "float64 loop") if mode == "eager" else (eager, "eager")
            diff = max(((s.double() - b.double()).abs().max().item() for s, b in
                        zip(scores, base)), default=0.0)
            good = diff <= TOLERANCE and all(s.shape == b.shape for s, b in zip(scores, base))
            ok = ok and good  # False for NaN too
            eager = scores if mode == "eager" else eager
            print(f"{mode:8s} {prepared:10.1f} {ms:11.2f} {diff:11.2e}  {against}"
                  f"{'' if good else '  FAIL'}")
    print(f"check: every mode within {TOLERANCE:.0e}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
