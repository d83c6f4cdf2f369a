// BYTE_ARRAY columns (strings, binary, byte-array decimals), in three steps:
//   gpq_dict_index   - a block walks each dictionary page, recording every
//                      entry's (offset, length);
//   gpq_string_sizes - per page, validity and each row's length and source
//                      (PLAIN: offset in the page, found by a block-wide walk;
//                      dictionary: the entry), plus the page's character total;
//   gpq_string_chars - per page, offsets by block-wide prefix sums from the
//                      page's first character (the host sums page totals), and
//                      the characters themselves.
// Byte-array decimals take gpq_bytes_decimal instead of gpq_string_chars.

// Mirrors decode/descriptors.rs (DictDesc, 32 bytes).
struct DictDesc {
  u64 data;       // dictionary page bytes
  u64 entries;    // out: (u32 offset, u32 length) per entry
  u32 size;       // page bytes
  u32 count;      // entries the header announces
  u32 status;
  u32 pad;
};

// The PLAIN walk. Each value is a u32 length and its bytes, so where a value
// starts is known only once the one before it has been read: a chain. Walked
// by one thread, short strings (TPC-H's flags: 5 bytes a value) leave the
// block idle for most of the page. The block instead takes a window of
// WALK_WINDOW bytes at a time and treats every byte as a candidate start:
// jump[0][c] is where the value starting at c would end (the next start),
// jump[k] the 2^k-th next start, built by pointer doubling; thread r then
// finds the r-th value of the window in WALK_LEVELS lookups. Values longer
// than WALK_SERIAL_BYTES on average make windows of few values, and those
// batches are walked by thread 0 as before.
#define WALK_WINDOW 1024
#define WALK_LEVELS 7                     // at most 2^7 values per window
#define WALK_SERIAL_BYTES 256
#define WALK_OUT WALK_WINDOW              // the next start lies past the window
#define WALK_BAD (WALK_WINDOW + 1)        // no value can start here: it would run past the stream

// Scratch of the block-wide walk (17 KB of shared memory).
struct PlainWalk {
  u16 jump[WALK_LEVELS][WALK_WINDOW];
  u8 bytes[WALK_WINDOW + 4];              // the window, zero past the stream's end
};
static_assert((1u << WALK_LEVELS) <= GPQ_BLOCK, "one thread per value of a window");

GPQ_DEVICE u32 le32_at(const u8* b) { return (u32)b[0] | ((u32)b[1] << 8) | ((u32)b[2] << 16) | ((u32)b[3] << 24); }

// Finds the next `count` PLAIN values from byte *cursor (shared memory) of
// the stream v[0, n) and records value j's start (`base` + offset) and
// length at src[j * stride] and len[j * stride]; advances *cursor. All
// threads call it with the same arguments and get the same result: 0, or
// GPQ_ERR_TRUNCATED_PAGE where a value runs past the stream (as a
// sequential walk reports).
GPQ_DEVICE u32 plain_walk_block(PlainWalk& w, u32* cursor, const u8* v, u32 n, u32 base, u32 count, u32* src,
                                u32* len, u32 stride) {
  u32 found = 0;
  while (found < count) {
    const u32 pos = *cursor;   // moved before the last barrier
    for (u32 i = threadIdx.x; i < WALK_WINDOW + 4; i += blockDim.x) {
      u64 a = (u64)pos + i;
      w.bytes[i] = a < n ? v[a] : 0;
    }
    __syncthreads();
    for (u32 c = threadIdx.x; c < WALK_WINDOW; c += blockDim.x) {
      u64 a = (u64)pos + c;
      u16 j = WALK_BAD;
      if (a + 4 <= n) {
        u64 next = a + 4 + le32_at(&w.bytes[c]);
        if (next <= n) j = next - pos < WALK_WINDOW ? (u16)(next - pos) : (u16)WALK_OUT;
      }
      w.jump[0][c] = j;
    }
    __syncthreads();
    for (u32 k = 1; k < WALK_LEVELS; k++) {
      for (u32 c = threadIdx.x; c < WALK_WINDOW; c += blockDim.x) {
        u16 j = w.jump[k - 1][c];
        w.jump[k][c] = j < WALK_WINDOW ? w.jump[k - 1][j] : j;
      }
      __syncthreads();
    }
    // Value r of the window (the first, r = 0, starts at the window's start).
    const u32 r = threadIdx.x;
    u32 node = 0;
    for (u32 k = 0; k < WALK_LEVELS; k++) {
      if (((r >> k) & 1) && node < WALK_WINDOW) node = w.jump[k][node];
    }
    const bool member = r < (1u << WALK_LEVELS) && node < WALK_WINDOW;
    const u32 members = __syncthreads_count(member);   // values 0 .. members - 1; at least 1
    const u32 take = min(members, count - found);
    bool bad = false;
    if (r < take) {
      if (w.jump[0][node] == WALK_BAD) {
        bad = true;
      } else {
        u32 length = le32_at(&w.bytes[node]);
        src[(u64)(found + r) * stride] = base + pos + node + 4;
        len[(u64)(found + r) * stride] = length;
        if (r == take - 1) *cursor = pos + node + 4 + length;
      }
    }
    if (__syncthreads_or(bad)) return GPQ_ERR_TRUNCATED_PAGE;
    found += take;
  }
  return 0;
}

// One block per dictionary page.
extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_dict_index(DictDesc* dicts, u32 num_dicts) {
  __shared__ PlainWalk w;
  __shared__ u32 cursor;
  if (blockIdx.x >= num_dicts) return;
  const DictDesc d = dicts[blockIdx.x];
  if (threadIdx.x == 0) cursor = 0;
  __syncthreads();
  u32* out = (u32*)d.entries;
  u32 err = plain_walk_block(w, &cursor, (const u8*)d.data, d.size, 0, d.count, out, out + 1, 2);
  if (threadIdx.x == 0 && err) dicts[blockIdx.x].status = err;
}

struct StringPageState {
  PageState base;
  u32 plain_pos;                 // byte offset of the next PLAIN value in the value stream
  u32 long_values;               // the last batch's PLAIN values averaged over WALK_SERIAL_BYTES bytes
  u32 src[GPQ_BATCH];            // per value of the batch: offset from the page start
  u32 len[GPQ_BATCH];
  unsigned long long total;
};
static_assert(sizeof(PlainWalk) <= sizeof(HybridRun) * (GPQ_BATCH + 1), "PlainWalk must fit in HybridStream::runs");


extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_string_sizes(PageDesc* pages, const ColumnDesc* columns,
                                                                          unsigned long long* page_chars) {
  __shared__ StringPageState ss;
  PageState& st = ss.base;
  PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  // DELTA pages are gpq_delta_string_sizes' (the whole block returns).
  if (pg.encoding == ENC_DELTA_LENGTH_BYTE_ARRAY || pg.encoding == ENC_DELTA_BYTE_ARRAY) return;
  start_page(st, pg, col);
  if (threadIdx.x == 0) { ss.plain_pos = 0; ss.long_values = 0; ss.total = 0; }
  __syncthreads();
  const u32 values_start = (u32)(st.streams.values - (const u8*)pg.data);
  const u32* entries = (const u32*)pg.dict;
  u32* out_len = (u32*)col.scratch_len;
  u32* out_src = (u32*)col.scratch_src;
  u32 value_base = 0;
  // As in gpq_decode_fixed: the loop's exits are decided at barriers.
  bool more = !__syncthreads_or(st.error != 0) && pg.num_values > 0;
  for (u32 lo = 0; more; lo += GPQ_BATCH) {
    u32 hi = min(lo + GPQ_BATCH, pg.num_values);
    bool valid[GPQ_PER_THREAD];
    u32 vi[GPQ_PER_THREAD];
    u32 nvals = decode_levels_batch(st, col, lo, hi, value_base, valid, vi);
    // Thread 0's error stays in a register until the barrier: the others read
    // st.error for the barrier's predicate (and the compiler may load it for
    // them at the `if`), so no plain write to it may precede the barrier.
    u32 fill_err = 0;
    // nvals, the stream kind and ss.long_values (which thread 0 sets only
    // after the next barrier) are the same in every thread.
    const bool block_walk = !st.streams.dictionary && nvals > 0 && !ss.long_values;
    bool long_values = false;   // thread 0's verdict on this batch, stored after the barrier
    if (block_walk) {
      // No thread writes the cursor before the walk's first barrier.
      const u32 from = ss.plain_pos;
      // The walk's scratch lives on the dictionary-index runs, unused on PLAIN pages.
      PlainWalk& w = *reinterpret_cast<PlainWalk*>(st.idx.runs);
      fill_err = plain_walk_block(w, &ss.plain_pos, st.streams.values, st.streams.values_len, values_start, nvals,
                                  ss.src, ss.len, 1);
      // The walk's last write to the cursor precedes its last barrier.
      if (threadIdx.x == 0) long_values = ss.plain_pos - from > WALK_SERIAL_BYTES * nvals;
    } else if (threadIdx.x == 0 && st.error == 0 && nvals > 0) {
      if (st.streams.dictionary) {
        hybrid_fill(st.idx, value_base, value_base + nvals);
        fill_err = st.idx.error;
      } else {
        // The sequential PLAIN walk, for long values.
        u32 pos = ss.plain_pos;
        const u8* v = st.streams.values;
        const u32 n = st.streams.values_len;
        for (u32 j = 0; j < nvals; j++) {
          if (n < 4 || pos > n - 4) { fill_err = GPQ_ERR_TRUNCATED_PAGE; break; }
          u32 len = le32_at(v + pos);
          pos += 4;
          if (len > n - pos) { fill_err = GPQ_ERR_TRUNCATED_PAGE; break; }
          ss.src[j] = values_start + pos;
          ss.len[j] = len;
          pos += len;
        }
        long_values = pos - ss.plain_pos > WALK_SERIAL_BYTES * nvals;
        ss.plain_pos = pos;
      }
    }
    if (stop_at_barrier(&st.error, fill_err)) break;
    if (threadIdx.x == 0 && !st.streams.dictionary && nvals > 0) ss.long_values = long_values;
    unsigned long long mine = 0;
    for (u32 k = 0; k < GPQ_PER_THREAD; k++) {
      u32 r = lo + k * blockDim.x + threadIdx.x;
      if (r >= hi) continue;
      u64 row = pg.row_start + r;
      u32 len = 0, src = 0;
      if (valid[k]) {
        if (st.streams.dictionary) {
          u32 e = hybrid_get(st.idx, vi[k]);
          if (e < pg.dict_count) { len = entries[2 * e + 1]; src = e; }
          else atomicCAS(&st.error, 0u, (u32)GPQ_ERR_DICTIONARY_INDEX);
        } else {
          u32 j = vi[k] - value_base;
          len = ss.len[j];
          src = ss.src[j];
        }
      }
      out_len[row] = len;
      out_src[row] = src;
      mine += len;
    }
    if (mine) atomicAdd(&ss.total, mine);
    write_validity_batch(st, col, pg, lo, hi, valid);
    value_base += nvals;
    more = !__syncthreads_or(st.error != 0) && hi < pg.num_values;
  }
  finish_page(st, col, &pages[blockIdx.x]);
  if (threadIdx.x == 0) page_chars[blockIdx.x] = ss.total;
}

// Exclusive prefix sum of `v` over the block; *total receives the block's sum.
GPQ_DEVICE unsigned long long block_prefix_sum(unsigned long long v, unsigned long long* warp_sums,
                                               unsigned long long* total) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) / 32;
  unsigned long long x = v;
  for (u32 d = 1; d < 32; d <<= 1) {
    unsigned long long y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long acc = 0;
    for (u32 w = 0; w < nwarps; w++) { unsigned long long c = warp_sums[w]; warp_sums[w] = acc; acc += c; }
    warp_sums[nwarps] = acc;
  }
  __syncthreads();
  unsigned long long r = warp_sums[warp] + x - v;
  *total = warp_sums[nwarps];
  __syncthreads();
  return r;
}

extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_string_chars(PageDesc* pages, const ColumnDesc* columns) {
  __shared__ unsigned long long warp_sums[GPQ_BLOCK / 32 + 1];
  __shared__ unsigned long long s_start[GPQ_BLOCK];
  __shared__ const u8* s_src[GPQ_BLOCK];
  __shared__ u32 s_len[GPQ_BLOCK];
  const PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  if (pg.status || col.kind != GPQ_KIND_STRING) return;
  const u32* in_len = (const u32*)col.scratch_len;
  const u32* in_src = (const u32*)col.scratch_src;
  const u32* entries = (const u32*)pg.dict;
  const bool dict = pg.encoding == ENC_PLAIN_DICTIONARY || pg.encoding == ENC_RLE_DICTIONARY;
  // DELTA_BYTE_ARRAY values are built by gpq_delta_byte_array_values; only their offsets are written here.
  const bool dba = pg.encoding == ENC_DELTA_BYTE_ARRAY;
  u8* chars = (u8*)col.chars;
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  unsigned long long running = pg.char_base;
  if (pg.row_start == 0 && threadIdx.x == 0) {
    if (col.large_offsets) ((i64*)col.offsets)[0] = 0;
    else ((i32*)col.offsets)[0] = 0;
  }
  for (u32 lo = 0; lo < pg.num_values; lo += blockDim.x) {
    u32 r = lo + threadIdx.x;
    u64 row = pg.row_start + r;
    u32 len = r < pg.num_values ? in_len[row] : 0;
    unsigned long long total;
    unsigned long long start = running + block_prefix_sum(len, warp_sums, &total);
    if (r < pg.num_values) {
      unsigned long long end = start + len;
      if (col.large_offsets) ((i64*)col.offsets)[row + 1] = (i64)end;
      else ((i32*)col.offsets)[row + 1] = (i32)end;
    }
    s_start[threadIdx.x] = start;
    s_len[threadIdx.x] = dba ? 0 : len;
    s_src[threadIdx.x] = len == 0 || dba ? nullptr
                       : dict ? (const u8*)pg.dict_data + entries[2 * in_src[row]] : (const u8*)pg.data + in_src[row];
    __syncthreads();
    // One warp per string: the lanes copy neighbouring bytes, so loads and
    // stores coalesce instead of 32 lanes touching 32 cache lines each.
    u32 n = min((u32)blockDim.x, pg.num_values - lo);
    for (u32 i = warp; i < n; i += nwarps) {
      u32 l = s_len[i];
      const u8* src = s_src[i];
      u8* dst = chars + s_start[i];
      for (u32 b = lane; b < l; b += 32) dst[b] = src[b];
    }
    running += total;
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_bytes_decimal(PageDesc* pages, const ColumnDesc* columns) {
  const PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  // DELTA_BYTE_ARRAY decimals are gpq_delta_byte_array_values'.
  if (pg.status || col.kind != GPQ_KIND_BYTES_DECIMAL || pg.encoding == ENC_DELTA_BYTE_ARRAY) return;
  const u32* in_len = (const u32*)col.scratch_len;
  const u32* in_src = (const u32*)col.scratch_src;
  const u32* entries = (const u32*)pg.dict;
  const bool dict = pg.encoding == ENC_PLAIN_DICTIONARY || pg.encoding == ENC_RLE_DICTIONARY;
  for (u32 r = threadIdx.x; r < pg.num_values; r += blockDim.x) {
    u64 row = pg.row_start + r;
    u32 len = in_len[row];
    u8* dst = (u8*)col.values + row * col.out_width;
    if (len > col.out_width) {
      atomicCAS(&pages[blockIdx.x].status, 0u, (u32)GPQ_ERR_DECIMAL_TOO_WIDE);
      len = 0;
    }
    const u8* src = len == 0 ? nullptr
                   : dict ? (const u8*)pg.dict_data + entries[2 * in_src[row]] : (const u8*)pg.data + in_src[row];
    u8 fill = (len > 0 && (src[0] & 0x80)) ? 0xff : 0;
    for (u32 i = 0; i < col.out_width; i++) dst[i] = i < len ? src[len - 1 - i] : fill;
  }
}
