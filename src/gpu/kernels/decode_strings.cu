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
// by one thread, short strings leave the block idle for most of the page, and
// a page is as slow as its longest chain. The block instead takes a region of
// GPQ_BLOCK * PLAIN_CHUNK bytes at a time, and each thread answers for one
// chunk of it:
//   1. Speculate. A thread guesses where the chain enters its chunk: the first
//      byte from which two values in a row fit the stream (text bytes read as
//      a length overshoot the stream, so in text this is nearly always right),
//      and walks from there to the first value past the chunk, counting.
//   2. Resolve. The chain really enters chunk t where it leaves chunk t - 1.
//      A thread whose guess does not continue the chunk before walks its
//      chunk again from that chunk's exit, all such threads at once. Then
//      thread 0 goes through the chunks in order: where a guess (or such a
//      second walk) starts at the true entry, it holds, and so do the chunks
//      after it whose guesses continue it (one bit each, found with ffs);
//      anywhere else thread 0 walks the chunk itself. A wrong guess costs a
//      chunk's walk, never a wrong answer.
//   3. Record. A prefix sum of the counts numbers the values, and each thread
//      walks its chunk again, writing the values the caller asked for.
// Values longer than WALK_SERIAL_BYTES on average leave most chunks without a
// start; those batches are walked by thread 0 alone (gpq_string_sizes).
#define PLAIN_CHUNK 128
#define PLAIN_NONE 0xffffffffu             // no entry guessed / the chain ended
#define WALK_SERIAL_BYTES 256

// Scratch of the block-wide walk (about 6 KB of shared memory).
struct PlainWalk {
  u32 entry[GPQ_BLOCK];     // where the chain enters the chunk (guess, then true)
  u32 exit[GPQ_BLOCK];      // the first chain position past the chunk, or PLAIN_NONE where it ended inside
  u32 count[GPQ_BLOCK];     // values starting in [entry, chunk end)
  u32 fix_entry[GPQ_BLOCK];     // where chunk t was walked again from (chunk t - 1's exit), or PLAIN_NONE
  u32 fix_exit[GPQ_BLOCK];
  u32 fix_count[GPQ_BLOCK];
  u32 agrees[GPQ_BLOCK / 32];   // bit t: chunk t's guess holds if chunk t - 1's did
  u32 resolved;             // chunks [0, resolved) are true; the rest hold no values
  u32 warp_sums[GPQ_BLOCK / 32 + 1];
};

GPQ_DEVICE u32 le32_at(const u8* b) { return (u32)b[0] | ((u32)b[1] << 8) | ((u32)b[2] << 16) | ((u32)b[3] << 24); }

// Where the value starting at p of v[0, n) ends, or PLAIN_NONE where its
// length or bytes run past the stream.
GPQ_DEVICE u32 plain_next(const u8* v, u32 n, u64 p) {
  if (p + 4 > n) return PLAIN_NONE;
  u64 next = p + 4 + le32_at(v + p);
  return next <= n ? (u32)next : PLAIN_NONE;
}

// Bit j: byte q + j may start a value, for j < PLAIN_SCAN. A value's length
// is under the stream's size, so in a stream under 16 MiB its fourth byte is
// zero; text has no zero bytes, so this skips most of a chunk, and the
// bytes' loads go out together rather than one candidate at a time.
#define PLAIN_SCAN 8
GPQ_DEVICE u32 plain_candidates(const u8* v, u32 n, u64 q) {
  if (n >= (1u << 24)) return (1u << PLAIN_SCAN) - 1;
  u32 maybe = 0;
  if (q + 3 + PLAIN_SCAN <= n) {
    u8 b[PLAIN_SCAN];
    for (u32 j = 0; j < PLAIN_SCAN; j++) b[j] = v[q + 3 + j];
    for (u32 j = 0; j < PLAIN_SCAN; j++) maybe |= (u32)(b[j] == 0) << j;
  } else {
    for (u32 j = 0; j < PLAIN_SCAN; j++) maybe |= (u32)(q + 3 + j < n && v[q + 3 + j] == 0) << j;
  }
  return maybe;
}

struct PlainChunk {
  u32 exit;     // first chain position >= end, or PLAIN_NONE where a value inside ran past the stream
  u32 count;
};

// Walks the chain from `from` to the first position at or past `end`.
GPQ_DEVICE PlainChunk plain_walk_chunk(const u8* v, u32 n, u32 from, u64 end) {
  PlainChunk w{from, 0};
  while (w.exit < end) {   // each step moves forward by at least 4 bytes
    u32 next = plain_next(v, n, w.exit);
    if (next == PLAIN_NONE) { w.exit = PLAIN_NONE; break; }
    w.exit = next;
    w.count++;
  }
  return w;
}

// Exclusive prefix sum of v over the block (all threads call it).
GPQ_DEVICE u32 block_prefix_u32(u32 v, u32* warp_sums, u32* total) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u32 x = v;
  for (u32 d = 1; d < 32; d <<= 1) {
    u32 y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 acc = 0;
    for (u32 k = 0; k < GPQ_BLOCK / 32; k++) { u32 c = warp_sums[k]; warp_sums[k] = acc; acc += c; }
    warp_sums[GPQ_BLOCK / 32] = acc;
  }
  __syncthreads();
  u32 r = warp_sums[warp] + x - v;
  *total = warp_sums[GPQ_BLOCK / 32];
  __syncthreads();
  return r;
}

// Finds the next `count` PLAIN values from byte *cursor (shared memory) of
// the stream v[0, n) and records value j's start (`base` + offset) and
// length at src[j * stride] and len[j * stride]; advances *cursor. All
// threads of a GPQ_BLOCK-thread block call it with the same arguments and get
// the same result: 0, or GPQ_ERR_TRUNCATED_PAGE where a value it needs runs
// past the stream or the stream ends first (as a sequential walk reports).
GPQ_DEVICE u32 plain_walk_block(PlainWalk& w, u32* cursor, const u8* v, u32 n, u32 base, u32 count, u32* src,
                                u32* len, u32 stride) {
  const u32 t = threadIdx.x;
  u32 found = 0;
  while (found < count) {
    const u32 pos = *cursor;   // moved before the last barrier
    const u64 lo = (u64)pos + (u64)t * PLAIN_CHUNK, hi = lo + PLAIN_CHUNK;
    // 1. Speculate.
    u32 guess = t == 0 ? pos : PLAIN_NONE;
    for (u64 q = lo; t > 0 && guess == PLAIN_NONE && q < hi && q < n; q += PLAIN_SCAN) {
      u32 maybe = plain_candidates(v, n, q);
      while (maybe) {
        const u64 p = q + __ffs(maybe) - 1;
        maybe &= maybe - 1;
        if (p >= hi) break;
        const u32 next = plain_next(v, n, p);
        if (next != PLAIN_NONE && (next == n || plain_next(v, n, next) != PLAIN_NONE)) { guess = (u32)p; break; }
      }
    }
    PlainChunk mine{PLAIN_NONE, 0};
    if (guess != PLAIN_NONE) mine = plain_walk_chunk(v, n, guess, hi);
    const bool usable = mine.exit != PLAIN_NONE;   // a guess that ran past the stream is left to thread 0
    w.entry[t] = usable ? guess : PLAIN_NONE;
    w.exit[t] = mine.exit;
    w.count[t] = mine.count;
    __syncthreads();
    const u32 prev_exit = t > 0 ? w.exit[t - 1] : PLAIN_NONE;
    const bool agrees = usable && t > 0 && guess == prev_exit;
    const u32 bits = __ballot_sync(0xffffffffu, agrees);
    if ((t & 31) == 0) w.agrees[t >> 5] = bits;
    // Where the guess does not continue the chunk before, walk again from
    // that chunk's exit: right whenever that chunk was (thread 0 checks).
    u32 fix_from = PLAIN_NONE;
    PlainChunk fix{PLAIN_NONE, 0};
    if (t > 0 && !agrees && prev_exit != PLAIN_NONE) {
      fix_from = prev_exit;
      fix = plain_walk_chunk(v, n, prev_exit, hi);
    }
    w.fix_entry[t] = fix_from;
    w.fix_exit[t] = fix.exit;
    w.fix_count[t] = fix.count;
    __syncthreads();
    // 2. Resolve.
    if (t == 0) {
      u32 entry = pos;   // the true entry of chunk c
      u32 c = 0;
      while (c < GPQ_BLOCK && entry != PLAIN_NONE) {
        if (w.entry[c] == entry) {
          // Chunk c holds, and so do the chunks up to the next that does not continue it.
          u32 g = c + 1;
          while (g < GPQ_BLOCK) {
            u32 word = ~w.agrees[g >> 5] & (0xffffffffu << (g & 31));
            if (word) { g = (g & ~31u) + __ffs(word) - 1; break; }
            g = (g & ~31u) + 32;
          }
          if (g > GPQ_BLOCK) g = GPQ_BLOCK;
          entry = w.exit[g - 1];
          c = g;
        } else {
          PlainChunk fix = w.fix_entry[c] == entry
                               ? PlainChunk{w.fix_exit[c], w.fix_count[c]}
                               : plain_walk_chunk(v, n, entry, (u64)pos + (u64)(c + 1) * PLAIN_CHUNK);
          w.entry[c] = entry;
          w.exit[c] = fix.exit;
          w.count[c] = fix.count;
          entry = fix.exit;
          c++;
        }
      }
      w.resolved = c;
    }
    __syncthreads();
    // 3. Record.
    const bool live = t < w.resolved;
    u32 total;
    const u32 first = block_prefix_u32(live ? w.count[t] : 0, w.warp_sums, &total);
    const u32 need = count - found;
    bool bad = false;
    if (live && first < need && w.count[t] > 0) {
      u32 p = w.entry[t];
      const u32 upto = min(w.count[t], need - first);
      for (u32 i = 0; i < upto; i++) {
        u32 next = plain_next(v, n, p);   // known to fit: the walk above counted it
        src[(u64)(found + first + i) * stride] = base + p + 4;
        len[(u64)(found + first + i) * stride] = next - p - 4;
        p = next;
      }
      if (first + upto == need) *cursor = p;
    }
    // Fewer values than needed: the region's end, or where the chain ended.
    const u32 last_exit = w.resolved > 0 ? w.exit[w.resolved - 1] : PLAIN_NONE;
    if (t == 0 && total < need) {
      if (w.resolved < GPQ_BLOCK || last_exit == PLAIN_NONE) bad = true;
      else *cursor = last_exit;
    }
    if (__syncthreads_or(bad)) return GPQ_ERR_TRUNCATED_PAGE;
    found += min(total, need);
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
    // One add per warp: a block's threads adding to one shared 64-bit
    // counter retry their compare-and-swaps in turn.
    for (u32 d = 16; d > 0; d >>= 1) mine += __shfl_down_sync(0xffffffffu, mine, d);
    if ((threadIdx.x & 31) == 0 && mine) atomicAdd(&ss.total, mine);
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
