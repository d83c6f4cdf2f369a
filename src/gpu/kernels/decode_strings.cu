// BYTE_ARRAY columns (strings, binary, byte-array decimals), in three steps:
//   gpq_dict_index   - one thread walks each dictionary page, recording every
//                      entry's (offset, length);
//   gpq_string_sizes - per page, validity and each row's length and source
//                      (PLAIN: offset in the page, found by a sequential walk;
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

extern "C" __global__ void gpq_dict_index(DictDesc* dicts, u32 num_dicts) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= num_dicts) return;
  DictDesc d = dicts[i];
  const u8* p = (const u8*)d.data;
  u32* out = (u32*)d.entries;
  u64 pos = 0;
  for (u32 e = 0; e < d.count; e++) {
    if (pos + 4 > d.size) { dicts[i].status = GPQ_ERR_TRUNCATED_PAGE; return; }
    u32 len = (u32)p[pos] | ((u32)p[pos + 1] << 8) | ((u32)p[pos + 2] << 16) | ((u32)p[pos + 3] << 24);
    pos += 4;
    if (len > d.size - pos) { dicts[i].status = GPQ_ERR_TRUNCATED_PAGE; return; }
    out[2 * e] = (u32)pos;
    out[2 * e + 1] = len;
    pos += len;
  }
}

struct StringPageState {
  PageState base;
  u32 plain_pos;                 // byte offset of the next PLAIN value in the value stream
  u32 src[GPQ_BATCH];            // per value of the batch: offset from the page start
  u32 len[GPQ_BATCH];
  unsigned long long total;
};

extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_string_sizes(PageDesc* pages, const ColumnDesc* columns,
                                                                          unsigned long long* page_chars) {
  __shared__ StringPageState ss;
  PageState& st = ss.base;
  PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  // DELTA pages are gpq_delta_string_sizes' (the whole block returns).
  if (pg.encoding == ENC_DELTA_LENGTH_BYTE_ARRAY || pg.encoding == ENC_DELTA_BYTE_ARRAY) return;
  start_page(st, pg, col);
  if (threadIdx.x == 0) { ss.plain_pos = 0; ss.total = 0; }
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
    if (threadIdx.x == 0 && st.error == 0 && nvals > 0) {
      if (st.streams.dictionary) {
        hybrid_fill(st.idx, value_base, value_base + nvals);
        fill_err = st.idx.error;
      } else {
        // The PLAIN walk: each value is a u32 length and its bytes.
        u32 pos = ss.plain_pos;
        const u8* v = st.streams.values;
        const u32 n = st.streams.values_len;
        for (u32 j = 0; j < nvals; j++) {
          if (n < 4 || pos > n - 4) { fill_err = GPQ_ERR_TRUNCATED_PAGE; break; }
          u32 len = (u32)v[pos] | ((u32)v[pos + 1] << 8) | ((u32)v[pos + 2] << 16) | ((u32)v[pos + 3] << 24);
          pos += 4;
          if (len > n - pos) { fill_err = GPQ_ERR_TRUNCATED_PAGE; break; }
          ss.src[j] = values_start + pos;
          ss.len[j] = len;
          pos += len;
        }
        ss.plain_pos = pos;
      }
    }
    if (stop_at_barrier(&st.error, fill_err)) break;
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
