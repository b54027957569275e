// Host probe of the THD row maps (hip_src/thd/index.h) on garbage cu_seqlens: int32 words of
// every kind (random, extremes, the 32-bit wrap pair 2147483640 / -2147483640), every map kind,
// cp up to 2^31 - 1 and tensors up to 2^40 rows, rows sampled at both ends and at random. Each
// mapped row must lie in the tensor it addresses (-1: no source, copy_valid_tokens only), and
// under UBSan no int64 expression may overflow. Runs the maps on the CPU (seq_of, the binary
// search; the device's wave searches differ only in which sequence a row of a non-monotone
// array lands in). No GPU needed.
//
// Build (one command line):
//   python3 tools/hipify.py hip_src build/cuda_src && nvcc -O1 -std=c++17
//   -Xcompiler=-fsanitize=signed-integer-overflow,-fno-sanitize-recover=all -lubsan
//   -I build/cuda_src -o build/thd_index_garbage tools/diag/thd_index_garbage.cu
// Run:   ./build/thd_index_garbage   (exit status 1 on a row outside its tensor)
#include <cstdio>
#include <random>

#include "thd/index.h"

int main() {
  std::mt19937_64 rng(1);
  const int32_t picks[] = {INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 0,
                           1,         -1,        9,             2147483640,    -2147483640};
  const int64_t cps[] = {1, 2, 3, 8, 1 << 20, INT32_MAX};
  auto word = [&]() { return rng() % 2 ? picks[rng() % 10] : static_cast<int32_t>(rng()); };
  long bad = 0, mapped = 0;
  for (int it = 0; it < 20000; ++it) {
    const int32_t b = 1 + static_cast<int32_t>(rng() % 6);
    int32_t cu[8], cu_dst[8], cu_src[8];
    for (int i = 0; i <= b; ++i) {
      cu[i] = word();
      cu_dst[i] = word();
      cu_src[i] = word();
    }
    ThdRowMapParams m{};
    m.kind = static_cast<ThdRowMap>(rng() % 5);  // partition .. copy valid
    m.b = b;
    m.cu = cu;
    m.cu_dst = cu_dst;
    m.cu_src = cu_src;
    m.cp = static_cast<int32_t>(cps[rng() % 6]);
    m.rank = static_cast<int32_t>(rng() % m.cp);
    m.half = static_cast<int32_t>(rng() % 2);
    m.src_rows = int64_t{1} << (rng() % 41);
    const int64_t total = int64_t{1} << (rng() % 41);  // rows of the tensor thd_gather reads
    // the launch arguments the bindings derive from the tensors, and the rows the
    // sources must lie in
    int64_t rows = total, limit = m.cp * (total / m.cp);
    m.local_rows = total / m.cp;
    if (m.kind == ThdRowMap::kPartition) rows = total / m.cp;
    if (m.kind == ThdRowMap::kHalf) {
      m.local_rows = total;
      rows = total / 2;
      limit = total;
    }
    if (m.kind == ThdRowMap::kCopyValid) {
      m.local_rows = total;  // dst rows
      limit = m.src_rows;
    }
    for (int j = 0; j < 16 && rows > 0; ++j) {
      const int64_t r = j < 4   ? (j < rows ? j : 0)
                        : j < 8 ? (rows - 1 - (j - 4) >= 0 ? rows - 1 - (j - 4) : 0)
                                : static_cast<int64_t>(rng() % rows);
      const thd::SeqQuery q = thd::map_query(m, r);
      const int32_t s = thd::seq_of(q.cu, m.b, q.div, q.pos);
      const int64_t v = thd::map_row_given(m, r, s, m.cu[m.b]);
      ++mapped;
      const bool none = v == -1 && m.kind == ThdRowMap::kCopyValid;
      if (!none && (v < 0 || v >= (limit > 0 ? limit : 1))) ++bad;
    }
  }
  printf("%ld rows mapped, %ld outside their tensor\n", mapped, bad);
  return bad != 0;
}
