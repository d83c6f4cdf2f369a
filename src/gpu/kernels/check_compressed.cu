// Structural checks of compressed pages before nvCOMP sees them. nvCOMP's
// decoders trust their input: on corrupt data they read and write out of
// bounds or never finish. The check walks each page and proves, with every
// read checked against the input's end, that decoding it stays inside its
// input and inside the output size the page header promises:
//   SNAPPY  - every tag: literal lengths inside the input and the output,
//             copy offsets inside the output written so far; the preamble and
//             the total equal the promised size.
//   LZ4_RAW - every sequence likewise, plus the block-format end rules.
//   ZSTD    - frames and blocks: magic, header fields (no dictionaries,
//             bounded windows), block types and sizes, literal and sequence
//             section headers, content sizes against the promised size.
//             Entropy-coded streams are not decoded here.
// A page that fails is handed to nvCOMP as an empty, well-formed stream of
// the same codec instead (so nvCOMP never touches it) and its status says
// why; the host then gives it to the CPU decoder, whose verdict stands.

// Mirrors decode/nvcomp.rs (CheckCodec).
enum CheckCodec : u32 {
  CHECK_SNAPPY = 0,
  CHECK_LZ4_RAW = 1,
  CHECK_ZSTD = 2,
};

// Why a page failed (the detail behind GPQ_ERR_MALFORMED_COMPRESSED_DATA).
// Mirrors decode/nvcomp.rs (check_reason).
enum CheckReason : u32 {
  CHECK_OK = 0,
  CHECK_TRUNCATED = 1,        // a header or length runs past the input
  CHECK_OUTPUT_OVERRUN = 2,   // decoding would write past the promised size
  CHECK_BAD_OFFSET = 3,       // a back-reference before the output's start (or 0)
  CHECK_SIZE_MISMATCH = 4,    // decodes to another size than promised
  CHECK_BAD_HEADER = 5,       // a frame, block or section header is malformed
  CHECK_UNSUPPORTED = 6,      // well-formed but outside what is handed to nvCOMP
};

struct ByteCursor {
  const u8* p;
  u64 pos;
  u64 len;
  GPQ_DEVICE bool has(u64 n) const { return n <= len - pos; }
  GPQ_DEVICE u32 le(u32 n) {   // caller checked has(n); n <= 4
    u32 v = 0;
    for (u32 i = 0; i < n; i++) v |= (u32)p[pos + i] << (8 * i);
    pos += n;
    return v;
  }
};

// A warp checks one SNAPPY page. Tags form one sequential chain; the warp
// stages the input into shared memory a window at a time (wide, coalesced
// loads; literal payloads are skipped, not staged) and checks it a span of
// WALK_SPAN bytes at a time:
//   - Each lane answers for WALK_CHUNK bytes of the span. It walks tags one
//     by one from WALK_WARMUP bytes before its chunk, where the chain is not
//     known, and counts (output, the earliest output its copies need, bad
//     tags) from its first tag inside the chunk. Walks from a wrong start
//     mostly fall into the true chain within the warm-up.
//   - The chain's entry into each chunk is the previous lane's exit. A lane
//     whose first tag is not that entry walks its chunk again from it; one
//     lane at a time, in order, until every lane's walk is on the chain.
//   - A prefix sum of the lanes' outputs then gives each copy the output
//     written before it, and the span passes or fails as a whole.
// A span that fails is checked again segment by segment (32 bytes: every
// lane decodes the tag that would start at its byte, pointer jumping finds
// the chain, exact output positions by a prefix sum) so that the verdict is
// the first failing tag's in stream order, as a sequential walk would give.
#define CHECK_WARPS 4                          // warps (pages) a block: decompress.rs launches 4 warps a block
#define WALK_CHUNK 256                         // bytes of a span each lane answers for
#define WALK_WARMUP 256                        // bytes a lane walks before its chunk to find the chain
#define WALK_SPAN (32 * WALK_CHUNK)            // bytes checked at once
#define CHECK_STAGED (WALK_SPAN + 64)          // staged bytes: the span, its start's misalignment and segments' tails

// Copies page bytes [lo, lo + CHECK_STAGED) (those inside [0, in_len); zero
// elsewhere) into `words`. `in + lo` is 4-byte aligned; lo may be up to 3
// bytes before the page's start, and those bytes, like any past its end,
// are never read.
GPQ_DEVICE void stage_window(u32* words, const u8* in, i32 lo, u32 in_len, u32 lane) {
  for (u32 k = lane; k < CHECK_STAGED / 4; k += 32) {
    i64 at = (i64)lo + 4 * (i64)k;
    u32 w = 0;
    if (at >= 0 && (u64)at + 4 <= in_len) {
      w = *(const u32*)(in + at);
    } else {
      for (u32 b = 0; b < 4; b++) {
        i64 q = at + b;
        if (q >= 0 && (u64)q < in_len) w |= (u32)in[q] << (8 * b);
      }
    }
    words[k] = w;
  }
}

GPQ_DEVICE u32 staged_word(const u32* words, u32 k) { return k < CHECK_STAGED / 4 ? words[k] : 0u; }

// The SNAPPY tag that would start at page offset p (window byte `at`), in
// 32-bit arithmetic (the kernel hands pages of 2^31 bytes or more to no one).
struct SnappyTag {
  u32 kind;      // 0 literal, 1-3 copies
  u32 len;       // output bytes (meaningless when truncated)
  u32 offset;    // copies: how far back
  u32 step;      // input bytes to the next tag, capped at 64 (64 when truncated)
  u32 advance;   // input bytes to the next tag (header, plus the payload of a literal)
  bool truncated;
};

GPQ_DEVICE SnappyTag snappy_tag_at(const u32* words, u32 at, u32 p, u32 in_len) {
  u32 s = 8 * (at & 3);
  // A tag is at most 5 bytes (the tag byte and 4 of length or offset): the
  // two words from the one holding the tag byte hold them all.
  u32 w0 = staged_word(words, at >> 2), w1 = staged_word(words, (at >> 2) + 1);
  u32 b0_3 = __funnelshift_r(w0, w1, s);
  u32 b4 = (w1 >> s) & 0xff;
  SnappyTag t;
  u32 tag = b0_3 & 0xff, t6 = tag >> 2;
  t.kind = tag & 3;
  u32 extra = t.kind == 0 ? (t6 >= 60 ? t6 - 59 : 0) : t.kind == 3 ? 4 : t.kind;
  u32 after = (b0_3 >> 8) | (b4 << 24);   // the four bytes after the tag byte
  u32 v = extra >= 4 ? after : after & ((1u << (8 * extra)) - 1);
  u32 header = 1 + extra;
  u32 left = p < in_len ? in_len - p : 0;
  t.truncated = header > left;
  t.offset = 0;
  if (t.kind == 0) {
    // The length minus one, so that a 4-byte length of 2^32 - 1 does not wrap.
    u32 len_m1 = t6 >= 60 ? v : t6;
    t.truncated = t.truncated || len_m1 >= left - header;
    t.len = len_m1 + 1;
    t.advance = header + t.len;
  } else {
    t.len = t.kind == 1 ? ((t6 & 7) + 4u) : (t6 + 1u);
    t.offset = t.kind == 1 ? (((tag >> 5) << 8) | v) : v;
    t.advance = header;
  }
  t.step = t.truncated || t.advance > 64 ? 64u : t.advance;
  return t;
}

// Why the tag fails, given the output written before it (0 if it does not).
// The order of the checks is that of a sequential walk.
GPQ_DEVICE u32 snappy_tag_verdict(const SnappyTag& t, u32 out_before, u32 out_len) {
  if (t.truncated) return CHECK_TRUNCATED;
  if (t.kind != 0 && (t.offset == 0 || t.offset > out_before)) return CHECK_BAD_OFFSET;
  if (t.len > out_len - out_before) return CHECK_OUTPUT_OVERRUN;
  return CHECK_OK;
}

// One segment of the exact check: the tags of the chain that start in
// [pos, pos + 32), all lanes together. Returns the first failing tag's
// verdict in stream order, or CHECK_OK with `pos` and `out` moved past them.
// The staged bytes must reach pos + 40 or the input's end.
GPQ_DEVICE u32 snappy_segment(const u32* words, i32 lo, u32& pos, u32& out, u32 in_len, u32 out_len, u32 lane) {
  const unsigned FULL = 0xffffffffu;
  u32 p = pos + lane;   // per lane
  SnappyTag t = snappy_tag_at(words, p - (u32)lo, p, in_len);
  // The chain from lane 0 by pointer jumping: `reach` holds the members
  // from this lane up to (not including) `next`; each round doubles how
  // many. Every tag advances at least 2 bytes, so a chain of 32 candidate
  // bytes has at most 16 members: four rounds, fewer once lane 0's chain
  // has left the segment (a long literal: none at all).
  u32 next = lane + t.step, reach = 1u << lane;
#pragma unroll
  for (u32 r = 0; r < 4; r++) {
    if (__shfl_sync(FULL, next, 0) >= 32) break;   // the same in every lane
    u32 their_reach = __shfl_sync(FULL, reach, next & 31);
    u32 their_next = __shfl_sync(FULL, next, next & 31);
    if (next < 32) {
      reach |= their_reach;
      next = their_next;
    }
  }
  // Candidates past the input's end are not tags.
  u32 limit = in_len - pos < 32 ? in_len - pos : 32u;
  u32 members = __shfl_sync(FULL, reach, 0) & (limit == 32 ? FULL : (1u << limit) - 1);
  u32 last = 31 - __clz(members);
  bool member = (members >> lane) & 1;
  u32 last_advance = __shfl_sync(FULL, t.advance, last);
  // Exact output positions: an inclusive prefix sum over the members.
  u32 mine = member ? t.len : 0, incl = mine;
#pragma unroll
  for (u32 d = 1; d < 32; d <<= 1) {
    u32 y = __shfl_up_sync(FULL, incl, d);
    if (lane >= d) incl += y;
  }
  // (Sums past a failing member may wrap; the first failure in stream order is what counts.)
  u32 verdict = member ? snappy_tag_verdict(t, out + (incl - mine), out_len) : CHECK_OK;
  u32 failing = __ballot_sync(FULL, verdict != CHECK_OK);
  if (failing) return __shfl_sync(FULL, verdict, __ffs(failing) - 1);
  out += __shfl_sync(FULL, incl, 31);
  pos += last + last_advance;
  return CHECK_OK;
}

// One lane's walk over the chain's tags (or what it takes for them).
struct ChunkWalk {
  u32 first;   // the first tag at or after the chunk's start (its exit if none)
  u32 exit;    // the first tag at or after the chunk's end
  u32 out;     // output of the tags from `first` on
  u32 need;    // how much output before `first` the copies from `first` on reach back into
  bool bad;    // one of those tags is truncated or copies from offset 0
};

// Walks tags from `from` until one starts at or after `end` (<= in_len),
// counting those at or after `count_from`. Every tag advances at least two
// bytes, and a truncated one ends the walk at the input's end.
GPQ_DEVICE ChunkWalk snappy_walk(const u32* words, i32 lo, u32 from, u32 count_from, u32 end, u32 in_len) {
  ChunkWalk w{0, 0, 0, 0, false};
  u32 q = from;
  // The warm-up needs only where each tag ends: fewer instructions than a
  // whole tag's decoding (this loop is most of the check's work).
  while (q < count_from) {
    u32 at = q - (u32)lo;
    u32 w0 = staged_word(words, at >> 2), w1 = staged_word(words, (at >> 2) + 1);
    u32 b0_3 = __funnelshift_r(w0, w1, 8 * (at & 3));
    u32 tag = b0_3 & 0xff, kind = tag & 3, t6 = tag >> 2;
    u32 left = in_len - q;   // q < count_from <= in_len
    u32 advance;
    if (kind != 0) {
      advance = (0x5320u >> (4 * kind)) & 15;   // copies: 2, 3 or 5 bytes
    } else if (t6 < 60) {
      advance = t6 + 2;
    } else {
      // A long literal: its length's bytes follow the tag (up to 3 of them
      // are in b0_3; a 4-byte length ends the walk as if truncated).
      u32 extra = t6 - 59;
      u32 len_m1 = extra < 4 ? (b0_3 >> 8) & ((1u << (8 * extra)) - 1) : 0xffffffffu;
      advance = len_m1 < left ? 2 + extra + len_m1 : 0xffffffffu;
    }
    if (advance > left) {
      q = in_len;
      break;
    }
    q += advance;
  }
  w.first = q;
  while (q < end) {
    SnappyTag t = snappy_tag_at(words, q - (u32)lo, q, in_len);
    if (t.truncated) {
      w.bad = true;
      q = in_len;
      break;
    }
    if (t.kind != 0) {
      w.bad = w.bad || t.offset == 0;
      if (t.offset > w.out && t.offset - w.out > w.need) w.need = t.offset - w.out;
    }
    w.out += t.len;
    q += t.advance;
  }
  w.exit = q;
  return w;
}

// Every lane of the warp calls this with the same page; all get the verdict.
// Sizes are below 2^31 (the caller's guarantee).
GPQ_DEVICE u32 check_snappy(const u8* in, u32 in_len, u32 out_len, u32* words, u32 lane) {
  const unsigned FULL = 0xffffffffu;
  // Preamble: the uncompressed length as a varint of at most 5 bytes.
  u64 declared = 0;
  u32 pos = 0;
  bool done = false;
  for (u32 shift = 0; shift < 35 && pos < in_len; shift += 7) {
    u8 b = in[pos++];
    declared |= (u64)(b & 0x7f) << shift;
    if (!(b & 0x80)) { done = true; break; }
  }
  if (!done) return CHECK_TRUNCATED;
  if (declared != out_len) return CHECK_SIZE_MISMATCH;
  u32 out = 0;   // output bytes of the tags before `pos`; never above out_len
  // Every value below is the same in all lanes except where named per lane.
  while (pos < in_len) {
    // (In unsigned arithmetic, where a page near 2^31 bytes cannot overflow;
    // `lo` may wrap below 0 by up to 3, which the casts below undo.)
    u32 lo_u = pos - (u32)((unsigned long long)(in + pos) & 3);
    i32 lo = (i32)lo_u;
    u32 staged_end = lo_u + CHECK_STAGED < in_len ? lo_u + CHECK_STAGED : in_len;
    stage_window(words, in, lo, in_len, lane);
    __syncwarp();
    // A span's tags read up to 5 bytes past it, and its segments 40 bytes:
    // all staged, or the input ends inside the staged bytes.
    while (pos < in_len && (pos + WALK_SPAN + 40 <= staged_end || staged_end == in_len)) {
      // A long literal first is passed over by one exact segment.
      if (snappy_tag_at(words, pos - lo_u, pos, in_len).advance > WALK_CHUNK) {
        u32 r = snappy_segment(words, lo, pos, out, in_len, out_len, lane);
        if (r) return r;
        continue;
      }
      u32 span_end = in_len - pos < WALK_SPAN ? in_len : pos + WALK_SPAN;
      u32 start = pos + lane * WALK_CHUNK;   // per lane, as are the walks
      bool active = start < span_end;
      u32 end = active && span_end - start > WALK_CHUNK ? start + WALK_CHUNK : span_end;
      ChunkWalk w{start, start, 0, 0, false};
      if (active) w = snappy_walk(words, lo, start - pos > WALK_WARMUP ? start - WALK_WARMUP : pos, start, end, in_len);
      // Put every active lane's walk on the chain, in stream order.
      while (true) {
        u32 entry = __shfl_up_sync(FULL, w.exit, 1);
        if (lane == 0) entry = pos;
        u32 wrong = __ballot_sync(FULL, active && w.first != entry);
        if (!wrong) break;
        if (lane == __ffs(wrong) - 1) w = snappy_walk(words, lo, entry, entry, end, in_len);
      }
      u32 mine = active ? w.out : 0u, incl = mine;
#pragma unroll
      for (u32 d = 1; d < 32; d <<= 1) {
        u32 y = __shfl_up_sync(FULL, incl, d);
        if (lane >= d) incl += y;
      }
      u32 span_out = __shfl_sync(FULL, incl, 31);
      u32 exit = __shfl_sync(FULL, w.exit, 31 - __clz(__ballot_sync(FULL, active)));
      bool fails = active && (w.bad || (u64)w.need > (u64)out + (incl - mine));
      if (__ballot_sync(FULL, fails) == 0 && (u64)out + span_out <= (u64)out_len) {
        out += span_out;
        pos = exit;
        continue;
      }
      // Something in the span fails: find the first failing tag exactly.
      while (pos < span_end) {
        u32 r = snappy_segment(words, lo, pos, out, in_len, out_len, lane);
        if (r) return r;
      }
    }
    __syncwarp();   // the window is read before the next round overwrites it
  }
  return out == out_len ? CHECK_OK : CHECK_SIZE_MISMATCH;
}

// LZ4 block format: sequences of (token, literals, offset, match); the last
// sequence has literals only. The end rules of the format (the last 5 bytes
// are literals, the last match starts at least 12 bytes before the end) are
// what fast decoders rely on to copy in wide strides, so they are enforced.
GPQ_DEVICE u32 check_lz4(const u8* in, u64 in_len, u64 out_len) {
  ByteCursor c{in, 0, in_len};
  u64 out = 0;
  if (in_len == 0) return CHECK_TRUNCATED;   // even an empty block has a token
  while (true) {
    if (!c.has(1)) return CHECK_TRUNCATED;
    u8 token = in[c.pos++];
    u64 lit = token >> 4;
    if (lit == 15) {
      u8 b;
      do {   // each extension byte is consumed from the input
        if (!c.has(1)) return CHECK_TRUNCATED;
        b = in[c.pos++];
        lit += b;
      } while (b == 255);
    }
    if (!c.has(lit)) return CHECK_TRUNCATED;
    if (lit > out_len - out) return CHECK_OUTPUT_OVERRUN;
    c.pos += lit;
    out += lit;
    if (c.pos == in_len) break;   // the last sequence: literals only
    if (!c.has(2)) return CHECK_TRUNCATED;
    u64 offset = c.le(2);
    if (offset == 0 || offset > out) return CHECK_BAD_OFFSET;
    u64 match = (token & 15) + 4u;
    if ((token & 15) == 15) {
      u8 b;
      do {
        if (!c.has(1)) return CHECK_TRUNCATED;
        b = in[c.pos++];
        match += b;
      } while (b == 255);
    }
    if (out_len < 12 || out > out_len - 12) return CHECK_OUTPUT_OVERRUN;   // match starts too late
    if (match > out_len - 5 - out) return CHECK_OUTPUT_OVERRUN;            // must leave 5 literal bytes
    out += match;
  }
  return out == out_len ? CHECK_OK : CHECK_SIZE_MISMATCH;
}

// One zstd compressed block: the literals section header and the sequences
// section header, each checked against the block's bytes and the format's
// limits. `block_max` bounds what the block may produce.
GPQ_DEVICE u32 check_zstd_block(const u8* b, u32 size, u32 block_max) {
  ByteCursor c{b, 0, size};
  if (!c.has(1)) return CHECK_TRUNCATED;
  u8 h0 = b[0];
  u32 type = h0 & 3, fmt = (h0 >> 2) & 3;
  u32 regenerated = 0, compressed = 0;
  if (type < 2) {   // raw or RLE literals
    if (fmt == 0 || fmt == 2) { regenerated = h0 >> 3; c.pos = 1; }
    else if (fmt == 1) { if (!c.has(2)) return CHECK_TRUNCATED; regenerated = c.le(2) >> 4; }
    else { if (!c.has(3)) return CHECK_TRUNCATED; regenerated = c.le(3) >> 4; }
    u32 stored = type == 0 ? regenerated : 1;
    if (!c.has(stored)) return CHECK_TRUNCATED;
    c.pos += stored;
  } else {          // Huffman-compressed (2) or treeless (3) literals
    u32 hlen = fmt <= 1 ? 3 : fmt == 2 ? 4 : 5;
    if (!c.has(hlen)) return CHECK_TRUNCATED;
    u64 h = 0;
    for (u32 i = 0; i < hlen; i++) h |= (u64)b[i] << (8 * i);
    c.pos = hlen;
    u32 bits = fmt <= 1 ? 10 : fmt == 2 ? 14 : 18;
    regenerated = (u32)((h >> 4) & ((1u << bits) - 1));
    compressed = (u32)((h >> (4 + bits)) & ((1u << bits) - 1));
    if (!c.has(compressed)) return CHECK_TRUNCATED;
    bool four = fmt != 0;
    if (four) {
      // Jump table: three stream sizes; the fourth stream is what is left.
      // The tree description (type 2) sits in front of it.
      if (compressed < 6 + (type == 2 ? 1u : 0u)) return CHECK_BAD_HEADER;
      u32 tree = 0;
      if (type == 2) {
        u8 t = b[c.pos];
        tree = t < 128 ? 1u + t : 1u + (t - 127u + 1u) / 2u;
        if (tree + 6 > compressed) return CHECK_TRUNCATED;
      }
      const u8* jt = b + c.pos + tree;
      u64 s1 = jt[0] | (jt[1] << 8), s2 = jt[2] | (jt[3] << 8), s3 = jt[4] | (jt[5] << 8);
      if (s1 + s2 + s3 > (u64)compressed - tree - 6) return CHECK_TRUNCATED;
      if (regenerated < 4) return CHECK_BAD_HEADER;   // four streams need at least one byte each... and a split
    }
    c.pos += compressed;
  }
  if (regenerated > block_max) return CHECK_OUTPUT_OVERRUN;
  // Sequences section header.
  if (!c.has(1)) return CHECK_TRUNCATED;
  u32 nseq = b[c.pos++];
  if (nseq >= 128) {
    if (nseq < 255) {
      if (!c.has(1)) return CHECK_TRUNCATED;
      nseq = ((nseq - 128) << 8) + b[c.pos++];
    } else {
      if (!c.has(2)) return CHECK_TRUNCATED;
      nseq = c.le(2) + 0x7F00;
    }
  }
  if (nseq == 0) return c.pos == size ? CHECK_OK : CHECK_BAD_HEADER;
  // Each sequence matches at least 3 bytes.
  if ((u64)nseq * 3 > block_max) return CHECK_OUTPUT_OVERRUN;
  if (!c.has(1)) return CHECK_TRUNCATED;
  u8 modes = b[c.pos++];
  if (modes & 3) return CHECK_BAD_HEADER;   // reserved bits
  // FSE table descriptions and the bitstream follow; at least one byte of
  // bitstream (its final byte carries the end marker and must be non-zero).
  if (c.pos >= size) return CHECK_TRUNCATED;
  if (b[size - 1] == 0) return CHECK_BAD_HEADER;
  return CHECK_OK;
}

GPQ_DEVICE u32 check_zstd(const u8* in, u64 in_len, u64 out_len) {
  ByteCursor c{in, 0, in_len};
  u64 out_min = 0, out_max = 0;   // what the frames can produce at least / at most
  if (in_len == 0) return CHECK_TRUNCATED;
  while (c.pos < in_len) {   // every frame consumes its header
    if (!c.has(4)) return CHECK_TRUNCATED;
    u32 magic = c.le(4);
    if (magic != 0xFD2FB528u) return (magic & 0xFFFFFFF0u) == 0x184D2A50u ? CHECK_UNSUPPORTED : CHECK_BAD_HEADER;
    if (!c.has(1)) return CHECK_TRUNCATED;
    u8 fhd = in[c.pos++];
    u32 fcs_flag = fhd >> 6, single = (fhd >> 5) & 1, reserved = (fhd >> 3) & 1, checksum = (fhd >> 2) & 1,
        dict_flag = fhd & 3;
    if (reserved) return CHECK_BAD_HEADER;
    u64 window = 0;
    if (!single) {
      if (!c.has(1)) return CHECK_TRUNCATED;
      u8 wd = in[c.pos++];
      u32 wlog = 10 + (wd >> 3);
      if (wlog > 31) return CHECK_BAD_HEADER;
      window = (1ull << wlog) + ((1ull << wlog) >> 3) * (wd & 7);
    }
    if (dict_flag) {
      u32 n = dict_flag == 3 ? 4 : dict_flag;
      if (!c.has(n)) return CHECK_TRUNCATED;
      if (c.le(n) != 0) return CHECK_UNSUPPORTED;   // dictionaries are not handed to nvCOMP
    }
    u32 fcs_len = fcs_flag == 0 ? (single ? 1 : 0) : fcs_flag == 1 ? 2 : fcs_flag == 2 ? 4 : 8;
    bool has_fcs = fcs_len > 0;
    u64 fcs = 0;
    if (has_fcs) {
      if (!c.has(fcs_len)) return CHECK_TRUNCATED;
      for (u32 i = 0; i < fcs_len; i++) fcs |= (u64)in[c.pos + i] << (8 * i);
      c.pos += fcs_len;
      if (fcs_len == 2) fcs += 256;
      if (fcs > out_len) return CHECK_OUTPUT_OVERRUN;
    }
    if (single) window = fcs;
    u64 block_max = window < (128u << 10) ? window : (128u << 10);
    u64 frame_min = 0, frame_max = 0;
    bool last = false;
    while (!last) {   // every block consumes its 3-byte header
      if (!c.has(3)) return CHECK_TRUNCATED;
      u32 bh = c.le(3);
      last = bh & 1;
      u32 btype = (bh >> 1) & 3, bsize = bh >> 3;
      if (btype == 3) return CHECK_BAD_HEADER;
      if (btype == 0 || btype == 1) {   // raw / RLE: the size is the output
        if (bsize > block_max) return CHECK_BAD_HEADER;
        u32 stored = btype == 0 ? bsize : 1;
        if (!c.has(stored)) return CHECK_TRUNCATED;
        c.pos += stored;
        frame_min += bsize;
        frame_max += bsize;
      } else {
        if (bsize == 0 || bsize > block_max) return CHECK_BAD_HEADER;
        if (!c.has(bsize)) return CHECK_TRUNCATED;
        u32 r = check_zstd_block(in + c.pos, bsize, (u32)block_max);
        if (r) return r;
        c.pos += bsize;
        frame_max += block_max;
      }
      if (frame_min > out_len) return CHECK_OUTPUT_OVERRUN;
    }
    if (checksum) {
      if (!c.has(4)) return CHECK_TRUNCATED;
      c.pos += 4;
    }
    if (has_fcs) {
      if (fcs < frame_min || fcs > frame_max) return CHECK_SIZE_MISMATCH;
      frame_min = frame_max = fcs;
    }
    out_min += frame_min;
    out_max += frame_max;
    if (out_min > out_len) return CHECK_OUTPUT_OVERRUN;
  }
  if (out_min > out_len || out_max < out_len) return CHECK_SIZE_MISMATCH;
  return CHECK_OK;
}

// One warp per page of one codec (CHECK_WARPS pages per block of
// 32 * CHECK_WARPS threads). in_ptrs/in_sizes/out_sizes are nvCOMP's
// argument arrays; a page that fails has its input replaced by `empty`
// (`empty_len` bytes, a valid stream of this codec that decodes to nothing).
// SNAPPY pages are walked by the whole warp; LZ4_RAW and ZSTD by its first
// lane alone (ZSTD's check jumps from block header to block header, and
// LZ4_RAW is rare in Parquet files).
// (Measured on an H100 over SF10 lineitem's 68,055 SNAPPY pages, 2026-12-06,
// scripts/bench_check_kernel.py: 6.1 ms with the walks of 256-byte chunks
// after 256 bytes of warm-up, against 11.6 ms for the earlier check that
// decoded a candidate tag at every byte; chunks of 128 bytes 6.4 ms, of 512
// bytes 9.4-10.2 ms; the warm-up decoding whole tags 6.9 ms.)
extern "C" __global__ void __launch_bounds__(32 * CHECK_WARPS) gpq_check_compressed(u64* in_ptrs, u64* in_sizes, const u64* out_sizes, u32 codec,
                                                u32 num_pages, u64 empty, u64 empty_len, u32* reasons) {
  __shared__ u32 windows[CHECK_WARPS][CHECK_STAGED / 4];
  u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  u32 i = blockIdx.x * CHECK_WARPS + warp;
  if (warp >= CHECK_WARPS || i >= num_pages) return;   // whole warps leave together
  const u8* in = (const u8*)in_ptrs[i];
  u64 in_len = in_sizes[i], out_len = out_sizes[i];
  u32 r;
  if (codec == CHECK_SNAPPY) {
    // Parquet page sizes are 32-bit signed; nothing larger is handed to nvCOMP.
    r = in_len >= (1ull << 31) || out_len >= (1ull << 31) ? CHECK_UNSUPPORTED
                                                         : check_snappy(in, (u32)in_len, (u32)out_len, windows[warp], lane);
  }
  else if (lane != 0) return;
  else if (codec == CHECK_LZ4_RAW) r = check_lz4(in, in_len, out_len);
  else if (codec == CHECK_ZSTD) r = check_zstd(in, in_len, out_len);
  else r = CHECK_UNSUPPORTED;
  if (lane != 0) return;
  reasons[i] = r;
  if (r) {
    in_ptrs[i] = empty;
    in_sizes[i] = empty_len;
  }
}
