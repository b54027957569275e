// rocm_attn: matrix-unit (MMA / MFMA) tiles behind one small API. Included by compat.h.
//
// The kernels above this header compute, per wave,
//   S[16][N]  += X[16][D] . Y[N][D]^T     (ra_mma_dot: rows of X against rows of Y)
//   O[N'][D]  += P[N'][16] . V[16][D]     (ra_mma_pv: P taken from an S accumulator)
// with 16-bit inputs (bf16 or fp16, the T template argument) and fp32 accumulation, and they
// read the same on every vendor. Everything vendor-specific is here: fragment layouts, the
// instruction, how fragments are filled from global memory.
//
//   NVIDIA sm_80+ (32-lane warp): mma.sync.aligned.m16n8k16 (row.col, f32 accumulators).
//   AMD gfx90a / gfx94x / gfx950 (64-lane wave): v_mfma_f32_16x16x16{bf16_1k,f16}.
//   Anything else: RA_HAS_MMA is 0 and none of this exists; callers keep a scalar path.
//
// Operands are read straight from global memory with 16-byte loads, one read per byte and no
// shared memory. That works because a dot product over D does not care in which order its terms
// are summed: every ra_mma_rows panel maps the instruction's k index onto the head dim through
// the same fixed permutation, chosen so that each lane's part of a row is whole 16-byte pieces.
// Likewise the columns of V and O (the D of P.V) are permuted identically on load and store.
// Callers never see the permutations; they only see matrices by (base, row stride, rows).
//
// The accumulator's element coordinates are public (ra_mma_acc_row / _col), so a softmax can
// run on the accumulator in registers; rows are reduced across lanes with ra_mma_row_max / _sum,
// columns with ra_mma_col_sum.
//
// NOTE (AMD): every MFMA here is issued with its A and B operands swapped, i.e. it computes the
// transpose of the logical product. With that, the logical accumulator layout (lane = row +
// 16 * (col / 4), element = col % 4) is exactly the layout of a logical A operand, so an
// accumulator converts to the next product's operand in registers, as on NVIDIA (where the
// m16n8 accumulator of two adjacent n-tiles is an m16k16 A fragment by construction).
#pragma once

#if defined(__HIP_DEVICE_COMPILE__) && \
    (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || \
     defined(__gfx950__))
#define RA_MMA_CDNA 1
#define RA_HAS_MMA 1
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RA_MMA_SM80 1
#define RA_HAS_MMA 1
#else
#define RA_HAS_MMA 0
#endif

#if RA_HAS_MMA

// Narrowest accumulator tile (columns) the hardware has: m16n8 on NVIDIA, 16x16 on CDNA.
// Products over few rows (the q heads of a GQA group) use tiles of this many columns.
#if defined(RA_MMA_SM80)
constexpr int kRaMmaMinN = 8;
#else
constexpr int kRaMmaMinN = 16;
#endif

// ---------------------------------------------------------------------------------------------
// The instruction: C[16][16 or 8] += A[16][16] . B[16][...] on raw 16-bit fragments.
// ---------------------------------------------------------------------------------------------
#if defined(RA_MMA_SM80)
// One m16n8k16. a: 4 registers of 2 x 16-bit, b: 2 registers, c: 4 fp32 (PTX ISA fragment
// layouts, groupID g = lane / 4, t = lane % 4):
//   a0 = A[g][2t..2t+1]  a1 = A[g+8][2t..2t+1]  a2 = A[g][2t+8..2t+9]  a3 = A[g+8][2t+8..2t+9]
//   b0 = B[2t..2t+1][g]  b1 = B[2t+8..2t+9][g]
//   c0, c1 = C[g][2t..2t+1]  c2, c3 = C[g+8][2t..2t+1]
template <typename T>
RA_DEVICE void ra_mma_m16n8k16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                               uint32_t b0, uint32_t b1);
template <>
RA_DEVICE void ra_mma_m16n8k16<ra_bf16>(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
RA_DEVICE void ra_mma_m16n8k16<ra_fp16>(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two fp32 -> one register of two 16-bit values (lo in bits 0..15), round to nearest even.
template <typename T>
RA_DEVICE uint32_t ra_mma_pack2(float lo, float hi);
template <>
RA_DEVICE uint32_t ra_mma_pack2<ra_bf16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> high
  return r;
}
template <>
RA_DEVICE uint32_t ra_mma_pack2<ra_fp16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 16-bit halves of two registers side by side: {x.lo, y.lo} and {x.hi, y.hi}.
RA_DEVICE uint32_t ra_mma_lo_lo(uint32_t x, uint32_t y) { return __byte_perm(x, y, 0x5410); }
RA_DEVICE uint32_t ra_mma_hi_hi(uint32_t x, uint32_t y) { return __byte_perm(x, y, 0x7632); }

#else  // RA_MMA_CDNA

typedef short ra_mma_v4i16 __attribute__((ext_vector_type(4)));
typedef _Float16 ra_mma_v4f16 __attribute__((ext_vector_type(4)));
typedef float ra_mma_v4f32 __attribute__((ext_vector_type(4)));

// One v_mfma_f32_16x16x16 (wave64). Each operand is 4 x 16-bit per lane in two registers
// (lo = items 0, 1; hi = items 2, 3), c is 4 fp32 per lane (CDNA ISA layouts, lane l):
//   A_op[i][k] at lane i + 16 * (k / 4), item k % 4
//   B_op[k][j] at lane j + 16 * (k / 4), item k % 4
//   D[i][j]    at lane j + 16 * (i / 4), item i % 4
template <typename T>
RA_DEVICE void ra_mfma_16x16x16(float* c, uint32_t a_lo, uint32_t a_hi, uint32_t b_lo,
                                uint32_t b_hi);
template <>
RA_DEVICE void ra_mfma_16x16x16<ra_bf16>(float* c, uint32_t a_lo, uint32_t a_hi, uint32_t b_lo,
                                         uint32_t b_hi) {
  const uint32_t a2[2] = {a_lo, a_hi};
  const uint32_t b2[2] = {b_lo, b_hi};
  ra_mma_v4f32 acc = {c[0], c[1], c[2], c[3]};
  acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(ra_mma_v4i16, a2),
                                                  __builtin_bit_cast(ra_mma_v4i16, b2), acc, 0,
                                                  0, 0);
  c[0] = acc[0];
  c[1] = acc[1];
  c[2] = acc[2];
  c[3] = acc[3];
}
template <>
RA_DEVICE void ra_mfma_16x16x16<ra_fp16>(float* c, uint32_t a_lo, uint32_t a_hi, uint32_t b_lo,
                                         uint32_t b_hi) {
  const uint32_t a2[2] = {a_lo, a_hi};
  const uint32_t b2[2] = {b_lo, b_hi};
  ra_mma_v4f32 acc = {c[0], c[1], c[2], c[3]};
  acc = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(ra_mma_v4f16, a2),
                                              __builtin_bit_cast(ra_mma_v4f16, b2), acc, 0, 0,
                                              0);
  c[0] = acc[0];
  c[1] = acc[1];
  c[2] = acc[2];
  c[3] = acc[3];
}

template <typename T>
RA_DEVICE uint32_t ra_mma_pack2(float lo, float hi) {
  return static_cast<uint32_t>(ra_dtype<T>::from_float(lo)) |
         (static_cast<uint32_t>(ra_dtype<T>::from_float(hi)) << 16);
}

RA_DEVICE uint32_t ra_mma_lo_lo(uint32_t x, uint32_t y) { return (x & 0xffffu) | (y << 16); }
RA_DEVICE uint32_t ra_mma_hi_hi(uint32_t x, uint32_t y) { return (x >> 16) | (y & 0xffff0000u); }

#endif

// ---------------------------------------------------------------------------------------------
// Accumulator: a 16 x N fp32 tile (N = 8 or 16; on CDNA every tile is 16 x 16).
// Element i of a lane sits at (ra_mma_acc_row(lane, i), ra_mma_acc_col(lane, i)). A lane holds
// kRaMmaAccSlots distinct rows; element i belongs to slot ra_mma_acc_slot(i), whose rows are
// >= ra_mma_slot_row0(slot). Every (row, col) of the tile is held by exactly one lane.
// ---------------------------------------------------------------------------------------------
template <int N>
struct ra_mma_acc {
  static_assert(N == 8 || N == 16, "accumulator tiles are 16 x 8 or 16 x 16");
#if defined(RA_MMA_SM80)
  static constexpr int kElems = N / 2;  // N / 8 m16n8 tiles of 4
#else
  static constexpr int kElems = 4;
#endif
  float x[kElems];
};

#if defined(RA_MMA_SM80)
constexpr int kRaMmaAccSlots = 2;  // rows g and g + 8
RA_DEVICE int ra_mma_acc_row(int lane, int i) { return (lane >> 2) + 8 * ((i >> 1) & 1); }
RA_DEVICE int ra_mma_acc_col(int lane, int i) { return 8 * (i >> 2) + 2 * (lane & 3) + (i & 1); }
RA_HOST_DEVICE constexpr int ra_mma_acc_slot(int i) { return (i >> 1) & 1; }
RA_HOST_DEVICE constexpr int ra_mma_slot_row0(int slot) { return 8 * slot; }
// Lanes sharing a row: the 4 lanes of a quad.
RA_DEVICE float ra_mma_row_max(float v) {
  v = fmaxf(v, ra_shfl_xor(v, 1));
  return fmaxf(v, ra_shfl_xor(v, 2));
}
RA_DEVICE float ra_mma_row_sum(float v) {
  v += ra_shfl_xor(v, 1);
  return v + ra_shfl_xor(v, 2);
}
#else
constexpr int kRaMmaAccSlots = 1;  // row lane % 16
RA_DEVICE int ra_mma_acc_row(int lane, int /*i*/) { return lane & 15; }
RA_DEVICE int ra_mma_acc_col(int lane, int i) { return 4 * (lane >> 4) + i; }
RA_HOST_DEVICE constexpr int ra_mma_acc_slot(int /*i*/) { return 0; }
RA_HOST_DEVICE constexpr int ra_mma_slot_row0(int /*slot*/) { return 0; }
// Lanes sharing a row: lane % 16 equal, i.e. the four 16-lane rows of the wave.
RA_DEVICE float ra_mma_row_max(float v) {
  v = fmaxf(v, ra_shfl_xor(v, 16));
  return fmaxf(v, ra_shfl_xor(v, 32));
}
RA_DEVICE float ra_mma_row_sum(float v) {
  v += ra_shfl_xor(v, 16);
  return v + ra_shfl_xor(v, 32);
}
#endif

// Column totals: element i of the result holds the sum over all 16 rows of element i's column.
template <int N>
RA_DEVICE ra_mma_acc<N> ra_mma_col_sum(const ra_mma_acc<N>& a) {
  ra_mma_acc<N> r;
#if defined(RA_MMA_SM80)
  // Elements i and i ^ 2 are rows g and g + 8 of one column; lanes sharing t share columns.
#pragma unroll
  for (int i = 0; i < ra_mma_acc<N>::kElems; ++i) {
    float v = a.x[i] + a.x[i ^ 2];
    v += ra_shfl_xor(v, 4);
    v += ra_shfl_xor(v, 8);
    r.x[i] = v + ra_shfl_xor(v, 16);
  }
#else
  // One row per lane; lanes sharing lane / 16 share columns.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v = a.x[i];
    v += ra_shfl_xor(v, 1);
    v += ra_shfl_xor(v, 2);
    v += ra_shfl_xor(v, 4);
    r.x[i] = v + ra_shfl_xor(v, 8);
  }
#endif
  return r;
}

template <int N>
RA_DEVICE void ra_mma_zero(ra_mma_acc<N>& c) {
#pragma unroll
  for (int i = 0; i < ra_mma_acc<N>::kElems; ++i) c.x[i] = 0.f;
}

// ---------------------------------------------------------------------------------------------
// Row panel: R (<= 16) rows of D 16-bit values, an operand of ra_mma_dot. Rows >= R, and rows
// >= the `nrows` given at load time, hold exact zeros (never read from memory).
//   NVIDIA: lane (g, t) holds rows g and g + 8 (the latter only when R > 8), 16-byte pieces
//           t, t + 4, t + 8, ... of each: one k16 step s uses piece s / 2, half s % 2, i.e. MMA
//           k = 2t + e (+8) <-> head-dim element 8 (t + 4 (s / 2)) + 4 (s % 2) + e (+2).
//   CDNA:   lane (r = l % 16, q = l / 16) holds row r, pieces q, q + 4, ...: step s, MFMA
//           k = 4q + e <-> element 8 (q + 4 (s / 2)) + 4 (s % 2) + e.
// Both are one permutation of the head dim per step, the same for every panel.
// ---------------------------------------------------------------------------------------------
template <int D, int R>
struct ra_mma_rows {
  static_assert(D % 32 == 0, "row panels take head dims that are multiples of 32");
  static_assert(R >= 1 && R <= 16, "row panels have at most 16 rows");
#if defined(RA_MMA_SM80)
  static constexpr int kRows = R > 8 ? 2 : 1;
#else
  static constexpr int kRows = 1;
#endif
  static constexpr int kPieces = D / 32;
  ra_vec8 v[kRows][kPieces];
};

// Loads rows [0, min(R, nrows)) of the matrix at `base` (row r at base + r * row_stride, 16-byte
// aligned rows). All lanes of the wave call this together.
template <int D, int R>
RA_DEVICE void ra_mma_load_rows(ra_mma_rows<D, R>& x, const uint16_t* base, int64_t row_stride,
                                int nrows, int lane) {
#if defined(RA_MMA_SM80)
  const int row0 = lane >> 2;
  const int piece0 = lane & 3;
#else
  const int row0 = lane & 15;
  const int piece0 = lane >> 4;
#endif
#pragma unroll
  for (int h = 0; h < ra_mma_rows<D, R>::kRows; ++h) {
    const int row = row0 + 8 * h;
    const bool ok = row < R && row < nrows;
    const uint16_t* p = base + row * row_stride;
#pragma unroll
    for (int j = 0; j < ra_mma_rows<D, R>::kPieces; ++j)
      x.v[h][j] = ok ? ra_load16(p + 8 * (piece0 + 4 * j)) : ra_vec8{{0u, 0u, 0u, 0u}};
  }
}

// c[m][n] += sum_d x[m][d] * y[n][d] for m < 16, n < N (y supplies at most N rows).
template <typename T, int N, int D, int RX, int RY>
RA_DEVICE void ra_mma_dot(ra_mma_acc<N>& c, const ra_mma_rows<D, RX>& x,
                          const ra_mma_rows<D, RY>& y) {
  static_assert(RY <= N, "y has more rows than the accumulator has columns");
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    const int j = s >> 1;
    const int w = 2 * (s & 1);
#if defined(RA_MMA_SM80)
    uint32_t a1 = 0u, a3 = 0u;
    if constexpr (RX > 8) {
      a1 = x.v[1][j].w[w];
      a3 = x.v[1][j].w[w + 1];
    }
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) {
      constexpr int kYRows = ra_mma_rows<D, RY>::kRows;
      const bool have = nt < kYRows;
      const int h = have ? nt : 0;
      ra_mma_m16n8k16<T>(c.x + 4 * nt, x.v[0][j].w[w], a1, x.v[0][j].w[w + 1], a3,
                         have ? y.v[h][j].w[w] : 0u, have ? y.v[h][j].w[w + 1] : 0u);
    }
#else
    ra_mfma_16x16x16<T>(c.x, y.v[0][j].w[w], y.v[0][j].w[w + 1], x.v[0][j].w[w],
                        x.v[0][j].w[w + 1]);  // swapped operands: see the header NOTE
#endif
  }
}

// ---------------------------------------------------------------------------------------------
// P operand of ra_mma_pv: N rows x 16 columns of 16-bit values, taken from an accumulator.
// ---------------------------------------------------------------------------------------------
template <int N>
struct ra_mma_pfrag {
  static_assert(N == 8 || N == 16, "P fragments have 8 or 16 rows");
#if defined(RA_MMA_SM80)
  uint32_t b[N / 8][2];  // the B operand (P^T) of the n8 tiles of O^T = V^T P^T
#else
  uint32_t b[2];
#endif
};

// P[n][k] = s[n][k] rounded to T, for rows n < N of the accumulator; columns k >= NS are zero.
template <typename T, int N, int NS>
RA_DEVICE ra_mma_pfrag<N> ra_mma_to_pfrag(const ra_mma_acc<NS>& s) {
  ra_mma_pfrag<N> f;
#if defined(RA_MMA_SM80)
  // n8 tile nt of P^T needs P[8 nt + g][2t..2t+1] and [2t+8..2t+9]: accumulator slot nt of the
  // first and of the second m16n8 tile.
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
    f.b[nt][0] = ra_mma_pack2<T>(s.x[2 * nt], s.x[2 * nt + 1]);
    if constexpr (NS == 16) {
      f.b[nt][1] = ra_mma_pack2<T>(s.x[4 + 2 * nt], s.x[5 + 2 * nt]);
    } else {
      f.b[nt][1] = 0u;
    }
  }
#else
  f.b[0] = ra_mma_pack2<T>(s.x[0], s.x[1]);
  f.b[1] = ra_mma_pack2<T>(s.x[2], s.x[3]);
#endif
  return f;
}

// P[n][k] = s[k][n] rounded to T: the P operand of the transposed 16 x 16 accumulator, built by
// shuffles (each lane packs its elements pairwise first, so one 32-bit shuffle moves two
// values; the receiving lane keeps the half it needs). For a product that needs both S and
// S^T as P operands: one product and these shuffles instead of a second product.
template <typename T>
RA_DEVICE ra_mma_pfrag<16> ra_mma_to_pfrag_transposed(const ra_mma_acc<16>& s, int lane) {
  ra_mma_pfrag<16> f;
#if defined(RA_MMA_SM80)
  // b[nt][hi] = P[8 nt + g][2t + 8 hi + a] for a = 0, 1, i.e. s[2t + 8 hi + a][8 nt + g]: held by
  // lane 4 (2t + a) + g / 2 as element (g & 1) + 2 hi + 4 nt (ra_mma_acc_row / _col).
  const int g = lane >> 2;
  const int t = lane & 3;
  const int src0 = 8 * t + (g >> 1);  // a = 0; a = 1 is the next group of four lanes
  const bool odd = (g & 1) != 0;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int w = static_cast<int>(ra_mma_pack2<T>(s.x[4 * nt + 2 * hi], s.x[4 * nt + 2 * hi + 1]));
      const uint32_t w0 = static_cast<uint32_t>(ra_shfl(w, src0));
      const uint32_t w1 = static_cast<uint32_t>(ra_shfl(w, src0 + 4));
      f.b[nt][hi] = odd ? ra_mma_hi_hi(w0, w1) : ra_mma_lo_lo(w0, w1);
    }
#else
  // b[e / 2] half e % 2 = P[r][4q + e] = s[4q + e][r]: held by lane 4q + e + 16 (r / 4) as
  // element r % 4.
  const int r = lane & 15;
  const int q = lane >> 4;
  const int w01 = static_cast<int>(ra_mma_pack2<T>(s.x[0], s.x[1]));
  const int w23 = static_cast<int>(ra_mma_pack2<T>(s.x[2], s.x[3]));
  const bool upper = (r & 2) != 0;  // element r % 4 in w23
  const bool odd = (r & 1) != 0;    // in the word's high half
  uint32_t v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int src = 4 * q + e + 16 * (r >> 2);
    const uint32_t a = static_cast<uint32_t>(ra_shfl(w01, src));
    const uint32_t b = static_cast<uint32_t>(ra_shfl(w23, src));
    const uint32_t word = upper ? b : a;
    v[e] = odd ? word >> 16 : word & 0xffffu;
  }
  f.b[0] = v[0] | (v[1] << 16);
  f.b[1] = v[2] | (v[3] << 16);
#endif
  return f;
}

// ---------------------------------------------------------------------------------------------
// V panel: R (<= 16) rows of D 16-bit values, the right operand of ra_mma_pv (contracted over
// its rows). Rows >= min(R, nrows) are exact zeros. Internally the product is O^T = V^T P^T, so
// a lane holds whole 16-byte pieces of a few rows (the MMA's A operand is V^T):
//   NVIDIA: lane (g, t) holds rows 2t, 2t+1, 2t+8, 2t+9 at local columns lambda < D/8, local
//           column lambda <-> head-dim element 8 (g + 8 (lambda / 8)) + lambda % 8; m-tile i
//           rows g and g + 8 are lambda = 2i and 2i + 1.
//   CDNA:   lane (r, q) holds rows 4q .. 4q+3 at lambda < D/16 <-> element
//           U (r + 16 (lambda / U)) + lambda % U with U = min(8, D/16); m-tile i is lambda = i.
// ---------------------------------------------------------------------------------------------
template <int D, int R>
struct ra_mma_vrows {
  static_assert(D % 64 == 0, "V panels take head dims that are multiples of 64");
  static_assert(R >= 1 && R <= 16, "V panels have at most 16 rows");
#if defined(RA_MMA_SM80)
  static constexpr int kSlots = R > 8 ? 4 : 2;
  static constexpr int kWords = D / 16;  // D / 8 values per row
#else
  static constexpr int kSlots = 4;
  static constexpr int kWords = D / 32;  // D / 16 values per row
  static constexpr int kUnit = D / 16 < 8 ? D / 16 : 8;  // values per load (4 or 8)
#endif
  uint32_t w[kSlots][kWords];
};

template <int D, int R>
RA_DEVICE void ra_mma_load_vrows(ra_mma_vrows<D, R>& v, const uint16_t* base, int64_t row_stride,
                                 int nrows, int lane) {
  using V = ra_mma_vrows<D, R>;
#if defined(RA_MMA_SM80)
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int rs = 0; rs < V::kSlots; ++rs) {
    const int row = 2 * t + (rs & 1) + 8 * (rs >> 1);
    const bool ok = row < R && row < nrows;
    const uint16_t* p = base + row * row_stride;
#pragma unroll
    for (int u = 0; u < D / 64; ++u) {
      const ra_vec8 piece = ok ? ra_load16(p + 8 * (g + 8 * u)) : ra_vec8{{0u, 0u, 0u, 0u}};
#pragma unroll
      for (int k = 0; k < 4; ++k) v.w[rs][4 * u + k] = piece.w[k];
    }
  }
#else
  const int r = lane & 15;
  const int q = lane >> 4;
#pragma unroll
  for (int rs = 0; rs < V::kSlots; ++rs) {
    const int row = 4 * q + rs;
    const bool ok = row < R && row < nrows;
    const uint16_t* p = base + row * row_stride;
    if constexpr (V::kUnit == 8) {
#pragma unroll
      for (int u = 0; u < D / 128; ++u) {
        const ra_vec8 piece = ok ? ra_load16(p + 8 * (r + 16 * u)) : ra_vec8{{0u, 0u, 0u, 0u}};
#pragma unroll
        for (int k = 0; k < 4; ++k) v.w[rs][4 * u + k] = piece.w[k];
      }
    } else {
      const ra_vec4 piece = ok ? ra_load8(p + 4 * r) : ra_vec4{{0u, 0u}};
      v.w[rs][0] = piece.w[0];
      v.w[rs][1] = piece.w[1];
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// Result of ra_mma_pv: O[N][D] in fp32 (as O^T accumulator tiles, one per 16 head-dim columns).
// ---------------------------------------------------------------------------------------------
template <int D, int N>
struct ra_mma_out {
#if defined(RA_MMA_SM80)
  float x[D / 16][N / 2];
#else
  float x[D / 16][4];
#endif
};

template <int D, int N>
RA_DEVICE void ra_mma_zero(ra_mma_out<D, N>& o) {
#pragma unroll
  for (int i = 0; i < D / 16; ++i)
#pragma unroll
    for (int e = 0; e < static_cast<int>(sizeof(o.x[0]) / sizeof(float)); ++e) o.x[i][e] = 0.f;
}

// o[n][d] += sum_k p[n][k] * v[k][d].
template <typename T, int D, int N, int R>
RA_DEVICE void ra_mma_pv(ra_mma_out<D, N>& o, const ra_mma_pfrag<N>& p,
                         const ra_mma_vrows<D, R>& v) {
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
#if defined(RA_MMA_SM80)
    // A = V^T rows (head-dim) g, g+8 x k = kv rows 2t, 2t+1 (a0, a1) and 2t+8, 2t+9 (a2, a3).
    const uint32_t a0 = ra_mma_lo_lo(v.w[0][i], v.w[1][i]);
    const uint32_t a1 = ra_mma_hi_hi(v.w[0][i], v.w[1][i]);
    uint32_t a2 = 0u, a3 = 0u;
    if constexpr (ra_mma_vrows<D, R>::kSlots == 4) {
      a2 = ra_mma_lo_lo(v.w[2][i], v.w[3][i]);
      a3 = ra_mma_hi_hi(v.w[2][i], v.w[3][i]);
    }
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
      ra_mma_m16n8k16<T>(o.x[i] + 4 * nt, a0, a1, a2, a3, p.b[nt][0], p.b[nt][1]);
#else
    // A = V^T row (head-dim) lambda = i x k = kv rows 4q .. 4q+3.
    const int wi = i >> 1;
    const bool hi = (i & 1) != 0;
    const uint32_t a_lo = hi ? ra_mma_hi_hi(v.w[0][wi], v.w[1][wi]) : ra_mma_lo_lo(v.w[0][wi], v.w[1][wi]);
    const uint32_t a_hi = hi ? ra_mma_hi_hi(v.w[2][wi], v.w[3][wi]) : ra_mma_lo_lo(v.w[2][wi], v.w[3][wi]);
    ra_mfma_16x16x16<T>(o.x[i], p.b[0], p.b[1], a_lo, a_hi);  // swapped: see the header NOTE
#endif
  }
}

// Stores rows [0, min(N, nrows)) of o as T at `base` (row n at base + n * row_stride, 16-byte
// aligned rows; 8-byte aligned is enough for D = 64 on CDNA).
template <typename T, int D, int N>
RA_DEVICE void ra_mma_store_rows(const ra_mma_out<D, N>& o, uint16_t* base, int64_t row_stride,
                                 int nrows, int lane) {
#if defined(RA_MMA_SM80)
  const int g = lane >> 2;
  const int t = lane & 3;
  // o.x[i][4 nt + 2h + e] = O[8 nt + 2t + e][element of local column 2i + h].
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = 8 * nt + 2 * t + e;
      if (row >= nrows) continue;
      uint16_t* p = base + row * row_stride;
#pragma unroll
      for (int u = 0; u < D / 64; ++u) {
        ra_vec8 piece;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = 4 * u + k;  // local columns 2i, 2i + 1
          piece.w[k] = ra_mma_pack2<T>(o.x[i][4 * nt + e], o.x[i][4 * nt + 2 + e]);
        }
        ra_store16(p + 8 * (g + 8 * u), piece);
      }
    }
#else
  const int r = lane & 15;
  const int q = lane >> 4;
  constexpr int U = ra_mma_vrows<D, 16>::kUnit;
  // o.x[i][e] = O[4q + e][element of local column i].
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = 4 * q + e;
    if (row >= nrows || row >= N) continue;
    uint16_t* p = base + row * row_stride;
    if constexpr (U == 8) {
#pragma unroll
      for (int u = 0; u < D / 128; ++u) {
        ra_vec8 piece;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          piece.w[k] = ra_mma_pack2<T>(o.x[8 * u + 2 * k][e], o.x[8 * u + 2 * k + 1][e]);
        ra_store16(p + 8 * (r + 16 * u), piece);
      }
    } else {
      ra_vec4 piece;
      piece.w[0] = ra_mma_pack2<T>(o.x[0][e], o.x[1][e]);
      piece.w[1] = ra_mma_pack2<T>(o.x[2][e], o.x[3][e]);
      ra_store8(p + 4 * r, piece);
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// Row panels and stores whose rows are not evenly spaced (the tiled small-seq kernels' tiles of
// query rows x q heads): `row_ptr(r)` gives row r's address (16-byte aligned; 8-byte aligned is
// enough for stores at D = 64 on CDNA) and is called only for rows r < min(R or N, nrows).
// Same fragment layouts as ra_mma_load_rows / ra_mma_store_rows above.
// ---------------------------------------------------------------------------------------------
template <int D, int R, typename RowPtr>
RA_DEVICE void ra_mma_load_rows_at(ra_mma_rows<D, R>& x, RowPtr row_ptr, int nrows, int lane) {
#if defined(RA_MMA_SM80)
  const int row0 = lane >> 2;
  const int piece0 = lane & 3;
#else
  const int row0 = lane & 15;
  const int piece0 = lane >> 4;
#endif
#pragma unroll
  for (int h = 0; h < ra_mma_rows<D, R>::kRows; ++h) {
    const int row = row0 + 8 * h;
    const bool ok = row < R && row < nrows;
    const uint16_t* p = ok ? row_ptr(row) : nullptr;
#pragma unroll
    for (int j = 0; j < ra_mma_rows<D, R>::kPieces; ++j)
      x.v[h][j] = ok ? ra_load16(p + 8 * (piece0 + 4 * j)) : ra_vec8{{0u, 0u, 0u, 0u}};
  }
}

template <typename T, int D, int N, typename RowPtr>
RA_DEVICE void ra_mma_store_rows_at(const ra_mma_out<D, N>& o, RowPtr row_ptr, int nrows,
                                    int lane) {
#if defined(RA_MMA_SM80)
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = 8 * nt + 2 * t + e;
      if (row >= nrows) continue;
      uint16_t* p = row_ptr(row);
#pragma unroll
      for (int u = 0; u < D / 64; ++u) {
        ra_vec8 piece;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = 4 * u + k;
          piece.w[k] = ra_mma_pack2<T>(o.x[i][4 * nt + e], o.x[i][4 * nt + 2 + e]);
        }
        ra_store16(p + 8 * (g + 8 * u), piece);
      }
    }
#else
  const int r = lane & 15;
  const int q = lane >> 4;
  constexpr int U = ra_mma_vrows<D, 16>::kUnit;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = 4 * q + e;
    if (row >= nrows || row >= N) continue;
    uint16_t* p = row_ptr(row);
    if constexpr (U == 8) {
#pragma unroll
      for (int u = 0; u < D / 128; ++u) {
        ra_vec8 piece;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          piece.w[k] = ra_mma_pack2<T>(o.x[8 * u + 2 * k][e], o.x[8 * u + 2 * k + 1][e]);
        ra_store16(p + 8 * (r + 16 * u), piece);
      }
    } else {
      ra_vec4 piece;
      piece.w[0] = ra_mma_pack2<T>(o.x[0][e], o.x[1][e]);
      piece.w[1] = ra_mma_pack2<T>(o.x[2][e], o.x[3][e]);
      ra_store8(p + 4 * r, piece);
    }
  }
#endif
}

// Per-row values of a 16-row accumulator (v[slot] for the rows this lane holds in ra_mma_acc
// layout, every lane of a row holding the same value) moved to the layout of ra_mma_out<D, 16>:
// the value of the row of o.x[i][j] (the same for every i). All lanes call it together.
RA_DEVICE float ra_mma_row_value_for_out(const float (&v)[kRaMmaAccSlots], int j, int lane) {
#if defined(RA_MMA_SM80)
  // o.x[i][j] is row 8 (j / 4) + 2t + j % 2; accumulator row r lives in lanes 4 (r % 8) + ..,
  // slot r / 8.
  return ra_shfl(v[(j >> 2) & 1], 4 * (2 * (lane & 3) + (j & 1)));
#else
  // o.x[i][j] is row 4 (lane / 16) + j; accumulator row r lives in lane r (and r + 16 k).
  return ra_shfl(v[0], 4 * (lane >> 4) + j);
#endif
}

// V panel whose rows are not evenly spaced (the tiled small-seq backward's tiles of query rows x
// q heads as the contracted side of dV = P^T dO and dK = dS^T Q): `row_ptr(r)` gives row r's
// address (16-byte aligned; 8-byte aligned is enough for D = 64 on CDNA) and is called only for
// rows r < min(R, nrows). Same fragment layout as ra_mma_load_vrows.
template <int D, int R, typename RowPtr>
RA_DEVICE void ra_mma_load_vrows_at(ra_mma_vrows<D, R>& v, RowPtr row_ptr, int nrows, int lane) {
  using V = ra_mma_vrows<D, R>;
#if defined(RA_MMA_SM80)
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int rs = 0; rs < V::kSlots; ++rs) {
    const int row = 2 * t + (rs & 1) + 8 * (rs >> 1);
    const bool ok = row < R && row < nrows;
    const uint16_t* p = ok ? row_ptr(row) : nullptr;
#pragma unroll
    for (int u = 0; u < D / 64; ++u) {
      const ra_vec8 piece = ok ? ra_load16(p + 8 * (g + 8 * u)) : ra_vec8{{0u, 0u, 0u, 0u}};
#pragma unroll
      for (int k = 0; k < 4; ++k) v.w[rs][4 * u + k] = piece.w[k];
    }
  }
#else
  const int r = lane & 15;
  const int q = lane >> 4;
#pragma unroll
  for (int rs = 0; rs < V::kSlots; ++rs) {
    const int row = 4 * q + rs;
    const bool ok = row < R && row < nrows;
    const uint16_t* p = ok ? row_ptr(row) : nullptr;
    if constexpr (V::kUnit == 8) {
#pragma unroll
      for (int u = 0; u < D / 128; ++u) {
        const ra_vec8 piece = ok ? ra_load16(p + 8 * (r + 16 * u)) : ra_vec8{{0u, 0u, 0u, 0u}};
#pragma unroll
        for (int k = 0; k < 4; ++k) v.w[rs][4 * u + k] = piece.w[k];
      }
    } else {
      const ra_vec4 piece = ok ? ra_load8(p + 4 * r) : ra_vec4{{0u, 0u}};
      v.w[rs][0] = piece.w[0];
      v.w[rs][1] = piece.w[1];
    }
  }
#endif
}

#endif  // RA_HAS_MMA
