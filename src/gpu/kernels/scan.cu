// Exclusive prefix sums of u64 arrays, in three launches: the sum of each
// tile of SCAN_TILE values (one block per tile), the exclusive scan of those
// sums in one block, then each tile's own exclusive scan plus its tile's
// base. Used by the filter (rows kept per 32-row word, to place each kept
// row) and by the gathers (bytes of each kept string, to place its bytes).
// Every block runs its barriers with all threads; values past the end count
// as 0.

#define SCAN_TILE 1024

// The exclusive scan of one value per thread of the block, and the block's
// total. Called by every thread of a block of SCAN_TILE threads.
GPQ_DEVICE u64 gpq_block_exclusive_scan(u64 v, u64* total) {
  __shared__ u64 warp_sums[SCAN_TILE / 32];
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  u64 x = v;
  for (u32 d = 1; d < 32; d <<= 1) {
    u64 y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    u64 s = lane < warps ? warp_sums[lane] : 0;
    for (u32 d = 1; d < 32; d <<= 1) {
      u64 y = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += y;
    }
    if (lane < warps) warp_sums[lane] = s;
  }
  __syncthreads();
  const u64 base = warp > 0 ? warp_sums[warp - 1] : 0;
  *total = warp_sums[warps - 1];
  // warp_sums is reused by the caller's next call.
  __syncthreads();
  return base + x - v;
}

// sums[b] = the sum of tile b of `in` (n values). Grid: one block per tile.
extern "C" __global__ void gpq_scan_tile_sums(const u64* in, u64 n, u64* sums) {
  const u64 i = (u64)blockIdx.x * SCAN_TILE + threadIdx.x;
  u64 total;
  gpq_block_exclusive_scan(i < n ? in[i] : 0, &total);
  if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

// The exclusive scan of the `tiles` tile sums, in place, and their total.
// One block of SCAN_TILE threads, which walks the sums a tile at a time.
extern "C" __global__ void gpq_scan_tile_bases(u64* sums, u64 tiles, u64* total) {
  u64 carry = 0;
  for (u64 start = 0; start < tiles; start += SCAN_TILE) {
    const u64 i = start + threadIdx.x;
    const u64 v = i < tiles ? sums[i] : 0;
    u64 tile_total;
    const u64 ex = gpq_block_exclusive_scan(v, &tile_total);
    if (i < tiles) sums[i] = carry + ex;
    carry += tile_total;
  }
  if (threadIdx.x == 0) *total = carry;
}

// out[i] = the sum of in[0..i), given each tile's base. `out` may be `in`.
// Grid: one block per tile.
extern "C" __global__ void gpq_scan_apply(const u64* in, u64 n, const u64* bases, u64* out) {
  const u64 i = (u64)blockIdx.x * SCAN_TILE + threadIdx.x;
  const u64 v = i < n ? in[i] : 0;
  u64 total;
  const u64 ex = gpq_block_exclusive_scan(v, &total);
  if (i < n) out[i] = bases[blockIdx.x] + ex;
}
