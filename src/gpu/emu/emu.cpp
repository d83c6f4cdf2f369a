// The scheduler of the CUDA emulator (see cuda_emu.h) and the table of
// kernels it can launch. Built by build.rs with the `emulator` feature.
#include "cuda_emu.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>
#include <ucontext.h>

// The kernels, compiled for the host.
#include "../kernels/common.cuh"
#include "../kernels/checksum.cu"
#include "../kernels/page_headers.cu"
#include "../kernels/page_checksums.cu"
#include "../kernels/rle.cuh"
#include "../kernels/page_decode.cuh"
#include "../kernels/delta.cuh"
#include "../kernels/decode_values.cu"
#include "../kernels/decode_strings.cu"
#include "../kernels/decode_delta.cu"
#include "../kernels/copy.cu"
#include "../kernels/check_compressed.cu"
#include "../kernels/unzstd.cu"
#include "../kernels/unsnappy.cu"
#include "../kernels/nesting.cu"
#include "../kernels/views.cu"
#include "../kernels/scan.cu"
#include "../kernels/filter.cu"
#include "../kernels/gather.cu"
#include "../kernels/aggregate.cu"

namespace gpq_emu {

// Switching fibers. glibc's swapcontext saves and restores the signal mask
// with a system call on every switch, and kernels with warp collectives
// switch at every shuffle: on x86-64 a switch of the callee-saved registers
// and the stack pointer does (the System V ABI leaves every other register
// to the caller, and no fiber changes the signal mask or the FP control
// state). Elsewhere ucontext remains.
#if defined(__x86_64__)
extern "C" void gpq_emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.p2align 4
.globl gpq_emu_switch
.type gpq_emu_switch,@function
gpq_emu_switch:
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
.size gpq_emu_switch, .-gpq_emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
struct Context {
  void* sp = nullptr;
};
static void switch_to(Context& save, Context& load) { gpq_emu_switch(&save.sp, load.sp); }
// A fresh stack whose first switch "returns" into `entry`, with the stack
// aligned as after a call (rsp % 16 == 8 at the entry).
static void start_on(Context& c, char* stack, size_t size, void (*entry)()) {
  uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
  void** sp = (void**)top;
  *--sp = nullptr;            // the entry's return address: it never returns
  *--sp = (void*)entry;       // popped by `ret`
  for (int i = 0; i < 6; i++) *--sp = nullptr;   // rbp rbx r12-r15
  c.sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};
static void switch_to(Context& save, Context& load) { swapcontext(&save.uc, &load.uc); }
static void start_on(Context& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

struct Fiber {
  Context ctx;
  std::vector<char> stack;
  State state = DONE;
  unsigned long long xchg = 0;
};

struct Block {
  unsigned block_idx = 0, block_dim = 0, grid_dim = 0;
  std::vector<Fiber> fibers;
  Context sched;
  unsigned current = 0;
  void (*body)(void**) = nullptr;
  void** args = nullptr;
  std::string error;
};

static thread_local Block* g_block = nullptr;
static const size_t kStack = 256 * 1024;

unsigned tid() { return g_block->current; }
unsigned bid() { return g_block->block_idx; }
unsigned bdim() { return g_block->block_dim; }
unsigned gdim() { return g_block->grid_dim; }

static void yield_as(State s) {
  Block* b = g_block;
  Fiber& f = b->fibers[b->current];
  f.state = s;
  switch_to(f.ctx, b->sched);
}

void sync_block() { yield_as(AT_BLOCK_BARRIER); }
void sync_warp() { yield_as(AT_WARP_BARRIER); }

static bool lane_present(Block* b, unsigned t) { return t < b->block_dim && b->fibers[t].state != DONE; }

unsigned long long warp_exchange(unsigned long long v, int src_lane) {
  Block* b = g_block;
  unsigned me = b->current;
  b->fibers[me].xchg = v;
  sync_warp();
  unsigned long long out = v;
  if (src_lane >= 0) {
    unsigned src = (me & ~31u) + (unsigned)src_lane;
    if (lane_present(b, src)) out = b->fibers[src].xchg;
  }
  sync_warp();
  return out;
}

// Every present lane of the caller's warp publishes `v`; `each(lane, value)`
// then sees each present lane's value, in every lane.
template <typename F>
static void warp_gather(unsigned long long v, F each) {
  Block* b = g_block;
  unsigned me = b->current;
  b->fibers[me].xchg = v;
  sync_warp();
  unsigned base = me & ~31u;
  for (unsigned l = 0; l < 32; l++)
    if (lane_present(b, base + l)) each(l, b->fibers[base + l].xchg);
  sync_warp();
}

unsigned warp_ballot(unsigned mask, bool pred) {
  unsigned r = 0;
  warp_gather(pred, [&](unsigned l, unsigned long long x) {
    if (((mask >> l) & 1) && x) r |= 1u << l;
  });
  return r;
}

unsigned warp_match(unsigned mask, unsigned long long v) {
  unsigned r = 0;
  warp_gather(v, [&](unsigned l, unsigned long long x) {
    if (((mask >> l) & 1) && x == v) r |= 1u << l;
  });
  return r;
}

unsigned warp_sum(unsigned v) {
  unsigned r = 0;
  warp_gather(v, [&](unsigned, unsigned long long x) { r += (unsigned)x; });
  return r;
}

int block_count(bool pred) {
  Block* b = g_block;
  b->fibers[b->current].xchg = pred;
  sync_block();
  int n = 0;
  for (unsigned t = 0; t < b->block_dim; t++)
    if (b->fibers[t].state != DONE && b->fibers[t].xchg) n++;
  sync_block();
  return n;
}

static void trampoline() {
  Block* b = g_block;
  b->body(b->args);
  b->fibers[b->current].state = DONE;
  switch_to(b->fibers[b->current].ctx, b->sched);
}

// Runs every fiber of the block until all are done; false on a deadlock.
static bool run_block(Block* b) {
  for (unsigned t = 0; t < b->block_dim; t++) {
    Fiber& f = b->fibers[t];
    if (f.stack.size() != kStack) f.stack.assign(kStack, 0);
    start_on(f.ctx, f.stack.data(), kStack, trampoline);
    f.state = RUNNABLE;
  }
  // Between barriers the threads run in index order in one block and in
  // reverse order in the next: CUDA promises no order, and a kernel whose
  // result depends on it (a missing barrier or dependency) then gives a
  // different result in one of the two. GPQ_EMU_ORDER=forward or reverse
  // keeps one order for every block; any other value is reported once and
  // alternates, so a typo cannot pass for the order it meant.
  static const int order = [] {
    const char* v = getenv("GPQ_EMU_ORDER");
    if (!v || !*v) return 0;
    std::string s(v);
    if (s == "forward") return 1;
    if (s == "reverse") return 2;
    if (s != "alternating")
      fprintf(stderr, "gpq emulator: GPQ_EMU_ORDER=%s is not forward, reverse or alternating; alternating\n", v);
    return 0;
  }();
  static thread_local unsigned long long blocks_run = 0;
  bool reverse = order == 2 || (order == 0 && (blocks_run++ & 1));
  for (;;) {
    bool ran = false;
    for (unsigned k = 0; k < b->block_dim; k++) {
      unsigned t = reverse ? b->block_dim - 1 - k : k;
      if (b->fibers[t].state != RUNNABLE) continue;
      b->current = t;
      ran = true;
      switch_to(b->sched, b->fibers[t].ctx);
    }
    if (ran) continue;
    unsigned live = 0, at_block = 0;
    for (auto& f : b->fibers) {
      if (f.state != DONE) live++;
      if (f.state == AT_BLOCK_BARRIER) at_block++;
    }
    if (live == 0) return true;
    bool released = false;
    if (at_block == live) {
      for (auto& f : b->fibers)
        if (f.state == AT_BLOCK_BARRIER) f.state = RUNNABLE;
      released = true;
    } else {
      for (unsigned w = 0; w * 32 < b->block_dim; w++) {
        unsigned waiting = 0, alive = 0;
        for (unsigned t = w * 32; t < b->block_dim && t < w * 32 + 32; t++) {
          if (b->fibers[t].state != DONE) alive++;
          if (b->fibers[t].state == AT_WARP_BARRIER) waiting++;
        }
        if (alive && waiting == alive) {
          for (unsigned t = w * 32; t < b->block_dim && t < w * 32 + 32; t++)
            if (b->fibers[t].state == AT_WARP_BARRIER) b->fibers[t].state = RUNNABLE;
          released = true;
        }
      }
    }
    if (!released) {
      b->error = "deadlock: threads wait at different barriers (divergent __syncthreads or warp op)";
      return false;
    }
  }
}

template <typename... A, size_t... I>
static void invoke(void (*f)(A...), void** args, std::index_sequence<I...>) {
  std::tuple<std::remove_cv_t<std::remove_reference_t<A>>...> vals;
  ((std::memcpy(&std::get<I>(vals), args[I], sizeof(std::get<I>(vals)))), ...);
  f(std::get<I>(vals)...);
}

}  // namespace gpq_emu

template <typename... A>
static void gpq_emu_call(void (*f)(A...), void** args) {
  gpq_emu::invoke(f, args, std::index_sequence_for<A...>{});
}

#define GPQ_KERNEL_LIST(X) \
  X(gpq_span_checksum)     \
  X(gpq_count_pages)       \
  X(gpq_parse_pages)       \
  X(gpq_decode_fixed)      \
  X(gpq_dict_index)        \
  X(gpq_string_sizes)      \
  X(gpq_string_chars)      \
  X(gpq_bytes_decimal)     \
  X(gpq_decode_delta)      \
  X(gpq_delta_string_sizes) \
  X(gpq_delta_byte_array_values) \
  X(gpq_batched_copy)      \
  X(gpq_check_compressed)  \
  X(gpq_unzstd_count)      \
  X(gpq_unzstd_sequences)  \
  X(gpq_unzstd)            \
  X(gpq_unsnappy)          \
  X(gpq_decode_levels)     \
  X(gpq_nest_count)        \
  X(gpq_nest_apply)        \
  X(gpq_page_crc)          \
  X(gpq_make_views)        \
  X(gpq_widen_offsets)     \
  X(gpq_scan_tile_sums)    \
  X(gpq_scan_tile_bases)   \
  X(gpq_scan_apply)        \
  X(gpq_filter_eval)       \
  X(gpq_filter_rows)       \
  X(gpq_gather_fixed)      \
  X(gpq_gather_bits)       \
  X(gpq_gather_lengths)    \
  X(gpq_gather_strings)    \
  X(gpq_aggregate)

struct KernelEntry {
  const char* name;
  void (*body)(void**);
};

#define GPQ_WRAP(k) static void emu_##k(void** a) { gpq_emu_call(k, a); }
GPQ_KERNEL_LIST(GPQ_WRAP)
#define GPQ_ENTRY(k) {#k, emu_##k},
static const KernelEntry kKernels[] = {GPQ_KERNEL_LIST(GPQ_ENTRY)};

// Launches kernel `name` with a 1-D grid; returns 0, or 1 for an unknown
// kernel, 2 for a deadlock (message in `err`, up to `err_len` bytes).
extern "C" int gpq_emu_launch(const char* name, unsigned grid, unsigned block, void** args, char* err, size_t err_len) {
  const KernelEntry* k = nullptr;
  for (auto& e : kKernels)
    if (std::strcmp(e.name, name) == 0) k = &e;
  if (!k) {
    std::snprintf(err, err_len, "the emulator has no kernel %s", name);
    return 1;
  }
  if (block == 0 || block > 1024) {
    std::snprintf(err, err_len, "block size %u out of range", block);
    return 3;
  }
  static thread_local gpq_emu::Block b;
  gpq_emu::Block* saved = gpq_emu::g_block;
  gpq_emu::g_block = &b;
  b.fibers.resize(block);
  b.block_dim = block;
  b.grid_dim = grid;
  b.body = k->body;
  b.args = args;
  b.error.clear();
  int rc = 0;
  for (unsigned i = 0; i < grid; i++) {
    b.block_idx = i;
    if (!gpq_emu::run_block(&b)) {
      std::snprintf(err, err_len, "%s block %u: %s", name, i, b.error.c_str());
      rc = 2;
      break;
    }
  }
  gpq_emu::g_block = saved;
  return rc;
}
