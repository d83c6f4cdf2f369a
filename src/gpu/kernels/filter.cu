// Filters on decoded columns: a predicate, compiled on the host into a
// postfix program, evaluated for every row; then the rows it keeps listed
// in order, for the gathers (gather.cu) to copy.
//
// Evaluation follows SQL's three-valued logic: each step pushes a truth
// value and whether it is known (not NULL) onto two bit stacks held in
// registers (at most FILTER_MAX_DEPTH deep, checked by the host); AND, OR
// and NOT combine them as Kleene logic does, and a row is kept when the
// program leaves a known TRUE. Numbers compare as 128-bit keys (integers
// and decimals sign- or zero-extended, floats in IEEE total order with
// -0.0 taken as 0.0, as DataFusion compares them); strings and binary compare
// bytewise. Each warp evaluates 32 consecutive rows and writes one word of
// the keep bitmap and its population count.

#define FILTER_MAX_DEPTH 32

enum FilterColumnKind : u32 {
  FILTER_INT = 0,           // signed integer or decimal, `width` 1, 2, 4, 8 or 16 bytes
  FILTER_UINT = 1,          // unsigned integer, `width` 1, 2, 4 or 8 bytes
  FILTER_FLOAT = 2,         // IEEE float, `width` 4 or 8 bytes
  FILTER_BOOL = 3,          // a bitmap of values
  FILTER_STRING = 4,        // i32 offsets and characters
  FILTER_LARGE_STRING = 5,  // i64 offsets and characters
  FILTER_VIEW = 6,          // 16-byte views over one character allocation
};

enum FilterOpCode : u32 {
  FILTER_OP_COMPARE = 0,   // column `cmp` literal
  FILTER_OP_IN = 1,        // column equals one of `count` literals
  FILTER_OP_IS_NULL = 2,
  FILTER_OP_IS_NOT_NULL = 3,
  FILTER_OP_LIKE = 4,      // `count` segments matched in order; `cmp` bit 0: anchored at the start, bit 1: at the end
  FILTER_OP_BOOL = 5,      // a boolean column's value
  FILTER_OP_AND = 6,
  FILTER_OP_OR = 7,
  FILTER_OP_NOT = 8,
  FILTER_OP_CONST = 9,     // `cmp`: 0 FALSE, 1 TRUE, 2 NULL
  FILTER_OP_COLUMNS = 10,  // column `cmp` the column at index `literal`
};

enum FilterCmp : u32 {
  FILTER_EQ = 0,
  FILTER_NE = 1,
  FILTER_LT = 2,
  FILTER_LE = 3,
  FILTER_GT = 4,
  FILTER_GE = 5,
};

struct FilterColumn {
  u64 values;      // fixed-width values, a bitmap of booleans, characters, or views
  u64 values_len;  // bytes of `values`
  u64 validity;    // validity bitmap, 0 when the column has no nulls
  u64 validity_len;
  u64 offsets;     // string offsets (i32 or i64), 0 otherwise
  u64 offsets_len;
  u64 data;        // the characters of views, 0 otherwise
  u64 data_len;    // bytes of `data`
  u64 offset;      // rows of every buffer before the column's first row
  u32 kind;        // FilterColumnKind
  u32 width;       // bytes of one value (fixed-width kinds)
};

struct FilterOp {
  u32 code;      // FilterOpCode
  u32 column;    // index into the column table
  u32 cmp;       // FilterCmp, LIKE anchors, or a constant
  u32 count;     // literals used (IN lists, LIKE segments)
  u64 literal;   // first literal used
};

// A number's key (high word signed, low word unsigned), or a byte string's
// place in the literal pool (offset, length).
struct FilterLiteral {
  u64 a;
  u64 b;
};

struct FilterProgram {
  u64 ops;          // FilterOp[n_ops]
  u64 columns;      // FilterColumn[n_columns]
  u64 literals;     // FilterLiteral[n_literals]
  u64 pool;         // bytes of string literals
  u64 pool_len;
  u64 rows;
  u64 bits;         // out: u32 keep bitmap, one word per 32 rows
  u64 counts;       // out: u64 rows kept per word
  u64 allowed;      // bitmap of the rows that may be kept, 0: all
  u64 allowed_len;  // its bytes
  u32 n_ops;
  u32 n_columns;
  u32 n_literals;
  u32 status;       // GPQ_OK, or GPQ_ERR_OUTPUT_OVERFLOW when a column's buffers do not hold a row
};

struct FilterKey {
  i64 hi;
  u64 lo;
};

GPQ_DEVICE int gpq_key_cmp(FilterKey x, FilterKey y) {
  if (x.hi != y.hi) return x.hi < y.hi ? -1 : 1;
  if (x.lo != y.lo) return x.lo < y.lo ? -1 : 1;
  return 0;
}

GPQ_DEVICE bool gpq_cmp_holds(u32 cmp, int c) {
  switch (cmp) {
    case FILTER_EQ: return c == 0;
    case FILTER_NE: return c != 0;
    case FILTER_LT: return c < 0;
    case FILTER_LE: return c <= 0;
    case FILTER_GT: return c > 0;
    default: return c >= 0;
  }
}

GPQ_DEVICE bool gpq_bit(const u8* bitmap, u64 i) { return (bitmap[i >> 3] >> (i & 7)) & 1; }

// The key of row `r` (offset applied) of a numeric column; false when the
// column's buffer does not hold it.
GPQ_DEVICE bool gpq_number_key(const FilterColumn& c, u64 r, FilterKey* k) {
  const u64 w = c.width;
  if (w == 0 || w > 16 || (r + 1) * w > c.values_len) return false;
  const u8* p = (const u8*)c.values + r * w;
  if (c.kind == FILTER_FLOAT) {
    i64 bits;
    if (w == 4) {
      u32 b = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
      // As f64: the cast Arrow makes before comparing with an f64 literal.
      double d = (double)__uint_as_float(b);
      bits = __double_as_longlong(d);
    } else {
      u64 b = 0;
      for (int i = 7; i >= 0; i--) b = (b << 8) | p[i];
      bits = (i64)b;
    }
    if ((u64)bits == 0x8000000000000000ull) bits = 0;  // -0.0 equals 0.0
    k->hi = bits ^ (i64)(((u64)(bits >> 63)) >> 1);
    k->lo = 0;
    return true;
  }
  u64 lo = 0;
  const u64 low_bytes = w < 8 ? w : 8;
  for (u64 i = low_bytes; i-- > 0;) lo = (lo << 8) | p[i];
  if (w == 16) {
    u64 hi = 0;
    for (int i = 15; i >= 8; i--) hi = (hi << 8) | p[i];
    k->hi = (i64)hi;
    k->lo = lo;
    return true;
  }
  if (c.kind == FILTER_UINT) {
    k->hi = 0;
    k->lo = lo;
    return true;
  }
  // Sign-extend from w bytes.
  const u32 shift = (u32)(64 - 8 * low_bytes);
  const i64 v = (i64)(lo << shift) >> shift;
  k->hi = v < 0 ? -1 : 0;
  k->lo = (u64)v;
  return true;
}

// Row `r`'s bytes of a string, binary or view column; false when its
// buffers do not hold them.
GPQ_DEVICE bool gpq_string_at(const FilterColumn& c, u64 r, const u8** s, u64* len) {
  if (c.kind == FILTER_VIEW) {
    if ((r + 1) * 16 > c.values_len) return false;
    const u32* v = (const u32*)((const u8*)c.values + r * 16);
    const u64 n = v[0];
    if (n <= 12) {
      *s = (const u8*)(v + 1);
      *len = n;
      return true;
    }
    const u64 start = ((u64)v[2] << 30) + v[3];
    if (start > c.data_len || n > c.data_len - start) return false;
    *s = (const u8*)c.data + start;
    *len = n;
    return true;
  }
  i64 a, b;
  const u64 ow = c.kind == FILTER_LARGE_STRING ? 8 : 4;
  if ((r + 2) * ow > c.offsets_len) return false;
  if (c.kind == FILTER_LARGE_STRING) {
    const i64* o = (const i64*)c.offsets;
    a = o[r];
    b = o[r + 1];
  } else {
    const i32* o = (const i32*)c.offsets;
    a = o[r];
    b = o[r + 1];
  }
  if (a < 0 || b < a || (u64)b > c.values_len) return false;
  *s = (const u8*)c.values + a;
  *len = (u64)(b - a);
  return true;
}

GPQ_DEVICE int gpq_bytes_cmp(const u8* x, u64 nx, const u8* y, u64 ny) {
  const u64 n = nx < ny ? nx : ny;
  for (u64 i = 0; i < n; i++)
    if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
  return nx == ny ? 0 : (nx < ny ? -1 : 1);
}

GPQ_DEVICE bool gpq_bytes_eq(const u8* x, const u8* y, u64 n) {
  for (u64 i = 0; i < n; i++)
    if (x[i] != y[i]) return false;
  return true;
}

// The first position >= from where `pat` (np bytes) starts inside s[0..end), or -1.
GPQ_DEVICE i64 gpq_find(const u8* s, u64 from, u64 end, const u8* pat, u64 np) {
  if (from > end) return -1;
  if (np == 0) return (i64)from;
  if (np > end - from) return -1;
  for (u64 i = from; i <= end - np; i++)
    if (gpq_bytes_eq(s + i, pat, np)) return (i64)i;
  return -1;
}

// LIKE with `%` wildcards only: segments in order, the first anchored at
// the start and the last at the end where the pattern has no `%` there.
GPQ_DEVICE bool gpq_like(const u8* s, u64 len, const FilterLiteral* segs, u32 count, u32 anchors, const u8* pool) {
  u64 pos = 0, end = len;
  u32 first = 0, last = count;
  if ((anchors & 1) && first < last) {
    const u8* p = pool + segs[first].a;
    const u64 n = segs[first].b;
    if (n > len || !gpq_bytes_eq(s, p, n)) return false;
    pos = n;
    first++;
    if (first == last && (anchors & 2)) return pos == len;
  }
  if ((anchors & 2) && first < last) {
    const u8* p = pool + segs[last - 1].a;
    const u64 n = segs[last - 1].b;
    if (n > len - pos || !gpq_bytes_eq(s + len - n, p, n)) return false;
    end = len - n;
    last--;
  }
  for (u32 i = first; i < last; i++) {
    const i64 at = gpq_find(s, pos, end, pool + segs[i].a, segs[i].b);
    if (at < 0) return false;
    pos = (u64)at + segs[i].b;
  }
  return true;
}

// Evaluates the program for row `row`: whether it leaves a known TRUE.
// Sets *bad when a column's buffers do not hold the row.
GPQ_DEVICE bool gpq_filter_row(const FilterProgram& p, u64 row, bool* bad) {
  const FilterOp* ops = (const FilterOp*)p.ops;
  const FilterColumn* cols = (const FilterColumn*)p.columns;
  const FilterLiteral* lits = (const FilterLiteral*)p.literals;
  const u8* pool = (const u8*)p.pool;
  u32 val = 0, known = 0, depth = 0;
  for (u32 i = 0; i < p.n_ops; i++) {
    const FilterOp op = ops[i];
    u32 v = 0, k = 1;
    if (op.code == FILTER_OP_AND || op.code == FILTER_OP_OR) {
      if (depth < 2) { *bad = true; return false; }
      const u32 b = val & 1, kb = known & 1, a = (val >> 1) & 1, ka = (known >> 1) & 1;
      val >>= 2;
      known >>= 2;
      depth -= 2;
      if (op.code == FILTER_OP_AND) {
        v = a & b;
        k = (ka & kb) | (ka & (a ^ 1)) | (kb & (b ^ 1));
      } else {
        v = a | b;
        k = (ka & kb) | (ka & a) | (kb & b);
      }
    } else if (op.code == FILTER_OP_NOT) {
      if (depth < 1) { *bad = true; return false; }
      v = (val & 1) ^ 1;
      k = known & 1;
      val >>= 1;
      known >>= 1;
      depth -= 1;
    } else if (op.code == FILTER_OP_CONST) {
      v = op.cmp == 1;
      k = op.cmp != 2;
    } else if (op.code == FILTER_OP_COLUMNS) {
      if (op.column >= p.n_columns || op.literal >= p.n_columns) { *bad = true; return false; }
      const FilterColumn& a = cols[op.column];
      const FilterColumn& b = cols[op.literal];
      const u64 ra = row + a.offset, rb = row + b.offset;
      if ((a.validity != 0 && (ra >> 3) >= a.validity_len) || (b.validity != 0 && (rb >> 3) >= b.validity_len)) { *bad = true; return false; }
      const bool known_a = a.validity == 0 || gpq_bit((const u8*)a.validity, ra);
      const bool known_b = b.validity == 0 || gpq_bit((const u8*)b.validity, rb);
      if (!known_a || !known_b) {
        k = 0;
      } else if (a.kind >= FILTER_STRING && b.kind >= FILTER_STRING) {
        const u8 *sa, *sb;
        u64 la, lb;
        if (!gpq_string_at(a, ra, &sa, &la) || !gpq_string_at(b, rb, &sb, &lb)) { *bad = true; return false; }
        v = gpq_cmp_holds(op.cmp, gpq_bytes_cmp(sa, la, sb, lb));
      } else if (a.kind <= FILTER_FLOAT && b.kind <= FILTER_FLOAT) {
        FilterKey ka, kb;
        if (!gpq_number_key(a, ra, &ka) || !gpq_number_key(b, rb, &kb)) { *bad = true; return false; }
        v = gpq_cmp_holds(op.cmp, gpq_key_cmp(ka, kb));
      } else {
        *bad = true;
        return false;
      }
    } else {
      if (op.column >= p.n_columns) { *bad = true; return false; }
      const FilterColumn& c = cols[op.column];
      const u64 r = row + c.offset;
      if (c.validity != 0 && (r >> 3) >= c.validity_len) { *bad = true; return false; }
      const bool is_valid = c.validity == 0 || gpq_bit((const u8*)c.validity, r);
      if (op.code == FILTER_OP_IS_NULL || op.code == FILTER_OP_IS_NOT_NULL) {
        v = (op.code == FILTER_OP_IS_NULL) != is_valid;
      } else if (!is_valid) {
        k = 0;
      } else if (op.code == FILTER_OP_BOOL) {
        if (c.kind != FILTER_BOOL || (r >> 3) >= c.values_len) { *bad = true; return false; }
        v = gpq_bit((const u8*)c.values, r);
      } else if (op.literal + op.count > p.n_literals || (op.code == FILTER_OP_COMPARE && op.literal >= p.n_literals)) {
        *bad = true;
        return false;
      } else if (c.kind >= FILTER_STRING) {
        const u8* s;
        u64 len;
        if (!gpq_string_at(c, r, &s, &len)) { *bad = true; return false; }
        if (op.code == FILTER_OP_COMPARE) {
          const FilterLiteral l = lits[op.literal];
          v = gpq_cmp_holds(op.cmp, gpq_bytes_cmp(s, len, pool + l.a, l.b));
        } else if (op.code == FILTER_OP_IN) {
          for (u32 j = 0; j < op.count && !v; j++) {
            const FilterLiteral l = lits[op.literal + j];
            v = l.b == len && gpq_bytes_eq(s, pool + l.a, len);
          }
        } else if (op.code == FILTER_OP_LIKE) {
          v = gpq_like(s, len, lits + op.literal, op.count, op.cmp, pool);
        } else {
          *bad = true;
          return false;
        }
      } else if (c.kind <= FILTER_FLOAT) {
        FilterKey key;
        if (!gpq_number_key(c, r, &key)) { *bad = true; return false; }
        if (op.code == FILTER_OP_COMPARE) {
          const FilterLiteral l = lits[op.literal];
          v = gpq_cmp_holds(op.cmp, gpq_key_cmp(key, FilterKey{(i64)l.a, l.b}));
        } else if (op.code == FILTER_OP_IN) {
          for (u32 j = 0; j < op.count && !v; j++) {
            const FilterLiteral l = lits[op.literal + j];
            v = gpq_key_cmp(key, FilterKey{(i64)l.a, l.b}) == 0;
          }
        } else {
          *bad = true;
          return false;
        }
      } else {
        *bad = true;
        return false;
      }
    }
    if (depth >= FILTER_MAX_DEPTH) { *bad = true; return false; }
    val = (val << 1) | (v & k);
    known = (known << 1) | k;
    depth++;
  }
  return depth == 1 && (val & known & 1);
}

// The keep bitmap and its count per word. Blocks are whole warps; each
// warp takes words in turn, so every lane of a warp runs the same trips.
extern "C" __global__ void gpq_filter_eval(FilterProgram* p) {
  const FilterProgram prog = *p;
  const u64 words = (prog.rows + 31) / 32;
  const u32 lane = threadIdx.x & 31;
  const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
  u32* bits = (u32*)prog.bits;
  u64* counts = (u64*)prog.counts;
  bool bad = false;
  for (u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < words; w += warps) {
    const u64 row = w * 32 + lane;
    bool keep = false;
    if (row < prog.rows) {
      const bool allowed = prog.allowed == 0 || ((row >> 3) < prog.allowed_len && gpq_bit((const u8*)prog.allowed, row));
      keep = allowed && gpq_filter_row(prog, row, &bad);
    }
    const u32 mask = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) {
      bits[w] = mask;
      counts[w] = (u64)__popc(mask);
    }
  }
  if (bad) gpq_set_error(&p->status, GPQ_ERR_OUTPUT_OVERFLOW);
}

// The rows kept, in order: word w's rows go from bases[w] on. `kept` holds
// `capacity` entries; a word whose rows would not fit reports an overflow.
extern "C" __global__ void gpq_filter_rows(const u32* bits, const u64* bases, u64 words, u32* kept, u64 capacity, u32* status) {
  for (u64 w = (u64)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += (u64)gridDim.x * blockDim.x) {
    u32 mask = bits[w];
    u64 at = bases[w];
    if (at > capacity || (u64)__popc(mask) > capacity - at) {
      gpq_set_error(status, GPQ_ERR_OUTPUT_OVERFLOW);
      continue;
    }
    while (mask) {
      const u32 b = (u32)__ffs(mask) - 1;
      kept[at++] = (u32)(w * 32 + b);
      mask &= mask - 1;
    }
  }
}
