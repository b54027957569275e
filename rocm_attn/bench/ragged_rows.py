"""Rows of the ragged-request benchmark (``rocm-attn bench small-seq --ranking --ragged``): what
a row is, how its users' candidate counts and history lengths are drawn, and its floors.

Pure arithmetic on CPU tensors (no device, no kernels), so that the rows, the drawing and the
floors are tested without a GPU (tests/test_bench_ragged_rows.py).

A row is a request batch: ``users`` users, each with its own candidate count (queries) and
history length (keys), both drawn from a :class:`Dist`; heads ``h_q`` / ``h_kv`` (MHA, GQA or
MQA), head dim ``d``, dtype bf16 or fp16. Its name spells all of it, so any row can be asked for
by name (``--cases``)::

    u256_cln100s1:1-1000_kzipf1.1:16-4096_h8kv2_d128_bf16

Distributions (integers, every drawn value within ``[lo, hi]``):
  ``N``                 fixed: every user has N
  ``A-B``               uniform on A..B
  ``lnMsS:A-B``         log-normal with median M and log-space deviation S, rounded and clipped
                        to A..B (a long tail of heavy users above a typical one)
  ``zipfE:A-B``         Zipf-like: P(n) proportional to n^-E on A..B (most users short, a few
                        at the top)
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

# Matrix products per (candidate, q head, valid key), as the ranking grid counts them.
from .small_seq_ranking import FWD_BWD_PRODUCTS, FWD_PRODUCTS

# The dtypes a row may name, and their element bytes.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ELEM_BYTES = 2
HEAD_DIMS = (64, 128, 256)

_NUM = r"(\d+(?:\.\d+)?)"
_DIST_FORMS = (
    ("fixed", re.compile(r"(\d+)")),
    ("uniform", re.compile(r"(\d+)-(\d+)")),
    ("lognormal", re.compile(rf"ln{_NUM}s{_NUM}:(\d+)-(\d+)")),
    ("zipf", re.compile(rf"zipf{_NUM}:(\d+)-(\d+)")),
)


def _num(x: float) -> str:
    """A parameter as the name spells it: 100 not 100.0, 1.25 as is."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass(frozen=True)
class Dist:
    """Per-user counts: ``kind`` fixed / uniform / lognormal / zipf on ``lo..hi`` (see the
    module's docstring); ``median`` and ``sigma`` for lognormal, ``exponent`` for zipf."""

    kind: str
    lo: int
    hi: int
    median: float = 0.0
    sigma: float = 0.0
    exponent: float = 0.0

    def __post_init__(self):
        if self.kind not in ("fixed", "uniform", "lognormal", "zipf"):
            raise ValueError(f"Dist kind must be fixed, uniform, lognormal or zipf, got "
                             f"{self.kind!r}")
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"Dist needs 1 <= lo <= hi, got lo {self.lo}, hi {self.hi}")
        if self.kind == "fixed" and self.lo != self.hi:
            raise ValueError(f"a fixed Dist has lo == hi, got {self.lo} and {self.hi}")
        if self.kind == "lognormal" and not (self.median > 0 and self.sigma > 0):
            raise ValueError(f"lognormal needs median > 0 and sigma > 0, got {self.median}, "
                             f"{self.sigma}")
        if self.kind == "zipf" and not self.exponent > 0:
            raise ValueError(f"zipf needs an exponent > 0, got {self.exponent}")

    @property
    def ragged(self) -> bool:
        return self.kind != "fixed"

    def spell(self) -> str:
        if self.kind == "fixed":
            return str(self.lo)
        if self.kind == "uniform":
            return f"{self.lo}-{self.hi}"
        if self.kind == "lognormal":
            return f"ln{_num(self.median)}s{_num(self.sigma)}:{self.lo}-{self.hi}"
        return f"zipf{_num(self.exponent)}:{self.lo}-{self.hi}"

    def draw(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """``n`` counts (int64, CPU) from the CPU generator ``gen``."""
        if self.kind == "fixed":
            return torch.full((n,), self.lo, dtype=torch.int64)
        if self.kind == "uniform":
            return torch.randint(self.lo, self.hi + 1, (n,), generator=gen, dtype=torch.int64)
        if self.kind == "lognormal":
            z = torch.randn(n, generator=gen, dtype=torch.float64)
            x = torch.exp(math.log(self.median) + self.sigma * z).round()
            return x.clamp(self.lo, self.hi).to(torch.int64)
        support = torch.arange(self.lo, self.hi + 1, dtype=torch.float64)
        weights = support.pow(-self.exponent)
        return self.lo + torch.multinomial(weights, n, replacement=True, generator=gen)

    def mean(self) -> float:
        """The distribution's exact mean (lognormal: of the rounded, clipped values), for
        tests and size estimates."""
        if self.kind == "fixed":
            return float(self.lo)
        if self.kind == "uniform":
            return (self.lo + self.hi) / 2
        support = torch.arange(self.lo, self.hi + 1, dtype=torch.float64)
        if self.kind == "zipf":
            w = support.pow(-self.exponent)
            return float((w * support).sum() / w.sum())
        # P(round(X) = n) for X log-normal; the clip puts the tails' mass on lo and hi
        edges = torch.cat([support - 0.5, support[-1:] + 0.5]).clamp(min=1e-300)
        normal = torch.distributions.Normal(0.0, 1.0)
        cdf = normal.cdf((edges.log() - math.log(self.median)) / self.sigma)
        p = cdf[1:] - cdf[:-1]
        p[0] += cdf[0]
        p[-1] += 1 - cdf[-1]
        return float((p * support).sum())


def parse_dist(text: str) -> Dist:
    for kind, form in _DIST_FORMS:
        m = form.fullmatch(text)
        if m is None:
            continue
        g = m.groups()
        if kind == "fixed":
            return Dist("fixed", int(g[0]), int(g[0]))
        if kind == "uniform":
            return Dist("uniform", int(g[0]), int(g[1]))
        if kind == "lognormal":
            return Dist("lognormal", int(g[2]), int(g[3]), median=float(g[0]), sigma=float(g[1]))
        return Dist("zipf", int(g[1]), int(g[2]), exponent=float(g[0]))
    raise ValueError(f"not a distribution: {text!r} (N, A-B, lnMsS:A-B or zipfE:A-B)")


@dataclass(frozen=True)
class Row:
    """One request batch (see the module's docstring); ``label`` says where it comes from."""

    users: int
    cands: Dist
    keys: Dist
    h_q: int = 8
    h_kv: int = 8
    d: int = 128
    dtype: str = "bf16"
    label: str = field(default="", compare=False)

    def __post_init__(self):
        if self.users < 1:
            raise ValueError(f"users must be >= 1, got {self.users}")
        if self.h_kv < 1 or self.h_q % self.h_kv:
            raise ValueError(f"h_q ({self.h_q}) must be a multiple of h_kv ({self.h_kv})")
        if self.d not in HEAD_DIMS:
            raise ValueError(f"d must be one of {HEAD_DIMS}, got {self.d}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")

    @property
    def name(self) -> str:
        return (f"u{self.users}_c{self.cands.spell()}_k{self.keys.spell()}_h{self.h_q}kv"
                f"{self.h_kv}_d{self.d}_{self.dtype}")

    @property
    def heads(self) -> str:
        if self.h_kv == self.h_q:
            return "MHA"
        return "MQA" if self.h_kv == 1 else "GQA"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def __str__(self) -> str:  # the progress line
        return self.name


_ROW = re.compile(r"u(\d+)_c([^_]+)_k([^_]+)_h(\d+)kv(\d+)_d(\d+)_(bf16|fp16)")


def parse_row(name: str) -> Row:
    """The row :attr:`Row.name` spells; ValueError naming what does not parse."""
    m = _ROW.fullmatch(name)
    if m is None:
        raise ValueError(f"not a ragged row name: {name!r} (spelled like "
                         f"{ISSUE_ROWS[0].name})")
    users, cands, keys, h_q, h_kv, d, dtype = m.groups()
    return Row(int(users), parse_dist(cands), parse_dist(keys), int(h_q), int(h_kv), int(d),
               dtype)


def _u(lo: int, hi: int) -> Dist:
    return Dist("uniform", lo, hi) if lo != hi else Dist("fixed", lo, lo)


# The request batches of the ranking issue's table, as rows (ragged ranges drawn uniformly;
# h_q 8; where the table names no heads, head dim or dtype: MHA, d 128, bf16).
ISSUE_ROWS: Tuple[Row, ...] = (
    Row(512, _u(64, 512), _u(16, 512), label="issue: 512 users, 64-512 cands, 16-512 keys"),
    Row(256, _u(128, 1024), _u(64, 384), h_kv=2,
        label="issue: 256 users, 128-1024 cands, 64-384 keys, 8/2 heads"),
    Row(128, _u(100, 300), _u(1000, 4000), h_kv=2,
        label="issue: 128 users, 100-300 cands, 1000-4000 keys, 8/2 heads"),
    Row(256, _u(50, 200), _u(8, 64), d=256, dtype="fp16",
        label="issue: 256 users, 50-200 cands, 8-64 keys, fp16, d 256"),
    Row(256, _u(512, 512), _u(256, 256), label="issue: 256 x 512 x 256, equal lengths"),
    Row(4096, _u(1, 32), _u(1, 64), h_kv=1, d=64,
        label="issue: 4096 users, 1-32 cands, 1-64 keys, MQA, d 64"),
    Row(2048, _u(8, 64), _u(4, 16), label="issue: 2048 users, 8-64 cands, 4-16 keys"),
    Row(8192, _u(1, 1), _u(32, 1024), label="issue: 8192 users, 1 query, 32-1024 keys"),
)


def _ln(median: float, sigma: float, lo: int, hi: int) -> Dist:
    return Dist("lognormal", lo, hi, median=median, sigma=sigma)


def _zipf(exponent: float, lo: int, hi: int) -> Dist:
    return Dist("zipf", lo, hi, exponent=exponent)


# Rows drawn from long-tailed distributions (up to 1,000 candidates and 4,096 keys per user),
# between them covering d 64 / 128 / 256, MHA / GQA / MQA, bf16 / fp16.
DRAWN_ROWS: Tuple[Row, ...] = (
    Row(256, _ln(100, 1.0, 1, 1000), _ln(256, 1.0, 1, 4096), h_kv=2,
        label="log-normal cands and keys, GQA"),
    Row(256, _zipf(1.1, 1, 1000), _zipf(1.1, 16, 4096), dtype="fp16",
        label="Zipf cands and keys, MHA, fp16"),
    Row(128, _ln(300, 0.7, 1, 1000), _ln(1500, 0.7, 16, 4096), h_kv=2,
        label="log-normal, long histories, GQA"),
    Row(1024, _u(1, 64), _ln(64, 1.0, 1, 1024), h_kv=1, d=64,
        label="uniform cands, log-normal keys, MQA, d 64"),
    Row(512, _u(16, 256), _zipf(1.0, 1, 2048), h_kv=2, d=256,
        label="uniform cands, Zipf keys, GQA, d 256"),
    Row(2048, _zipf(1.5, 1, 256), _u(8, 128), d=64, dtype="fp16",
        label="Zipf cands, uniform keys, MHA, d 64, fp16"),
    Row(256, _ln(64, 1.2, 1, 1000), _ln(512, 1.2, 1, 4096), h_kv=1, d=256, dtype="fp16",
        label="log-normal, heavy tails, MQA, d 256, fp16"),
    Row(4096, _u(1, 1), _ln(200, 1.0, 1, 4096), h_kv=2,
        label="1 query, log-normal keys, GQA"),
)

ROWS: Tuple[Row, ...] = ISSUE_ROWS + DRAWN_ROWS


def row_seed(row: Row, seed: int) -> int:
    """The generator seed of a row's lengths: from the run's seed and the row's name, so a
    row's users are the same whichever rows run beside it."""
    return zlib.crc32(f"{seed}:{row.name}".encode())


@dataclass(frozen=True)
class Lengths:
    """A row's drawn counts (int64 CPU ``[users]``) and what the floors need of them."""

    cands: torch.Tensor
    keys: torch.Tensor

    @property
    def total_q(self) -> int:
        return int(self.cands.sum())

    @property
    def total_kv(self) -> int:
        return int(self.keys.sum())

    @property
    def pairs(self) -> int:
        """(candidate, valid key) pairs: the score entries per head."""
        return int((self.cands * self.keys).sum())

    @property
    def max_q(self) -> int:
        return int(self.cands.max())

    @property
    def max_kv(self) -> int:
        return int(self.keys.max())

    def offsets(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """int32 ``cu_seqlens_q`` and ``cu_seqlens_kv`` ``[users + 1]`` (CPU)."""
        out = []
        for n in (self.cands, self.keys):
            cu = torch.zeros(n.numel() + 1, dtype=torch.int32)
            cu[1:] = torch.cumsum(n, 0)
            out.append(cu)
        return out[0], out[1]


def draw_lengths(row: Row, seed: int) -> Lengths:
    """The row's per-user candidate counts and history lengths for the run's ``seed``."""
    gen = torch.Generator().manual_seed(row_seed(row, seed))
    cands = row.cands.draw(row.users, gen)
    keys = row.keys.draw(row.users, gen)
    return Lengths(cands, keys)


def floor_bytes(row: Row, n: Lengths) -> Tuple[int, int]:
    """Fewest bytes (forward, forward+backward), as the ranking grid counts them
    (small_seq_ranking.floor_bytes): the forward reads q, each history's K and V once and writes
    out; the backward reads q, K, V, out and dout and writes dq, dK and dV."""
    qb = n.total_q * row.h_q * row.d * ELEM_BYTES
    kvb = 2 * n.total_kv * row.h_kv * row.d * ELEM_BYTES
    fwd = qb + qb + kvb
    bwd = (qb + kvb + qb + qb) + (qb + kvb)
    return fwd, fwd + bwd


def matrix_flops(row: Row, n: Lengths) -> Tuple[float, float]:
    """FLOP of the fewest matrix products (forward, forward+backward): per product a
    multiply-add (2 FLOP) over the head dim for every (candidate, q head, valid key)."""
    per_product = 2.0 * n.pairs * row.h_q * row.d
    return FWD_PRODUCTS * per_product, FWD_BWD_PRODUCTS * per_product


@dataclass(frozen=True)
class Floor:
    """A mode's floors in ms: bytes over the copy bandwidth, FLOP over the matrix-product
    rate; ``ms`` is the larger (what no kernel beats), ``bound`` which one it is."""

    bytes_ms: float
    matrix_ms: float

    @property
    def ms(self) -> float:
        return max(self.bytes_ms, self.matrix_ms)

    @property
    def bound(self) -> str:
        return "matrix" if self.matrix_ms > self.bytes_ms else "bytes"


def floors(row: Row, n: Lengths, copy_bytes_per_s: float,
           matmul_flop_per_s: float) -> Tuple[Floor, Floor]:
    """(forward, forward+backward) floors at this run's copy bandwidth and matrix rate."""
    if copy_bytes_per_s <= 0 or matmul_flop_per_s <= 0:
        raise ValueError(f"rates must be positive, got {copy_bytes_per_s} B/s and "
                         f"{matmul_flop_per_s} FLOP/s")
    nbytes = floor_bytes(row, n)
    flops = matrix_flops(row, n)
    return tuple(Floor(b / copy_bytes_per_s * 1e3, f / matmul_flop_per_s * 1e3)
                 for b, f in zip(nbytes, flops))


def padded_bytes(row: Row, n: Lengths, backward: bool) -> int:
    """Bytes of the padded anchors' tensors (q / out and K / V expanded to h_q heads, at each
    batch's longest user; with the backward also dout, dq, dK and dV): what SDPA on padded
    tensors needs beside the THD inputs."""
    q = row.users * n.max_q * row.h_q * row.d * ELEM_BYTES
    kv = row.users * n.max_kv * row.h_q * row.d * ELEM_BYTES
    per = 2 if backward else 1
    return per * (2 * q + 2 * kv)


def sample_users(n: Lengths, count: int, gen: Optional[torch.Generator] = None) -> List[int]:
    """Users the float64 oracle checks: the one with the longest history, the one with the most
    candidates, the one with the fewest keys, then drawn ones, ``count`` distinct in all (fewer
    where the row has fewer users)."""
    picks: List[int] = []
    for u in (int(n.keys.argmax()), int(n.cands.argmax()), int(n.keys.argmin())):
        if u not in picks:
            picks.append(u)
    users = n.cands.numel()
    order = torch.randperm(users, generator=gen).tolist()
    for u in order:
        if len(picks) >= min(count, users):
            break
        if u not in picks:
            picks.append(u)
    return picks[:min(count, users)]
