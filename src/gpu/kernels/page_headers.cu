// Page headers on the GPU: one thread walks one column chunk's Thrift
// compact-protocol page headers. Pass 1 counts pages; pass 2 fills the page
// table. Every read is checked against the end of the span it is in; a
// malformed header sets the chunk's status and stops the walk. A chunk whose
// read skips pages (a row window) is two spans, walked one after the other.

// Mirrors decode/descriptors.rs (ChunkDesc).
struct ChunkDesc {
  u64 offset;        // chunk start in the device buffer
  u64 len;           // chunk length in bytes (its first span, where it has two)
  u64 resume_offset; // the second span: pages after the skipped ones
  u64 resume_len;    // (0: none)
  u32 page_start;    // first slot in the page table (pass 2)
  u32 page_count;    // pages found (pass 1) / slots reserved (pass 2)
  u32 status;        // GpqStatus of the walk
  u32 error_page;    // page number (within the chunk's file pages) the error refers to
  u32 skipped_pages; // pages skipped between the spans
  u32 pad;
};

// Field order and sizes mirror decode/pages.rs (PageInfo, 80 bytes).
struct PageInfo {
  u64 header_offset;   // offset of the header in the device buffer
  u64 data_offset;     // offset of the page body in the device buffer
  u32 chunk;
  u32 page_type;       // 0 data v1, 1 index, 2 dictionary, 3 data v2
  i32 compressed_size;
  i32 uncompressed_size;
  i32 num_values;
  i32 num_nulls;       // v2 only, else -1
  i32 num_rows;        // v2 only, else -1
  u32 encoding;
  u32 def_encoding;    // v1 only
  u32 rep_encoding;    // v1 only
  i32 def_len;         // v2 only, else 0
  i32 rep_len;         // v2 only, else 0
  u32 is_compressed;   // v2 flag (default true); 1 for other pages
  u32 header_len;
  u32 flags;           // PAGE_DICT_SORTED, PAGE_HAS_CRC
  u32 crc;             // the header's crc field, if PAGE_HAS_CRC
};

#define PAGE_DICT_SORTED 1u
#define PAGE_HAS_CRC 2u

struct ThriftReader {
  const u8* p;
  const u8* end;
  bool bad;

  GPQ_DEVICE u8 byte() {
    if (p >= end) { bad = true; return 0; }
    return *p++;
  }
  GPQ_DEVICE u64 varint() {
    u64 v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      u8 b = byte();
      if (bad) return 0;
      v |= (u64)(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    bad = true;
    return 0;
  }
  GPQ_DEVICE i64 zigzag() {
    u64 v = varint();
    return (i64)(v >> 1) ^ -(i64)(v & 1);
  }
  GPQ_DEVICE i32 i32v() {
    i64 v = zigzag();
    if (v < -2147483648LL || v > 2147483647LL) { bad = true; return 0; }
    return (i32)v;
  }
  GPQ_DEVICE void skip_bytes(u64 n) {
    if ((u64)(end - p) < n) { bad = true; p = end; return; }
    p += n;
  }
  // Skips one value of compact type `t`, iteratively (bounded nesting).
  GPQ_DEVICE void skip(u32 t) {
    // Stack of pending containers: for structs we loop fields; for lists a count.
    u32 kind[16];
    u64 remaining[16];   // elements left (lists/maps), unused for structs
    u32 elem[16];        // element type for lists, key|value<<4 for maps
    int depth = 0;
    u32 cur = t;
    while (!bad) {
      // Consume one value of type `cur`.
      switch (cur) {
        case 1: case 2: break;                 // bool in field header
        case 3: byte(); break;                 // i8
        case 4: case 5: case 6: varint(); break;
        case 7: skip_bytes(8); break;
        case 8: skip_bytes(varint()); break;   // binary
        case 9: case 10: {                     // list / set
          u8 h = byte();
          u64 n = h >> 4;
          if (n == 15) n = varint();
          if (depth >= 16) { bad = true; return; }
          kind[depth] = 9; remaining[depth] = n; elem[depth] = h & 0x0f; depth++;
          break;
        }
        case 11: {                             // map
          u64 n = varint();
          u8 kv = n ? byte() : 0;
          if (depth >= 16) { bad = true; return; }
          kind[depth] = 11; remaining[depth] = n * 2; elem[depth] = kv; depth++;
          break;
        }
        case 12: {                             // struct
          if (depth >= 16) { bad = true; return; }
          kind[depth] = 12; remaining[depth] = 0; elem[depth] = 0; depth++;
          break;
        }
        default: bad = true; return;
      }
      // Find the next value to consume. Every step reads at least one byte
      // or pops a container, so the input's end bounds the loop even when a
      // container claims 2^64 elements.
      for (;;) {
        if (bad || depth == 0) return;
        int d = depth - 1;
        if (kind[d] == 12) {
          u8 h = byte();
          if (bad) return;
          if (h == 0) { depth--; continue; }    // struct end
          if ((h >> 4) == 0) zigzag();          // long-form field id
          u32 ft = h & 0x0f;
          if (ft == 1 || ft == 2) continue;     // bool: no payload
          cur = ft;
          break;
        }
        if (remaining[d] == 0) { depth--; continue; }
        remaining[d]--;
        if (kind[d] == 9) {
          cur = elem[d];
          if (cur == 1 || cur == 2) { byte(); continue; }  // list<bool>: one byte each
        } else {
          cur = (remaining[d] & 1) ? (elem[d] >> 4) : (elem[d] & 0x0f);
          if (cur == 1 || cur == 2) { byte(); continue; }
        }
        break;
      }
    }
  }
};

// Reads the fields of a nested struct; `on_field(id, type)` returns true if it consumed the value.
template <typename F>
GPQ_DEVICE void read_struct(ThriftReader& r, F on_field) {
  i32 last = 0;
  for (int guard = 0; guard < 256 && !r.bad; guard++) {
    u8 h = r.byte();
    if (r.bad || h == 0) return;
    i32 id = (h >> 4) ? last + (h >> 4) : (i32)r.zigzag();
    last = id;
    u32 t = h & 0x0f;
    if (!on_field(id, t)) {
      if (t != 1 && t != 2) r.skip(t);
    }
  }
  r.bad = true;  // too many fields
}

// Whether `e` is one of Parquet's Encoding values (1 was never assigned).
GPQ_DEVICE bool known_encoding(u32 e) { return e == 0 || (e >= 2 && e <= 9); }

// Parses one page header at `p`; returns false and sets *status on error.
GPQ_DEVICE bool parse_page_header(const u8* p, const u8* end, PageInfo* out, u32* status) {
  ThriftReader r{p, end, false};
  PageInfo pi;
  pi.page_type = 0xffffffffu; pi.compressed_size = -1; pi.uncompressed_size = -1;
  pi.num_values = -1; pi.num_nulls = -1; pi.num_rows = -1; pi.encoding = 0xffffffffu;
  pi.def_encoding = 3; pi.rep_encoding = 3; pi.def_len = 0; pi.rep_len = 0;
  pi.is_compressed = 1; pi.flags = 0; pi.crc = 0;
  bool have_sub = false;
  u32 required = 0;   // required fields of the data page headers seen (bits)
  read_struct(r, [&](i32 id, u32 t) -> bool {
    if (id == 1 && t == 5) { pi.page_type = (u32)r.i32v(); return true; }
    if (id == 2 && t == 5) { pi.uncompressed_size = r.i32v(); return true; }
    if (id == 3 && t == 5) { pi.compressed_size = r.i32v(); return true; }
    if (id == 4 && t == 5) { pi.crc = (u32)r.i32v(); pi.flags |= PAGE_HAS_CRC; return true; }
    if ((id == 5 || id == 7 || id == 8) && t == 12) {
      have_sub = true;
      read_struct(r, [&](i32 f, u32 ft) -> bool {
        if (id == 5) {             // DataPageHeader
          if (f == 1 && ft == 5) { pi.num_values = r.i32v(); return true; }
          if (f == 2 && ft == 5) { pi.encoding = (u32)r.i32v(); return true; }
          if (f == 3 && ft == 5) { pi.def_encoding = (u32)r.i32v(); required |= 1; return true; }
          if (f == 4 && ft == 5) { pi.rep_encoding = (u32)r.i32v(); required |= 2; return true; }
        } else if (id == 7) {      // DictionaryPageHeader
          if (f == 1 && ft == 5) { pi.num_values = r.i32v(); return true; }
          if (f == 2 && ft == 5) { pi.encoding = (u32)r.i32v(); return true; }
          if (f == 3 && (ft == 1 || ft == 2)) { if (ft == 1) pi.flags |= PAGE_DICT_SORTED; return true; }
        } else {                   // DataPageHeaderV2
          if (f == 1 && ft == 5) { pi.num_values = r.i32v(); return true; }
          if (f == 2 && ft == 5) { pi.num_nulls = r.i32v(); return true; }
          if (f == 3 && ft == 5) { pi.num_rows = r.i32v(); return true; }
          if (f == 4 && ft == 5) { pi.encoding = (u32)r.i32v(); return true; }
          if (f == 5 && ft == 5) { pi.def_len = r.i32v(); required |= 4; return true; }
          if (f == 6 && ft == 5) { pi.rep_len = r.i32v(); required |= 8; return true; }
          if (f == 7 && (ft == 1 || ft == 2)) { pi.is_compressed = ft == 1; return true; }
        }
        return false;
      });
      return true;
    }
    return false;
  });
  if (r.bad) { *status = (r.p >= end) ? GPQ_ERR_TRUNCATED_HEADER : GPQ_ERR_BAD_HEADER; return false; }
  if (pi.page_type > 3) { *status = GPQ_ERR_UNKNOWN_PAGE_TYPE; return false; }
  if (pi.compressed_size < 0 || pi.uncompressed_size < 0) { *status = GPQ_ERR_NEGATIVE_COUNT; return false; }
  if (pi.page_type != 1) {
    if (!have_sub) { *status = GPQ_ERR_BAD_HEADER; return false; }
    if (pi.num_values < 0 || pi.def_len < 0 || pi.rep_len < 0 || (pi.page_type == 3 && (pi.num_nulls < 0 || pi.num_rows < 0))) {
      *status = GPQ_ERR_NEGATIVE_COUNT; return false;
    }
    if (pi.page_type == 3 && (i64)pi.def_len + pi.rep_len > pi.compressed_size) { *status = GPQ_ERR_BAD_HEADER; return false; }
    // Fields the format requires must be there, and level encodings must be
    // encodings (arrow-rs refuses such headers too, even where a flat column
    // never reads its repetition levels).
    if (pi.page_type == 0 && (required != 3 || !known_encoding(pi.def_encoding) || !known_encoding(pi.rep_encoding))) {
      *status = GPQ_ERR_BAD_HEADER; return false;
    }
    if (pi.page_type == 3 && required != 12) { *status = GPQ_ERR_BAD_HEADER; return false; }
  }
  pi.header_len = (u32)(r.p - p);
  *out = pi;
  return true;
}

// Walks one chunk. With `pages == nullptr` only counts.
GPQ_DEVICE void walk_chunk(const u8* base, ChunkDesc* c, u32 chunk_index, PageInfo* pages) {
  u32 n = 0;
  u32 cap = c->page_count;
  u32 skipped = 0;   // added to page numbers in the second span
  for (u32 span = 0; span < 2; span++) {
    const u8* p = base + (span == 0 ? c->offset : c->resume_offset);
    const u8* end = p + (span == 0 ? c->len : c->resume_len);
    if (span == 1) skipped = c->skipped_pages;
    while (p < end) {
      PageInfo pi;
      u32 status = 0;
      if (!parse_page_header(p, end, &pi, &status)) { c->status = status; c->error_page = n + skipped; return; }
      const u8* body = p + pi.header_len;
      if ((u64)(end - body) < (u64)pi.compressed_size) { c->status = GPQ_ERR_PAGE_OUT_OF_CHUNK; c->error_page = n + skipped; return; }
      if (pages) {
        if (n >= cap) { c->status = GPQ_ERR_PAGE_COUNT_CHANGED; c->error_page = n + skipped; return; }
        pi.chunk = chunk_index;
        pi.header_offset = (u64)(p - base);
        pi.data_offset = (u64)(body - base);
        pages[c->page_start + n] = pi;
      }
      n++;
      p = body + pi.compressed_size;
    }
  }
  if (!pages) c->page_count = n;
  else if (n != cap) { c->status = GPQ_ERR_PAGE_COUNT_CHANGED; c->error_page = n + skipped; }
}

extern "C" __global__ void gpq_count_pages(const u8* base, ChunkDesc* chunks, u32 num_chunks) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= num_chunks) return;
  chunks[i].status = 0;
  chunks[i].error_page = 0;
  walk_chunk(base, &chunks[i], i, nullptr);
}

extern "C" __global__ void gpq_parse_pages(const u8* base, ChunkDesc* chunks, u32 num_chunks, PageInfo* pages) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= num_chunks) return;
  if (chunks[i].status != 0) return;
  walk_chunk(base, &chunks[i], i, pages);
}
