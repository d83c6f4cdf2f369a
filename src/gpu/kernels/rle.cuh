// Block-cooperative decoding of Parquet's RLE / bit-packed hybrid encoding
// (definition levels, dictionary indices, RLE booleans).
//
// Thread 0 parses run headers (a sequential varint walk) into a table in
// shared memory covering the values a batch needs; then every thread looks
// up its own values by binary search in that table. A run table holds at most
// BATCH + 1 runs, enough for any batch because every run covers at least one
// value. Every byte read is checked against the stream's end.
#pragma once

#define GPQ_BATCH 1024
#define GPQ_BLOCK 256
#define GPQ_PER_THREAD (GPQ_BATCH / GPQ_BLOCK)

struct HybridRun {
  u32 start;      // index of the run's first value
  u32 count;      // values in the run
  u32 payload;    // RLE: the value; bit-packed: byte offset of the packed bits
  u32 bitpacked;
};

struct HybridStream {
  const u8* data;
  u32 len;
  u32 bit_width;
  u32 pos;         // byte offset of the next unparsed run header
  u32 next_start;  // value index where the next unparsed run starts
  u32 nruns;
  u32 error;
  u32 packed_only;  // the deprecated BIT_PACKED levels: one headerless run of packed_only values
  HybridRun runs[GPQ_BATCH + 1];
};

GPQ_DEVICE void hybrid_init(HybridStream& s, const u8* data, u32 len, u32 bit_width) {
  s.data = data; s.len = len; s.bit_width = bit_width;
  s.pos = 0; s.next_start = 0; s.nruns = 0; s.packed_only = 0;
  s.error = bit_width > 32 ? GPQ_ERR_BIT_WIDTH : 0;
}

// The deprecated BIT_PACKED level encoding of v1 pages: `count` values of
// `bit_width` bits and no run headers, in `len` bytes (the caller checks that
// they hold them). The bits are read in the hybrid encoding's order, least
// significant first, as arrow-rs and Arrow C++ read them (the format's text
// says most significant first, as parquet-mr writes them; no reader here
// follows it).
GPQ_DEVICE void packed_levels_init(HybridStream& s, const u8* data, u32 len, u32 bit_width, u32 count) {
  hybrid_init(s, data, len, bit_width);
  s.packed_only = count;
}

// Thread 0 only: makes the run table cover values [lo, hi). Values must be
// asked for in increasing order across calls.
GPQ_DEVICE void hybrid_fill(HybridStream& s, u32 lo, u32 hi) {
  if (s.error) return;
  if (s.packed_only) {
    HybridRun r; r.start = 0; r.count = s.packed_only; r.payload = 0; r.bitpacked = 1;
    s.runs[0] = r; s.nruns = 1; s.next_start = s.packed_only;
    if (hi > s.packed_only) s.error = GPQ_ERR_TOO_FEW_VALUES;
    return;
  }
  // Keep the last run if it reaches into the new window.
  if (s.nruns > 0) {
    HybridRun last = s.runs[s.nruns - 1];
    if (last.start + last.count > lo) { s.runs[0] = last; s.nruns = 1; }
    else s.nruns = 0;
  }
  const u32 bw = s.bit_width;
  while (s.next_start < hi) {
    if (s.nruns > GPQ_BATCH) { s.error = GPQ_ERR_BAD_RLE_RUN; return; }
    // ULEB128 run header, at most 5 bytes for 32 bits.
    u32 header = 0;
    u32 p = s.pos;
    bool done = false;
    for (int i = 0; i < 5; i++) {
      if (p >= s.len) { s.error = GPQ_ERR_TOO_FEW_VALUES; return; }
      u8 b = s.data[p++];
      header |= (u32)(b & 0x7f) << (7 * i);
      if (!(b & 0x80)) { done = true; break; }
    }
    if (!done) { s.error = GPQ_ERR_BAD_RLE_RUN; return; }
    HybridRun r;
    r.start = s.next_start;
    if (header & 1) {
      u64 groups = header >> 1;
      u64 count = groups * 8;
      u64 bytes = groups * bw;
      u32 avail = s.len - p;
      if (bytes > avail) {
        // A short final run: keep the values whose bits are all present.
        bytes = avail;
        count = bw ? ((u64)avail * 8) / bw : count;
      }
      r.count = (u32)(count > 0xffffffffull ? 0xffffffffull : count);
      r.payload = p;
      r.bitpacked = 1;
      p += (u32)bytes;
    } else {
      r.count = header >> 1;
      u32 vbytes = (bw + 7) / 8;
      if (s.len - p < vbytes) { s.error = GPQ_ERR_BAD_RLE_RUN; return; }
      u32 v = 0;
      for (u32 i = 0; i < vbytes; i++) v |= (u32)s.data[p + i] << (8 * i);
      if (bw < 32 && (v >> bw) != 0) { s.error = GPQ_ERR_BAD_RLE_RUN; return; }
      r.payload = v;
      r.bitpacked = 0;
      p += vbytes;
    }
    if (r.count == 0) { s.error = GPQ_ERR_BAD_RLE_RUN; return; }
    s.pos = p;
    s.next_start += r.count;
    if (r.start + r.count > lo) s.runs[s.nruns++] = r;
  }
}

// Any thread: value `i`, which must lie in the window of the last fill.
GPQ_DEVICE u32 hybrid_get(const HybridStream& s, u32 i) {
  u32 lo = 0, hi = s.nruns;
  while (hi - lo > 1) {
    u32 mid = (lo + hi) / 2;
    if (s.runs[mid].start <= i) lo = mid; else hi = mid;
  }
  const HybridRun& r = s.runs[lo];
  if (!r.bitpacked) return r.payload;
  const u32 bw = s.bit_width;
  if (bw == 0) return 0;
  u64 bit = (u64)(i - r.start) * bw;
  u32 byte = r.payload + (u32)(bit >> 3);
  u32 shift = (u32)(bit & 7);
  u64 w = 0;
  u32 need = (shift + bw + 7) / 8;
  for (u32 k = 0; k < need; k++) {
    u32 at = byte + k;
    w |= (u64)(at < s.len ? s.data[at] : 0) << (8 * k);
  }
  return (u32)((w >> shift) & ((bw == 32) ? 0xffffffffull : ((1ull << bw) - 1)));
}

// Exclusive prefix count of `flag` over the block (all threads must call).
// Returns this thread's prefix; *total receives the block's count.
GPQ_DEVICE u32 block_prefix_count(bool flag, u32* warp_sums, u32* total) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) / 32;
  u32 ballot = __ballot_sync(0xffffffffu, flag);
  u32 before = __popc(ballot & ((1u << lane) - 1));
  if (lane == 0) warp_sums[warp] = __popc(ballot);
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 acc = 0;
    for (u32 w = 0; w < nwarps; w++) { u32 c = warp_sums[w]; warp_sums[w] = acc; acc += c; }
    warp_sums[nwarps] = acc;
  }
  __syncthreads();
  u32 r = warp_sums[warp] + before;
  *total = warp_sums[nwarps];
  __syncthreads();
  return r;
}

// ORs one bit per thread (rows row0 .. row0+31 of a warp) into a bitmap.
GPQ_DEVICE void warp_write_bits(u32* bitmap, u64 row0, bool bit, u32 warp_rows) {
  u32 mask = __ballot_sync(0xffffffffu, bit);
  if ((threadIdx.x & 31) != 0 || warp_rows == 0) return;
  if (warp_rows < 32) mask &= (1u << warp_rows) - 1;
  if (!mask) return;
  u64 w = row0 >> 5;
  u32 s = (u32)(row0 & 31);
  atomicOr(bitmap + w, mask << s);
  if (s && (mask >> (32 - s))) atomicOr(bitmap + w + 1, mask >> (32 - s));
}
