// Batched copies between device buffers: one block per copy. Used to gather
// compressed pages into aligned buffers for nvCOMP and to put a v2 page's
// uncompressed level bytes in front of its decompressed values.

struct CopyDesc {
  u64 src;
  u64 dst;
  u64 len;
};

extern "C" __global__ void gpq_batched_copy(const CopyDesc* copies, u32 n) {
  if (blockIdx.x >= n) return;
  CopyDesc c = copies[blockIdx.x];
  const u8* s = (const u8*)c.src;
  u8* d = (u8*)c.dst;
  // Source and destination at the same offset within 16 bytes: the bytes up
  // to the boundary one at a time, then 16 at a time.
  u64 head = (16 - (c.dst & 15)) & 15;
  if (!((c.src ^ c.dst) & 15) && head <= c.len) {
    for (u64 i = threadIdx.x; i < head; i += blockDim.x) d[i] = s[i];
    const uint4* s16 = (const uint4*)(s + head);
    uint4* d16 = (uint4*)(d + head);
    u64 n16 = (c.len - head) / 16;
    for (u64 i = threadIdx.x; i < n16; i += blockDim.x) d16[i] = s16[i];
    for (u64 i = head + n16 * 16 + threadIdx.x; i < c.len; i += blockDim.x) d[i] = s[i];
  } else {
    for (u64 i = threadIdx.x; i < c.len; i += blockDim.x) d[i] = s[i];
  }
}

// List offsets widened from i32 to i64 (Arrow's LargeList), grid-stride.
extern "C" __global__ void gpq_widen_offsets(const i32* src, i64* dst, u64 n) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) dst[i] = src[i];
}
