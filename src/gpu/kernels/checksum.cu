// Position-weighted checksum of byte spans in device memory, used to prove
// that IO put every planned byte where the plan says (see io tests).
// sum over i of (byte[i] + 1) * (i * 0x9E3779B97F4A7C15 + 1), wrapping at 2^64.

extern "C" __global__ void gpq_span_checksum(const u8* base, const u64* offsets, const u64* lengths,
                                              u32 num_spans, u32 slices, u64* out) {
  // blockIdx.x enumerates (span, slice) pairs.
  u32 span = blockIdx.x / slices;
  u32 slice = blockIdx.x % slices;
  if (span >= num_spans) return;
  const u8* p = base + offsets[span];
  u64 n = lengths[span];
  u64 per = (n + slices - 1) / slices;
  u64 lo = per * slice;
  u64 hi = lo + per < n ? lo + per : n;
  u64 acc = 0;
  for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    acc += (u64)(p[i] + 1) * (i * 0x9E3779B97F4A7C15ull + 1);
  }
  // Warp reduction, then one atomic per warp.
  for (int d = 16; d > 0; d >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, d);
  if ((threadIdx.x & 31) == 0) atomicAdd(out + span, acc);
}
