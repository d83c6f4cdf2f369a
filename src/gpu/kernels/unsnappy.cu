// gpq's own SNAPPY decoder. A block decompresses one page, checking every
// tag before it writes a byte, so a page needs neither gpq_check_compressed
// in front nor nvCOMP; a page it refuses gets the first failing tag's
// CheckReason (the same verdict as the check's sequential walk) and goes to
// the CPU decoder.
//
// nvCOMP gives a page one warp, which follows the tag chain alone. Here the
// whole block takes the chain a window of input at a time:
//   - every byte of the window is a candidate tag start; jump[0][c] is where
//     the tag starting at c would end, jump[k] the 2^k-th next start, built
//     by pointer doubling, so that thread r finds the window's r-th tag in
//     UNSNAP_LEVELS lookups (as gpq_string_sizes walks PLAIN values);
//   - a block prefix sum over the tags' output lengths gives each tag its
//     output position; every tag is checked against the input's end, the
//     output written before it and the promised size, and the window stops
//     the page at its first failing tag; the window keeps the tags whose
//     output fits UNSNAP_CAP bytes (a longer literal alone is copied as it is);
//   - each output byte of the window is then a literal byte (read from the
//     input), a byte of an earlier window (final: read from the output) or
//     a copy of an earlier byte of the window: pointer jumping over those
//     links, in shared memory, resolves every byte in about log2 of the
//     longest chain of copies rounds.
#define UNSNAP_THREADS 256
#define UNSNAP_WINDOW 1024                  // input bytes a window's walk takes
#define UNSNAP_LEVELS 8                     // at most 2^8 = UNSNAP_THREADS tags a window
#define UNSNAP_OUT UNSNAP_WINDOW            // the next tag starts past the window
#define UNSNAP_END (UNSNAP_WINDOW + 1)      // the input ends here: no tag
#define UNSNAP_BAD (UNSNAP_WINDOW + 2)      // a tag here would run past the input
#define UNSNAP_CAP 4096                     // output bytes a window resolves in shared memory
#define UNSNAP_DONE 0x80000000u             // a resolved byte's entry: the flag and the byte
static_assert((1u << UNSNAP_LEVELS) == UNSNAP_THREADS, "one thread per tag of a window");

struct UnsnapScratch {
  u16 jump[UNSNAP_LEVELS][UNSNAP_WINDOW];
  u8 bytes[UNSNAP_WINDOW + 8];             // the window, zero past the input's end
  u32 out_at[UNSNAP_THREADS + 1];          // each tag's output position; [tags] is the window's end
  u32 src[UNSNAP_THREADS];                 // a literal's first input byte, a copy's offset
  u32 literal[UNSNAP_THREADS / 32];        // a bit per tag: a literal
  u64 warp_sums[UNSNAP_THREADS / 32 + 1];
  u32 byte[UNSNAP_CAP];                    // per output byte: UNSNAP_DONE | value, or the window byte it copies
  u32 first_bad;                           // (rank << 3) | reason of the window's first failing tag
  u32 next;                                // the input offset of the tag after the window's last
};

// The tag at window byte c (page offset p < in_len).
struct UnsnapTag {
  u32 literal;   // 1 for a literal, 0 for a copy
  u32 len;       // output bytes
  u32 arg;       // literal: input offset of its bytes; copy: offset back
  u32 advance;   // input bytes to the next tag
  bool truncated;
};

GPQ_DEVICE UnsnapTag unsnap_tag(const u8* b, u32 c, u32 p, u32 in_len) {
  const u32 tag = b[c], t6 = tag >> 2, kind = tag & 3;
  const u32 extra = kind == 0 ? (t6 >= 60 ? t6 - 59 : 0) : kind == 3 ? 4 : kind;
  u32 v = 0;
  for (u32 i = 0; i < extra; i++) v |= (u32)b[c + 1 + i] << (8 * i);
  const u32 header = 1 + extra, left = in_len - p;
  UnsnapTag t;
  t.literal = kind == 0;
  t.truncated = header > left;
  if (kind == 0) {
    // The length minus one, so that a 4-byte length of 2^32 - 1 does not wrap.
    const u32 len_m1 = t6 >= 60 ? v : t6;
    t.truncated = t.truncated || len_m1 >= left - header;
    t.len = t.truncated ? 0 : len_m1 + 1;
    t.arg = p + header;
    t.advance = t.truncated ? 0 : header + t.len;
  } else {
    t.len = kind == 1 ? (t6 & 7) + 4 : t6 + 1;
    t.arg = kind == 1 ? ((tag >> 5) << 8) | v : v;
    t.advance = header;
  }
  return t;
}

// Decodes the tags from page offset `pos` (output written so far: `out`)
// that start in one window, at most UNSNAP_THREADS of them; all threads call
// it with the same arguments. Returns a CheckReason (0: the window's bytes
// are written) and moves *pos and *out past the window.
GPQ_DEVICE u32 unsnap_window(UnsnapScratch& s, const u8* in, u32 in_len, u8* dst, u32 out_len, u32* pos_io,
                             u32* out_io) {
  const u32 pos = *pos_io, out = *out_io;
  for (u32 i = threadIdx.x; i < UNSNAP_WINDOW + 8; i += blockDim.x) {
    const u32 a = pos + i;   // in_len < 2^31: no wrap
    s.bytes[i] = a < in_len ? in[a] : 0;
  }
  if (threadIdx.x == 0) s.first_bad = 0xffffffffu;
  __syncthreads();
  for (u32 c = threadIdx.x; c < UNSNAP_WINDOW; c += blockDim.x) {
    u16 j = UNSNAP_END;
    if (c < in_len - pos) {
      const UnsnapTag t = unsnap_tag(s.bytes, c, pos + c, in_len);
      j = t.truncated ? (u16)UNSNAP_BAD : c + t.advance < UNSNAP_WINDOW ? (u16)(c + t.advance) : (u16)UNSNAP_OUT;
    }
    s.jump[0][c] = j;
  }
  __syncthreads();
  for (u32 k = 1; k < UNSNAP_LEVELS; k++) {
    for (u32 c = threadIdx.x; c < UNSNAP_WINDOW; c += blockDim.x) {
      const u16 j = s.jump[k - 1][c];
      s.jump[k][c] = j < UNSNAP_WINDOW ? s.jump[k - 1][j] : j;
    }
    __syncthreads();
  }
  // Tag r of the window (tag 0 starts at the window's start, inside the input).
  const u32 r = threadIdx.x;
  u32 node = 0;
  for (u32 k = 0; k < UNSNAP_LEVELS; k++) {
    if (((r >> k) & 1) && node < UNSNAP_WINDOW) node = s.jump[k][node];
  }
  const bool member = node < UNSNAP_WINDOW && node < in_len - pos;
  // Members are tags 0 .. some count - 1: at least tag 0.
  UnsnapTag t{0, 0, 0, 0, false};
  if (member) t = unsnap_tag(s.bytes, node, pos + node, in_len);
  // Output positions: an exclusive block prefix sum of the lengths (64-bit:
  // a window of tags past a failing one may claim more than 2^32 bytes).
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x / 32;
  u64 x = t.len;
  for (u32 d = 1; d < 32; d <<= 1) {
    const u64 y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  const u32 literal_bits = __ballot_sync(0xffffffffu, member && t.literal);
  if (lane == 31) s.warp_sums[warp] = x;
  if (lane == 0) s.literal[warp] = literal_bits;
  __syncthreads();
  u64 before = 0;
  for (u32 w = 0; w < warp && w < warps; w++) before += s.warp_sums[w];
  const u64 before_me = before + x - t.len;   // the window's output before this tag
  const u64 at = (u64)out + before_me;
  // The window keeps its tags while their output fits UNSNAP_CAP (tag 0 always).
  const bool kept = member && (r == 0 || before_me + t.len <= UNSNAP_CAP);
  if (member) {
    u32 reason = CHECK_OK;
    if (t.truncated) reason = CHECK_TRUNCATED;
    else if (!t.literal && (t.arg == 0 || t.arg > at)) reason = CHECK_BAD_OFFSET;
    else if (at > out_len || t.len > out_len - at) reason = CHECK_OUTPUT_OVERRUN;
    // (Every tag before a failing one passes, kept or not: its reason is the page's.)
    if (reason != CHECK_OK) atomicMin(&s.first_bad, (r << 3) | reason);
    s.out_at[r] = (u32)at;   // below out_len wherever it is used (no tag before fails)
    s.src[r] = t.arg;
  }
  const u32 tags = __syncthreads_count(kept);
  if (r == tags - 1) {
    s.next = pos + node + t.advance;
    s.out_at[tags] = (u32)min(at + t.len, (u64)out_len);
  }
  __syncthreads();
  const u32 bad = s.first_bad;
  if (bad != 0xffffffffu) return bad & 7;
  const u32 end = s.out_at[tags], n = end - out;
  if (n > UNSNAP_CAP) {
    // One literal, longer than the window's room: copied as it is.
    const u8* from = in + s.src[0];
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) dst[out + i] = from[i];
  } else {
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
      const u32 q = out + i;
      // The tag holding q: the last one starting at or before it.
      u32 lo = 0, hi = tags;   // out_at[lo] <= q < out_at[hi]
      while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (s.out_at[mid] <= q) lo = mid; else hi = mid;
      }
      const u32 start = s.out_at[lo], src = s.src[lo];
      u32 e;
      if ((s.literal[lo >> 5] >> (lo & 31)) & 1) {
        e = UNSNAP_DONE | in[src + (q - start)];
      } else {
        // The byte `src` (the offset) back; inside this same copy, the one a
        // period earlier: the source lies before the copy's start.
        const u32 back = q - start < src ? q - src : start - src + (q - start) % src;
        e = back < out ? UNSNAP_DONE | dst[back] : back - out;
      }
      s.byte[i] = e;
    }
    __syncthreads();
    // Pointer jumping: each round, an unresolved byte takes its source's
    // entry (the source's value, or the source's own source). A round reads
    // every entry before it writes any (a barrier between), so no thread reads
    // an entry another is rewriting; chains of at most UNSNAP_CAP links
    // resolve in log2(UNSNAP_CAP) + 1 rounds.
    bool pending = true;
    for (u32 round = 0; round < 32 && pending; round++) {
      u32 next[UNSNAP_CAP / UNSNAP_THREADS];
      bool mine = false;
      for (u32 k = 0; k < UNSNAP_CAP / UNSNAP_THREADS; k++) {
        const u32 i = threadIdx.x + k * UNSNAP_THREADS;
        u32 e = i < n ? s.byte[i] : UNSNAP_DONE;
        if (!(e & UNSNAP_DONE)) {
          e = s.byte[e];
          mine = mine || !(e & UNSNAP_DONE);
        }
        next[k] = e;
      }
      __syncthreads();
      for (u32 k = 0; k < UNSNAP_CAP / UNSNAP_THREADS; k++) {
        const u32 i = threadIdx.x + k * UNSNAP_THREADS;
        if (i < n) s.byte[i] = next[k];
      }
      pending = __syncthreads_or(mine);
    }
    if (pending) return CHECK_UNSUPPORTED;   // not reached: the chains are shorter
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) dst[out + i] = (u8)s.byte[i];
  }
  const u32 next = s.next;
  __syncthreads();   // the window's bytes are final, and the scratch free, before the next one
  *pos_io = next;
  *out_io = end;
  return CHECK_OK;
}

// One block per page. args: n input pointers, n input sizes, n output sizes,
// n output pointers (u64 each), as for gpq_unzstd; verdicts: a CheckReason per page.
extern "C" __global__ void __launch_bounds__(UNSNAP_THREADS) gpq_unsnappy(const u64* args, u32 num_pages, u32* verdicts) {
  __shared__ UnsnapScratch s;
  const u32 i = blockIdx.x;
  if (i >= num_pages) return;
  const u8* in = (const u8*)args[i];
  const u64 in_len64 = args[num_pages + i], out_len64 = args[2 * num_pages + i];
  u8* dst = (u8*)args[3 * num_pages + i];
  // Parquet page sizes are 32-bit signed.
  if (in_len64 >= (1ull << 31) || out_len64 >= (1ull << 31)) {
    if (threadIdx.x == 0) verdicts[i] = CHECK_UNSUPPORTED;
    return;
  }
  const u32 in_len = (u32)in_len64, out_len = (u32)out_len64;
  // Preamble: the uncompressed length as a varint of at most 5 bytes (every
  // thread reads it: the same few bytes, the same result).
  u64 declared = 0;
  u32 pos = 0;
  bool done = false;
  for (u32 shift = 0; shift < 35 && pos < in_len; shift += 7) {
    const u8 b = in[pos++];
    declared |= (u64)(b & 0x7f) << shift;
    if (!(b & 0x80)) { done = true; break; }
  }
  u32 verdict = !done ? CHECK_TRUNCATED : declared != out_len ? CHECK_SIZE_MISMATCH : CHECK_OK;
  u32 out = 0;
  // pos, out and verdict are the same in every thread.
  while (verdict == CHECK_OK && pos < in_len) verdict = unsnap_window(s, in, in_len, dst, out_len, &pos, &out);
  if (verdict == CHECK_OK && out != out_len) verdict = CHECK_SIZE_MISMATCH;
  if (threadIdx.x == 0) verdicts[i] = verdict;
}
