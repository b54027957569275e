// Scheduler of the CPU emulation runtime (hip_cpu_runtime.h has the model).
//
// Each thread of a block is a fiber with its own stack. A worker thread runs one block at a
// time: wave by wave, every runnable lane of the wave runs until it reaches a wave exchange, a
// block barrier or its end; when all live lanes of the wave wait at an exchange, the exchange
// resolves and they run on; when every live thread of the block waits at the barrier, it
// resolves. A fiber that returned is never resumed.
// NOTE: fibers switch with a few instructions of x86-64 assembly (callee-saved registers and
// the stack pointer). swapcontext, the portable fallback (other hosts, or -DRA_EMU_UCONTEXT),
// makes a signal-mask system call per switch, and an exchange costs two switches per lane:
// 556 ns of CPU per lane per exchange against 51 ns for the assembly (64-lane waves, 32768
// exchanges of model_kernels.cpp's uneven loop, one worker, 2-core CI-class machine). OS
// threads with barriers would pay a futex wake per lane and switch; not tried.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hip_cpu_runtime.h"

#if defined(__x86_64__) && !defined(RA_EMU_UCONTEXT)
#define RA_EMU_ASM_SWITCH 1
#else
#define RA_EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if RA_EMU_ASM_SWITCH
// ra_emu_switch(save, load): pushes the callee-saved registers, stores the stack pointer in
// *save, loads `load` as the stack pointer and pops the registers saved there.
extern "C" void ra_emu_switch(void** save, void* load);
asm(R"(
  .text
  .p2align 4
  .hidden ra_emu_switch
  .globl ra_emu_switch
  .type ra_emu_switch, @function
ra_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ra_emu_switch, .-ra_emu_switch
)");
#endif

namespace {

constexpr int W = RA_EMU_WAVE;

enum State { kRunnable, kAtExchange, kAtBarrier, kExited, kFailed };

struct Fiber {
  void* sp = nullptr;
  State state = kExited;
  int tid = 0;
  int barrier_pred = 1;
  ra_emu::Exchange x{};
  ra_emu_uint3 idx{};
#if !RA_EMU_ASM_SWITCH
  ucontext_t ctx;
#endif
};

struct Worker {
  std::vector<Fiber> fibers;
  std::vector<char*> stacks;
  size_t stack_bytes = 0;
  void* sched_sp = nullptr;
#if !RA_EMU_ASM_SWITCH
  ucontext_t sched_ctx;
#endif
  Fiber* cur = nullptr;
  const std::function<void()>* body = nullptr;
  std::string error;  // first failure of this worker's current launch
  std::vector<uint64_t> dynamic_shared;  // the current launch's dynamic shared memory

  ~Worker() {
    for (char* s : stacks) munmap(s, stack_bytes + page());
  }
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

  void ensure(size_t n) {
    if (stack_bytes == 0) {
      const char* env = getenv("RA_EMU_STACK_KB");
      stack_bytes = static_cast<size_t>(env != nullptr ? atoi(env) : 512) * 1024;
    }
    while (stacks.size() < n) {
      // one guard page below each stack: an overflow faults instead of corrupting a neighbour
      void* m = mmap(nullptr, stack_bytes + page(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) {
        perror("ra_emu: fiber stack");
        abort();
      }
      mprotect(m, page(), PROT_NONE);
      stacks.push_back(static_cast<char*>(m));
    }
    if (fibers.size() < n) fibers.resize(n);
  }
};

thread_local Worker tw;

std::atomic<int64_t> g_inactive_reads{0};
std::atomic<int64_t> g_exchanges{0};
std::atomic<int64_t> g_barriers{0};
std::atomic<int64_t> g_launches{0};
std::mutex g_error_mutex;
std::string g_last_message;     // the last launch failure, kept for the tests' messages
hipError_t g_last_error = hipSuccess;
std::string g_pending_host_failure;
std::set<std::string> g_kernels_run;  // names of the kernels launched (ra_emu_kernels_run)
std::set<std::string> g_kernels_since_mark;  // the same since the last ra_emu_kernels_mark
std::string g_kernels_text;
// Fault injection for the tests that prove a broken kernel is caught: bit 0 issues every MFMA
// with its A and B operands exchanged (what a swapped call in mma.h would compute).
std::atomic<int> g_faults{0};
constexpr int kFaultSwapMfmaOperands = 1;

extern "C" [[noreturn]] void ra_emu_fiber_main() {
  Fiber* f = tw.cur;
  (*tw.body)();
  f->state = kExited;
#if RA_EMU_ASM_SWITCH
  ra_emu_switch(&f->sp, tw.sched_sp);
#else
  swapcontext(&f->ctx, &tw.sched_ctx);
#endif
  __builtin_unreachable();
}

void start_fiber(Worker& w, int i) {
  Fiber& f = w.fibers[i];
  char* base = w.stacks[i] + Worker::page();
#if RA_EMU_ASM_SWITCH
  uintptr_t top = reinterpret_cast<uintptr_t>(base + w.stack_bytes) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                             // fiber_main's return address
  *--sp = reinterpret_cast<void*>(&ra_emu_fiber_main);         // popped by ret
  for (int r = 0; r < 6; ++r) *--sp = nullptr;                 // rbp rbx r12-r15
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = base;
  f.ctx.uc_stack.ss_size = w.stack_bytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, reinterpret_cast<void (*)()>(&ra_emu_fiber_main), 0);
#endif
  f.state = kRunnable;
}

void resume(Worker& w, Fiber& f) {
  w.cur = &f;
  threadIdx = f.idx;
#if RA_EMU_ASM_SWITCH
  ra_emu_switch(&w.sched_sp, f.sp);
#else
  swapcontext(&w.sched_ctx, &f.ctx);
#endif
  w.cur = nullptr;
}

void yield_to_scheduler(Fiber& f) {
#if RA_EMU_ASM_SWITCH
  ra_emu_switch(&f.sp, tw.sched_sp);
#else
  swapcontext(&f.ctx, &tw.sched_ctx);
#endif
}

void fail(Worker& w, const std::string& what) {
  if (w.error.empty()) w.error = what;
}

std::string where() {
  char buf[96];
  snprintf(buf, sizeof(buf), " (block %u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z);
  return buf;
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man != 0 ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

// D = A B + C of one v_mfma_f32_16x16x16 from the lanes' registers, with the CDNA ISA layouts
// (lane l, item e):  A[i][k]: l = i + 16 (k / 4), e = k % 4;  B[k][j]: l = j + 16 (k / 4),
// e = k % 4;  C/D[i][j]: l = j + 16 (i / 4), e = i % 4.
void resolve_mfma(Fiber* lanes, bool f16) {
  auto cvt = [f16](uint16_t v) { return f16 ? fp16_to_float(v) : bf16_to_float(v); };
  const bool swap = (g_faults.load() & kFaultSwapMfmaOperands) != 0;
  float A[16][16], B[16][16];
  for (int l = 0; l < 64; ++l)
    for (int e = 0; e < 4; ++e) {
      const int k = 4 * (l / 16) + e;
      A[l % 16][k] = cvt(swap ? lanes[l].x.b[e] : lanes[l].x.a[e]);
      B[k][l % 16] = cvt(swap ? lanes[l].x.a[e] : lanes[l].x.b[e]);
    }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      Fiber& out = lanes[j + 16 * (i / 4)];
      // products of 16-bit values are exact in double; one rounding to fp32 at the end
      double acc = out.x.c[i % 4];
      for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[i][k]) * B[k][j];
      out.x.d[i % 4] = static_cast<float>(acc);
    }
}

// All live lanes of wave `first .. first + n` wait at an exchange: resolve it.
bool resolve_exchange(Worker& w, int first, int n) {
  Fiber* lanes = &w.fibers[first];
  int op = 0;
  for (int l = 0; l < n; ++l) {
    if (lanes[l].state != kAtExchange) continue;
    if (op == 0) op = lanes[l].x.op;
    if (lanes[l].x.op != op) {
      fail(w, "lanes of one wave at different cross-lane operations" + where());
      return false;
    }
  }
  g_exchanges.fetch_add(1, std::memory_order_relaxed);
  switch (op) {
    case ra_emu::kBpermute:
      for (int l = 0; l < n; ++l) {
        if (lanes[l].state != kAtExchange) continue;
        const int src = lanes[l].x.src & (W - 1);
        if (src < n && lanes[src].state == kAtExchange) {
          lanes[l].x.out = lanes[src].x.val;
        } else {
          lanes[l].x.out = 0u;  // disabled source lane
          g_inactive_reads.fetch_add(1, std::memory_order_relaxed);
        }
      }
      break;
    case ra_emu::kBallot: {
      uint64_t mask = 0;
      for (int l = 0; l < n; ++l)
        if (lanes[l].state == kAtExchange && lanes[l].x.val != 0u) mask |= uint64_t{1} << l;
      for (int l = 0; l < n; ++l) lanes[l].x.mask = mask;
      break;
    }
    case ra_emu::kMfmaBf16:
    case ra_emu::kMfmaF16: {
      bool full = n == 64;
      for (int l = 0; l < n && full; ++l) full = lanes[l].state == kAtExchange;
      if (!full) {
        fail(w, "MFMA issued by a wave without all 64 lanes live" + where());
        return false;
      }
      resolve_mfma(lanes, op == ra_emu::kMfmaF16);
      break;
    }
    default:
      fail(w, "unknown cross-lane operation" + where());
      return false;
  }
  for (int l = 0; l < n; ++l)
    if (lanes[l].state == kAtExchange) lanes[l].state = kRunnable;
  return true;
}

// Runs wave `first .. first + n` until every live lane waits at the block barrier or has exited.
// `reverse`: lanes run last to first between exchanges (results must not depend on it).
bool run_wave(Worker& w, int first, int n, bool reverse) {
  for (;;) {
    int at_exchange = 0, at_barrier = 0;
    for (int i = 0; i < n; ++i) {
      Fiber& f = w.fibers[first + (reverse ? n - 1 - i : i)];
      if (f.state == kRunnable) resume(w, f);
      if (f.state == kFailed) return false;
      at_exchange += f.state == kAtExchange;
      at_barrier += f.state == kAtBarrier;
    }
    if (at_exchange == 0) return true;
    if (at_barrier != 0) {
      fail(w, "lanes of one wave wait at a block barrier while others wait at a cross-lane "
              "operation" + where());
      return false;
    }
    if (!resolve_exchange(w, first, n)) return false;
  }
}

bool run_block(Worker& w, int nthreads, dim3 block, bool reverse) {
  for (int i = 0; i < nthreads; ++i) {
    start_fiber(w, i);
    Fiber& f = w.fibers[i];
    f.tid = i;
    f.idx = ra_emu_uint3{i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
  }
  for (;;) {
    const int waves = (nthreads + W - 1) / W;
    for (int i = 0; i < waves; ++i) {
      const int first = W * (reverse ? waves - 1 - i : i);
      if (!run_wave(w, first, nthreads - first < W ? nthreads - first : W, reverse)) return false;
    }
    int live = 0, all = 1;
    for (int i = 0; i < nthreads; ++i) {
      Fiber& f = w.fibers[i];
      if (f.state != kAtBarrier) continue;
      ++live;
      all &= f.barrier_pred;
    }
    if (live == 0) return true;
    g_barriers.fetch_add(1, std::memory_order_relaxed);
    for (int i = 0; i < nthreads; ++i) {
      Fiber& f = w.fibers[i];
      if (f.state != kAtBarrier) continue;
      f.barrier_pred = all;
      f.state = kRunnable;
    }
  }
}

int worker_count() {
  const char* env = getenv("RA_EMU_WORKERS");
  int n = env != nullptr ? atoi(env) : 2;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  if (env == nullptr && hw > 0 && n > hw) n = hw;
  return n < 1 ? 1 : n;
}

}  // namespace

namespace ra_emu {

Exchange& slot() { return tw.cur->x; }

void exchange() {
  Fiber* f = tw.cur;
  f->state = kAtExchange;
  yield_to_scheduler(*f);
}

int block_barrier(int pred) {
  Fiber* f = tw.cur;
  f->barrier_pred = pred;
  f->state = kAtBarrier;
  yield_to_scheduler(*f);
  return f->barrier_pred;
}

int lane_id() { return tw.cur->tid % W; }

// The kernel's demangled name without its parameter list where the dynamic symbol table has
// it (kernels in named namespaces), else the launch site's expression.
std::string kernel_name(const char* expr, const void* fn) {
  Dl_info info;
  if (dladdr(fn, &info) != 0 && info.dli_saddr == fn && info.dli_sname != nullptr) {
    int status = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    if (status == 0 && d != nullptr) {
      std::string name(d);
      free(d);
      const size_t paren = name.rfind('(');
      return paren == std::string::npos ? name : name.substr(0, paren);
    }
  }
  std::string e(expr);
  while (!e.empty() && (e.front() == '(' || e.front() == ' ')) e.erase(0, 1);
  while (!e.empty() && (e.back() == ')' || e.back() == ' ')) e.pop_back();
  return e;
}

void* dynamic_shared() { return tw.dynamic_shared.data(); }

hipError_t launch(dim3 grid, dim3 block, const std::function<void()>& body, const char* expr,
                  const void* fn, size_t dynamic_shared_bytes) {
  g_launches.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    const std::string name = kernel_name(expr, fn);
    g_kernels_run.insert(name);
    g_kernels_since_mark.insert(name);
    if (!g_pending_host_failure.empty()) {
      g_last_message = g_pending_host_failure;
      g_pending_host_failure.clear();
      g_last_error = hipErrorLaunchFailure;
      return g_last_error;
    }
  }
  const int64_t nthreads = static_cast<int64_t>(block.x) * block.y * block.z;
  const int64_t nblocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (nthreads <= 0 || nthreads > 1024 || nblocks <= 0 ||
      dynamic_shared_bytes > static_cast<size_t>(kSharedBytesPerBlock)) {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    g_last_message = "invalid launch configuration";
    g_last_error = hipErrorInvalidValue;
    return g_last_error;
  }
  // RA_EMU_REVERSE=1: waves and lanes run in reverse order, blocks from the last one
  const char* env = getenv("RA_EMU_REVERSE");
  const bool reverse = env != nullptr && atoi(env) != 0;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::string first_error;
  auto work = [&] {
    Worker& w = tw;
    w.ensure(static_cast<size_t>(nthreads));
    w.body = &body;
    w.error.clear();
    w.dynamic_shared.assign((dynamic_shared_bytes + 7) / 8, ~uint64_t{0});
    gridDim = ra_emu_uint3{grid.x, grid.y, grid.z};
    blockDim = ra_emu_uint3{block.x, block.y, block.z};
    for (int64_t i; !failed.load() && (i = next.fetch_add(1)) < nblocks;) {
      const int64_t b = reverse ? nblocks - 1 - i : i;
      blockIdx = ra_emu_uint3{static_cast<uint32_t>(b % grid.x),
                              static_cast<uint32_t>((b / grid.x) % grid.y),
                              static_cast<uint32_t>(b / (static_cast<int64_t>(grid.x) * grid.y))};
      if (!run_block(w, static_cast<int>(nthreads), block, reverse)) {
        if (w.error.empty()) w.error = "kernel failed" + where();
        std::lock_guard<std::mutex> lock(g_error_mutex);
        if (first_error.empty()) first_error = w.error;
        failed.store(true);
      }
    }
    w.body = nullptr;
  };
  const int64_t workers = std::min<int64_t>(worker_count(), nblocks);
  std::vector<std::thread> threads;
  for (int64_t i = 1; i < workers; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  std::lock_guard<std::mutex> lock(g_error_mutex);
  if (failed.load()) {
    g_last_message = first_error;
    g_last_error = hipErrorLaunchFailure;
    return g_last_error;
  }
  return hipSuccess;
}

}  // namespace ra_emu

void ra_emu_fail(const char* what) {
  Fiber* f = tw.cur;
  if (f == nullptr) {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    g_pending_host_failure = what;
    return;
  }
  fail(tw, std::string(what) + where());
  f->state = kFailed;
  yield_to_scheduler(*f);
  __builtin_unreachable();
}

hipError_t hipGetLastError() {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  if (g_last_error == hipSuccess && !g_pending_host_failure.empty()) {
    g_last_message = g_pending_host_failure;
    g_pending_host_failure.clear();
    return hipErrorLaunchFailure;
  }
  const hipError_t e = g_last_error;
  g_last_error = hipSuccess;
  return e;
}

hipError_t hipPeekAtLastError() {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  return g_last_error;
}

const char* hipGetErrorString(hipError_t err) {
  switch (err) {
    case hipSuccess:
      return "hipSuccess";
    case hipErrorInvalidValue:
      return "hipErrorInvalidValue";
    case hipErrorNotSupported:
      return "hipErrorNotSupported";
    case hipErrorLaunchFailure:
      return "hipErrorLaunchFailure";
    default:
      return "hip error";
  }
}

hipError_t hipGetDevice(int* device) {
  *device = 0;
  return hipSuccess;
}

// One emulated device: 0.
hipError_t hipSetDevice(int device) { return device == 0 ? hipSuccess : hipErrorInvalidValue; }

hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int device) {
  if (device != 0) return hipErrorInvalidValue;
  switch (attribute) {
    case hipDeviceAttributeWarpSize:
      *value = W;
      return hipSuccess;
    case hipDeviceAttributeMultiprocessorCount: {
      const char* env = getenv("RA_EMU_MULTIPROCESSORS");
      *value = env != nullptr ? atoi(env) : 2;
      return hipSuccess;
    }
    case hipDeviceAttributeComputeCapabilityMajor:
      *value = 9;  // gfx9
      return hipSuccess;
    case hipDeviceAttributeMaxSharedMemoryPerBlock:
    case hipDeviceAttributeMaxSharedMemoryPerMultiprocessor:
      *value = ra_emu::kSharedBytesPerBlock;
      return hipSuccess;
  }
  return hipErrorInvalidValue;
}

hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind) {
  memcpy(dst, src, bytes);
  return hipSuccess;
}

hipError_t hipMemset(void* dst, int value, size_t bytes) {
  memset(dst, value, bytes);
  return hipSuccess;
}

hipError_t hipDeviceSynchronize() { return hipSuccess; }

// C entry points for the tests (tests/helpers/emu.py).
extern "C" {
const char* ra_emu_last_message() { return g_last_message.c_str(); }
int ra_emu_wave() { return W; }
void ra_emu_set_faults(int faults) { g_faults.store(faults); }
// Names of every kernel launched since the library was loaded (since_mark: since the last
// ra_emu_kernels_mark), one per line.
const char* ra_emu_kernels_run(int since_mark) {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  g_kernels_text.clear();
  for (const std::string& k : since_mark ? g_kernels_since_mark : g_kernels_run)
    g_kernels_text += k + "\n";
  return g_kernels_text.c_str();
}
void ra_emu_kernels_mark() {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  g_kernels_since_mark.clear();
}
// [inactive-lane reads, exchanges, barriers, launches] since the last reset
void ra_emu_stats(int64_t* out, int reset) {
  out[0] = g_inactive_reads.load();
  out[1] = g_exchanges.load();
  out[2] = g_barriers.load();
  out[3] = g_launches.load();
  if (reset) {
    g_inactive_reads = 0;
    g_exchanges = 0;
    g_barriers = 0;
    g_launches = 0;
    std::lock_guard<std::mutex> lock(g_error_mutex);
    g_last_message.clear();
  }
}
}
