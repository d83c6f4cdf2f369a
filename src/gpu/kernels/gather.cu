// Gathers: a column's rows listed in `rows` (the rows a filter kept, in
// order) copied into fresh buffers. Fixed-width values one thread per row;
// bitmaps (validity, booleans) one warp per 32 rows, each warp writing one
// whole output word; strings in two steps around a scan (scan.cu): each
// kept value's length, then, at the scanned starts, its bytes and offset,
// one warp per value. Views keep short values inline and get their long
// values' bytes packed into fresh characters, their buffer and offset
// rewritten (see views.cu for the buffer layout). Every read is checked
// against its buffer's length; a row outside it reports an overflow.

struct GatherDesc {
  u64 src;          // source buffer (values, bitmap, offsets or views)
  u64 src_len;      // its bytes
  u64 src_data;     // strings: the characters; views: the view data
  u64 src_data_len;
  u64 src_offset;   // rows before the column's first row
  u64 rows;         // u32 row numbers (relative to the column's first row)
  u64 n;            // rows to gather
  u64 dst;          // values, bitmap words, offsets or views
  u64 dst_len;
  u64 dst_data;     // strings and views: fresh characters
  u64 dst_data_len;
  u64 starts;       // strings and views: each value's start in dst_data (scanned lengths)
  u64 lengths;      // strings and views: out, bytes of each value kept (0 for inline views)
  u64 unset;        // bitmaps: out, the count of 0 bits written
  u32 width;        // fixed width: bytes per value; strings: bytes per offset (4 or 8)
  u32 status;
};

// Fixed-width values, one thread per row.
extern "C" __global__ void gpq_gather_fixed(GatherDesc* d) {
  const GatherDesc g = *d;
  const u32* rows = (const u32*)g.rows;
  const u64 w = g.width;
  bool bad = false;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += (u64)gridDim.x * blockDim.x) {
    const u64 r = (u64)rows[i] + g.src_offset;
    if ((r + 1) * w > g.src_len || (i + 1) * w > g.dst_len) {
      bad = true;
      continue;
    }
    const u8* s = (const u8*)g.src + r * w;
    u8* t = (u8*)g.dst + i * w;
    switch (w) {
      case 1: *t = *s; break;
      case 2: *(u16*)t = *(const u16*)s; break;
      case 4: *(u32*)t = *(const u32*)s; break;
      case 8: *(u64*)t = *(const u64*)s; break;
      case 16: *(uint4*)t = *(const uint4*)s; break;
      default:
        for (u64 b = 0; b < w; b++) t[b] = s[b];
    }
  }
  if (bad) gpq_set_error(&d->status, GPQ_ERR_OUTPUT_OVERFLOW);
}

// Bits (LSB first), one warp per output word; counts the 0 bits written.
// Blocks are whole warps, so every lane of a warp runs the same trips.
extern "C" __global__ void gpq_gather_bits(GatherDesc* d) {
  const GatherDesc g = *d;
  const u32* rows = (const u32*)g.rows;
  const u8* src = (const u8*)g.src;
  u32* dst = (u32*)g.dst;
  const u32 lane = threadIdx.x & 31;
  const u64 words = (g.n + 31) / 32;
  const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  bool bad = false;
  u64 unset = 0;
  for (u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < words; w += warps) {
    const u64 i = w * 32 + lane;
    bool bit = false;
    if (i < g.n) {
      const u64 r = (u64)rows[i] + g.src_offset;
      if ((r >> 3) < g.src_len) {
        bit = gpq_bit(src, r);
      } else {
        bad = true;
      }
    }
    const u32 mask = __ballot_sync(0xffffffffu, bit);
    if (lane == 0) {
      if ((w + 1) * 4 <= g.dst_len) {
        dst[w] = mask;
      } else {
        bad = true;
      }
      const u64 valid_lanes = g.n - w * 32 >= 32 ? 32 : g.n - w * 32;
      unset += valid_lanes - (u64)__popc(mask);
    }
  }
  if (unset) atomicAdd((unsigned long long*)&d->unset, (unsigned long long)unset);
  if (bad) gpq_set_error(&d->status, GPQ_ERR_OUTPUT_OVERFLOW);
}

// A string column's value bounds at row r (offset applied), checked.
GPQ_DEVICE bool gpq_string_bounds(const GatherDesc& g, u64 r, u64* start, u64* len) {
  i64 a, b;
  if ((r + 2) * g.width > g.src_len) return false;
  if (g.width == 8) {
    a = ((const i64*)g.src)[r];
    b = ((const i64*)g.src)[r + 1];
  } else {
    a = ((const i32*)g.src)[r];
    b = ((const i32*)g.src)[r + 1];
  }
  if (a < 0 || b < a || (u64)b > g.src_data_len) return false;
  *start = (u64)a;
  *len = (u64)(b - a);
  return true;
}

// A view's length and, for a long value, its start in the view data.
GPQ_DEVICE bool gpq_view_bounds(const GatherDesc& g, u64 r, u64* start, u64* len) {
  if ((r + 1) * 16 > g.src_len) return false;
  const u32* v = (const u32*)((const u8*)g.src + r * 16);
  *len = v[0];
  *start = 0;
  if (*len <= 12) return true;
  *start = ((u64)v[2] << 30) + v[3];
  return *start <= g.src_data_len && *len <= g.src_data_len - *start;
}

// Bytes each kept value needs in the fresh characters (`width` 4 or 8:
// offsets; 16: views, whose inline values need none).
extern "C" __global__ void gpq_gather_lengths(GatherDesc* d) {
  const GatherDesc g = *d;
  const u32* rows = (const u32*)g.rows;
  u64* lengths = (u64*)g.lengths;
  bool bad = false;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += (u64)gridDim.x * blockDim.x) {
    const u64 r = (u64)rows[i] + g.src_offset;
    u64 start = 0, len = 0;
    const bool ok = g.width == 16 ? gpq_view_bounds(g, r, &start, &len) : gpq_string_bounds(g, r, &start, &len);
    if (!ok) {
      bad = true;
      len = 0;
    }
    lengths[i] = g.width == 16 && len <= 12 ? 0 : len;
  }
  if (bad) gpq_set_error(&d->status, GPQ_ERR_OUTPUT_OVERFLOW);
}

// Copies `len` bytes with the lanes of a warp.
GPQ_DEVICE void gpq_warp_copy(u8* t, const u8* s, u64 len, u32 lane) {
  for (u64 b = lane; b < len; b += 32) t[b] = s[b];
}

// Strings: offsets (`width` 4 or 8) and characters at the scanned starts;
// views: the views, long values' bytes packed at the scanned starts. One
// warp per value; the last value's end closes the offsets.
extern "C" __global__ void gpq_gather_strings(GatherDesc* d) {
  const GatherDesc g = *d;
  const u32* rows = (const u32*)g.rows;
  const u64* starts = (const u64*)g.starts;
  const u64* lengths = (const u64*)g.lengths;
  const u32 lane = threadIdx.x & 31;
  const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  bool bad = false;
  for (u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < g.n; i += warps) {
    const u64 r = (u64)rows[i] + g.src_offset;
    const u64 at = starts[i], n = lengths[i];
    u64 start = 0, len = 0;
    const bool ok = g.width == 16 ? gpq_view_bounds(g, r, &start, &len) : gpq_string_bounds(g, r, &start, &len);
    if (!ok || at > g.dst_data_len || n > g.dst_data_len - at || (g.width != 16 && n != len)) {
      bad = true;
      continue;
    }
    if (n > 0) gpq_warp_copy((u8*)g.dst_data + at, (const u8*)g.src_data + start, n, lane);
    if (lane != 0) continue;
    if (g.width == 16) {
      if ((i + 1) * 16 > g.dst_len) {
        bad = true;
        continue;
      }
      const u32* s = (const u32*)((const u8*)g.src + r * 16);
      u32* t = (u32*)((u8*)g.dst + i * 16);
      t[0] = s[0];
      t[1] = s[1];
      if (len <= 12) {
        t[2] = s[2];
        t[3] = s[3];
      } else {
        t[2] = (u32)(at >> 30);
        t[3] = (u32)(at & ((1ull << 30) - 1));
      }
      continue;
    }
    if ((i + 2) * g.width > g.dst_len) {
      bad = true;
      continue;
    }
    if (g.width == 8) {
      ((i64*)g.dst)[i] = (i64)at;
      if (i + 1 == g.n) ((i64*)g.dst)[i + 1] = (i64)(at + n);
    } else {
      ((i32*)g.dst)[i] = (i32)at;
      if (i + 1 == g.n) ((i32*)g.dst)[i + 1] = (i32)(at + n);
    }
  }
  if (bad) gpq_set_error(&d->status, GPQ_ERR_OUTPUT_OVERFLOW);
}
