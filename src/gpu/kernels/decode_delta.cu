// The DELTA encodings of flat columns, one block per page:
//   gpq_decode_delta         - DELTA_BINARY_PACKED INT32 and INT64 values,
//                              converted as gpq_decode_fixed converts them;
//   gpq_delta_string_sizes   - DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY
//                              pages: validity and each row's length, the
//                              source of its bytes in the page (for
//                              DELTA_BYTE_ARRAY the suffix) and its prefix
//                              length, plus the page's character total, as
//                              gpq_string_sizes does for PLAIN pages;
//   gpq_delta_byte_array_values - DELTA_BYTE_ARRAY pages after the offsets
//                              exist: each value is a prefix of the one before
//                              it and its suffix, so one warp walks the page's
//                              values in order (strings into their characters,
//                              FIXED_LEN_BYTE_ARRAY into the values, decimals
//                              converted).
// DELTA_LENGTH_BYTE_ARRAY pages need no pass of their own: their bytes lie
// in the page like PLAIN strings', and gpq_string_chars copies them.

// Shared state of a DELTA_BINARY_PACKED page (PageState without the
// dictionary decoder, plus the delta stream and one window of values).
struct DeltaPageState {
  HybridStream def;
  u32 warp_sums[GPQ_BLOCK / 32 + 1];
  u32 error;
  u32 nulls;
  DeltaStream delta;
  u64 scan[GPQ_BLOCK / 32 + 1];
  u64 vals[GPQ_BATCH];
};

extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_decode_delta(PageDesc* pages, const ColumnDesc* columns) {
  __shared__ DeltaPageState st;
  PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  // Barrier discipline (the emulator runs threads in order and shows none of
  // this): thread 0 sets up the page and keeps its error in a register; the
  // first barrier decides on that register alone (other threads must not read
  // st.* before thread 0's writes are behind a barrier), and publishes st.*.
  u32 setup_err = 0;
  if (threadIdx.x == 0) {
    st.nulls = 0;
    const u8* values;
    u32 values_len;
    const bool kind_ok = col.kind == GPQ_KIND_COPY || col.kind == GPQ_KIND_SEXT || col.kind == GPQ_KIND_MUL;
    if (pg.row_start + pg.num_values > col.num_rows) setup_err = GPQ_ERR_OUTPUT_OVERFLOW;
    else if (pg.encoding != ENC_DELTA_BINARY_PACKED || !kind_ok || (col.in_width != 4 && col.in_width != 8))
      setup_err = GPQ_ERR_UNSUPPORTED_ENCODING;
    else setup_err = levels_setup(pg, col, st.def, &values, &values_len);
    if (!setup_err) setup_err = delta_init(st.delta, values, values_len, col.in_width);
    st.error = setup_err;
  }
  u32 value_base = 0;
  // As in gpq_decode_fixed: the loop's exits are decided at barriers.
  bool more = !__syncthreads_or(setup_err != 0) && pg.num_values > 0;
  for (u32 lo = 0; more; lo += GPQ_BATCH) {
    u32 hi = min(lo + GPQ_BATCH, pg.num_values);
    bool valid[GPQ_PER_THREAD];
    u32 vi[GPQ_PER_THREAD];
    u32 nvals = decode_levels_batch(st, col, lo, hi, value_base, valid, vi);
    // Thread 0 extends the miniblock table; its error stays in a register
    // until the barrier (other threads read st.error for the barrier's
    // predicate, and the compiler may load it for them even at the `if`).
    u32 fill_err = 0;
    if (threadIdx.x == 0 && nvals > 0 && st.error == 0) fill_err = delta_fill(st.delta, value_base, (u64)value_base + nvals);
    if (stop_at_barrier(&st.error, fill_err)) break;
    delta_decode_window(st.delta, value_base, nvals, st.scan, st.vals, &st.error);
    for (u32 k = 0; k < GPQ_PER_THREAD; k++) {
      u32 r = lo + k * blockDim.x + threadIdx.x;
      if (r >= hi) continue;
      u8* dst = (u8*)col.values + (pg.row_start + r) * col.out_width;
      if (valid[k]) {
        u64 v = st.vals[vi[k] - value_base];
        store_value(col, (const u8*)&v, dst);
      } else {
        for (u32 i = 0; i < col.out_width; i++) dst[i] = 0;
      }
    }
    write_validity_batch(st, col, pg, lo, hi, valid);
    value_base += nvals;
    // Also orders this batch's reads of st.vals before the next window's writes.
    more = !__syncthreads_or(st.error != 0) && hi < pg.num_values;
  }
  finish_page(st, col, &pages[blockIdx.x]);
}

// Shared state of a DELTA_LENGTH_BYTE_ARRAY or DELTA_BYTE_ARRAY page.
struct DeltaStringState {
  HybridStream def;
  u32 warp_sums[GPQ_BLOCK / 32 + 1];
  u32 error;
  u32 nulls;
  DeltaStream lens;       // lengths (DELTA_LENGTH_BYTE_ARRAY) or suffix lengths (DELTA_BYTE_ARRAY)
  DeltaStream prefixes;   // DELTA_BYTE_ARRAY prefix lengths
  u64 scan[GPQ_BLOCK / 32 + 1];
  u32 values_start;       // page offset of the value streams
  u64 data_pos;           // page offset of the next value's bytes
  u64 data_end;           // page offset of the end of the bytes
  u64 prev_len;           // DELTA_BYTE_ARRAY: length of the value before the window
  unsigned long long total;
  u32 pre[GPQ_BATCH];     // per value of the window: prefix length
  u32 len[GPQ_BATCH];     //   stored length (the suffix's, for DELTA_BYTE_ARRAY)
  u32 src[GPQ_BATCH];     //   page offset of the stored bytes
};

// Thread 0: reads the length streams' headers and finds where the bytes start.
GPQ_DEVICE u32 delta_strings_setup(DeltaStringState& st, const PageDesc& pg, const ColumnDesc& col) {
  const u8* values;
  u32 values_len;
  u32 err = levels_setup(pg, col, st.def, &values, &values_len);
  if (err) return err;
  st.values_start = (u32)(values - (const u8*)pg.data);
  const bool dba = pg.encoding == ENC_DELTA_BYTE_ARRAY;
  u64 at = 0;
  if (dba) {
    if ((err = delta_init(st.prefixes, values, values_len, 4))) return err;
    // A page holds no more values than levels.
    if (st.prefixes.count > pg.num_values) return GPQ_ERR_BAD_DELTA_LENGTH;
    if ((err = delta_stream_end(st.prefixes, &at))) return err;
  }
  if ((err = delta_init(st.lens, values + at, values_len - at, 4))) return err;
  if (st.lens.count > pg.num_values) return GPQ_ERR_BAD_DELTA_LENGTH;
  if (dba && st.lens.count != st.prefixes.count) return GPQ_ERR_BAD_DELTA_LENGTH;
  u64 end = 0;
  if ((err = delta_stream_end(st.lens, &end))) return err;
  st.data_pos = st.values_start + at + end;
  st.data_end = (u64)st.values_start + values_len;
  st.prev_len = 0;
  return 0;
}

extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_delta_string_sizes(PageDesc* pages, const ColumnDesc* columns,
                                                                                unsigned long long* page_chars) {
  __shared__ DeltaStringState st;
  PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  const bool dba = pg.encoding == ENC_DELTA_BYTE_ARRAY;
  if (!dba && pg.encoding != ENC_DELTA_LENGTH_BYTE_ARRAY) return;   // gpq_string_sizes' page (the whole block returns)
  // Byte arrays for strings and decimals; DELTA_BYTE_ARRAY also for FIXED_LEN_BYTE_ARRAY.
  const bool byte_array = col.kind == GPQ_KIND_STRING || col.kind == GPQ_KIND_BYTES_DECIMAL;
  const bool flba = (col.kind == GPQ_KIND_COPY || col.kind == GPQ_KIND_BE_DECIMAL) && col.in_width > 0;
  // As in gpq_decode_delta: thread 0's setup error stays in a register until
  // the first barrier, which alone publishes st.* to the other threads.
  u32 setup_err = 0;
  if (threadIdx.x == 0) {
    st.nulls = 0;
    st.total = 0;
    if (pg.row_start + pg.num_values > col.num_rows) setup_err = GPQ_ERR_OUTPUT_OVERFLOW;
    else if (!(byte_array || (dba && flba)) || (dba && !col.scratch_pre)) setup_err = GPQ_ERR_UNSUPPORTED_ENCODING;
    else setup_err = delta_strings_setup(st, pg, col);
    st.error = setup_err;
  }
  u32* out_len = (u32*)col.scratch_len;
  u32* out_src = (u32*)col.scratch_src;
  u32* out_pre = (u32*)col.scratch_pre;
  u32 value_base = 0;
  // Every exit is decided at a barrier; `failed` (the same in every thread)
  // says whether one was an error.
  bool failed = __syncthreads_or(setup_err != 0);
  bool more = !failed && pg.num_values > 0;
  for (u32 lo = 0; more; lo += GPQ_BATCH) {
    u32 hi = min(lo + GPQ_BATCH, pg.num_values);
    bool valid[GPQ_PER_THREAD];
    u32 vi[GPQ_PER_THREAD];
    u32 nvals = decode_levels_batch(st, col, lo, hi, value_base, valid, vi);
    // Thread 0's error stays in a register until the barrier (others read
    // st.error for the predicate, and the compiler may load it for them at the `if`).
    u32 fill_err = 0;
    if (threadIdx.x == 0 && nvals > 0 && st.error == 0) {
      fill_err = delta_fill(st.lens, value_base, (u64)value_base + nvals);
      if (!fill_err && dba) fill_err = delta_fill(st.prefixes, value_base, (u64)value_base + nvals);
      // More values than the length streams hold.
      if (fill_err == GPQ_ERR_TOO_FEW_VALUES) fill_err = GPQ_ERR_BAD_DELTA_LENGTH;
    }
    if (stop_at_barrier(&st.error, fill_err)) {
      failed = true;
      break;
    }
    delta_decode_window(st.lens, value_base, nvals, st.scan, st.len, &st.error);
    if (dba) delta_decode_window(st.prefixes, value_base, nvals, st.scan, st.pre, &st.error);
    // Stored bytes follow one another: each value's source by a prefix sum of
    // the lengths (thread t owns values t*P .. t*P+P-1, as in the window decode).
    u64 local = 0;
    u32 bad = 0;
    for (u32 q = 0; q < GPQ_PER_THREAD; q++) {
      u32 i = threadIdx.x * GPQ_PER_THREAD + q;
      if (i < nvals) {
        if ((i32)st.len[i] < 0 || (dba && (i32)st.pre[i] < 0)) bad = GPQ_ERR_BAD_DELTA_LENGTH;
        else local += st.len[i];
      }
    }
    // Read before the scan's barriers; thread 0 moves it on only after the next barrier.
    const u64 base = st.data_pos;
    const u64 prev_len = st.prev_len;
    u64 incl = delta_block_scan(local, st.scan);
    u64 at = base + incl - local;
    for (u32 q = 0; q < GPQ_PER_THREAD && !bad; q++) {
      u32 i = threadIdx.x * GPQ_PER_THREAD + q;
      if (i >= nvals) break;
      if (st.len[i] > st.data_end || at > st.data_end - st.len[i]) { bad = GPQ_ERR_TRUNCATED_PAGE; break; }
      st.src[i] = (u32)at;
      at += st.len[i];
      if (dba) {
        // A prefix of the value before (the first value of a page has none).
        u64 prev = i == 0 ? prev_len : (u64)st.pre[i - 1] + st.len[i - 1];
        u64 full = (u64)st.pre[i] + st.len[i];
        if (st.pre[i] > prev || full > 0xffffffffull || (flba && full != col.in_width)) bad = GPQ_ERR_BAD_DELTA_LENGTH;
      }
    }
    // The windows' atomicCAS on st.error lie behind the scans' barriers; each
    // thread's own error is published only after this barrier.
    if (stop_at_barrier(&st.error, bad)) {
      failed = true;
      break;
    }
    // st.data_pos and st.prev_len are read again only after the loop's last barrier.
    if (threadIdx.x == 0 && nvals > 0) {
      st.data_pos = st.src[nvals - 1] + (u64)st.len[nvals - 1];
      if (dba) st.prev_len = (u64)st.pre[nvals - 1] + st.len[nvals - 1];
    }
    unsigned long long mine = 0;
    for (u32 k = 0; k < GPQ_PER_THREAD; k++) {
      u32 r = lo + k * blockDim.x + threadIdx.x;
      if (r >= hi) continue;
      u64 row = pg.row_start + r;
      u32 len = 0, src = 0, pre = 0;
      if (valid[k]) {
        u32 j = vi[k] - value_base;
        pre = dba ? st.pre[j] : 0;
        len = pre + st.len[j];
        src = st.src[j];
      }
      out_len[row] = len;
      out_src[row] = src;
      if (dba) out_pre[row] = pre;
      mine += len;
    }
    // One add per warp, as in gpq_string_sizes.
    for (u32 d = 16; d > 0; d >>= 1) mine += __shfl_down_sync(0xffffffffu, mine, d);
    if ((threadIdx.x & 31) == 0 && mine) atomicAdd(&st.total, mine);
    write_validity_batch(st, col, pg, lo, hi, valid);
    value_base += nvals;
    // Also orders this batch's reads of st.len/pre/src/data_pos before the next batch's writes.
    failed = __syncthreads_or(st.error != 0);
    more = !failed && hi < pg.num_values;
  }
  // The length streams hold exactly the page's values (arrow-rs decodes them
  // all). st.error is 0 here unless `failed`; nobody else reads it before
  // finish_page's barrier, so thread 0 may write it (the condition reads no st.error).
  if (!failed && threadIdx.x == 0 && st.lens.count != value_base) st.error = GPQ_ERR_BAD_DELTA_LENGTH;
  finish_page(st, col, &pages[blockIdx.x]);
  if (threadIdx.x == 0) page_chars[blockIdx.x] = st.total;
}

// Whether row `row` holds a value.
GPQ_DEVICE bool row_valid(const ColumnDesc& col, u64 row) {
  if (!col.validity) return true;
  return (((const u32*)col.validity)[row >> 5] >> (row & 31)) & 1;
}

// One warp per DELTA_BYTE_ARRAY page (launched with 32 threads): value k is
// the first prefix[k] bytes of value k-1 followed by its suffix, so values go
// in order; the lanes copy neighbouring bytes of each. Strings and
// FIXED_LEN_BYTE_ARRAY copies are written where they belong and the next
// value's prefix is read back from there; decimals (at most 32 bytes) are
// built in shared memory and converted.
extern "C" __global__ void __launch_bounds__(32) gpq_delta_byte_array_values(PageDesc* pages, const ColumnDesc* columns) {
  __shared__ u8 cur[32];
  __shared__ u8 prev[32];
  const PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  if (pg.status || pg.encoding != ENC_DELTA_BYTE_ARRAY || threadIdx.x >= 32) return;
  const u32 lane = threadIdx.x;
  const u32* in_len = (const u32*)col.scratch_len;
  const u32* in_src = (const u32*)col.scratch_src;
  const u32* in_pre = (const u32*)col.scratch_pre;
  const bool strings = col.kind == GPQ_KIND_STRING;
  const bool copy = col.kind == GPQ_KIND_COPY;
  const bool decimal = col.kind == GPQ_KIND_BE_DECIMAL || col.kind == GPQ_KIND_BYTES_DECIMAL;
  if (!strings && !copy && !decimal) return;
  u8* chars = (u8*)col.chars;
  const u8* last = nullptr;   // strings and copies: the previous value's bytes
  u32 error = 0;
  for (u32 r = 0; r < pg.num_values && !error; r++) {
    const u64 row = pg.row_start + r;
    u8* out = copy || decimal ? (u8*)col.values + row * col.out_width : nullptr;
    if (!row_valid(col, row)) {
      if (out) for (u32 b = lane; b < col.out_width; b += 32) out[b] = 0;
      continue;
    }
    const u32 len = in_len[row], pre = in_pre[row];
    const u8* src = (const u8*)pg.data + in_src[row];
    u8* dst;
    const u8* from;
    if (strings) {
      u64 start = col.large_offsets ? (u64)((const i64*)col.offsets)[row] : (u64)(u32)((const i32*)col.offsets)[row];
      dst = chars + start;
      from = last;
    } else if (copy) {
      dst = out;
      from = last;
    } else {
      if (len > 32 || (col.kind == GPQ_KIND_BYTES_DECIMAL && len > col.out_width)) { error = GPQ_ERR_DECIMAL_TOO_WIDE; break; }
      dst = cur;
      from = prev;
    }
    // The sizes pass checked pre <= the previous value's length (0 before the first).
    if (pre > 0 && from == nullptr) { error = GPQ_ERR_BAD_DELTA_LENGTH; break; }
    for (u32 b = lane; b < pre; b += 32) dst[b] = from[b];
    for (u32 b = lane; b < len - pre; b += 32) dst[pre + b] = src[b];
    __syncwarp();
    if (decimal) {
      u8 fill = (len > 0 && (cur[0] & 0x80)) ? 0xff : 0;
      for (u32 b = lane; b < col.out_width; b += 32) out[b] = b < len ? cur[len - 1 - b] : fill;
      if (lane < len) prev[lane] = cur[lane];
      __syncwarp();
    } else {
      last = dst;
    }
  }
  if (error && lane == 0) atomicCAS(&pages[blockIdx.x].status, 0u, error);
}
