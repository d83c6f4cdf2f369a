// A small CUDA execution emulator for the CPU: just enough of the CUDA C++
// device dialect for gpq's kernels to compile with g++ and run, one block at
// a time, each thread a fiber (ucontext) scheduled cooperatively. It exists so
// kernel logic can be tested on machines without a GPU (CI); it says nothing
// about speed, and it is no substitute for running on a device.
//
// Semantics kept: __syncthreads and warp intrinsics are real barriers (a
// divergent barrier is reported as a deadlock); __shared__ is per block (and
// per host thread); atomics are trivially atomic because fibers never preempt.
// Between barriers no order is promised, so the threads of alternate blocks
// run in opposite orders (GPQ_EMU_ORDER, emu.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static thread_local
#define __constant__
#define __launch_bounds__(...)

struct gpq_dim3 { unsigned x, y, z; };
struct alignas(16) uint4 { unsigned x, y, z, w; };

namespace gpq_emu {
unsigned tid();
unsigned bid();
unsigned bdim();
unsigned gdim();
void sync_block();
void sync_warp();
unsigned long long warp_exchange(unsigned long long v, int src_lane);   // value of src_lane (own if absent)
unsigned warp_ballot(unsigned mask, bool pred);
unsigned warp_match(unsigned mask, unsigned long long v);  // lanes of `mask` whose value equals the caller's
unsigned warp_sum(unsigned v);
int block_count(bool pred);
}  // namespace gpq_emu

#define threadIdx (gpq_dim3{gpq_emu::tid(), 0, 0})
#define blockIdx (gpq_dim3{gpq_emu::bid(), 0, 0})
#define blockDim (gpq_dim3{gpq_emu::bdim(), 1, 1})
#define gridDim (gpq_dim3{gpq_emu::gdim(), 1, 1})
#define warpSize 32

inline void __syncthreads() { gpq_emu::sync_block(); }
inline int __syncthreads_count(int p) { return gpq_emu::block_count(p != 0); }
inline int __syncthreads_or(int p) { return gpq_emu::block_count(p != 0) != 0; }
inline int __syncthreads_and(int p) { return gpq_emu::block_count(p != 0) == (int)gpq_emu::bdim(); }
inline void __syncwarp(unsigned = 0xffffffffu) { gpq_emu::sync_warp(); }
inline void __threadfence() {}
inline long long clock64() { return 0; }
inline void __threadfence_block() {}
inline unsigned __ballot_sync(unsigned mask, int pred) { return gpq_emu::warp_ballot(mask, pred != 0); }
inline unsigned __reduce_add_sync(unsigned, unsigned v) { return gpq_emu::warp_sum(v); }
template <typename T> inline unsigned __match_any_sync(unsigned mask, T v) {
  static_assert(sizeof(T) <= 8, "match of at most 8 bytes");
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return gpq_emu::warp_match(mask, bits);
}
inline int __any_sync(unsigned mask, int pred) { return gpq_emu::warp_ballot(mask, pred != 0) != 0; }
inline int __all_sync(unsigned mask, int pred) { return gpq_emu::warp_ballot(mask, pred != 0) == gpq_emu::warp_ballot(mask, true); }

template <typename T>
inline T gpq_emu_shfl(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = gpq_emu::warp_exchange(bits, src);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
inline int gpq_emu_lane() { return (int)(gpq_emu::tid() & 31); }
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int = 32) { return gpq_emu_shfl(v, src & 31); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int = 32) {
  int s = gpq_emu_lane() + (int)d;
  return gpq_emu_shfl(v, s < 32 ? s : -1);
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int = 32) {
  int s = gpq_emu_lane() - (int)d;
  return gpq_emu_shfl(v, s >= 0 ? s : -1);
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int m, int = 32) { return gpq_emu_shfl(v, (gpq_emu_lane() ^ m) & 31); }

template <typename T> inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicOr(T* p, T v) { T o = *p; *p = o | v; return o; }
template <typename T> inline T atomicAnd(T* p, T v) { T o = *p; *p = o & v; return o; }
template <typename T> inline T atomicMax(T* p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> inline T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <typename T> inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __clzll(unsigned long long x) { return x ? __builtin_clzll(x) : 64; }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline int __ffsll(unsigned long long x) { return __builtin_ffsll((long long)x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
template <typename T> inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline long long __double_as_longlong(double d) { long long x; std::memcpy(&x, &d, 8); return x; }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  s &= 31;
  return s ? (lo >> s) | (hi << (32 - s)) : lo;
}
template <typename A, typename B> inline auto min(A a, B b) -> typename std::common_type<A, B>::type { return a < b ? a : b; }
template <typename A, typename B> inline auto max(A a, B b) -> typename std::common_type<A, B>::type { return a > b ? a : b; }
