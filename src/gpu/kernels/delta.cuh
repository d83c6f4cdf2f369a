// DELTA_BINARY_PACKED streams, decoded by a block in windows of at most
// GPQ_BATCH values.
//
// Stream layout: a header (block size, miniblocks per block, value count,
// first value as zigzag varints), then blocks: a zigzag min delta, one bit
// width per miniblock, and the miniblocks' bit-packed deltas. Value i > 0 is
// value i-1 plus delta i-1 plus the block's min delta, all wrapping in the
// column's width (as arrow-rs computes them; a 64-bit wrapping sum truncated
// to 32 bits gives the same INT32 values).
//
// Thread 0 parses miniblock headers into a table covering the deltas a
// window needs (delta_fill); then every thread unpacks its own deltas and a
// block-wide prefix sum turns them into values (delta_decode_window). A
// window of GPQ_BATCH values spans at most GPQ_BATCH / 32 + 2 miniblocks
// (each holds a multiple of 32 deltas). Every byte read is checked against
// the stream's end, every count against what the bytes can hold; the header
// is checked as arrow-rs checks it.
#pragma once

#define GPQ_DELTA_MINIS (GPQ_BATCH / 32 + 2)

struct DeltaMini {
  u64 first;       // index of the miniblock's first delta
  u64 offset;      // byte offset of its packed bits in the stream
  u64 min_delta;   // its block's min delta (two's complement)
  u32 width;       // bits per delta
  u32 pad;
};

struct DeltaStream {
  const u8* data;
  u64 len;
  u32 in_width;      // 4 (INT32) or 8 (INT64)
  u32 error;
  u64 count;         // values the header announces
  u64 first_value;
  u64 vpm;           // values per miniblock
  u64 nmini;         // miniblocks per block
  u64 header_end;    // byte offset just past the header
  // Parser state: the next miniblock to enter the table.
  u64 pos;           // next block header (when mini_idx == nmini)
  u64 widths_pos;    // the current block's bit widths
  u64 data_pos;      // the next miniblock's bits
  u64 min_delta;     // the current block's min delta
  u64 mini_idx;      // next miniblock of the current block
  u64 next_delta;    // first delta not yet in the table
  u64 last;          // the value before the current window
  u32 nminis;        // table entries
  DeltaMini minis[GPQ_DELTA_MINIS];
};

// ULEB128 of at most 10 bytes at *pos; false (with *err set) if truncated or too long.
GPQ_DEVICE bool delta_uleb(const u8* d, u64 len, u64* pos, u64* out, u32* err) {
  u64 v = 0;
  u64 p = *pos;
  for (u32 i = 0; i < 10; i++) {
    if (p >= len) { *err = GPQ_ERR_TRUNCATED_PAGE; return false; }
    u8 b = d[p++];
    v |= (u64)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) { *pos = p; *out = v; return true; }
  }
  *err = GPQ_ERR_BAD_DELTA_HEADER;
  return false;
}

GPQ_DEVICE u64 delta_unzigzag(u64 v) { return (v >> 1) ^ (0ull - (v & 1)); }

// Whether `v` (two's complement) fits the stream's value width.
GPQ_DEVICE bool delta_fits(const DeltaStream& s, u64 v) {
  if (s.in_width == 8) return true;
  i64 x = (i64)v;
  return x >= -2147483648ll && x <= 2147483647ll;
}

// Thread 0: reads and checks the header of the stream in data[0, len).
GPQ_DEVICE u32 delta_init(DeltaStream& s, const u8* data, u64 len, u32 in_width) {
  s.data = data;
  s.len = len;
  s.in_width = in_width;
  s.error = 0;
  s.count = 0;
  s.nminis = 0;
  s.last = 0;
  s.next_delta = 0;
  u64 p = 0, block_size = 0, nmini = 0, count = 0, first = 0;
  u32 err = 0;
  if (!delta_uleb(data, len, &p, &block_size, &err) || !delta_uleb(data, len, &p, &nmini, &err) ||
      !delta_uleb(data, len, &p, &count, &err) || !delta_uleb(data, len, &p, &first, &err)) {
    return s.error = err;
  }
  first = delta_unzigzag(first);
  // arrow-rs's checks, with sizes kept below 2^32 (a page holds fewer values).
  if (nmini == 0 || block_size > 0xffffffffull || count > 0xffffffffull || block_size % 128 != 0 ||
      block_size % nmini != 0 || (block_size / nmini) % 32 != 0 || !delta_fits(s, first)) {
    return s.error = GPQ_ERR_BAD_DELTA_HEADER;
  }
  s.vpm = block_size / nmini;
  // A block of no values holds no deltas: only a stream of at most one value can have it.
  if (s.vpm == 0 && count > 1) return s.error = GPQ_ERR_BAD_DELTA_HEADER;
  s.nmini = nmini;
  s.count = count;
  s.first_value = first;
  s.header_end = p;
  s.pos = p;
  s.data_pos = p;
  s.widths_pos = p;
  s.mini_idx = nmini;   // a block header comes next
  s.min_delta = 0;
  return 0;
}

// Steps over the next miniblock: parses its block's header first if it
// starts a block, checks its bit width, returns its entry and advances.
GPQ_DEVICE u32 delta_next_mini(DeltaStream& s, DeltaMini* m) {
  if (s.mini_idx == s.nmini) {
    u64 p = s.pos, md = 0;
    u32 err = 0;
    if (!delta_uleb(s.data, s.len, &p, &md, &err)) return err;
    md = delta_unzigzag(md);
    if (!delta_fits(s, md)) return GPQ_ERR_BAD_DELTA_HEADER;
    if (s.nmini > s.len - p) return GPQ_ERR_TRUNCATED_PAGE;
    s.min_delta = md;
    s.widths_pos = p;
    s.data_pos = p + s.nmini;
    s.mini_idx = 0;
  }
  u32 width = s.data[s.widths_pos + s.mini_idx];
  if (width > 8 * s.in_width) return GPQ_ERR_BIT_WIDTH;
  m->first = s.next_delta;
  m->offset = s.data_pos;
  m->min_delta = s.min_delta;
  m->width = width;
  m->pad = 0;
  // vpm < 2^32 and width <= 64: no overflow; the bits themselves are checked as they are read.
  s.data_pos += (u64)width * s.vpm / 8;
  s.next_delta += s.vpm;
  s.mini_idx++;
  if (s.mini_idx == s.nmini) s.pos = s.data_pos;
  return 0;
}

// Thread 0: makes the table cover the deltas values [lo, hi) need. Windows
// must come in order, each starting where the last ended.
GPQ_DEVICE u32 delta_fill(DeltaStream& s, u64 lo, u64 hi) {
  if (s.error) return s.error;
  if (hi > s.count) return s.error = GPQ_ERR_TOO_FEW_VALUES;
  const u64 dlo = lo == 0 ? 0 : lo - 1;
  const u64 dhi = hi == 0 ? 0 : hi - 1;
  // Keep the last miniblock if it reaches into this window.
  if (s.nminis > 0) {
    DeltaMini last = s.minis[s.nminis - 1];
    if (last.first + s.vpm > dlo) { s.minis[0] = last; s.nminis = 1; }
    else s.nminis = 0;
  }
  while (s.next_delta < dhi) {
    if (s.nminis >= GPQ_DELTA_MINIS) return s.error = GPQ_ERR_BAD_DELTA_HEADER;
    DeltaMini m;
    u32 err = delta_next_mini(s, &m);
    if (err) return s.error = err;
    s.minis[s.nminis++] = m;
  }
  return 0;
}

// Thread 0: the byte offset just past the stream (what arrow-rs's decoder
// reports after its last value: miniblocks that hold none of the stream's
// deltas take no bytes), checking every header and bit width on the way.
// Leaves `s` as it was.
GPQ_DEVICE u32 delta_stream_end(const DeltaStream& s, u64* end) {
  if (s.error) return s.error;
  DeltaStream t = s;   // only the parser fields change
  const u64 deltas = s.count == 0 ? 0 : s.count - 1;
  // Each miniblock takes a width byte, so the walk is bounded by the stream's length.
  while (t.next_delta < deltas) {
    DeltaMini m;
    u32 err = delta_next_mini(t, &m);
    if (err) return err;
  }
  *end = t.next_delta == 0 ? s.header_end : t.data_pos;
  if (*end > s.len) return GPQ_ERR_TRUNCATED_PAGE;
  return 0;
}

// Delta j (j < count - 1), or sets *err if its bits run past the stream.
GPQ_DEVICE u64 delta_get(const DeltaStream& s, u64 j, u32* err) {
  u32 lo = 0, hi = s.nminis;
  while (hi - lo > 1) {
    u32 mid = (lo + hi) / 2;
    if (s.minis[mid].first <= j) lo = mid; else hi = mid;
  }
  const DeltaMini& m = s.minis[lo];
  const u32 w = m.width;
  u64 packed = 0;
  if (w > 0) {
    u64 bit = (j - m.first) * w;
    u64 byte = m.offset + (bit >> 3);
    u32 shift = (u32)(bit & 7);
    u32 need = (shift + w + 7) / 8;   // at most 9 bytes
    if (byte > s.len || need > s.len - byte) {
      *err = GPQ_ERR_TRUNCATED_PAGE;
      return 0;
    }
    u64 lo64 = 0;
    for (u32 k = 0; k < need && k < 8; k++) lo64 |= (u64)s.data[byte + k] << (8 * k);
    packed = lo64 >> shift;
    if (need == 9) packed |= (u64)s.data[byte + 8] << (64 - shift);
    if (w < 64) packed &= (1ull << w) - 1;
  }
  return packed + m.min_delta;
}

// Inclusive prefix sum (wrapping) of `v` over the block; all threads call.
GPQ_DEVICE u64 delta_block_scan(u64 v, u64* warp_sums) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) / 32;
  u64 x = v;
  for (u32 d = 1; d < 32; d <<= 1) {
    u64 y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 acc = 0;
    for (u32 w = 0; w < nwarps; w++) { u64 c = warp_sums[w]; warp_sums[w] = acc; acc += c; }
  }
  __syncthreads();
  u64 r = warp_sums[warp] + x;
  __syncthreads();
  return r;
}

// Values [lo, lo + n) of the stream into out[0, n), n <= GPQ_BATCH, after
// delta_fill(s, lo, lo + n). Thread t decodes values t*P .. t*P+P-1 of the
// window (P = GPQ_PER_THREAD, so the sum runs over consecutive values). All
// threads call; a read past the stream sets *err (atomically, before the
// scan's first barrier: callers read *err only after a later barrier).
template <typename T>
GPQ_DEVICE void delta_decode_window(DeltaStream& s, u64 lo, u32 n, u64* warp_sums, T* out, u32* err) {
  u64 d[GPQ_PER_THREAD];
  u64 local = 0;
  u32 my_err = 0;
  for (u32 q = 0; q < GPQ_PER_THREAD; q++) {
    u32 i = threadIdx.x * GPQ_PER_THREAD + q;
    u64 x = 0;
    if (i < n) {
      u64 v = lo + i;
      x = v == 0 ? s.first_value : delta_get(s, v - 1, &my_err);
    }
    local += x;
    d[q] = local;
  }
  if (my_err) atomicCAS(err, 0u, my_err);
  const u64 base = s.last;
  u64 incl = delta_block_scan(local, warp_sums);
  u64 before = base + (incl - local);
  for (u32 q = 0; q < GPQ_PER_THREAD; q++) {
    u32 i = threadIdx.x * GPQ_PER_THREAD + q;
    if (i < n) out[i] = (T)(before + d[q]);
  }
  // Every thread has read s.last (before the scan's barriers); the window's last value carries on.
  if (n > 0 && (n - 1) / GPQ_PER_THREAD == threadIdx.x) s.last = before + d[(n - 1) % GPQ_PER_THREAD];
  __syncthreads();
}
