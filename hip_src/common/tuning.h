// Launch-time tuning of every kernel family, in one place: the choices a launcher makes that
// are not fixed by the arguments (which kernel variant, how large a grid, whether to overlap
// with the kernel ahead). Compile-time constants that no run ever changes stay beside their
// kernels; what is here can be changed without a rebuild, for A/B runs, tests and a user who
// needs to turn a feature off.
//
// Rule: the values are read from the environment once, at the first launch (the extension
// reads them when it loads), and can be overridden in-process through ra_set_tuning (the
// bindings expose it as rocm_attn.tuning). Launchers read ra_tuning() and never the
// environment: a getenv per launch costs host time on a path that is 5-20 us long, and a value
// that changes under a running process would make two launches of one graph disagree.
// A captured graph keeps the choices made at capture time. The small-seq knobs (small_seq_*)
// are read by the kernel plan in Python (rocm_attn/small_seq_plan.py, through
// rocm_attn.tuning), which passes the small-seq launchers the kernels to run; no small-seq
// launcher reads them. Comments below that name a launcher function name the plan's function
// of the same rule.
//
// Plain host declarations: the bindings, compiled without the GPU compiler, include it.
#pragma once

struct RaTuning {
  // small-seq: grid = this many times the blocks resident at once; 0 = one wave per item;
  // -1 = the plan's default (small_seq_plan.py FWD_RESIDENCY_FACTOR / BWD_RESIDENCY_FACTOR,
  // checked equal to small_seq/tiling.h kFwdResidencyFactor / kBwdResidencyFactor).
  int small_seq_fwd_grid = -1;
  int small_seq_bwd_grid = -1;
  // tiled small-seq forward: the same factor for its grid; -1 = the compiled default
  // (small_seq/tiled_fwd_kernel.h kTiledFwdResidencyFactor).
  int small_seq_tiled_fwd_grid = -1;
  // tiled small-seq forward: 1 = segments with many query rows and long histories take the
  // block kernel (K/V staged in shared memory, tiled_fwd_kernel.h), d <= 128; 0 = never;
  // 2 = every d <= 128 call (tests).
  int small_seq_tiled_block = 1;
  // tiled small-seq forward, CUDA builds: histories (max_seqlen_kv) longer than this take the
  // block kernel's two-warp instance (key tiles staged by cp.async) for a (segment, kv head) of
  // 9-16 rows; 0 = the plan's bound (rocm_attn/small_seq_plan.py: 16, one key tile).
  int small_seq_tiled_small_block_keys = 0;
  // tiled small-seq forward: 1 = calls whose histories fit one key tile (max_seqlen_kv <= 16,
  // d <= 128) that take the wave kernel run its one-tile instance (K/V held in registers, no
  // streaming path, fewer registers: small_seq/tiled_fwd_kernel.h kTiledOneTileMinBlocks);
  // 0 = the general wave kernel.
  int small_seq_tiled_one_tile = 1;
  // tiled small-seq forward: keys per online-softmax step of the resident kernel, 16 or 64;
  // 0 = the launcher's choice (small_seq/tiled_launch.hip: 64 where histories reach 64 keys).
  int small_seq_tiled_resident_key_step = 0;
  // tiled small-seq forward: 1 = segments with many query rows whose K/V fit a block's shared
  // memory take the resident kernel (tiled_fwd_resident_kernel.h), d <= 128; 0 = never; 2 =
  // every d <= 128 call whose K/V fit (tests).
  int small_seq_tiled_resident = 1;
  // tiled small-seq forward on Hopper (sm_90a builds): 1 = calls of at least one 64-row tile
  // per (segment, kv head) whose K/V fit a block's shared memory take the warpgroup-MMA kernel
  // (tiled_fwd_warpgroup_kernel.h), d 64 / 128, no return_softmax; 0 = never; 2 = every call
  // it can serve, fewer rows included (tests, A/B runs).
  int small_seq_tiled_warpgroup = 1;
  // tiled small-seq on Hopper, CUDA sm_90a builds: 1 = the warpgroup-MMA forward stages K, V, Q
  // and out, the warpgroup dK / dV kernel moves whole row tiles of Q, dO and dQ, and the
  // warpgroup dQ kernel those of Q and dO, by tensor tile copies where the call allows
  // (tiled_fwd_warpgroup_tma_kernel.h, tiled_bwd_warpgroup_tma_kernel.h: GQA group dividing 64,
  // tile-copy layouts; forward 16-key steps only for single-tile items); 0 = cp.async staging
  // always (the forward's warpgroup kernel then takes only histories of at most 16 keys), and
  // the backward takes the wave / block kernels (the warpgroup backward has no instance without
  // tile copies but the two-tile kernel).
  int small_seq_tiled_warpgroup_tma = 1;
  // tiled small-seq forward on Hopper, CUDA sm_90a builds, d 128: 1 = calls of one 64-row tile
  // per (segment, kv head) over histories of 129-384 keys take the tile-copy warpgroup kernel's
  // streaming instance (one warpgroup and one row tile per work item, K / V streamed through a
  // two-step ring: two blocks per multiprocessor instead of one block holding the whole
  // history; tiled_fwd_warpgroup_tma_kernel.h); 2 = every call of 64-key steps that the
  // tile-copy kernel serves at d 128 (tests, A/B runs); 0 = never.
  int small_seq_tiled_warpgroup_stream = 1;
  // tiled small-seq forward on Hopper, CUDA sm_90a builds, d 128: 1 = calls that would run the
  // tile-copy kernel in blocks of two warpgroups over at most 256 keys with more than one
  // 64-row tile per (segment, kv head) take the warp-specialized kernel (a copy warp brings the
  // next item's K, V and Q while two warpgroups compute; tiled_fwd_warpgroup_ws_kernel.h);
  // 2 = every call of 64-key steps over at most 256 keys it can serve (tests, A/B runs);
  // 0 = never.
  int small_seq_tiled_warpgroup_ws = 1;
  // the warp-specialized forward's items: 1 = from a work queue (a counter the binding zeroes
  // per call), one block per multiprocessor, so that the blocks of a ragged batch end together
  // (tiled_fwd_warpgroup_ws_kernel.h; small_seq_tiled_fwd_grid is not read for it then);
  // 0 = grid-stride over small_seq_tiled_fwd_grid x the resident blocks.
  int small_seq_tiled_ws_queue = 1;
  // tiled small-seq backward on Hopper (sm_90a builds): 1 = calls of at least one 64-row tile
  // per (segment, kv head) over at most 4096 keys (256 with small_seq_tiled_bwd_dq_stream 0)
  // take the warpgroup-MMA kernels (tiled_bwd_warpgroup_kernel.h), d 64 / 128; 0 = never;
  // 2 = every call it can serve, fewer rows included (tests, A/B runs).
  int small_seq_tiled_bwd_warpgroup = 1;
  // tiled small-seq backward on Hopper, histories past one 64-key block where every (segment,
  // kv head) holds at most two 64-row tiles but some more than one (64 < max_seqlen_q x group
  // <= 128): 1 = one kernel of two warpgroups walks each item's key blocks, each warpgroup one
  // tile, dV and dK per block from operands the two exchange, dQ summed across the blocks
  // (tiled_bwd_warpgroup_two_tile_kernel.h; Delta from pass 1); 0 = the dK / dV kernel per key
  // block and the dQ kernel.
  int small_seq_tiled_bwd_two_tile = 1;
  // tiled small-seq backward on Hopper, the warpgroup backward's dQ kernel (histories past one
  // 64-key block where the one- and two-tile walks do not serve): 1 = K / V staged whole up to
  // 256 keys, streamed through a ring of 64-key steps past that
  // (tiled_bwd_warpgroup_dq_stream_kernel.h), so that the warpgroup backward serves up to 4096
  // keys; 2 = streamed always (A/B runs); 0 = never streamed: the warpgroup backward serves at
  // most 256 keys.
  int small_seq_tiled_bwd_dq_stream = 1;
  // tiled small-seq backward: 1 = calls of at most 4 rows per (segment, kv head) (one query
  // with a GQA group of at most 4) take the streaming kernel (tiled_bwd_stream_kernel.h) in
  // place of the dK / dV and dQ passes, one (segment, kv head) per wave or per block by the
  // launcher's rule; 0 = never; 2 / 3 = the kernel with one per wave / per block (tests, A/B).
  int small_seq_tiled_bwd_stream = 1;
  // tiled small-seq backward: 1 = calls whose every (segment, kv head) fits one 16-row tile
  // (and is not the streaming kernel's) take the dK / dV pass's one-row-tile instance (only
  // that item compiled, tiled_bwd_kernel.h); 0 = never (the general instance).
  int small_seq_tiled_bwd_row_tile = 1;
  // small-seq, THD calls on a CUDA build of torch: the flash route (torch's flash varlen
  // kernels with the contract kernels around them, rocm_attn/small_seq_flash.py). 1 = the
  // measured rule (small_seq_flash.route_wins: 64+ candidates over 64+ keys with a backward,
  // 128+ keys forward only, less what the warpgroup kernels serve faster) and histories beyond
  // the tiled kernels; 2 = every call the route can serve (tests); 0 = never (tiled kernels,
  // varlen attention past them).
  // Read by the Python dispatch, not by a launcher; ROCm builds never take the route.
  int small_seq_flash_route = 1;
  // small-seq: passes whose GQA calls take the matrix-unit kernels, a bit mask (1 = forward,
  // 2 = backward); 0 sends every GQA call to the general kernels.
  int small_seq_mma = 3;
  // small-seq: passes that take the software-pipelined general loops (same bit mask).
  int small_seq_pipe = 3;
  // THD: rows of a wave of 16-byte vectors or more take the wide-row kernels (copy_wide_kernel.h,
  // merge_wide_kernel.h, grad_wide_kernel.h); 0 keeps them on the row-group / tile kernels.
  int thd_copy_wide = 1;
  int thd_merge_wide = 1;
  int thd_grad_wide = 1;
  // THD: L2 prefetch of the rows mapped before the wait; -1 = each kernel's default (merge:
  // kMergePrefetchBatches batches, the others on), 0 = off, n > 0 = on (merge: n batches).
  int thd_prefetch = -1;
  // CUDA sm_90+: programmatic dependent launch (a kernel may start while the one ahead drains).
  int pdl = 1;
};

// One row per field: its name (rocm_attn.tuning and the README's table use it), the environment
// variable read at load, and the field.
struct RaTuningKnob {
  const char* name;
  const char* env;
  int RaTuning::*field;
};

inline constexpr RaTuningKnob kRaTuningKnobs[] = {
    {"small_seq_fwd_grid", "ROCM_ATTN_SMALL_SEQ_GRID", &RaTuning::small_seq_fwd_grid},
    {"small_seq_bwd_grid", "ROCM_ATTN_SMALL_SEQ_BWD_GRID", &RaTuning::small_seq_bwd_grid},
    {"small_seq_tiled_fwd_grid", "ROCM_ATTN_SMALL_SEQ_TILED_GRID", &RaTuning::small_seq_tiled_fwd_grid},
    {"small_seq_tiled_block", "ROCM_ATTN_SMALL_SEQ_TILED_BLOCK", &RaTuning::small_seq_tiled_block},
    {"small_seq_tiled_one_tile", "ROCM_ATTN_SMALL_SEQ_TILED_ONE_TILE", &RaTuning::small_seq_tiled_one_tile},
    {"small_seq_tiled_small_block_keys", "ROCM_ATTN_SMALL_SEQ_TILED_SMALL_BLOCK_KEYS", &RaTuning::small_seq_tiled_small_block_keys},
    {"small_seq_tiled_resident", "ROCM_ATTN_SMALL_SEQ_TILED_RESIDENT", &RaTuning::small_seq_tiled_resident},
    {"small_seq_tiled_warpgroup", "ROCM_ATTN_SMALL_SEQ_TILED_WARPGROUP", &RaTuning::small_seq_tiled_warpgroup},
    {"small_seq_tiled_warpgroup_tma", "ROCM_ATTN_SMALL_SEQ_TILED_WARPGROUP_TMA", &RaTuning::small_seq_tiled_warpgroup_tma},
    {"small_seq_tiled_warpgroup_stream", "ROCM_ATTN_SMALL_SEQ_TILED_WARPGROUP_STREAM", &RaTuning::small_seq_tiled_warpgroup_stream},
    {"small_seq_tiled_warpgroup_ws", "ROCM_ATTN_SMALL_SEQ_TILED_WARPGROUP_WS", &RaTuning::small_seq_tiled_warpgroup_ws},
    {"small_seq_tiled_ws_queue", "ROCM_ATTN_SMALL_SEQ_TILED_WS_QUEUE", &RaTuning::small_seq_tiled_ws_queue},
    {"small_seq_tiled_resident_key_step", "ROCM_ATTN_SMALL_SEQ_TILED_RESIDENT_KEY_STEP", &RaTuning::small_seq_tiled_resident_key_step},
    {"small_seq_tiled_bwd_warpgroup", "ROCM_ATTN_SMALL_SEQ_TILED_BWD_WARPGROUP", &RaTuning::small_seq_tiled_bwd_warpgroup},
    {"small_seq_tiled_bwd_two_tile", "ROCM_ATTN_SMALL_SEQ_TILED_BWD_TWO_TILE", &RaTuning::small_seq_tiled_bwd_two_tile},
    {"small_seq_tiled_bwd_dq_stream", "ROCM_ATTN_SMALL_SEQ_TILED_BWD_DQ_STREAM", &RaTuning::small_seq_tiled_bwd_dq_stream},
    {"small_seq_tiled_bwd_stream", "ROCM_ATTN_SMALL_SEQ_TILED_BWD_STREAM", &RaTuning::small_seq_tiled_bwd_stream},
    {"small_seq_tiled_bwd_row_tile", "ROCM_ATTN_SMALL_SEQ_TILED_BWD_ROW_TILE", &RaTuning::small_seq_tiled_bwd_row_tile},
    {"small_seq_flash_route", "ROCM_ATTN_SMALL_SEQ_FLASH_ROUTE", &RaTuning::small_seq_flash_route},
    {"small_seq_mma", "ROCM_ATTN_SMALL_SEQ_MMA", &RaTuning::small_seq_mma},
    {"small_seq_pipe", "ROCM_ATTN_SMALL_SEQ_PIPE", &RaTuning::small_seq_pipe},
    {"thd_copy_wide", "ROCM_ATTN_THD_COPY_WIDE", &RaTuning::thd_copy_wide},
    {"thd_merge_wide", "ROCM_ATTN_THD_MERGE_WIDE", &RaTuning::thd_merge_wide},
    {"thd_grad_wide", "ROCM_ATTN_THD_GRAD_WIDE", &RaTuning::thd_grad_wide},
    {"thd_prefetch", "ROCM_ATTN_THD_PREFETCH", &RaTuning::thd_prefetch},
    {"pdl", "ROCM_ATTN_PDL", &RaTuning::pdl},
};

// The current values: defaults, then the environment (read on the first call), then overrides.
const RaTuning& ra_tuning();
// Sets one value by name; false (and nothing changed) for an unknown name. `old` gets the
// previous value.
bool ra_set_tuning(const char* name, int value, int* old);
