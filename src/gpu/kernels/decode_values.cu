// Fixed-width values (and BOOLEAN) of flat columns: one block per page,
// batches of GPQ_BATCH rows. Definition levels give validity and value
// indices; values come from the PLAIN or BYTE_STREAM_SPLIT stream or through
// the dictionary, are
// converted to the output type, and written at their rows. Null rows get zeros.

GPQ_DEVICE void store_value(const ColumnDesc& col, const u8* src, u8* dst) {
  const u32 in = col.in_width, out = col.out_width;
  switch (col.kind) {
    case GPQ_KIND_COPY:
      // Aligned 8- and 4-byte copies are the common case (decompressed pages are aligned).
      if (out == 8 && !(((u64)src | (u64)dst) & 7)) *(u64*)dst = *(const u64*)src;
      else if (out == 4 && !(((u64)src | (u64)dst) & 3)) *(u32*)dst = *(const u32*)src;
      else for (u32 i = 0; i < out; i++) dst[i] = src[i];
      break;
    case GPQ_KIND_SEXT: {
      // Aligned fast paths for the common decimal widenings.
      if (in == 8 && out == 16 && !(((u64)src | (u64)dst) & 7)) {
        i64 v = *(const i64*)src;
        ((i64*)dst)[0] = v;
        ((i64*)dst)[1] = v >> 63;
      } else if (in == 4 && (out == 8 || out == 16) && !((u64)src & 3) && !((u64)dst & 7)) {
        i64 v = *(const i32*)src;
        ((i64*)dst)[0] = v;
        if (out == 16) ((i64*)dst)[1] = v >> 63;
      } else {
        u8 fill = (src[in - 1] & 0x80) ? 0xff : 0;
        for (u32 i = 0; i < out; i++) dst[i] = i < in ? src[i] : fill;
      }
      break;
    }
    case GPQ_KIND_MUL: {
      i32 v = (i32)((u32)src[0] | ((u32)src[1] << 8) | ((u32)src[2] << 16) | ((u32)src[3] << 24));
      i64 r = (i64)v * col.mul;
      for (u32 i = 0; i < 8; i++) dst[i] = (u8)((u64)r >> (8 * i));
      break;
    }
    case GPQ_KIND_BE_DECIMAL: {
      u8 fill = (in > 0 && (src[0] & 0x80)) ? 0xff : 0;
      for (u32 i = 0; i < out; i++) dst[i] = i < in ? src[in - 1 - i] : fill;
      break;
    }
    case GPQ_KIND_INT96: {
      // arrow-rs's Int96::to_{seconds,millis,micros,nanos}, bit for bit: the
      // Julian day is a signed i32, the nanoseconds a signed i64 (divided
      // with truncation toward zero), and day * unit-per-day + nanos / div
      // wraps modulo 2^64. The wrapping arithmetic is done on u64 (signed
      // overflow is undefined in C++); col.div is 1, 1e3, 1e6 or 1e9.
      u64 nanos = 0;
      for (u32 i = 0; i < 8; i++) nanos |= (u64)src[i] << (8 * i);
      u32 julian = (u32)src[8] | ((u32)src[9] << 8) | ((u32)src[10] << 16) | ((u32)src[11] << 24);
      i64 days = (i64)(i32)julian - 2440588;
      u64 per_day = (u64)86400 * (u64)col.mul;
      i64 div = col.div > 0 ? col.div : 1;
      u64 r = (u64)days * per_day + (u64)((i64)nanos / div);
      for (u32 i = 0; i < 8; i++) dst[i] = (u8)(r >> (8 * i));
      break;
    }
    case GPQ_KIND_INTERVAL_DAY_TIME:
      // Parquet's INTERVAL is three little-endian u32: months, days,
      // milliseconds. arrow-rs's day-time reading keeps the last two.
      for (u32 i = 0; i < 8; i++) dst[i] = src[4 + i];
      break;
    default:
      break;
  }
}

// Writes the `out` bytes of a little-endian value whose low 8 bytes are `lo`
// and whose higher bytes all equal the bytes of `hi` (zero or a sign fill),
// in whole words where `dst` is aligned for them.
GPQ_DEVICE void store_words(u8* dst, u32 out, u64 lo, u64 hi) {
  if (out == 8 && !((u64)dst & 7)) { *(u64*)dst = lo; return; }
  if (out == 4 && !((u64)dst & 3)) { *(u32*)dst = (u32)lo; return; }
  if (out == 16 && !((u64)dst & 7)) { ((u64*)dst)[0] = lo; ((u64*)dst)[1] = hi; return; }
  for (u32 k = 0; k < out; k++) dst[k] = (u8)(k < 8 ? lo >> (8 * k) : hi >> (8 * (k & 7)));
}

// BYTE_STREAM_SPLIT: byte b of value i is byte i of stream b (streams of
// `stride` bytes each). Neighbouring threads read neighbouring bytes of each
// stream. page_setup admits only fixed-width kinds, and conversions only for
// values of at most 32 bytes.
GPQ_DEVICE void store_split_value(const ColumnDesc& col, const u8* streams, u32 stride, u32 i, u8* dst) {
  const u32 in = col.in_width;
  if (in <= 8 && (col.kind == GPQ_KIND_COPY || col.kind == GPQ_KIND_SEXT)) {
    // Values of up to 8 bytes are gathered in a register and stored in whole
    // words (a byte array here would live in local memory).
    u64 w = 0;
    for (u32 b = 0; b < in; b++) w |= (u64)streams[(u64)b * stride + i] << (8 * b);
    u64 hi = 0;
    if (col.kind == GPQ_KIND_SEXT) {
      const u32 drop = 64 - 8 * in;   // in >= 1: a kind with in_width 0 never gets here
      w = (u64)((i64)(w << drop) >> drop);
      hi = (u64)((i64)w >> 63);
    }
    store_words(dst, col.out_width, w, hi);
    return;
  }
  if (col.kind == GPQ_KIND_COPY) {
    for (u32 b = 0; b < col.out_width && b < in; b++) dst[b] = streams[(u64)b * stride + i];
    return;
  }
  u8 v[32];
  for (u32 b = 0; b < in && b < 32; b++) v[b] = streams[(u64)b * stride + i];
  store_value(col, v, dst);
}

extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_decode_fixed(PageDesc* pages, const ColumnDesc* columns) {
  __shared__ PageState st;
  PageDesc pg = pages[blockIdx.x];
  const ColumnDesc col = columns[pg.column];
  start_page(st, pg, col);
  const bool is_bool = col.kind == GPQ_KIND_BOOL;
  const u32 in = col.in_width;
  u32 value_base = 0;
  // Whether to go on is decided at barriers (__syncthreads_or), never by
  // re-reading st.error, which thread 0 may already be setting for the next
  // batch: every thread must take the same path through the barriers.
  bool more = !__syncthreads_or(st.error != 0) && pg.num_values > 0;
  for (u32 lo = 0; more; lo += GPQ_BATCH) {
    u32 hi = min(lo + GPQ_BATCH, pg.num_values);
    bool valid[GPQ_PER_THREAD];
    u32 vi[GPQ_PER_THREAD];
    u32 nvals = decode_levels_batch(st, col, lo, hi, value_base, valid, vi);
    // Thread 0's fill error stays in a register until the barrier, whose
    // predicate the other threads evaluate by reading st.error.
    u32 fill_err = 0;
    if (st.streams.dictionary || st.streams.rle_bool) {
      if (threadIdx.x == 0 && nvals > 0) {
        hybrid_fill(st.idx, value_base, value_base + nvals);
        fill_err = st.idx.error;
      }
    }
    if (stop_at_barrier(&st.error, fill_err)) break;
    for (u32 k = 0; k < GPQ_PER_THREAD; k++) {
      u32 r = lo + k * blockDim.x + threadIdx.x;
      u64 row = pg.row_start + r;
      bool present = r < hi && valid[k];
      if (is_bool) {
        bool bit = false;
        if (present) {
          if (st.streams.rle_bool) {
            bit = hybrid_get(st.idx, vi[k]) != 0;
          } else if (st.streams.dictionary) {
            atomicCAS(&st.error, 0u, (u32)GPQ_ERR_UNSUPPORTED_ENCODING);
          } else if (vi[k] / 8 < st.streams.values_len) {
            bit = (st.streams.values[vi[k] / 8] >> (vi[k] % 8)) & 1;
          } else {
            atomicCAS(&st.error, 0u, (u32)GPQ_ERR_TRUNCATED_PAGE);
          }
        }
        u32 r0 = lo + k * blockDim.x + (threadIdx.x & ~31u);
        u32 rows = r0 < hi ? min(32u, hi - r0) : 0u;
        warp_write_bits((u32*)col.values, pg.row_start + r0, bit, rows);
        continue;
      }
      if (r >= hi) continue;
      u8* dst = (u8*)col.values + row * col.out_width;
      const u8* src = nullptr;
      if (present) {
        if (st.streams.dictionary) {
          u32 e = hybrid_get(st.idx, vi[k]);
          if (e < pg.dict_count) src = (const u8*)pg.dict + (u64)e * in;
          else atomicCAS(&st.error, 0u, (u32)GPQ_ERR_DICTIONARY_INDEX);
        } else if (st.streams.bss) {
          if (vi[k] < st.streams.bss_stride) {
            store_split_value(col, st.streams.values, st.streams.bss_stride, vi[k], dst);
            continue;
          }
          atomicCAS(&st.error, 0u, (u32)GPQ_ERR_TRUNCATED_PAGE);
        } else if ((u64)(vi[k] + 1) * in <= st.streams.values_len) {
          src = st.streams.values + (u64)vi[k] * in;
        } else {
          atomicCAS(&st.error, 0u, (u32)GPQ_ERR_TRUNCATED_PAGE);
        }
      }
      if (src) store_value(col, src, dst);
      else store_words(dst, col.out_width, 0, 0);
    }
    write_validity_batch(st, col, pg, lo, hi, valid);
    value_base += nvals;
    more = !__syncthreads_or(st.error != 0) && hi < pg.num_values;
  }
  finish_page(st, col, &pages[blockIdx.x]);
}
