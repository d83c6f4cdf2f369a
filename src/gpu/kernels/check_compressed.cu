// Structural checks of compressed pages before nvCOMP sees them. nvCOMP's
// decoders trust their input: on corrupt data they read and write out of
// bounds or never finish. One thread walks one page and proves, with every
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

GPQ_DEVICE u32 check_snappy(const u8* in, u64 in_len, u64 out_len) {
  ByteCursor c{in, 0, in_len};
  // Preamble: the uncompressed length as a varint of at most 5 bytes.
  u64 declared = 0;
  bool done = false;
  for (u32 shift = 0; shift < 35 && c.has(1); shift += 7) {
    u8 b = in[c.pos++];
    declared |= (u64)(b & 0x7f) << shift;
    if (!(b & 0x80)) { done = true; break; }
  }
  if (!done) return CHECK_TRUNCATED;
  if (declared != out_len) return CHECK_SIZE_MISMATCH;
  u64 out = 0;
  while (c.pos < in_len) {   // every element consumes at least one byte
    u8 tag = in[c.pos++];
    u32 kind = tag & 3;
    u64 len;
    if (kind == 0) {
      len = (tag >> 2) + 1u;
      if ((tag >> 2) >= 60) {
        u32 n = (tag >> 2) - 59;
        if (!c.has(n)) return CHECK_TRUNCATED;
        len = (u64)c.le(n) + 1;
      }
      if (!c.has(len)) return CHECK_TRUNCATED;
      if (len > out_len - out) return CHECK_OUTPUT_OVERRUN;
      c.pos += len;
      out += len;
      continue;
    }
    u64 offset;
    if (kind == 1) {
      if (!c.has(1)) return CHECK_TRUNCATED;
      len = ((tag >> 2) & 7) + 4u;
      offset = ((u64)(tag >> 5) << 8) | in[c.pos++];
    } else {
      u32 n = kind == 2 ? 2 : 4;
      if (!c.has(n)) return CHECK_TRUNCATED;
      len = (tag >> 2) + 1u;
      offset = c.le(n);
    }
    if (offset == 0 || offset > out) return CHECK_BAD_OFFSET;
    if (len > out_len - out) return CHECK_OUTPUT_OVERRUN;
    out += len;
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

// One thread per page of one codec. in_ptrs/in_sizes/out_sizes are nvCOMP's
// argument arrays; a page that fails has its input replaced by `empty`
// (`empty_len` bytes, a valid stream of this codec that decodes to nothing).
extern "C" __global__ void gpq_check_compressed(u64* in_ptrs, u64* in_sizes, const u64* out_sizes, u32 codec,
                                                u32 num_pages, u64 empty, u64 empty_len, u32* reasons) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= num_pages) return;
  const u8* in = (const u8*)in_ptrs[i];
  u64 in_len = in_sizes[i], out_len = out_sizes[i];
  u32 r;
  if (codec == CHECK_SNAPPY) r = check_snappy(in, in_len, out_len);
  else if (codec == CHECK_LZ4_RAW) r = check_lz4(in, in_len, out_len);
  else if (codec == CHECK_ZSTD) r = check_zstd(in, in_len, out_len);
  else r = CHECK_UNSUPPORTED;
  reasons[i] = r;
  if (r) {
    in_ptrs[i] = empty;
    in_sizes[i] = empty_len;
  }
}
