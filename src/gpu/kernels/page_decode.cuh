// What every value-decoding kernel shares: the descriptors the host fills,
// locating a page's level and value streams, and decoding definition levels
// batch by batch into validity bits and value indices.
#pragma once

// Mirrors decode/descriptors.rs (ColumnDesc, 128 bytes).
struct ColumnDesc {
  u64 values;        // output values (a bitmap for BOOLEAN)
  u64 validity;      // output validity bitmap (32-bit words), 0 for a required column
  u64 offsets;       // strings: offsets (i32 or i64)
  u64 chars;         // strings: characters
  u64 scratch_len;   // strings: u32 length per row
  u64 scratch_src;   // strings: u32 source per row (page offset, or dictionary entry)
  u64 scratch_pre;   // DELTA_BYTE_ARRAY: u32 prefix length per row (0 if the column has no such page)
  u64 null_count;    // address of a u64 counter
  u64 num_rows;      // rows in the output (level positions, for a leaf of a nested column)
  u64 rep_levels;    // nested leaves: u16 repetition level per level position (gpq_decode_levels), else 0
  u64 def_levels;    // nested leaves: u16 definition level per level position, else 0
  i64 mul;           // conversion multiplier
  i64 div;           // conversion divisor
  u32 kind;          // GpqKind
  u32 in_width;      // bytes per stored value (0 for BOOLEAN and BYTE_ARRAY)
  u32 out_width;     // bytes per output value
  u32 max_def;       // highest definition level
  u32 large_offsets; // strings: 64-bit offsets
  u32 max_rep;       // highest repetition level (0 for a flat column)
};

// Bits of an RLE/bit-packed level stream whose largest level is `max`.
GPQ_DEVICE u32 level_bit_width(u32 max) { return max ? 32u - __clz(max) : 0u; }

// PageDesc.level_mode: the page version in the low bits, and for v1 pages
// whether a level stream uses the deprecated BIT_PACKED encoding.
#define LEVELS_V1 1u
#define LEVELS_V2 2u
#define LEVELS_VERSION_MASK 3u
#define LEVELS_REP_BIT_PACKED 4u
#define LEVELS_DEF_BIT_PACKED 8u

// Thread 0: the v1 level stream at *p (of a column whose largest level is
// `max`, `num_values` levels): RLE behind a u32 length, or BIT_PACKED
// without one. Initialises `s` if given and moves *p and *left past it.
GPQ_DEVICE u32 v1_level_stream(const u8** p, u32* left, u32 max, bool bit_packed, u32 num_values, HybridStream* s) {
  u32 bw = level_bit_width(max);
  if (bit_packed) {
    u64 n = ((u64)num_values * bw + 7) / 8;
    if (n > *left) return GPQ_ERR_TRUNCATED_PAGE;
    if (s) packed_levels_init(*s, *p, (u32)n, bw, num_values);
    *p += n;
    *left -= (u32)n;
    return 0;
  }
  if (*left < 4) return GPQ_ERR_TRUNCATED_PAGE;
  const u8* q = *p;
  u32 n = (u32)q[0] | ((u32)q[1] << 8) | ((u32)q[2] << 16) | ((u32)q[3] << 24);
  if (n > *left - 4) return GPQ_ERR_TRUNCATED_PAGE;
  if (s) hybrid_init(*s, q + 4, n, bw);
  *p += 4 + n;
  *left -= 4 + n;
  return 0;
}

// Mirrors decode/descriptors.rs (PageDesc, 80 bytes).
struct PageDesc {
  u64 data;          // page bytes: [rep levels][def levels][values], uncompressed
  u64 dict;          // fixed width: dictionary values; strings: (offset, length) per entry
  u64 dict_data;     // strings: the dictionary page's bytes
  u64 row_start;     // first output row of the page
  u64 char_base;     // strings: first output character of the page
  u32 size;          // page bytes
  u32 num_values;    // levels in the page (rows, for flat columns)
  u32 dict_count;    // dictionary entries (0: no dictionary)
  u32 encoding;      // value encoding (Parquet's Encoding enum)
  u32 level_mode;    // LEVELS_V1 or LEVELS_V2, with the BIT_PACKED flags of v1 pages
  u32 def_len;       // v2
  u32 rep_len;       // v2
  u32 column;        // index into the column table
  u32 status;        // GpqStatus, written by the kernels
  u32 v2_nulls;      // v2: the header's null count + 1 (checked against the levels); 0: none given
};

enum GpqKind : u32 {
  GPQ_KIND_COPY = 0,        // copy the low out_width bytes of each value
  GPQ_KIND_SEXT = 1,        // sign-extend in_width bytes to out_width
  GPQ_KIND_MUL = 2,         // i32 * mul -> i64 (dates to milliseconds)
  GPQ_KIND_BE_DECIMAL = 3,  // big-endian two's complement -> little-endian out_width
  GPQ_KIND_INT96 = 4,       // Impala timestamp -> i64 in the unit given by mul/div
  GPQ_KIND_BOOL = 5,        // bits
  GPQ_KIND_STRING = 6,      // offsets + characters
  GPQ_KIND_BYTES_DECIMAL = 7, // variable-length big-endian -> out_width
  GPQ_KIND_INTERVAL_DAY_TIME = 8, // INTERVAL (months, days, millis) -> (days, millis)
};

enum ParquetEncoding : u32 {
  ENC_PLAIN = 0,
  ENC_PLAIN_DICTIONARY = 2,
  ENC_RLE = 3,
  ENC_BIT_PACKED = 4,
  ENC_DELTA_BINARY_PACKED = 5,
  ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
  ENC_DELTA_BYTE_ARRAY = 7,
  ENC_RLE_DICTIONARY = 8,
  ENC_BYTE_STREAM_SPLIT = 9,
};

struct PageStreams {
  const u8* values;   // value stream after levels (after the bit-width byte for dictionary pages)
  u32 values_len;
  bool dictionary;    // values are dictionary indices
  bool rle_bool;      // values are RLE-encoded booleans
  bool bss;           // BYTE_STREAM_SPLIT: byte b of value i at values[b * bss_stride + i]
  u32 bss_stride;     // BYTE_STREAM_SPLIT: values in the page's streams
};

// Thread 0: locates the definition levels (initialising their decoder) and
// the value stream after them.
GPQ_DEVICE u32 levels_setup(const PageDesc& pg, const ColumnDesc& col, HybridStream& def, const u8** values,
                            u32* values_len) {
  const u8* p = (const u8*)pg.data;
  u32 left = pg.size;
  *values = p;
  *values_len = 0;
  hybrid_init(def, p, 0, 0);
  if ((pg.level_mode & LEVELS_VERSION_MASK) == LEVELS_V2) {
    if ((u64)pg.rep_len + pg.def_len > left) return GPQ_ERR_TRUNCATED_PAGE;
    // Repetition levels are gpq_decode_levels's business. (A flat column
    // has none, but some writers store them anyway in v2 pages: all zeros,
    // bit width 0, as in parquet-testing's rle_boolean_encoding.parquet;
    // like arrow-rs, skip them unread.)
    p += pg.rep_len;
    left -= pg.rep_len;
    if (col.max_def > 0) hybrid_init(def, p, pg.def_len, level_bit_width(col.max_def));
    p += pg.def_len;
    left -= pg.def_len;
  } else if ((pg.level_mode & LEVELS_VERSION_MASK) == LEVELS_V1) {
    // v1: repetition levels if repeated, then definition levels if
    // nullable; the repetition levels are gpq_decode_levels's business.
    if (col.max_rep > 0) {
      u32 err = v1_level_stream(&p, &left, col.max_rep, pg.level_mode & LEVELS_REP_BIT_PACKED, pg.num_values, nullptr);
      if (err) return err;
    }
    if (col.max_def > 0) {
      u32 err = v1_level_stream(&p, &left, col.max_def, pg.level_mode & LEVELS_DEF_BIT_PACKED, pg.num_values, &def);
      if (err) return err;
    }
  }
  *values = p;
  *values_len = left;
  return 0;
}

// Thread 0: locates streams and initialises the level and index decoders
// (PLAIN, dictionary, RLE booleans and BYTE_STREAM_SPLIT pages; the DELTA
// encodings have kernels of their own).
GPQ_DEVICE u32 page_setup(const PageDesc& pg, const ColumnDesc& col, HybridStream& def, HybridStream& idx,
                          PageStreams& out) {
  const u8* p;
  u32 left;
  out.dictionary = false;
  out.rle_bool = false;
  out.bss = false;
  out.bss_stride = 0;
  u32 err = levels_setup(pg, col, def, &p, &left);
  if (err) return err;
  if (pg.encoding == ENC_PLAIN_DICTIONARY || pg.encoding == ENC_RLE_DICTIONARY) {
    if (pg.dict_count == 0 && pg.dict == 0) return GPQ_ERR_NO_DICTIONARY;
    // A page of only nulls may carry no bit-width byte.
    u32 bw = 0;
    if (left > 0) { bw = p[0]; p++; left--; }
    if (bw > 32) return GPQ_ERR_BIT_WIDTH;
    hybrid_init(idx, p, left, bw);
    out.dictionary = true;
  } else if (pg.encoding == ENC_RLE && col.kind == GPQ_KIND_BOOL) {
    if (left < 4) return GPQ_ERR_TRUNCATED_PAGE;
    u32 n = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
    if (n > left - 4) return GPQ_ERR_TRUNCATED_PAGE;
    hybrid_init(idx, p + 4, n, 1);
    out.rle_bool = true;
    p += 4 + n;
    left -= 4 + n;
  } else if (pg.encoding == ENC_BYTE_STREAM_SPLIT) {
    // Fixed-width values only; the streams hold whole values.
    const bool fixed = col.kind == GPQ_KIND_COPY || col.kind == GPQ_KIND_SEXT || col.kind == GPQ_KIND_MUL ||
                       col.kind == GPQ_KIND_BE_DECIMAL || col.kind == GPQ_KIND_INT96 ||
                       col.kind == GPQ_KIND_INTERVAL_DAY_TIME;
    if (!fixed || col.in_width == 0) return GPQ_ERR_UNSUPPORTED_ENCODING;
    // Conversions gather a value into a 32-byte buffer; plain copies go byte by byte.
    if (col.kind != GPQ_KIND_COPY && col.in_width > 32) return GPQ_ERR_UNSUPPORTED_ENCODING;
    if (left % col.in_width) return GPQ_ERR_TRUNCATED_PAGE;
    out.bss = true;
    out.bss_stride = left / col.in_width;
  } else if (pg.encoding != ENC_PLAIN) {
    return GPQ_ERR_UNSUPPORTED_ENCODING;
  }
  out.values = p;
  out.values_len = left;
  return 0;
}

// Shared state of one page being decoded by one block.
struct PageState {
  HybridStream def;
  HybridStream idx;
  PageStreams streams;
  u32 warp_sums[GPQ_BLOCK / 32 + 1];
  u32 error;
  u32 nulls;
};

// Decodes the definition levels of rows lo + k*blockDim + threadIdx.x (k < GPQ_PER_THREAD),
// giving each row's validity and its index among the page's values. Returns
// the number of values the batch holds. All threads must call.
template <typename S>
GPQ_DEVICE u32 decode_levels_batch(S& st, const ColumnDesc& col, u32 lo, u32 hi, u32 value_base,
                                   bool valid[GPQ_PER_THREAD], u32 vindex[GPQ_PER_THREAD]) {
  if (col.max_def > 0 && threadIdx.x == 0) {
    hybrid_fill(st.def, lo, hi);
    if (st.def.error) atomicCAS(&st.error, 0u, st.def.error);
  }
  __syncthreads();
  u32 count = value_base;
  for (u32 k = 0; k < GPQ_PER_THREAD; k++) {
    u32 r = lo + k * blockDim.x + threadIdx.x;
    bool in = r < hi;
    bool v = in;
    if (in && col.max_def > 0 && st.error == 0) {
      u32 d = hybrid_get(st.def, r);
      if (d > col.max_def) atomicCAS(&st.error, 0u, (u32)GPQ_ERR_LEVEL_OUT_OF_RANGE);
      v = d == col.max_def;
    }
    u32 total;
    u32 before = block_prefix_count(v, st.warp_sums, &total);
    valid[k] = v;
    vindex[k] = count + before;
    count += total;
  }
  return count - value_base;
}

// Counts nulls of a batch into the page state and writes validity bits.
template <typename S>
GPQ_DEVICE void write_validity_batch(S& st, const ColumnDesc& col, const PageDesc& pg, u32 lo, u32 hi,
                                     const bool valid[GPQ_PER_THREAD]) {
  if (!col.validity) return;
  u32 nulls = 0;
  for (u32 k = 0; k < GPQ_PER_THREAD; k++) {
    u32 r0 = lo + k * blockDim.x + (threadIdx.x & ~31u);
    u32 r = lo + k * blockDim.x + threadIdx.x;
    u32 rows = r0 < hi ? min(32u, hi - r0) : 0u;
    warp_write_bits((u32*)col.validity, pg.row_start + r0, valid[k] && r < hi, rows);
    if (r < hi && !valid[k]) nulls++;
  }
  if (nulls) atomicAdd(&st.nulls, nulls);
}

// Decides at a barrier whether a batch loop stops: on an error already in
// `*error`, or on `local_err`, an error a thread kept in a register until
// now (no thread may write `*error` while others read it for the barrier's
// predicate). `local_err` is published after the barrier. Every thread of
// the block must call it.
GPQ_DEVICE bool stop_at_barrier(u32* error, u32 local_err) {
  bool stop = __syncthreads_or(*error != 0 || local_err != 0);
  if (stop && local_err) atomicCAS(error, 0u, local_err);
  return stop;
}

// Thread 0 at the end of a page: publishes the null count and the first error.
template <typename S>
GPQ_DEVICE void finish_page(S& st, const ColumnDesc& col, PageDesc* pg) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (st.nulls && col.null_count) atomicAdd((unsigned long long*)col.null_count, (unsigned long long)st.nulls);
  // A v2 header's null count is redundant with the levels; when they
  // disagree the page is corrupt (arrow-rs trusts the count and fails).
  u32 v2_nulls = pg->v2_nulls;
  if (!st.error && v2_nulls != 0 && st.nulls != v2_nulls - 1) st.error = GPQ_ERR_BAD_HEADER;
  if (st.error) atomicCAS(&pg->status, 0u, st.error);
}

// Thread 0 at the start of a page.
GPQ_DEVICE void start_page(PageState& st, const PageDesc& pg, const ColumnDesc& col) {
  if (threadIdx.x == 0) {
    st.error = 0;
    st.nulls = 0;
    if (pg.row_start + pg.num_values > col.num_rows) st.error = GPQ_ERR_OUTPUT_OVERFLOW;
    else st.error = page_setup(pg, col, st.def, st.idx, st.streams);
  }
  __syncthreads();
}
