// ZSTD decompression of pages on the device, checked at every step
// (RFC 8878). nvCOMP's ZSTD decoder trusts its input: a corrupt page can
// make it read or write out of bounds or never finish, and a check in front
// of it would have to decode the entropy-coded streams anyway. This decoder
// does decode them, and every read is bounded by its stream, every write by
// the page's promised size or its list, every loop by its input or output:
// a page that breaks any rule of the format (or one this decoder is
// stricter about than the reference library: dictionaries, checksummed
// frames, windows over 128 MiB, offsets beyond the window, Huffman codes of
// 12 bits) gets a CheckReason instead, and the host hands it to the CPU
// decoder, whose verdict stands. So what this decoder accepts, it decodes
// exactly as the reference library would.
//
// Three kernels run over a batch of pages, in stream order:
// - gpq_unzstd_count, a thread per page, walks the page's frame and block
//   headers and counts the entries its sequence list needs: heads for each
//   compressed block, and one a sequence, at most a third of the block's
//   largest size and one more. The host sizes the lists from the counts and
//   splits a batch whose lists would not fit into rounds.
// - gpq_unzstd_sequences, a thread per work item, builds the item's FSE
//   tables (in shared memory, a set per thread, 16-bit entries) and decodes
//   its sequences into the list: (literal length, match length, offset).
//   Decoding a block's sequences is one chain of dependent steps; with a
//   thread per item, thousands of such chains run side by side, where a
//   warp per page would issue every step for one lane. An item is one
//   compressed block of a page (blocks decoded apart; a page of more than
//   ZSTD_APART_MAX blocks is one item): the kernel's time is its longest
//   chain, and a page of many blocks would otherwise be one long chain. A
//   block decoded apart walks the blocks before it for the tables it
//   repeats and leaves the repeat offsets it inherits symbolic, for the
//   warp to resolve. Threads take the items longest first, so that the
//   kernel ends soon after its longest chain, and the threads of a warp
//   step their chains together: one whose chain ends takes the next item
//   at once, while the others go on.
// - gpq_unzstd, a warp per page, decodes the literals (up to four lanes
//   decode the Huffman streams side by side, from windows the warp stages
//   in shared memory), then checks and executes the page's sequences from
//   its list, 32 at a time, a sequence per lane, in rounds: one whose match
//   reads output of an earlier sequence of the batch waits for that one's
//   round; long sequences are copied by the whole warp. Literals are
//   decoded into the tail of the page's own output slot: a block's matches
//   never overtake the literals still to be read, because the block's
//   output (literals plus matches) must fit in what is left of the slot.
//
// The list decoder checks what its chain needs (the table descriptions, the
// bitstream's bounds and its end); the warp checks every sequence against
// the literals, the output and the window before anything is written. The
// first failure in the page's order is its reason, as if one decoder did
// both: each block's list starts with an entry that carries the list
// decoder's reason after the last sequence it decoded. The three kernels
// walk a page's frames and blocks with the same functions, so the warp
// finds each block's list where the list decoder put it.
//
// The warp kernel's speed is how many pages an SM keeps in flight, so its
// shared memory is kept small (what is never needed at the same time shares
// it; see ZstdWarp) and so are its registers: lane 0's page state lives in
// shared memory, and the launch bounds ask for as many blocks an SM as that
// shared memory allows on an H100 (UNZSTD_MIN_BLOCKS).

#define UNZSTD_WARPS 2                 // warps (pages) a block: decompress.rs launches 64 threads a block
// Blocks an SM the register cap is set for (the shared memory allows more).
#ifndef UNZSTD_MIN_BLOCKS
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000)
#define UNZSTD_MIN_BLOCKS 14           // 228 KB an SM (H100, H200, B200)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800
#define UNZSTD_MIN_BLOCKS 10           // 164 KB (A100)
#else
#define UNZSTD_MIN_BLOCKS 6            // 100 KB (sm_86, sm_89, sm_120)
#endif
#endif
#define UNZSTD_COUNT_THREADS 64        // threads a block of the counting kernel
#define UNZSTD_LIST_THREADS 16         // threads a block of the sequence kernel (their tables fill the block's shared memory)
#define ZSTD_BLOCK_LIMIT (128u << 10)  // largest block content
#define ZSTD_WINDOW_LIMIT (1u << 27)   // largest window accepted (the reference library's default limit)
#define ZSTD_SEQ_BATCH 32              // sequences the warp checks and executes at once
#define ZSTD_HUF_WINDOW 256            // staged bytes of each Huffman stream per round
#define ZSTD_LANE_COPY 256             // sequences longer than this are copied by the whole warp
// A sequence in a list: ll | ml << 18 | off << 36. Lengths are below 2^18;
// an offset over ZSTD_LIST_OFF_MAX is over every window accepted too, so it
// is kept as that (still refused, by the warp's check).
#define ZSTD_LIST_OFF_MAX ((1u << 28) - 1)

// Literal-length and match-length codes: baselines and extra bits (RFC 8878, 3.1.1.3.2.1.1).
__constant__ const u32 ZSTD_LL_BASE[36] = {0,  1,  2,  3,  4,  5,  6,  7,  8,   9,   10,  11,   12,   13,   14,   15,   16,    18,
                                         20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
__constant__ const u8 ZSTD_LL_BITS[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  1,  1,
                                        1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
__constant__ const u32 ZSTD_ML_BASE[53] = {3,  4,  5,  6,  7,  8,  9,  10, 11, 12,  13,  14,  15,  16,   17,   18,   19,   20,
                                         21, 22, 23, 24, 25, 26, 27, 28, 29, 30,  31,  32,  33,  34,   35,   37,   39,   41,
                                         43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
__constant__ const u8 ZSTD_ML_BITS[53] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
// Predefined distributions (RFC 8878, 3.1.1.3.2.2).
__constant__ const i16 ZSTD_LL_DEFAULT[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2,
                                            2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
__constant__ const i16 ZSTD_ML_DEFAULT[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
__constant__ const i16 ZSTD_OF_DEFAULT[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                            1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};

// What the Huffman table builder works in: normalized counts, the next
// state per symbol, the weights and the FSE table they are coded with.
struct ZstdScratch {
  i16 norm[256];
  u16 next[256];
  u8 weights[256];
  u32 weight_table[64];
};

// Staged Huffman stream bytes, as words so that a refill is two aligned
// loads; the extra word lets a refill read past the staged bytes (bits
// above the reader's position, never used, so whatever they hold is
// harmless).
struct ZstdWindows {
  u64 huf[4][ZSTD_HUF_WINDOW / 8 + 1];   // Huffman stream bytes [huf_lo[s], huf_hi[s])
};

// Everything a warp keeps for its page. Shared memory bounds how many pages
// an SM decodes at once, so the builder's scratch, dead before any window
// is staged, shares memory with the windows.
struct ZstdWarp {
  u16 huf[2048];         // Huffman decoding table: symbol | bits << 8 (RFC 8878: at most 11 bits)
  union {
    ZstdScratch build;
    ZstdWindows staged;
  };
  const u8* huf_src[4];
  i32 huf_lo[4], huf_hi[4];
  // Lane 0's plans for the warp, read by every lane after a __syncwarp.
  u32 reason;            // CheckReason, final for the page once set
  u32 action;            // what the warp does next (ZstdAction)
  u32 op;                // output position of a raw or RLE block
  u32 len;               // bytes of a raw or RLE block
  const u8* src;         // raw block bytes
  const u8* lits;        // the block's raw literals in the input
  u32 lit_kind;          // 0 raw, 1 RLE, 2 Huffman
  u32 lit_at;            // output offset of Huffman-decoded literals
  u8 rle;
  // The block's sequences: its list (nseq sequences, then the list
  // decoder's reason), and what every one is checked against.
  const u64* seq_list;
  u32 nseq, seq_reason;
  u32 rep_start[3];      // the repeat offsets before the block (a page decoded apart: its symbolic offsets' bases)
  u32 block_op, lit_size, room, frame_start, window;
  u32 seq_done, lit_used, matched;   // the block's sequences executed, their literals and match bytes
  u32 streams;           // Huffman streams of the literals (0: none)
  u32 huf_log;
  u32 stream_at[4], stream_len[4];   // input offsets and sizes of the streams
  u32 stream_out[4], stream_count[4];  // output positions and symbol counts
  u32 stream_reason[4];
};

enum ZstdAction : u32 {
  ZSTD_DONE = 0,        // the page is finished (reason says how)
  ZSTD_COPY_RAW = 1,    // copy `len` bytes from `src` to `op`
  ZSTD_FILL_RLE = 2,    // write `len` copies of `rle` at `op`
  ZSTD_LITERALS = 3,    // decode the Huffman streams
  ZSTD_SEQUENCES = 4,   // execute the block's sequences, then copy its last literals
  ZSTD_START = 5,       // nothing yet: lane 0 plans the first block
};

GPQ_DEVICE u32 zstd_highbit(u32 v) { return 31 - __clz(v); }   // v > 0

// 8 bytes of p[0, len) from byte `at` on, little-endian, zero past the end.
GPQ_DEVICE u64 zstd_load8(const u8* p, u32 len, u32 at) {
  u64 v = 0;
  for (u32 k = 0; k < 8; k++) {
    u32 q = at + k;
    if (q < len) v |= (u64)p[q] << (8 * k);
  }
  return v;
}

// A backward bitstream (RFC 8878, 4.1): read from its end towards its start,
// after the padding bits of its last byte. Bits before the start read as
// zeros; `pos` then goes negative, which is an error for every stream the
// format has except the Huffman weights' (whose end is found that way).
struct ZstdBits {
  const u8* p;
  u32 len;
  i32 pos;   // bits not yet read: [0, pos)
  i32 lo;    // `win` holds stream bits [lo, lo + 64)
  u64 win;
  const u64* staged;  // stream bytes [staged_lo, staged_hi) in shared memory, or null
  i32 staged_lo, staged_hi;
  // The byte the next refill starts at.
  GPQ_DEVICE i32 refill_start() const {
    i32 top = (pos + 7) >> 3;
    return top > 8 ? top - 8 : 0;
  }
  GPQ_DEVICE void refill() {
    i32 start = refill_start();
    if (staged && start >= staged_lo) {
      // start < staged_hi, and bytes at or past staged_hi lie above `pos`
      // (never read): the two words are inside the window's array.
      u32 i = (u32)(start - staged_lo), a = i >> 3, sh = 8 * (i & 7);
      u64 v = staged[a];
      win = sh ? (v >> sh) | (staged[a + 1] << (64 - sh)) : v;
    } else {
      // Two aligned words where both lie inside the stream, else byte by byte.
      const u8* q = p + start;
      const u64* w = (const u64*)((unsigned long long)q & ~7ull);
      u32 sh = 8 * (u32)((unsigned long long)q & 7);
      if ((const u8*)w >= p && (const u8*)(w + 2) <= p + len) {
        win = sh ? (w[0] >> sh) | (w[1] << (64 - sh)) : w[0];
      } else {
        win = zstd_load8(p, len, (u32)start);
      }
    }
    lo = 8 * start;
  }
  // Fails on an empty stream or one whose last byte holds no end marker.
  GPQ_DEVICE bool init(const u8* stream, u32 n) {
    p = stream;
    len = n;
    staged = nullptr;
    staged_lo = staged_hi = 0;
    if (n == 0 || stream[n - 1] == 0) return false;
    pos = 8 * (i32)(n - 1) + (i32)zstd_highbit(stream[n - 1]);
    refill();
    return true;
  }
  GPQ_DEVICE u32 peek(u32 n) {   // n <= 32
    i32 from = pos - (i32)n;
    if (from < lo && lo > 0) refill();
    if (from >= lo) return (u32)((win >> (from - lo)) & ((1ull << n) - 1));
    if (pos <= 0) return 0;
    return (u32)((win & ((1ull << pos) - 1)) << (n - (u32)pos));   // lo == 0: zeros below the start
  }
  GPQ_DEVICE void skip(u32 n) { pos -= (i32)n; }
  GPQ_DEVICE u32 read(u32 n) {
    u32 v = peek(n);
    pos -= (i32)n;
    return v;
  }
  // The window of `size` bytes the next refills read from: [lo, hi).
  GPQ_DEVICE void window(i32 size, i32& wlo, i32& whi) const {
    whi = (pos + 7) >> 3;
    if (whi > (i32)len) whi = (i32)len;
    wlo = whi > size ? whi - size : 0;
  }
};

// The sequence kernel's backward bitstream: as ZstdBits (without staged
// windows), but a refill's two aligned words are held in registers and the
// word below them is loaded one refill ahead, so that a refill in the
// chain of dependent steps waits for no load. A refill moves the window
// down by at most 8 bytes (at most 64 bits are read between two), so the
// next refill needs the words it holds or the one loaded ahead.
struct ZstdAheadBits {
  const u8* p;
  const u8* base;   // p rounded down to 8 bytes: word k is base[8k, 8k + 8)
  u32 len;
  i32 pos;          // bits not yet read: [0, pos)
  i32 lo;           // `win` holds stream bits [lo, lo + 64)
  u64 win;
  i32 k;            // w0 is word k, w1 word k + 1, ahead word k - 1
  u64 w0, w1, ahead;
  // Word j, with zeros for the bytes outside the stream: a load where the
  // word lies inside it, else byte by byte (the stream's first and last
  // words).
  GPQ_DEVICE u64 word(i32 j) const {
    const u8* q = base + 8 * (i64)j;
    if (q >= p && q + 8 <= p + len) return *(const u64*)q;
    u64 v = 0;
    for (u32 b = 0; b < 8; b++) {
      const u8* c = q + b;
      if (c >= p && c < p + len) v |= (u64)*c << (8 * b);
    }
    return v;
  }
  GPQ_DEVICE void refill() {
    i32 top = (pos + 7) >> 3, start = top > 8 ? top - 8 : 0;
    u32 at = (u32)(p - base) + (u32)start;
    i32 j = (i32)(at >> 3);
    u32 sh = 8 * (at & 7);
    if (j != k) {
      if (j == k - 1) {
        w1 = w0;
        w0 = ahead;
      } else {
        w0 = word(j);
        w1 = word(j + 1);
      }
      ahead = word(j - 1);
      k = j;
    }
    win = sh ? (w0 >> sh) | (w1 << (64 - sh)) : w0;
    lo = 8 * start;
  }
  // Fails on an empty stream or one whose last byte holds no end marker.
  GPQ_DEVICE bool init(const u8* stream, u32 n) {
    p = stream;
    base = (const u8*)((unsigned long long)stream & ~7ull);
    len = n;
    k = -8;
    if (n == 0 || stream[n - 1] == 0) return false;
    pos = 8 * (i32)(n - 1) + (i32)zstd_highbit(stream[n - 1]);
    refill();
    return true;
  }
  GPQ_DEVICE u32 read(u32 n) {   // n <= 32
    i32 from = pos - (i32)n;
    if (from < lo && lo > 0) refill();
    u32 v;
    if (from >= lo) v = (u32)((win >> (from - lo)) & ((1ull << n) - 1));
    else if (pos <= 0) v = 0;
    else v = (u32)((win & ((1ull << pos) - 1)) << (n - (u32)pos));   // lo == 0: zeros below the start
    pos = from;
    return v;
  }
};

// Reads an FSE table description (RFC 8878, 4.1.1) from p[0, avail):
// normalized counts into `norm`, with the largest symbol and the accuracy.
// `used` is set to the bytes it takes.
GPQ_DEVICE u32 zstd_read_ncount(const u8* p, u32 avail, i16* norm, u32 max_symbol, u32 max_log, u32& max_sv, u32& log,
                                u32& used) {
  if (avail == 0) return CHECK_TRUNCATED;
  u64 bit = 0;
  u64 limit = 8ull * avail;
  auto get = [&](u32 n) -> u32 {   // the next n <= 16 bits, zeros past the input
    u32 byte = (u32)(bit >> 3), shift = (u32)(bit & 7);
    u32 v = 0;
    for (u32 k = 0; k < 4; k++)
      if (byte + k < avail) v |= (u32)p[byte + k] << (8 * k);
    return (v >> shift) & ((1u << n) - 1);
  };
  u32 nb = get(4) + 5;
  bit = 4;
  if (nb > max_log) return CHECK_BAD_HEADER;
  log = nb;
  i32 remaining = (1 << nb) + 1, threshold = 1 << nb;
  nb++;
  u32 symbol = 0;
  bool previous0 = false;
  while (remaining > 1 && symbol <= max_symbol) {
    if (bit > limit) return CHECK_TRUNCATED;
    if (previous0) {
      u32 zeros = symbol;
      for (;;) {   // each pass consumes 2 bits and the run is bounded by max_symbol
        u32 flag = get(2);
        bit += 2;
        if (bit > limit) return CHECK_TRUNCATED;
        zeros += flag;
        if (zeros > max_symbol + 1) return CHECK_BAD_HEADER;
        if (flag != 3) break;
      }
      if (zeros > max_symbol) return CHECK_BAD_HEADER;
      while (symbol < zeros) norm[symbol++] = 0;
    }
    i32 max = (2 * threshold - 1) - remaining;
    u32 v = get(nb);
    i32 count;
    if ((i32)(v & (threshold - 1)) < max) {
      count = (i32)(v & (threshold - 1));
      bit += nb - 1;
    } else {
      count = (i32)(v & (2 * threshold - 1));
      if (count >= threshold) count -= max;
      bit += nb;
    }
    count--;
    remaining -= count < 0 ? -count : count;
    norm[symbol++] = (i16)count;
    previous0 = count == 0;
    while (remaining < threshold) {
      nb--;
      threshold >>= 1;
    }
  }
  if (remaining != 1 || bit > limit) return CHECK_BAD_HEADER;
  max_sv = symbol - 1;
  used = (u32)((bit + 7) >> 3);
  return CHECK_OK;
}

// What an FSE table is for: the extra bits its symbols take after them
// (sequence codes, RFC 8878, 3.1.1.3.2.1.1) differ.
enum ZstdFseKind : u32 { ZSTD_FSE_WEIGHTS = 0, ZSTD_FSE_LL = 1, ZSTD_FSE_ML = 2, ZSTD_FSE_OF = 3 };

// An FSE table entry of the Huffman weights' table: the symbol, the bits
// of the next state and the next state's base.
GPQ_DEVICE u32 zstd_fse_symbol(u32 e) { return e & 0xff; }
GPQ_DEVICE u32 zstd_fse_bits(u32 e) { return (e >> 8) & 15; }
GPQ_DEVICE u32 zstd_fse_base(u32 e) { return e >> 17; }
GPQ_DEVICE void zstd_fse_put(u32* table, u32 u, u32 symbol, u32 state, u32 log) {
  u32 bits = log - zstd_highbit(state);
  table[u] = symbol | (bits << 8) | (((state << bits) - (1u << log)) << 17);
}
// An entry of a sequence code's table: the symbol (below 64) and the state
// it was given while the table was built (1 to 2^(log+1) - 1). The next
// state's bits and base follow from the state and the table's accuracy, so
// an entry takes 16 bits and a thread's three tables 2.5 KB: twice as many
// threads' tables fit an SM's shared memory as with 32-bit entries.
GPQ_DEVICE void zstd_fse_put(u16* table, u32 u, u32 symbol, u32 state, u32) { table[u] = (u16)(symbol | (state << 6)); }
GPQ_DEVICE u32 zstd_seq_symbol(u32 e) { return e & 63; }
GPQ_DEVICE u32 zstd_state_bits(u32 e, u32 log) { return log - zstd_highbit(e >> 6); }
GPQ_DEVICE u32 zstd_state_base(u32 e, u32 bits, u32 log) { return ((e >> 6) << bits) - (1u << log); }

// Builds an FSE decoding table of 2^log entries (log <= 9) from
// normalized counts of symbols up to max_sv.
template <typename Entry>
GPQ_DEVICE u32 zstd_build_fse(Entry* table, const i16* norm, u32 max_sv, u32 log, u16* next) {
  u32 size = 1u << log, high = size - 1;
  for (u32 s = 0; s <= max_sv; s++) {
    if (norm[s] == -1) {
      if (high == 0) return CHECK_BAD_HEADER;
      table[high--] = (Entry)s;
      next[s] = 1;
    } else {
      next[s] = (u16)norm[s];
    }
  }
  u32 step = (size >> 1) + (size >> 3) + 3, mask = size - 1, pos = 0;
  for (u32 s = 0; s <= max_sv; s++) {
    for (i32 k = 0; k < norm[s]; k++) {
      table[pos] = (Entry)s;
      u32 guard = 0;
      do {
        pos = (pos + step) & mask;
      } while (pos > high && ++guard < size);
    }
  }
  if (pos != 0) return CHECK_BAD_HEADER;
  for (u32 u = 0; u < size; u++) {
    u32 s = table[u] & 0xff;
    u32 state = next[s]++;
    if (state == 0) return CHECK_BAD_HEADER;
    zstd_fse_put(table, u, s, state, log);
  }
  return CHECK_OK;
}

// Sequence codes' extra bits and baselines in one word (base | bits << 24),
// one table for literal lengths and one for match lengths; offsets' extra
// bits are their code.
GPQ_DEVICE u32 zstd_code_info(u32 base, u32 bits) { return base | (bits << 24); }
GPQ_DEVICE u32 zstd_info_base(u32 v) { return v & 0xffffff; }
GPQ_DEVICE u32 zstd_info_bits(u32 v) { return v >> 24; }

// Builds the FSE table of one kind of sequence code (literal lengths,
// offsets or match lengths) for `mode` 0 to 2, from p[0, avail), with
// `norm` and `next` to work in; `used` is set to the bytes its description
// takes.
GPQ_DEVICE u32 zstd_seq_table(u16* table, i16* norm, u16* next, u32 kind, u32 mode, const u8* p, u32 avail, u32& log, u32& used) {
  used = 0;
  u32 max_symbol = kind == ZSTD_FSE_LL ? 35 : kind == ZSTD_FSE_ML ? 52 : 31;
  if (mode == 0) {   // predefined
    const i16* defaults = kind == ZSTD_FSE_LL ? ZSTD_LL_DEFAULT : kind == ZSTD_FSE_ML ? ZSTD_ML_DEFAULT : ZSTD_OF_DEFAULT;
    u32 count = kind == ZSTD_FSE_LL ? 36 : kind == ZSTD_FSE_ML ? 53 : 29;
    for (u32 s = 0; s < count; s++) norm[s] = defaults[s];
    log = kind == ZSTD_FSE_OF ? 5 : 6;
    return zstd_build_fse(table, norm, count - 1, log, next);
  }
  if (mode == 1) {   // RLE: one symbol, no bits
    if (avail < 1) return CHECK_TRUNCATED;
    if (p[0] > max_symbol) return CHECK_BAD_HEADER;
    log = 0;
    zstd_fse_put(table, 0, p[0], 1, 0);
    used = 1;
    return CHECK_OK;
  }
  // FSE-compressed
  u32 max_sv = 0;
  u32 r = zstd_read_ncount(p, avail, norm, max_symbol, kind == ZSTD_FSE_OF ? 8 : 9, max_sv, log, used);
  if (r) return r;
  return zstd_build_fse(table, norm, max_sv, log, next);
}

// Reads a Huffman tree description (RFC 8878, 4.2.1) from p[0, avail) and
// fills z.huf; `used` is set to the bytes it takes.
GPQ_DEVICE u32 zstd_huffman_table(ZstdWarp& z, const u8* p, u32 avail, u32& log, u32& used) {
  if (avail < 1) return CHECK_TRUNCATED;
  u32 header = p[0], count = 0;
  if (header < 128) {   // FSE-compressed weights
    u32 size = header;
    if (size + 1 > avail || size == 0) return CHECK_TRUNCATED;
    u32 max_sv = 0, wlog = 0, nc = 0;
    u32 r = zstd_read_ncount(p + 1, size, z.build.norm, 255, 6, max_sv, wlog, nc);
    if (r) return r;
    r = zstd_build_fse(z.build.weight_table, z.build.norm, max_sv, wlog, z.build.next);
    if (r) return r;
    ZstdBits b;
    if (nc >= size || !b.init(p + 1 + nc, size - nc)) return CHECK_BAD_HEADER;
    u32 s1 = b.read(wlog), s2 = b.read(wlog);
    // Two states take turns; the weights end where the stream runs out
    // (the state read past its start gives no weight, the other one does).
    for (;;) {
      if (count > 253) return CHECK_BAD_HEADER;
      u32 e = z.build.weight_table[s1];
      z.build.weights[count++] = (u8)e;
      s1 = zstd_fse_base(e) + b.read(zstd_fse_bits(e));
      if (b.pos < 0) {
        z.build.weights[count++] = (u8)z.build.weight_table[s2];
        break;
      }
      if (count > 253) return CHECK_BAD_HEADER;
      e = z.build.weight_table[s2];
      z.build.weights[count++] = (u8)e;
      s2 = zstd_fse_base(e) + b.read(zstd_fse_bits(e));
      if (b.pos < 0) {
        z.build.weights[count++] = (u8)z.build.weight_table[s1];
        break;
      }
    }
    used = 1 + size;
  } else {   // 4-bit weights
    count = header - 127;
    u32 size = (count + 1) / 2;
    if (size + 1 > avail) return CHECK_TRUNCATED;
    for (u32 k = 0; k < count; k++) {
      u8 b = p[1 + k / 2];
      z.build.weights[k] = k % 2 == 0 ? b >> 4 : b & 15;
    }
    used = 1 + size;
  }
  // The last weight is implied: it completes the total to a power of two.
  u32 total = 0, rank1 = 0;
  for (u32 k = 0; k < count; k++) {
    u32 w = z.build.weights[k];
    if (w > 12) return CHECK_BAD_HEADER;
    total += (1u << w) >> 1;
    rank1 += w == 1;
  }
  if (total == 0) return CHECK_BAD_HEADER;
  log = zstd_highbit(total) + 1;
  if (log > 12) return CHECK_BAD_HEADER;
  if (log > 11) return CHECK_UNSUPPORTED;   // the format's limit; the reference library takes 12, so the CPU decides
  u32 rest = (1u << log) - total;
  u32 last = zstd_highbit(rest) + 1;
  if ((1u << (last - 1)) != rest) return CHECK_BAD_HEADER;
  z.build.weights[count++] = (u8)last;
  rank1 += last == 1;
  if (rank1 < 2 || (rank1 & 1)) return CHECK_BAD_HEADER;
  // Codes by weight, lightest first, then by symbol: each symbol of weight
  // w fills 2^(w-1) entries of the 2^log table.
  u16* start = z.build.next;   // free again once the weights are decoded (shared: an indexed local array is slow)
  for (u32 w = 0; w < 13; w++) start[w] = 0;
  for (u32 s = 0; s < count; s++) start[z.build.weights[s]]++;   // counts first, then where each weight's codes begin
  u32 at = 0;
  for (u32 w = 1; w <= 12; w++) {
    u32 n = start[w];
    start[w] = (u16)at;
    at += n << (w - 1);
  }
  for (u32 s = 0; s < count; s++) {
    u32 w = z.build.weights[s];
    if (w == 0) continue;
    u32 n = 1u << (w - 1), at = start[w];
    u16 e = (u16)(s | ((log + 1 - w) << 8));
    for (u32 k = 0; k < n; k++) z.huf[at + k] = e;
    start[w] = (u16)(at + n);
  }
  return CHECK_OK;
}

// How the sequence table of one kind in use was described: its mode (0
// predefined, 1 RLE, 2 FSE-compressed; ZSTD_NO_TABLE: none yet in this
// frame), and where the description lies: in[at, at + avail), the rest of
// its block (kept for a block decoded apart, which builds the table an
// earlier block described; see zstd_list_apart).
struct ZstdTableDesc {
  u32 mode, at, avail;
};
#define ZSTD_NO_TABLE 4u

// Where a walk through a page's frames and blocks stands. The counting and
// list kernels keep it in registers; the warp kernel's lane 0 keeps it in
// shared memory (held in registers, its fields would raise the whole
// kernel's register count, and so lower the warps an SM runs, for the sake
// of cold code).
struct ZstdPage {
  const u8* in;
  u32 in_len, out_len;
  u32 ip, op;                // input and output positions
  u32 frame_start, window, block_max;
  u64 fcs;
  bool has_fcs, last_block, in_frame;
  // The block being decoded.
  u32 block_end, block_start_op;
  // The list kernel's: the sequence tables a later block may repeat, and
  // the repeat offsets.
  ZstdTableDesc ll_desc, of_desc, ml_desc;
  u32 ll_log, of_log, ml_log;
  u32 rep0, rep1, rep2;
  // The warp kernel's: the Huffman tree description in use (huf_avail 0:
  // none yet), and the page's sequence list, read from `list_at` on. For a
  // page whose blocks were decoded apart (ZSTD_LIST_APART in `written`),
  // `written` says which blocks' lists are complete and `block_k` counts
  // the compressed blocks so far; the warp keeps the repeat offsets.
  u32 huf_at, huf_avail, huf_log;
  const u64* list;
  u32 list_at, list_len;
  u64 written;
  u32 block_k;
};

// A new frame starts without tables to repeat.
GPQ_DEVICE void zstd_forget_tables(ZstdPage& p) {
  p.ll_desc.mode = p.of_desc.mode = p.ml_desc.mode = ZSTD_NO_TABLE;
  p.huf_avail = 0;
}

// Parses a frame header at p.ip (or skips a skippable frame).
GPQ_DEVICE u32 zstd_frame_header(ZstdPage& p) {
  const u8* in = p.in;
  for (;;) {
    if (p.ip == p.in_len) return CHECK_OK;   // no more frames
    if (p.in_len - p.ip < 5) return CHECK_TRUNCATED;
    u32 magic = in[p.ip] | (in[p.ip + 1] << 8) | (in[p.ip + 2] << 16) | ((u32)in[p.ip + 3] << 24);
    if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) {   // skippable frame
      if (p.in_len - p.ip < 8) return CHECK_TRUNCATED;
      u32 size = in[p.ip + 4] | (in[p.ip + 5] << 8) | (in[p.ip + 6] << 16) | ((u32)in[p.ip + 7] << 24);
      if (size > p.in_len - p.ip - 8) return CHECK_TRUNCATED;
      p.ip += 8 + size;
      continue;
    }
    if (magic != 0xFD2FB528u) return CHECK_BAD_HEADER;
    u32 fhd = in[p.ip + 4];
    p.ip += 5;
    u32 fcs_flag = fhd >> 6, single = (fhd >> 5) & 1, checksum = (fhd >> 2) & 1, dict = fhd & 3;
    if (fhd & 8) return CHECK_BAD_HEADER;
    if (checksum) return CHECK_UNSUPPORTED;   // the content checksum is left to the CPU decoder
    u64 window = 0;
    if (!single) {
      if (p.ip >= p.in_len) return CHECK_TRUNCATED;
      u32 wd = in[p.ip++];
      u32 wlog = 10 + (wd >> 3);
      if (wlog > 27) return CHECK_UNSUPPORTED;
      window = (1ull << wlog) + ((1ull << wlog) >> 3) * (wd & 7);
    }
    if (dict) {
      u32 n = dict == 3 ? 4 : dict;
      if (p.in_len - p.ip < n) return CHECK_TRUNCATED;
      u32 id = 0;
      for (u32 k = 0; k < n; k++) id |= (u32)in[p.ip + k] << (8 * k);
      p.ip += n;
      if (id != 0) return CHECK_UNSUPPORTED;
    }
    u32 fcs_len = fcs_flag == 0 ? single : fcs_flag == 1 ? 2 : fcs_flag == 2 ? 4 : 8;
    p.has_fcs = fcs_len > 0;
    p.fcs = 0;
    if (fcs_len) {
      if (p.in_len - p.ip < fcs_len) return CHECK_TRUNCATED;
      for (u32 k = 0; k < fcs_len; k++) p.fcs |= (u64)in[p.ip + k] << (8 * k);
      p.ip += fcs_len;
      if (fcs_len == 2) p.fcs += 256;
      if (p.fcs > p.out_len - p.op) return CHECK_OUTPUT_OVERRUN;
    }
    if (single) window = p.fcs;
    if (window > ZSTD_WINDOW_LIMIT) return CHECK_UNSUPPORTED;
    p.window = (u32)window;
    p.block_max = p.window < ZSTD_BLOCK_LIMIT ? p.window : ZSTD_BLOCK_LIMIT;
    p.frame_start = p.op;
    p.in_frame = true;
    p.last_block = false;
    zstd_forget_tables(p);
    p.rep0 = 1;
    p.rep1 = 4;
    p.rep2 = 8;
    return CHECK_OK;
  }
}

// The next block of the page: ends the frame after its last block (checking
// its size with `sizes`), starts the next frame, and parses the block's
// header. Returns CHECK_OK with `type` ZSTD_END once the input is used up
// (with `sizes`, the output must be complete then). p.ip is left after the
// block header; a raw or RLE block's bytes are checked to be there.
// Without `sizes` (the counting kernel, which does not know the output
// position) nothing depending on p.op is checked but what cannot pass
// anyway, so it walks at least as far as the others.
#define ZSTD_END 4u
GPQ_DEVICE u32 zstd_next_block(ZstdPage& p, bool sizes, u32& type, u32& size) {
  const u8* in = p.in;
  if (!p.in_frame || p.last_block) {
    if (p.in_frame) {   // the frame just ended
      if (sizes && p.has_fcs && p.op - p.frame_start != p.fcs) return CHECK_SIZE_MISMATCH;
      p.in_frame = false;
    }
    u32 r = zstd_frame_header(p);
    if (r) return r;
    if (!p.in_frame) {   // all input consumed
      if (sizes && p.op != p.out_len) return CHECK_SIZE_MISMATCH;
      type = ZSTD_END;
      return CHECK_OK;
    }
  }
  if (p.in_len - p.ip < 3) return CHECK_TRUNCATED;
  u32 bh = in[p.ip] | (in[p.ip + 1] << 8) | (in[p.ip + 2] << 16);
  p.ip += 3;
  p.last_block = bh & 1;
  type = (bh >> 1) & 3;
  size = bh >> 3;
  if (type == 3) return CHECK_BAD_HEADER;
  if (size > p.block_max) return CHECK_BAD_HEADER;
  if (type < 2) {   // raw or RLE: the size is the output
    if (size > p.out_len - p.op) return CHECK_OUTPUT_OVERRUN;
    u32 stored = type == 0 ? size : 1;
    if (stored > p.in_len - p.ip) return CHECK_TRUNCATED;
    return CHECK_OK;
  }
  if (size > p.in_len - p.ip) return CHECK_TRUNCATED;
  if (size < 2) return CHECK_BAD_HEADER;
  p.block_end = p.ip + size;
  p.block_start_op = p.op;
  return CHECK_OK;
}

// A compressed block's literals section header (RFC 8878, 3.1.1.3.1).
struct ZstdLiterals {
  u32 type;      // 0 raw, 1 RLE, 2 Huffman, 3 Huffman with the previous tree
  u32 size;      // literals
  u32 hlen;      // header bytes
  u32 csize;     // Huffman: the tree and streams' bytes
  u32 streams;   // Huffman: 1 or 4
  u32 section;   // bytes of the whole section
};

// Parses the literals section header of the block at b[0, size) (size >= 2)
// whose output may take `room` bytes.
GPQ_DEVICE u32 zstd_literals_header(const u8* b, u32 size, u32 room, ZstdLiterals& l) {
  u32 h0 = b[0], fmt = (h0 >> 2) & 3;
  l.type = h0 & 3;
  l.csize = 0;
  l.streams = 0;
  if (l.type < 2) {
    if (fmt == 0 || fmt == 2) { l.size = h0 >> 3; l.hlen = 1; }
    else if (fmt == 1) { l.size = (h0 | (b[1] << 8)) >> 4; l.hlen = 2; }
    else { if (size < 3) return CHECK_TRUNCATED; l.size = (h0 | (b[1] << 8) | (b[2] << 16)) >> 4; l.hlen = 3; }
    if (l.size > room) return CHECK_OUTPUT_OVERRUN;
    u32 stored = l.type == 0 ? l.size : 1;
    if (l.hlen + stored > size) return CHECK_TRUNCATED;
    l.section = l.hlen + stored;
    return CHECK_OK;
  }
  if (size < 5) return CHECK_TRUNCATED;
  l.hlen = fmt <= 1 ? 3 : fmt == 2 ? 4 : 5;
  u64 h = 0;
  for (u32 k = 0; k < l.hlen; k++) h |= (u64)b[k] << (8 * k);
  u32 bits = fmt <= 1 ? 10 : fmt == 2 ? 14 : 18;
  l.size = (u32)((h >> 4) & ((1u << bits) - 1));
  l.csize = (u32)((h >> (4 + bits)) & ((1u << bits) - 1));
  l.streams = fmt == 0 ? 1 : 4;
  if (l.size > room) return CHECK_OUTPUT_OVERRUN;
  if (l.streams == 4 && l.size < 6) return CHECK_BAD_HEADER;
  if (l.hlen + l.csize > size) return CHECK_TRUNCATED;
  l.section = l.hlen + l.csize;
  return CHECK_OK;
}

// The number of sequences (RFC 8878, 3.1.1.3.2.1) at in[at, end); moves
// `at` past it.
GPQ_DEVICE u32 zstd_sequence_count(const u8* in, u32& at, u32 end, u32& nseq) {
  if (at >= end) return CHECK_TRUNCATED;
  nseq = in[at++];
  if (nseq >= 128) {
    if (nseq == 255) {
      if (end - at < 2) return CHECK_TRUNCATED;
      nseq = (in[at] | (in[at + 1] << 8)) + 0x7F00;
      at += 2;
    } else {
      if (at >= end) return CHECK_TRUNCATED;
      nseq = ((nseq - 128) << 8) + in[at++];
    }
  }
  return CHECK_OK;
}

// A walk's start at the beginning of a page.
GPQ_DEVICE void zstd_start_page(ZstdPage& p, const u8* in, u32 in_len, u32 out_len) {
  p.in = in;
  p.in_len = in_len;
  p.out_len = out_len;
  p.ip = p.op = 0;
  p.in_frame = p.last_block = false;
  zstd_forget_tables(p);
  p.huf_log = p.ll_log = p.of_log = p.ml_log = 0;
}

// The entries of a block's list at most: its heads (ZSTD_LIST_HEADS where
// the blocks of the page are decoded apart, else one), then a sequence
// each. The list kernel stops after the first sequence whose matches
// overrun the block (every match is 3 bytes or more).
#define ZSTD_LIST_HEADS 3u
GPQ_DEVICE u32 zstd_list_cap(const ZstdPage& p, u32 nseq, u32 heads) {
  u32 most = p.block_max / 3 + 1;
  return heads + (nseq < most ? nseq : most);
}

// A page decoded block by block: `written` has this bit and a bit for each
// compressed block whose list is complete (at most ZSTD_APART_MAX blocks).
#define ZSTD_LIST_APART (1ull << 63)
#define ZSTD_APART_MAX 63u
// A work item of the list kernel: page | block << 32, the block being
// the page's k-th compressed block, or ZSTD_ITEM_PAGE for the whole page.
#define ZSTD_ITEM_PAGE 0xffffffffu
// A list entry whose offset repeats one from before its block (blocks
// decoded apart): its literal length has this bit (no length reaches it),
// and its offset is j | d << 2, the block's first repeat offset j less d.
#define ZSTD_LIST_SYMBOLIC (1u << 17)

// The next block of a walk that decodes nothing (the counting kernel and
// the blocks decoded apart walk a page this way, so they agree on where
// each block's list is). Returns what zstd_next_block does; `type` is 2
// only for a compressed block whose literals header passed, and then `at`
// is where its sequences section starts, after their count `nseq` (when
// the count is there: not on failure). Raw and RLE blocks are passed over;
// a compressed block leaves p.ip at its start.
GPQ_DEVICE u32 zstd_walk_block(ZstdPage& p, u32& type, u32& nseq, u32& at) {
  u32 size = 0;
  nseq = 0;
  u32 r = zstd_next_block(p, false, type, size);
  if (r || type == ZSTD_END) {
    type = ZSTD_END;
    return r;
  }
  if (type < 2) {
    p.ip += type == 0 ? size : 1;
    p.op += size;
    return CHECK_OK;
  }
  ZstdLiterals l;
  r = zstd_literals_header(p.in + p.ip, size, p.block_max, l);
  if (r) {
    type = ZSTD_END;
    return r;
  }
  at = p.ip + l.section;
  return zstd_sequence_count(p.in, at, p.block_end, nseq);
}

// Page i's arguments from nvCOMP's packed arrays (inputs, input sizes,
// output sizes, outputs); false for a page too large for the decoders' u32
// positions.
GPQ_DEVICE bool zstd_page_args(const u64* args, u32 num_pages, u32 i, const u8*& in, u32& in_len, u32& out_len, u8*& out) {
  in = (const u8*)args[i];
  u64 il = args[num_pages + i], ol = args[2 * (u64)num_pages + i];
  out = (u8*)args[3 * (u64)num_pages + i];
  in_len = (u32)il;
  out_len = (u32)ol;
  return il < (1ull << 31) && ol < (1ull << 31);
}

// A thread per page: counts[i] gets the entries page i's sequence list
// needs at most (0 for a page the warp refuses before any list), and
// counts[num_pages + i] the number of its compressed blocks when they are
// to be decoded apart (else 0). Besides each block's cap (zstd_list_cap),
// the page's output bounds the whole: every block the list kernel finishes
// fits the output left (it stops at the first sequence that does not), and
// each sequence matches 3 bytes or more, so those blocks hold at most
// out_len / 3 sequences, and the block it stops in as many and one more.
// A page of 1 to ZSTD_APART_MAX compressed blocks whose caps fit that bound
// (every valid page's do) has its blocks decoded apart, each list at a
// fixed place: the caps with their heads, in block order. So nearly every
// item of the list kernel takes the same path (zstd_list_apart), and the
// threads of a warp decode side by side.
extern "C" __global__ void __launch_bounds__(UNZSTD_COUNT_THREADS) gpq_unzstd_count(const u64* args, u32 num_pages, u32* counts) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= num_pages) return;
  const u8* in;
  u8* out;
  u32 in_len, out_len;
  u64 entries = 0, blocks = 0;
  u32 apart = 0;
  if (zstd_page_args(args, num_pages, i, in, in_len, out_len, out) && in_len > 0) {
    ZstdPage p;
    // The output position is not known here (matches are not decoded): the
    // walk takes the output as larger than any, so that no check stops it
    // before the list kernel's walk stops.
    zstd_start_page(p, in, in_len, 0xFFFFFFFFu);
    // Each pass consumes 3 bytes of input or more, so the loop ends.
    for (;;) {
      u32 type = ZSTD_END, nseq = 0, at = 0;
      u32 r = zstd_walk_block(p, type, nseq, at);
      if (type == 2) {
        entries += zstd_list_cap(p, r == CHECK_OK ? nseq : 0, 1);
        blocks++;
      }
      if (r || type == ZSTD_END) break;
      if (type == 2) p.ip = p.block_end;
    }
    u64 most = 2 * (u64)(out_len / 3) + 1 + blocks;
    if (blocks >= 1 && blocks <= ZSTD_APART_MAX && entries <= most) {
      apart = (u32)blocks;
      entries += (ZSTD_LIST_HEADS - 1) * blocks;
    } else if (entries > most) {
      entries = most;
    }
  }
  counts[i] = (u32)entries;   // below 2^32: out_len < 2^31, and a block takes 5 input bytes or more
  counts[num_pages + i] = apart;
}

// One list kernel thread's sequence tables and its table builder's
// scratch (norm, next), in shared memory: each step of a block's chain of
// dependent steps waits on three lookups.
#define ZSTD_LIST_TABLE_WORDS 697   // 512 + 512 + 256 u16 entries (640 words), 56 + 56 u16 of scratch, and one word so that the threads' tables start in different banks
struct ZstdSeqTables {
  u16 *ll, *ml, *of;
  i16* norm;
  u16* next;
};

// The list kernel: the sequence table of one kind (its description `d`,
// its accuracy `log`, its entries `table`) for `mode` (3: the one an
// earlier block of the frame described), described at p.in[at, at +
// avail). A block decoded apart (APART) builds a repeated table from the
// earlier block's description; otherwise it is in `table` already. Each
// call names its kind's fields: chosen here by the kind, they would make
// the page state addressable, which puts it in local memory.
template <bool APART>
GPQ_DEVICE u32 zstd_list_table(ZstdSeqTables& tb, const ZstdPage& p, ZstdTableDesc& d, u32& log, u16* table, u32 kind, u32 mode, u32 at,
                               u32 avail, u32& used) {
  used = 0;
  if (mode == 3) {
    if (d.mode == ZSTD_NO_TABLE) return CHECK_BAD_HEADER;
    if (!APART) return CHECK_OK;
    u32 again = 0;
    return zstd_seq_table(table, tb.norm, tb.next, kind, d.mode, p.in + d.at, d.avail, log, again);
  }
  d.mode = mode;
  d.at = at;
  d.avail = avail;
  return zstd_seq_table(table, tb.norm, tb.next, kind, mode, p.in + at, avail, log, used);
}

// A walk before a block decoded apart: notes where the sequence tables of
// an earlier block (its sequences section at p.in[at, p.block_end), after
// the count `nseq`) are described, for a later block that repeats them.
// False where the block's descriptions cannot be read: the page fails
// there, so no later block is decoded.
GPQ_DEVICE bool zstd_note_tables(ZstdSeqTables& tb, ZstdPage& p, u32 at, u32 nseq) {
  if (nseq == 0) return true;
  u32 end = p.block_end;
  if (at >= end) return false;
  u32 modes = p.in[at++];
  if (modes & 3) return false;
  ZstdTableDesc* descs[3] = {&p.ll_desc, &p.of_desc, &p.ml_desc};
  for (u32 k = 0; k < 3; k++) {
    u32 mode = (modes >> (6 - 2 * k)) & 3, kind = k == 0 ? ZSTD_FSE_LL : k == 1 ? ZSTD_FSE_OF : ZSTD_FSE_ML;
    ZstdTableDesc& d = *descs[k];
    if (mode == 3) {
      if (d.mode == ZSTD_NO_TABLE) return false;
      continue;
    }
    d.mode = mode;
    d.at = at;
    d.avail = end - at;
    if (mode == 1) {
      if (at >= end) return false;
      at++;
    } else if (mode == 2) {
      u32 max_sv = 0, log = 0, used = 0;
      u32 max_symbol = kind == ZSTD_FSE_LL ? 35 : kind == ZSTD_FSE_ML ? 52 : 31;
      if (zstd_read_ncount(p.in + at, end - at, tb.norm, max_symbol, kind == ZSTD_FSE_OF ? 8 : 9, max_sv, log, used)) return false;
      at += used;
    }
  }
  return true;
}

// The list kernel: a block's sequence tables (from the sequences section
// at p.in[at, p.block_end), after the count `nseq`) and the start of its
// bitstream. For nseq 0, the section's verdict.
template <bool SYMBOLIC>
GPQ_DEVICE u32 zstd_list_tables(ZstdSeqTables& tb, ZstdPage& p, u32 at, u32 nseq, ZstdAheadBits& bits) {
  const u8* in = p.in;
  u32 end = p.block_end;
  if (nseq == 0) return at != end ? (u32)CHECK_BAD_HEADER : (u32)CHECK_OK;
  if (at >= end) return CHECK_TRUNCATED;
  u32 modes = in[at++];
  if (modes & 3) return CHECK_BAD_HEADER;
  u32 used = 0;
  u32 r = zstd_list_table<SYMBOLIC>(tb, p, p.ll_desc, p.ll_log, tb.ll, ZSTD_FSE_LL, modes >> 6, at, end - at, used);
  if (r) return r;
  at += used;
  r = zstd_list_table<SYMBOLIC>(tb, p, p.of_desc, p.of_log, tb.of, ZSTD_FSE_OF, (modes >> 4) & 3, at, end - at, used);
  if (r) return r;
  at += used;
  r = zstd_list_table<SYMBOLIC>(tb, p, p.ml_desc, p.ml_log, tb.ml, ZSTD_FSE_ML, (modes >> 2) & 3, at, end - at, used);
  if (r) return r;
  at += used;
  if (at > end || !bits.init(in + at, end - at)) return CHECK_BAD_HEADER;
  return CHECK_OK;
}

// The list kernel: one block's chain of dependent steps, its sequences
// decoded one a step into list[0, limit). The state lives in registers
// from one step to the next, so that a thread can hold its chain while the
// threads beside it take new items (see gpq_unzstd_sequences). With
// SYMBOLIC (a block decoded apart), the repeat offsets start as the
// block's own first three, unknown here: an offset that repeats one of
// them (`tag`: which of rep0..2 do) is written as ZSTD_LIST_SYMBOLIC.
struct ZstdChain {
  ZstdAheadBits bits;
  u32 ll_state, of_state, ml_state;
  u32 ll_log, of_log, ml_log;
  u32 rep0, rep1, rep2, tag;
  u64 lit_sum, match_sum;
  u32 s, nseq;   // sequences decoded, and in the block
  u32 trunc;     // the first sequence whose bits run past the stream's start (nseq: none)
  u32 count, limit;
  u64* list;
};

// Starts the chain of the block whose sequences section is at p.in[at,
// p.block_end) (after the count `nseq`): its tables and bitstream, then its
// first states. For a failure or no sequences, c.nseq is 0 (no step to run)
// and the section's verdict is returned.
template <bool SYMBOLIC>
GPQ_DEVICE u32 zstd_chain_begin(ZstdSeqTables& tb, ZstdPage& p, u32 at, u32 nseq, u64* list, u32 limit, ZstdChain& c) {
  c.s = c.nseq = c.count = 0;
  c.lit_sum = c.match_sum = 0;
  c.list = list;
  c.limit = limit;
  if (SYMBOLIC) {
    p.rep0 = 0;
    p.rep1 = 1;
    p.rep2 = 2;
  }
  c.rep0 = p.rep0;
  c.rep1 = p.rep1;
  c.rep2 = p.rep2;
  c.tag = SYMBOLIC ? 7 : 0;
  u32 r = zstd_list_tables<SYMBOLIC>(tb, p, at, nseq, c.bits);
  if (r != CHECK_OK || nseq == 0) return r;
  c.ll_log = p.ll_log;
  c.of_log = p.of_log;
  c.ml_log = p.ml_log;
  c.ll_state = c.bits.read(c.ll_log);
  c.of_state = c.bits.read(c.of_log);
  c.ml_state = c.bits.read(c.ml_log);
  c.nseq = c.trunc = nseq;
  return CHECK_OK;
}

// One step of a chain (c.s < c.nseq): decodes sequence c.s into the list.
// No branch depends on what a sequence decodes to (the checks come after
// the chain, in zstd_chain_end), so nothing waits for a step but the next
// step's lookups. CHECK_OUTPUT_OVERRUN where the list is full (the count
// said less, which it cannot): the warp refuses the page there.
template <bool SYMBOLIC>
GPQ_DEVICE u32 zstd_chain_step(ZstdChain& c, const ZstdSeqTables& tb, const u32* ll_info, const u32* ml_info) {
  ZstdAheadBits& bits = c.bits;
  const u16 *llt = tb.ll, *oft = tb.of, *mlt = tb.ml;
  u32 ll_log = c.ll_log, of_log = c.of_log, ml_log = c.ml_log;
  u32 ll_state = c.ll_state, of_state = c.of_state, ml_state = c.ml_state;
  u32 rep0 = c.rep0, rep1 = c.rep1, rep2 = c.rep2, tag = c.tag;
  u32 s = c.s, nseq = c.nseq;
  u32 lle = llt[ll_state], ofe = oft[of_state], mle = mlt[ml_state];
  // No symbol past its kind's codes is in a table (zstd_seq_table).
  u32 llc = zstd_seq_symbol(lle), ofc = zstd_seq_symbol(ofe), mlc = zstd_seq_symbol(mle);
  u32 lli = ll_info[llc], mli = ml_info[mlc];
  // The three fields (offset bits first, then match and literal length:
  // at most 31 + 16 + 16 bits) from the word at once, after at most one
  // refill; bit by bit only near the stream's start. One refill usually
  // serves the next states too.
  u32 mlb = zstd_info_bits(mli), llb = zstd_info_bits(lli), n1 = ofc + mlb + llb;
  u32 lln = zstd_state_bits(lle, ll_log), mln = zstd_state_bits(mle, ml_log), ofn = zstd_state_bits(ofe, of_log), n2 = lln + mln + ofn;
  if (bits.pos - bits.lo < (i32)(n1 + n2) && bits.lo > 0) bits.refill();
  u32 ofx, mlx, llx;
  if (bits.pos - bits.lo >= (i32)n1) {
    u64 v = (bits.win >> (bits.pos - (i32)n1 - bits.lo)) & ((1ull << n1) - 1);
    llx = (u32)(v & ((1ull << llb) - 1));
    mlx = (u32)((v >> llb) & ((1ull << mlb) - 1));
    ofx = (u32)(v >> (llb + mlb));
    bits.pos -= (i32)n1;
  } else {
    ofx = bits.read(ofc);
    mlx = bits.read(mlb);
    llx = bits.read(llb);
  }
  u32 ofv = (1u << ofc) + ofx;
  u32 ml = zstd_info_base(mli) + mlx;
  u32 ll = zstd_info_base(lli) + llx;
  u32 off, sym = 0;
  if (ofv > 3) {
    off = ofv - 3;
    rep2 = rep1;
    rep1 = rep0;
    rep0 = off;
    if (SYMBOLIC) tag = (tag << 1) & 7;
  } else {
    u32 idx = ofv - 1 + (ll == 0);   // 0..3: rep0, rep1, rep2, rep0 - 1
    if (idx == 0) {
      off = rep0;
      if (SYMBOLIC) sym = tag & 1;
    } else {
      if (SYMBOLIC) sym = idx == 1 ? (tag >> 1) & 1 : idx == 2 ? (tag >> 2) & 1 : tag & 1;
      // rep0 - 1, where rep0 is the block's first j less d: j less d + 1
      off = idx == 1 ? rep1 : idx == 2 ? rep2 : SYMBOLIC && sym ? rep0 + 4 : rep0 - 1;
      if (SYMBOLIC) tag = sym | ((tag & 1) << 1) | (idx == 1 ? tag & 4 : (tag & 2) << 1);
      if (idx != 1) rep2 = rep1;
      rep1 = rep0;
      rep0 = off;
    }
  }
  if (s + 1 < nseq) {   // the next states: literal length first, then match, then offset (at most 26 bits)
    if (bits.pos - bits.lo < (i32)n2 && bits.lo > 0) bits.refill();
    if (bits.pos - bits.lo >= (i32)n2) {
      u64 v = (bits.win >> (bits.pos - (i32)n2 - bits.lo)) & ((1ull << n2) - 1);
      of_state = zstd_state_base(ofe, ofn, of_log) + (u32)(v & ((1ull << ofn) - 1));
      ml_state = zstd_state_base(mle, mln, ml_log) + (u32)((v >> ofn) & ((1ull << mln) - 1));
      ll_state = zstd_state_base(lle, lln, ll_log) + (u32)(v >> (ofn + mln));
      bits.pos -= (i32)n2;
    } else {
      ll_state = zstd_state_base(lle, lln, ll_log) + bits.read(lln);
      ml_state = zstd_state_base(mle, mln, ml_log) + bits.read(mln);
      of_state = zstd_state_base(ofe, ofn, of_log) + bits.read(ofn);
    }
  }
  c.ll_state = ll_state;
  c.of_state = of_state;
  c.ml_state = ml_state;
  c.rep0 = rep0;
  c.rep1 = rep1;
  c.rep2 = rep2;
  c.tag = tag;
  // Past the stream's start the reads give zeros: harmless, and the
  // sequences from the first such one on are dropped by zstd_chain_end.
  c.trunc = bits.pos < 0 && c.trunc == nseq ? s : c.trunc;
  if (c.count >= c.limit) return CHECK_OUTPUT_OVERRUN;
  u64 flagged = (u64)ll | (SYMBOLIC && sym ? ZSTD_LIST_SYMBOLIC : 0u);
  c.list[c.count++] = flagged | ((u64)ml << 18) | ((u64)(off < ZSTD_LIST_OFF_MAX ? off : ZSTD_LIST_OFF_MAX) << 36);
  c.lit_sum += ll;
  c.match_sum += ml;
  c.s = s + 1;
  return CHECK_OK;
}

// The verdict on a chain that stopped with `r` (after its last step, or
// at a full list) for a block with `lit_size` literals whose output may
// take `room` bytes. c.count ends as the sequences kept: a failure's reason
// comes after the sequences before it; where the sequences take more
// literals than the block has or more output than `room`, the warp refuses
// the one that goes over before it gets to the reason. The stream must be
// used up exactly. `matched` gets the match bytes of a block that passed.
GPQ_DEVICE u32 zstd_chain_end(ZstdChain& c, u32 r, u32 lit_size, u32 room, u32& matched) {
  matched = 0;
  if (c.trunc < c.count) {
    c.count = c.trunc;
    return CHECK_TRUNCATED;
  }
  if (r) return r;
  if (c.bits.pos != 0) return CHECK_BAD_HEADER;
  if (c.lit_sum > lit_size || c.match_sum > room - lit_size) return CHECK_OUTPUT_OVERRUN;
  matched = (u32)c.match_sum;
  return CHECK_OK;
}

// The list kernel, one page: its sequence list into list[0, limit); returns
// the entries written. Each block's list is its count and reason (count |
// reason << 32), then its sequences. The page's chains run one after
// another on one thread (only pages of more compressed blocks than
// ZSTD_APART_MAX, or every page under GPQ_UNZSTD_APART=0, come here).
GPQ_DEVICE u32 zstd_list_page(ZstdSeqTables& tb, const u32* ll_info, const u32* ml_info, const u8* in, u32 in_len, u32 out_len, u64* list,
                              u32 limit) {
  if (in_len == 0) return 0;
  ZstdPage p;
  zstd_start_page(p, in, in_len, out_len);
  u32 w = 0;
  // Each pass consumes 3 bytes of input or more, or stops.
  for (;;) {
    u32 type = 0, size = 0;
    if (zstd_next_block(p, true, type, size) != CHECK_OK || type == ZSTD_END) return w;
    if (type < 2) {
      p.ip += type == 0 ? size : 1;
      p.op += size;
      continue;
    }
    u32 room = p.out_len - p.op < p.block_max ? p.out_len - p.op : p.block_max;
    ZstdLiterals l;
    if (zstd_literals_header(p.in + p.ip, size, room, l) != CHECK_OK) return w;
    if (w >= limit) return w;
    u32 head = w++, matched = 0, at = p.ip + l.section, nseq = 0;
    ZstdChain c;
    c.count = 0;
    u32 r = zstd_sequence_count(p.in, at, p.block_end, nseq);
    if (r == CHECK_OK) {
      r = zstd_chain_begin<false>(tb, p, at, nseq, list + w, limit - w, c);
      // Each pass decodes a sequence or stops, and there are c.nseq.
      while (r == CHECK_OK && c.s < c.nseq) r = zstd_chain_step<false>(c, tb, ll_info, ml_info);
      if (c.nseq > 0) r = zstd_chain_end(c, r, l.size, room, matched);
      p.rep0 = c.rep0;
      p.rep1 = c.rep1;
      p.rep2 = c.rep2;
    }
    w += c.count;
    list[head] = (u64)c.count | ((u64)r << 32);
    if (r) return w;
    p.op += l.size + matched;
    p.ip = p.block_end;
  }
}

// The list kernel, the `block`-th compressed block of a page decoded
// apart: walks the blocks before it as the counting kernel did (noting
// where their tables are described), then starts the block's chain, its
// sequences to go into its region of the page's list[0, limit):
// ZSTD_LIST_HEADS heads, then its sequences (see zstd_apart_end). The
// output position is not known here, so the block may take its largest
// size (`room`); the warp checks every sequence against the real output
// before it writes. False where the page has no such block (nothing is
// written then); else `r` is the verdict so far (CHECK_OK: run the chain's
// c.nseq steps).
GPQ_DEVICE bool zstd_apart_begin(ZstdSeqTables& tb, const u8* in, u32 in_len, u64* list, u32 limit, u32 block, ZstdChain& c, u64*& heads,
                                 u32& cap, u32& lit_size, u32& room, u32& r) {
  ZstdPage p;
  zstd_start_page(p, in, in_len, 0xFFFFFFFFu);
  u32 k = 0, region = 0, nseq = 0, at = 0;
  bool found = false;
  r = CHECK_OK;
  cap = 0;
  // Each pass consumes 3 bytes of input or more, or stops.
  while (in_len > 0 && block < ZSTD_APART_MAX) {
    u32 type = ZSTD_END;
    r = zstd_walk_block(p, type, nseq, at);
    if (type == ZSTD_END) break;
    if (type < 2) continue;
    cap = zstd_list_cap(p, r == CHECK_OK ? nseq : 0, ZSTD_LIST_HEADS);
    if (cap > limit - region) break;   // (the count gave the page room for every block's cap)
    if (k == block) {
      found = true;
      break;
    }
    if (r || !zstd_note_tables(tb, p, at, nseq)) break;
    region += cap;
    k++;
    p.ip = p.block_end;
  }
  if (!found) return false;
  heads = list + region;
  room = p.block_max;
  lit_size = 0;
  c.s = c.nseq = c.count = 0;
  c.rep0 = 0;
  c.rep1 = 1;
  c.rep2 = 2;
  c.tag = 7;
  if (r == CHECK_OK) {
    ZstdLiterals l;
    zstd_literals_header(p.in + p.ip, p.block_end - p.ip, p.block_max, l);   // passed in the walk
    lit_size = l.size;
    r = zstd_chain_begin<true>(tb, p, at, nseq, heads + ZSTD_LIST_HEADS, cap - ZSTD_LIST_HEADS, c);
  }
  return true;
}

// Ends a block decoded apart whose chain stopped with `r`: its heads (count
// | region << 24 | reason << 48; rep0 | rep1 << 32; rep2 | tags << 32, the
// repeat offsets after the block), then marks the block done in `written`
// (the warp reads a block's list only once its bit is set).
GPQ_DEVICE void zstd_apart_end(ZstdChain& c, u32 r, u64* heads, u32 cap, u32 lit_size, u32 room, u64* written, u32 block) {
  u32 matched = 0;
  if (c.nseq > 0) r = zstd_chain_end(c, r, lit_size, room, matched);   // (else no chain ran: `r` is the verdict)
  heads[0] = (u64)c.count | ((u64)cap << 24) | ((u64)r << 48);
  heads[1] = (u64)c.rep0 | ((u64)c.rep1 << 32);
  heads[2] = (u64)c.rep2 | ((u64)c.tag << 32);
  atomicOr((unsigned long long*)written, (unsigned long long)(ZSTD_LIST_APART | (1ull << block)));
}

// Work items [item_first, item_last) of `items` (page | block << 32, see
// ZSTD_ITEM_PAGE; the host puts the longest first, so that a long chain
// starts early and the short ones fill in around it), of pages [first,
// last). Page i's list is list[offsets[i] - offsets[first], offsets[i + 1]
// - offsets[first]); written[i] (zeroed by the host) gets the entries
// written, or for a page decoded apart ZSTD_LIST_APART and its blocks' bits
// (the warp reads no further). `profile` is null, or 2 u64s that get the
// items' clock cycles summed and the longest item's (GPQ_UNZSTD_PROFILE=1).
//
// The threads of a block (one warp) run their chains side by side: each
// pass of the kernel's loop, every thread that holds a chain decodes up to
// ZSTD_CHAIN_STEPS sequences of it, together, and a thread whose chain has
// ended first takes the next item off the counter `next_item` and starts
// its chain (a whole page's item it decodes there and then: such pages are
// rare). So a thread is never idle while items are left, and the steps of
// all threads issue as one warp instruction: threads that decode their
// chains on their own each issue them alone. Blocks of UNZSTD_LIST_THREADS
// threads: their tables take 44 KB of shared memory, within the 48 KB a
// block has without asking the driver for more.
#define ZSTD_CHAIN_STEPS 4
extern "C" __global__ void __launch_bounds__(UNZSTD_LIST_THREADS)
    gpq_unzstd_sequences(const u64* args, u32 num_pages, const u64* items, u32 item_first, u32 item_last, u32 first, u32 last,
                         const u64* offsets, u64* list, u64* written, u32* next_item, u64* profile) {
  __shared__ u32 tables[UNZSTD_LIST_THREADS * ZSTD_LIST_TABLE_WORDS];
  // The length codes' baselines and extra bits, in shared memory too: the
  // threads of a warp look up different codes, which constant memory would
  // serve one address at a time.
  __shared__ u32 ll_info[36], ml_info[53];
  for (u32 k = threadIdx.x; k < 53; k += blockDim.x) {
    if (k < 36) ll_info[k] = zstd_code_info(ZSTD_LL_BASE[k], ZSTD_LL_BITS[k]);
    ml_info[k] = zstd_code_info(ZSTD_ML_BASE[k], ZSTD_ML_BITS[k]);
  }
  __syncthreads();
  if (threadIdx.x >= UNZSTD_LIST_THREADS) return;
  u32* mine = tables + threadIdx.x * ZSTD_LIST_TABLE_WORDS;
  ZstdSeqTables tb = {(u16*)mine, (u16*)mine + 512, (u16*)mine + 1024, (i16*)(mine + 640), (u16*)(mine + 668)};
  u64 base = offsets[first];
  const unsigned lanes = (1u << UNZSTD_LIST_THREADS) - 1;   // the block: one warp, its first lanes
  const u32 n_items = item_last - item_first;
  ZstdChain c;
  c.s = c.nseq = 0;
  u64* heads = nullptr;
  u64* page_written = nullptr;
  u32 cap = 0, lit_size = 0, room = 0, block = 0;
  u64 start = 0;
  bool busy = false, done = false;
  // Each pass either takes items off the counter (there are n_items) or
  // runs a step of every chain held (each has c.nseq steps): the loop ends,
  // for all threads together.
  for (;;) {
    // A thread without a chain takes items until one leaves it a chain to
    // run, or none is left. (No warp barrier in here: the threads that come
    // in are not all of them.)
    while (!busy && !done) {
      u32 k = atomicAdd(next_item, 1u);
      if (k >= n_items) {
        done = true;
        break;
      }
      u64 item = items[item_first + k];
      u32 i = (u32)item;
      block = (u32)(item >> 32);
      const u8* in;
      u8* out;
      u32 in_len, out_len;
      start = profile ? (u64)clock64() : 0;
      // (the host's items are the round's pages' only)
      if (i < first || i >= last || !zstd_page_args(args, num_pages, i, in, in_len, out_len, out)) continue;
      u32 limit = (u32)(offsets[i + 1] - offsets[i]);
      u64* page_list = list + (offsets[i] - base);
      page_written = written + i;
      if (block == ZSTD_ITEM_PAGE) {
        *page_written = zstd_list_page(tb, ll_info, ml_info, in, in_len, out_len, page_list, limit);
      } else {
        u32 r = CHECK_OK;
        if (!zstd_apart_begin(tb, in, in_len, page_list, limit, block, c, heads, cap, lit_size, room, r)) continue;
        if (r == CHECK_OK && c.nseq > 0) {
          busy = true;
          break;
        }
        zstd_apart_end(c, r, heads, cap, lit_size, room, page_written, block);
      }
      if (profile) {   // a measuring aid: cycles summed over the items, and the longest item's
        u64 cycles = (u64)clock64() - start;
        atomicAdd((unsigned long long*)&profile[0], (unsigned long long)cycles);
        atomicMax((unsigned long long*)&profile[1], (unsigned long long)cycles);
      }
    }
    if (!__any_sync(lanes, busy)) break;
    if (busy) {
      u32 r = CHECK_OK;
#pragma unroll
      for (u32 q = 0; q < ZSTD_CHAIN_STEPS; q++) {
        if (r == CHECK_OK && c.s < c.nseq) r = zstd_chain_step<true>(c, tb, ll_info, ml_info);
      }
      if (r != CHECK_OK || c.s == c.nseq) {
        zstd_apart_end(c, r, heads, cap, lit_size, room, page_written, block);
        busy = false;
        if (profile) {
          u64 cycles = (u64)clock64() - start;
          atomicAdd((unsigned long long*)&profile[0], (unsigned long long)cycles);
          atomicMax((unsigned long long*)&profile[1], (unsigned long long)cycles);
        }
      }
    }
  }
}

// Lane 0: parses the next block (or frame) and plans the warp's next action.
GPQ_DEVICE u32 zstd_plan_list(ZstdWarp& z, ZstdPage& p);
GPQ_DEVICE u32 zstd_plan_block(ZstdWarp& z, ZstdPage& p) {
  const u8* in = p.in;
  u32 type = 0, size = 0;
  u32 r = zstd_next_block(p, true, type, size);
  if (r) return r;
  if (type == ZSTD_END) {
    z.action = ZSTD_DONE;
    return CHECK_OK;
  }
  if (type < 2) {
    z.action = type == 0 ? ZSTD_COPY_RAW : ZSTD_FILL_RLE;
    z.src = in + p.ip;
    z.rle = type == 1 ? in[p.ip] : 0;
    z.op = p.op;
    z.len = size;
    p.ip += type == 0 ? size : 1;
    p.op += size;
    return CHECK_OK;
  }
  const u8* b = in + p.ip;
  u32 room = p.out_len - p.op < p.block_max ? p.out_len - p.op : p.block_max;   // the block's output at most
  if ((b[0] & 3) == 3 && p.huf_avail == 0) return CHECK_BAD_HEADER;   // the previous tree, of which there is none
  ZstdLiterals l;
  r = zstd_literals_header(b, size, room, l);
  if (r) return r;
  z.streams = 0;
  z.lit_kind = l.type < 2 ? l.type : 2;
  z.lits = l.type == 0 ? b + l.hlen : nullptr;
  z.rle = l.type == 1 ? b[l.hlen] : 0;
  z.lit_size = l.size;
  z.lit_at = l.type >= 2 ? p.out_len - l.size : 0;
  z.room = room;
  z.block_op = p.op;
  if (l.type >= 2) {
    u32 tree = 0;
    if (l.type == 2) {   // a new tree (the one in use stays in shared memory for the blocks after)
      p.huf_at = p.ip + l.hlen;
      p.huf_avail = l.csize;
      r = zstd_huffman_table(z, in + p.huf_at, p.huf_avail, p.huf_log, tree);
      if (r) return r;
    }
    u32 s0 = l.hlen + tree, rest = l.csize - tree;   // the streams
    z.huf_log = p.huf_log;
    z.streams = l.streams;
    if (l.streams == 1) {
      z.stream_at[0] = p.ip + s0;
      z.stream_len[0] = rest;
      z.stream_out[0] = z.lit_at;
      z.stream_count[0] = l.size;
    } else {
      if (rest < 10) return CHECK_BAD_HEADER;
      const u8* jt = b + s0;
      u32 l1 = jt[0] | (jt[1] << 8), l2 = jt[2] | (jt[3] << 8), l3 = jt[4] | (jt[5] << 8);
      if (l1 + l2 + l3 + 6 > rest) return CHECK_TRUNCATED;
      u32 l4 = rest - 6 - l1 - l2 - l3;
      u32 seg = (l.size + 3) / 4;
      if (3 * seg > l.size) return CHECK_BAD_HEADER;
      u32 lens[4] = {l1, l2, l3, l4};
      u32 from = p.ip + s0 + 6;
      for (u32 k = 0; k < 4; k++) {
        z.stream_at[k] = from;
        z.stream_len[k] = lens[k];
        z.stream_out[k] = z.lit_at + k * seg;
        z.stream_count[k] = k < 3 ? seg : l.size - 3 * seg;
        from += lens[k];
      }
    }
    z.action = ZSTD_LITERALS;   // then the sequences (zstd_plan_list)
    return CHECK_OK;
  }
  return zstd_plan_list(z, p);
}

// Lane 0: the block's sequences, from the next entries of the page's list.
// The list kernel walked the page as the warp does, so the block's entries
// are there whenever the warp gets this far (and if they are not, the page
// is refused, never decoded from memory the list kernel did not write).
GPQ_DEVICE u32 zstd_plan_list(ZstdWarp& z, ZstdPage& p) {
  u32 count, skip;
  if (p.written & ZSTD_LIST_APART) {
    // The block's region: its heads, then its sequences; the repeat
    // offsets after it follow from those before it.
    u32 k = p.block_k++;
    if (k >= ZSTD_APART_MAX || !((p.written >> k) & 1)) return CHECK_BAD_HEADER;
    if (p.list_len - p.list_at < ZSTD_LIST_HEADS) return CHECK_BAD_HEADER;
    const u64* h = p.list + p.list_at;
    u64 head = h[0];
    count = (u32)head & 0xffffff;
    skip = (u32)(head >> 24) & 0xffffff;
    if (skip < ZSTD_LIST_HEADS || skip > p.list_len - p.list_at || count > skip - ZSTD_LIST_HEADS) return CHECK_BAD_HEADER;
    z.seq_reason = (u32)(head >> 48);
    z.seq_list = h + ZSTD_LIST_HEADS;
    u32 start[3] = {p.rep0, p.rep1, p.rep2}, after[3] = {(u32)h[1], (u32)(h[1] >> 32), (u32)h[2]}, tags = (u32)(h[2] >> 32);
    for (u32 j = 0; j < 3; j++) {
      z.rep_start[j] = start[j];
      u32 v = after[j], base = (v & 3) == 0 ? start[0] : (v & 3) == 1 ? start[1] : start[2];
      after[j] = (tags >> j) & 1 ? ((v & 3) < 3 ? base - (v >> 2) : 0) : v;
    }
    p.rep0 = after[0];
    p.rep1 = after[1];
    p.rep2 = after[2];
  } else {
    if (p.list_at >= p.list_len) return CHECK_BAD_HEADER;
    u64 head = p.list[p.list_at++];
    count = (u32)head;
    if (count > p.list_len - p.list_at) return CHECK_BAD_HEADER;
    z.seq_list = p.list + p.list_at;
    z.seq_reason = (u32)(head >> 32);
    skip = count;
  }
  z.nseq = count;
  p.list_at += skip;
  z.frame_start = p.frame_start;
  z.window = p.window;
  z.action = ZSTD_SEQUENCES;
  return CHECK_OK;
}

// The warp: copies `len` bytes from src to dst, dst <= src or the two apart.
// 256 bytes at a time, every lane loading its 8 before any stores, so a
// forward overlap (the literals' tail moving down) reads each byte before it
// is overwritten.
GPQ_DEVICE void zstd_copy_down(u8* dst, const u8* src, u32 len, u32 lane) {
  for (u32 b = 0; b < len; b += 256) {
    u8 t[8];
#pragma unroll
    for (u32 q = 0; q < 8; q++) {
      u32 j = b + 32 * q + lane;
      t[q] = j < len ? src[j] : 0;
    }
    __syncwarp();
#pragma unroll
    for (u32 q = 0; q < 8; q++) {
      u32 j = b + 32 * q + lane;
      if (j < len) dst[j] = t[q];
    }
  }
  __syncwarp();
}

GPQ_DEVICE void zstd_fill(u8* dst, u8 v, u32 len, u32 lane) {
  for (u32 j = lane; j < len; j += 32) dst[j] = v;
  __syncwarp();
}

// The warp: a match of `ml` bytes at out[at] from `off` bytes back. The
// source is all written already and none of it is written here (a match
// longer than its offset repeats the last `off` bytes), so every lane loads
// 8 bytes before it stores them.
GPQ_DEVICE void zstd_match(u8* out, u32 at, u32 ml, u32 off, u32 lane) {
  const u8* src = out + at - off;
  u32 period = off >= ml ? ml : off;   // the source's length
  u32 r = lane % period, step = 32 % period;
  for (u32 b = 0; b < ml; b += 256) {
    u8 t[8];
    u32 rq = r;
#pragma unroll
    for (u32 q = 0; q < 8; q++) {
      u32 j = b + 32 * q + lane;
      t[q] = j < ml ? src[rq] : 0;
      rq += step;
      if (rq >= period) rq -= period;
    }
#pragma unroll
    for (u32 q = 0; q < 8; q++) {
      u32 j = b + 32 * q + lane;
      if (j < ml) out[at + j] = t[q];
    }
    r = rq;
  }
  __syncwarp();
}

// The warp decodes the block's Huffman streams (a lane each), in rounds:
// the warp stages the next ZSTD_HUF_WINDOW bytes of every stream still
// going, then each stream's lane decodes until its window is used up.
// Sets z.stream_reason.
GPQ_DEVICE void zstd_literals(ZstdWarp& z, const u8* in, u8* out, u32 lane) {
  const unsigned FULL = 0xffffffffu;
  u32 streams = z.streams, log = z.huf_log;
  ZstdBits b;
  u32 k = 0, count = 0, r = CHECK_OK;
  u8* dst = nullptr;
  bool active = lane < streams;
  if (active) {
    count = z.stream_count[lane];
    dst = out + z.stream_out[lane];
    if (!b.init(in + z.stream_at[lane], z.stream_len[lane])) {
      r = CHECK_BAD_HEADER;
      active = false;
    }
  }
  // Each round decodes at least the bits of one full window per stream
  // still going, or finishes it, so the rounds end.
  while (__any_sync(FULL, active)) {
    if (lane < 4) {
      i32 lo = 0, hi = 0;
      if (active) b.window(ZSTD_HUF_WINDOW, lo, hi);
      z.huf_src[lane] = active ? b.p : in;
      z.huf_lo[lane] = lo;
      z.huf_hi[lane] = hi;
    }
    __syncwarp();
    for (u32 t = 0; t < streams; t++) zstd_copy_down((u8*)z.staged.huf[t], z.huf_src[t] + z.huf_lo[t], (u32)(z.huf_hi[t] - z.huf_lo[t]), lane);
    __syncwarp();
    if (active) {
      b.staged = z.staged.huf[lane];
      b.staged_lo = z.huf_lo[lane];
      b.staged_hi = z.huf_hi[lane];
      u32 mask = (1u << log) - 1;
      while (k < count) {
        if (b.pos - b.lo < (i32)log) {
          if (b.lo > 0) {   // a refill, from this round's window only
            if (b.refill_start() < b.staged_lo) break;
            b.refill();
          } else {   // near the stream's start: bits below it read as zeros
            u32 e = z.huf[b.peek(log)];
            dst[k++] = (u8)e;
            b.skip(e >> 8);
            if (b.pos < 0) break;
            continue;
          }
        }
        // Symbols without further checks while the word holds their bits
        // (a symbol takes at most `log` bits): five or more per refill.
        while (k < count && b.pos - b.lo >= (i32)log) {
          u32 e = z.huf[(u32)(b.win >> (b.pos - (i32)log - b.lo)) & mask];
          dst[k++] = (u8)e;
          b.pos -= (i32)(e >> 8);
        }
      }
      if (b.pos < 0) {
        r = CHECK_TRUNCATED;
        active = false;
      } else if (k == count) {
        r = b.pos == 0 ? CHECK_OK : CHECK_BAD_HEADER;
        active = false;
      }
    }
    __syncwarp();
  }
  if (lane < streams) z.stream_reason[lane] = r;
  __syncwarp();
}

// One lane: copies n bytes from src to dst, C at a time, loads before
// stores. dst <= src, or src + C <= dst (a match at least C back): either
// way every byte is read before it is overwritten, or after it is written.
// The larger C, the fewer round trips to memory a copy waits for.
template <u32 C>
GPQ_DEVICE void zstd_lane_copy(u8* dst, const u8* src, u32 n) {
  for (u32 j = 0; j < n; j += C) {
    u8 t[C];
#pragma unroll
    for (u32 q = 0; q < C; q++) t[q] = j + q < n ? src[j + q] : 0;
#pragma unroll
    for (u32 q = 0; q < C; q++)
      if (j + q < n) dst[j + q] = t[q];
  }
}

// One lane executes a short sequence: `ll` literals from index `lit` to
// out[at], then its match.
GPQ_DEVICE void zstd_lane_sequence(u8* out, const u8* lits, u32 kind, u8 rle, u32 at, u32 lit, u32 ll, u32 ml, u32 off) {
  u8* d = out + at;
  if (kind == 1) {
    for (u32 j = 0; j < ll; j++) d[j] = rle;
  } else {
    zstd_lane_copy<16>(d, lits + lit, ll);
  }
  u8* m = d + ll;
  if (off >= 16) {
    zstd_lane_copy<16>(m, m - off, ml);
  } else if (off >= 8) {
    zstd_lane_copy<8>(m, m - off, ml);
  } else {   // the last off (< 8) bytes, repeated
    u64 pattern = 0;
    for (u32 j = 0; j < off; j++) pattern |= (u64)m[(i64)j - (i64)off] << (8 * j);
    u32 r = 0;
    for (u32 j = 0; j < ml; j++) {
      m[j] = (u8)(pattern >> (8 * r));
      if (++r == off) r = 0;
    }
  }
}

// What a batch of sequences did, for the warp's running totals and the profile.
struct ZstdBatch {
  u32 lits, matched;   // literals and match bytes of the batch
  u32 rounds;
  bool serial;
};

// The warp checks a batch of n <= 32 sequences (lane k holds the k-th:
// ll, ml, off) and executes it, a sequence per lane. The block has used
// `lit0` literals and written `matched0` match bytes before it. Prefix sums
// give each sequence its literals and output position; each is checked as
// the reference library checks it, and the first failure in order is the
// page's reason (nothing of the batch is written then). A sequence runs
// once every earlier one whose output its match reads has run, so the
// batch goes in rounds; long sequences are copied by the whole warp.
// Returns the reason (the same in every lane).
GPQ_DEVICE u32 zstd_execute(const ZstdWarp& z, u8* out, u32 lane, u32 n, u32 ll, u32 ml, u32 off, u32 lit0, u32 matched0, ZstdBatch& b) {
  const unsigned FULL = 0xffffffffu;
  u32 kind = z.lit_kind;
  bool mine = lane < n;
  if (!mine) ll = ml = off = 0;
  u32 sum_ll = ll, sum_all = ll + ml;   // inclusive prefix sums over the lanes
#pragma unroll
  for (u32 d = 1; d < 32; d <<= 1) {
    u32 x = __shfl_up_sync(FULL, sum_ll, d), y = __shfl_up_sync(FULL, sum_all, d);
    if (lane >= d) {
      sum_ll += x;
      sum_all += y;
    }
  }
  u32 at0 = z.block_op + lit0 + matched0;
  u32 lit = lit0 + sum_ll - ll;
  u32 matched = matched0 + (sum_all - sum_ll) - ml;
  u32 at = at0 + sum_all - ll - ml;
  u32 reason = CHECK_OK;
  if (mine) {   // in the reference library's order
    if ((u64)lit + ll > z.lit_size) {
      reason = CHECK_TRUNCATED;
    } else if ((u64)matched + ml + z.lit_size > z.room) {
      reason = CHECK_OUTPUT_OVERRUN;
    } else {
      u32 before = at + ll - z.frame_start;   // output of the frame before the match
      if (off == 0 || off > before || off > z.window) reason = CHECK_BAD_OFFSET;
    }
  }
  u32 bad = __ballot_sync(FULL, reason != CHECK_OK);
  b.rounds = 0;
  b.serial = false;
  if (bad) return __shfl_sync(FULL, reason, __ffs(bad) - 1);
  u32 total_ll = __shfl_sync(FULL, sum_ll, 31), total_all = __shfl_sync(FULL, sum_all, 31);
  b.lits = total_ll;
  b.matched = total_all - total_ll;
  // Literals in the output tail that a later sequence of the batch could
  // overwrite before an earlier one reads them (near a page's end): one
  // sequence at a time, in order.
  b.serial = kind == 2 && (u64)at0 + total_all > (u64)z.lit_at + lit0;
  // The earlier sequences of the batch whose output the match reads:
  // [from, to) is its source, cut to the batch's output before it.
  u32 end = at + ll + ml, dep = 0;
  if (b.serial) {
    dep = lane > 0 ? 1u << (lane - 1) : 0;
  } else {
    u32 src = at + ll - off, src_end = src + (ml < off ? ml : off);
    u32 from = src > at0 ? src : at0, to = src_end < at ? src_end : at;
    // `at` and `end` grow with the lane (every match is 3 bytes or more;
    // lanes past n sit at the batch's end), so the sequences that [from, to)
    // overlaps are a run of lanes before this one: from the first whose end
    // is past `from` up to the last that starts before `to`. Two searches by
    // halving, five shuffles each, find the run.
    u32 first = 0, stop = 0;   // lanes with end <= from; lanes with at < to
#pragma unroll
    for (u32 step = 16; step; step >>= 1) {
      u32 end_j = __shfl_sync(FULL, end, first + step - 1), at_j = __shfl_sync(FULL, at, stop + step - 1);
      if (end_j <= from) first += step;
      if (at_j < to) stop += step;
    }
    if (from < to && first < stop) dep = ((1u << stop) - 1) & ~((1u << first) - 1);
  }
  u32 all = n >= 32 ? FULL : (1u << n) - 1, done = 0;
  u32 longs = __ballot_sync(FULL, mine && ll + ml > ZSTD_LANE_COPY);
  const u8* lits = kind == 2 ? out + z.lit_at : z.lits;
  u8 rle = z.rle;
  // Each round runs at least the first sequence not yet run (all it reads
  // is written), so n rounds are enough.
  for (u32 r = 0; r < n && done != all; r++) {
    u32 ready = __ballot_sync(FULL, mine && !((done >> lane) & 1) && (dep & ~done) == 0);
    if ((ready & ~longs) >> lane & 1) zstd_lane_sequence(out, lits, kind, rle, at, lit, ll, ml, off);
    for (u32 rest = ready & longs; rest; rest &= rest - 1) {   // uniform: the same mask in every lane
      u32 k = __ffs(rest) - 1;
      u32 k_at = __shfl_sync(FULL, at, k), k_lit = __shfl_sync(FULL, lit, k), k_ll = __shfl_sync(FULL, ll, k);
      u32 k_ml = __shfl_sync(FULL, ml, k), k_off = __shfl_sync(FULL, off, k);
      if (k_ll) {
        if (kind == 1) zstd_fill(out + k_at, rle, k_ll, lane);
        else zstd_copy_down(out + k_at, lits + k_lit, k_ll, lane);
      }
      zstd_match(out, k_at + k_ll, k_ml, k_off, lane);
    }
    __syncwarp();
    done |= ready;
    b.rounds++;
  }
  return CHECK_OK;
}

// Where a warp's time goes, for `profile` (lane 0's clock, summed over pages).
enum ZstdPhase : u32 {
  ZSTD_T_PLAN = 0,        // frame and block headers, the Huffman table
  ZSTD_T_LITERALS = 1,    // Huffman streams
  ZSTD_T_EXECUTE = 2,     // sequences checked and executed, the literals after the last
  ZSTD_T_COPY = 3,        // raw and RLE blocks
  ZSTD_T_PAGE = 4,        // the whole page
  ZSTD_T_PAGES = 5,       // pages (a count)
  ZSTD_T_SEQUENCES = 6,   // sequences (a count)
  ZSTD_T_BATCHES = 7,     // batches (a count)
  ZSTD_T_WAVES = 8,       // rounds of the batches (a count; "waves" in the log)
  ZSTD_T_SERIAL = 9,      // batches executed one sequence a round for their literals' sake (a count)
  ZSTD_T_COUNT = 10,      // (what the host reads; the two below are lane 0's clock marks)
  ZSTD_T_START = 10,
  ZSTD_T_MARK = 11,
};

// The warp: the block's sequences from its list, a batch at a time, then
// the literals after the last match. Returns the page's reason; sets z.matched.
GPQ_DEVICE u32 zstd_run_block(ZstdWarp& z, u8* out, u32 lane, u64* t) {
  const u64 MASK = (1ull << 18) - 1;
  // The running totals live in shared memory, where lane 0 moves them
  // between batches: held in registers across a batch, they would spill.
  if (lane == 0) z.seq_done = z.lit_used = z.matched = 0;
  __syncwarp();
  while (z.seq_done < z.nseq) {
    u32 at = z.seq_done, k = z.nseq - at < ZSTD_SEQ_BATCH ? z.nseq - at : ZSTD_SEQ_BATCH;
    u64 e = lane < k ? z.seq_list[at + lane] : 0;
    u32 ll = (u32)(e & MASK), off = (u32)(e >> 36);
    if (ll & ZSTD_LIST_SYMBOLIC) {   // a block decoded apart: the block's first repeat offset j, less d
      ll &= ~ZSTD_LIST_SYMBOLIC;
      u32 j = off & 3, v = j < 3 ? z.rep_start[j] - (off >> 2) : 0;
      off = v < ZSTD_LIST_OFF_MAX ? v : ZSTD_LIST_OFF_MAX;
    }
    ZstdBatch b;
    u32 r = zstd_execute(z, out, lane, k, ll, (u32)((e >> 18) & MASK), off, z.lit_used, z.matched, b);
    if (t && lane == 0) {
      t[ZSTD_T_SEQUENCES] += k;
      t[ZSTD_T_BATCHES] += 1;
      t[ZSTD_T_WAVES] += b.rounds;
      t[ZSTD_T_SERIAL] += b.serial;
    }
    if (r) return r;   // the same in every lane
    if (lane == 0) {   // at most the block's literals and output: checked
      z.seq_done = at + k;
      z.lit_used += b.lits;
      z.matched += b.matched;
    }
    __syncwarp();
  }
  if (z.seq_reason) return z.seq_reason;
  u32 lit0 = z.lit_used, left = z.lit_size - lit0, at = z.block_op + lit0 + z.matched;
  if (left) {
    if (z.lit_kind == 1) zstd_fill(out + at, z.rle, left, lane);
    else zstd_copy_down(out + at, (z.lit_kind == 2 ? out + z.lit_at : z.lits) + lit0, left, lane);
  }
  return CHECK_OK;
}

// The whole warp decodes one page from its list[0, list_len); returns its
// CheckReason. With `t` (null in normal use), lane 0 adds its clock per
// phase to it.
GPQ_DEVICE u32 zstd_page(ZstdWarp& z, ZstdPage& p, const u8* in, u32 in_len, u8* out, u32 out_len, const u64* list, u32 list_len, u64 written,
                         u32 lane, u64* t) {
  // The clocks live in `t` (shared), not in registers the whole page long.
  if (t && lane == 0) t[ZSTD_T_START] = t[ZSTD_T_MARK] = (u64)clock64();
  auto lap = [&](u32 phase) {
    if (t && lane == 0) {
      u64 now = (u64)clock64();
      t[phase] += now - t[ZSTD_T_MARK];
      t[ZSTD_T_MARK] = now;
    }
  };
  if (lane == 0) {
    zstd_start_page(p, in, in_len, out_len);
    p.list = list;
    p.list_at = 0;
    p.list_len = list_len;
    p.written = written;
    p.block_k = 0;
    z.reason = in_len == 0 ? CHECK_TRUNCATED : CHECK_OK;
    z.action = ZSTD_START;
  }
  __syncwarp();
  // Every step: all lanes read the plan, act on it, and lane 0 plans the
  // next one. Each plan consumes input or output, so the loop ends.
  for (;;) {
    u32 reason = z.reason, action = z.action;
    if (reason != CHECK_OK || action == ZSTD_DONE) {
      __syncwarp();
      if (t && lane == 0) {
        t[ZSTD_T_PAGE] += (u64)clock64() - t[ZSTD_T_START];
        t[ZSTD_T_PAGES] += 1;
      }
      return reason;
    }
    u32 r = CHECK_OK;
    if (action == ZSTD_COPY_RAW) {
      zstd_copy_down(out + z.op, z.src, z.len, lane);
    } else if (action == ZSTD_FILL_RLE) {
      zstd_fill(out + z.op, z.rle, z.len, lane);
    } else if (action == ZSTD_LITERALS) {
      zstd_literals(z, in, out, lane);
    } else if (action == ZSTD_SEQUENCES) {
      r = zstd_run_block(z, out, lane, t);   // the same in every lane
    }
    __syncwarp();
    lap(action == ZSTD_LITERALS ? ZSTD_T_LITERALS : action == ZSTD_SEQUENCES ? ZSTD_T_EXECUTE : ZSTD_T_COPY);
    if (lane == 0) {
      if (r == CHECK_OK) {
        if (action == ZSTD_LITERALS) {
          for (u32 k = 0; k < z.streams && r == CHECK_OK; k++) r = z.stream_reason[k];
          if (r == CHECK_OK) r = zstd_plan_list(z, p);
        } else {
          if (action == ZSTD_SEQUENCES) {
            p.op = z.block_op + z.lit_size + z.matched;
            p.ip = p.block_end;
          }
          r = zstd_plan_block(z, p);   // (its one call: inlined once, the kernel needs fewer registers)
          if (r == CHECK_OK && action == ZSTD_START && z.action == ZSTD_DONE) r = CHECK_SIZE_MISMATCH;   // no frame at all
        }
      }
      z.reason = r;
    }
    __syncwarp();
    lap(ZSTD_T_PLAN);
  }
}

// One warp per page (UNZSTD_WARPS pages per block of 32 * UNZSTD_WARPS
// threads), over pages [first, last). `args` holds nvCOMP's packed argument
// arrays: input addresses, input sizes, output sizes and output addresses,
// `num_pages` each. Page i's list is at list[offsets[i] - offsets[first]]
// and holds written[i] entries, or is the regions of blocks decoded apart
// (gpq_unzstd_sequences). `reasons[i]` gets
// page i's CheckReason: 0 when its output is complete. `profile` is null, or
// ZSTD_T_COUNT u64s that get each phase's clock cycles summed over the pages
// (a measuring aid: GPQ_UNZSTD_PROFILE=1).
extern "C" __global__ void __launch_bounds__(32 * UNZSTD_WARPS, UNZSTD_MIN_BLOCKS)
    gpq_unzstd(const u64* args, u32 num_pages, u32 first, u32 last, const u64* offsets, const u64* list, const u64* written,
               u32* reasons, u64* profile) {
  __shared__ ZstdWarp warps[UNZSTD_WARPS];
  __shared__ ZstdPage pages[UNZSTD_WARPS];   // lane 0's
  __shared__ u64 times[UNZSTD_WARPS][ZSTD_T_COUNT + 2];
  u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  u32 i = first + blockIdx.x * UNZSTD_WARPS + warp;
  if (warp >= UNZSTD_WARPS || i >= last) return;   // whole warps leave together
  u64* t = nullptr;
  if (profile) {
    t = times[warp];
    if (lane < ZSTD_T_COUNT) t[lane] = 0;
    __syncwarp();
  }
  const u8* in;
  u8* out;
  u32 in_len, out_len;
  u32 r = CHECK_UNSUPPORTED;
  if (zstd_page_args(args, num_pages, i, in, in_len, out_len, out)) {
    u64 room = offsets[i + 1] - offsets[i], w = written[i];
    u32 n = (w & ZSTD_LIST_APART) || w > room ? (u32)room : (u32)w;
    r = zstd_page(warps[warp], pages[warp], in, in_len, out, out_len, list + (offsets[i] - offsets[first]), n, w, lane, t);
  }
  if (lane == 0) reasons[i] = r;
  if (profile) {
    __syncwarp();
    if (lane < ZSTD_T_COUNT) atomicAdd((unsigned long long*)&profile[lane], (unsigned long long)t[lane]);
  }
}
