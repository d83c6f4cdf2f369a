// Grouped aggregation of decoded rows: DataFusion's partial aggregation
// (COUNT, SUM, MIN, MAX, and AVG as a count and a sum) done where the rows
// are, so that only one row per group crosses the bus.
//
// Each row's grouping columns are packed into one 63-bit key (a field per
// column: a null bit, then the value's low bits, or a string's length and
// bytes; the host sizes the fields, and a value that does not fit its field
// is reported, never truncated). Each aggregate's input is a postfix
// program over integer and decimal columns in exact 128-bit arithmetic
// (+, -, *, scaling by a power of ten, and range checks where DataFusion's
// types would wrap or a cast would fail); any overflow is reported. Keys
// are inserted into a small table in shared memory per block with
// compare-and-swap (a whole key is one 64-bit word, so a slot is never half
// written), and into the global table when that is full; at the end each
// block adds its shared table into the global one. Sums are 192 bits wide
// (each 128-bit input sign-extended), added as three 64-bit atomics with
// their carries, so no count of rows a batch can hold overflows them; MIN
// and MAX keep an order-preserving 64-bit encoding under atomicMax.
//
// The host reads back the global table. A reported condition (a key or a
// value out of range, more groups than the table holds) makes it aggregate
// the batch on the host instead: the kernel never guesses.

#define AGG_MAX_FUNCS 8
#define AGG_WORDS 4  // accumulator words per aggregate: values counted, then three value words
#define AGG_SHARED_SLOTS 128
#define AGG_MAX_DEPTH 16
#define AGG_EMPTY 0xffffffffffffffffull
#define AGG_SIGN 0x8000000000000000ull
// Probes before a key gives up on the shared table (and goes to the global
// one), and on the global table (which then counts as full: the host grows
// it and runs the batch again). Bounded so that a batch with more groups
// than the table costs each thread one long search, not every row.
#define AGG_SHARED_PROBES 16
#define AGG_GLOBAL_PROBES 1024

typedef __int128 i128;
typedef unsigned __int128 u128;

// Bits of AggProgram::status.
enum AggStatus : u32 {
  AGG_BAD_BUFFER = 1,    // a column's buffers do not hold a row: a bug, never a fallback
  AGG_BAD_PROGRAM = 2,   // a malformed program: a bug
  AGG_KEY_TOO_WIDE = 4,  // a grouping value does not fit its field of the key
  AGG_OVERFLOW = 8,      // an input value overflowed (or left its type's range)
  AGG_TABLE_FULL = 16,   // more groups than the global table holds
};

enum AggOpCode : u32 {
  AGG_OP_COLUMN = 0,      // push the column's value (NULL where it is null)
  AGG_OP_CONST = 1,       // push (hi, lo); `arg` 1: push NULL
  AGG_OP_ADD = 2,
  AGG_OP_SUB = 3,
  AGG_OP_MUL = 4,
  AGG_OP_SCALE = 5,       // multiply by 10^arg
  AGG_OP_FIT_SIGNED = 6,  // the value must fit a signed integer of `arg` bits (1 to 127)
  AGG_OP_FIT_UNSIGNED = 7,  // ... an unsigned integer of `arg` bits (1 to 126)
  AGG_OP_FIT_DIGITS = 8,  // |value| < 10^arg (a decimal's precision)
};

enum AggFuncKind : u32 {
  AGG_COUNT_ROWS = 0,  // every row
  AGG_COUNT = 1,       // rows whose input is not NULL
  AGG_SUM = 2,
  AGG_MIN = 3,
  AGG_MAX = 4,
};

struct AggKey {
  u32 column;    // index into the column table
  u32 shift;     // first bit of the field in the packed key
  u32 bits;      // bits of the field: the null bit, then the value
  u32 len_bits;  // strings: bits of the length (bytes follow it); 0 for numbers
};

struct AggOp {
  u32 code;    // AggOpCode
  u32 column;  // AGG_OP_COLUMN: index into the column table
  u32 arg;     // see AggOpCode
  u32 pad;
  i64 hi;      // AGG_OP_CONST: the value
  u64 lo;
};

struct AggFunc {
  u32 kind;      // AggFuncKind
  u32 first_op;  // its input program: ops[first_op .. first_op + n_ops)
  u32 n_ops;
  u32 pad;
};

struct AggProgram {
  u64 columns;      // FilterColumn[n_columns] (filter.cu)
  u64 keys;         // AggKey[n_keys]
  u64 ops;          // AggOp[...]
  u64 funcs;        // AggFunc[n_funcs]
  u64 allowed;      // bitmap of the rows to aggregate, 0: all
  u64 allowed_len;  // its bytes
  u64 rows;
  u64 table_keys;   // u64[capacity], AGG_EMPTY where free
  u64 table_acc;    // u64[capacity * n_funcs * AGG_WORDS], zeroed by the host
  u64 status;       // u32 then u64, zeroed by the host; out: AggStatus bits, and the
                    // rows aggregated (apart from the program, which every thread
                    // copies while others may be done)
  u32 capacity;     // slots of the global table, a power of two
  u32 n_columns;
  u32 n_keys;
  u32 n_ops;
  u32 n_funcs;
  u32 pad;
};

GPQ_DEVICE u64 gpq_agg_hash(u64 k) {
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  return k ^ (k >> 31);
}

// The slot of `key` in a table of `cap` slots (a power of two), claimed if
// new; -1 when none of the first `probes` slots of its sequence holds it or
// is free (slots are never freed, so a key that once found no place never
// finds one later, and one that did is found where it went).
GPQ_DEVICE i64 gpq_agg_insert(u64* keys, u64 cap, u64 key, u64 probes) {
  const u64 h = gpq_agg_hash(key);
  const u64 limit = probes < cap ? probes : cap;
  for (u64 probe = 0; probe < limit; probe++) {
    const u64 at = (h + probe) & (cap - 1);
    const u64 seen = atomicCAS(&keys[at], AGG_EMPTY, key);
    if (seen == AGG_EMPTY || seen == key) return (i64)at;
  }
  return -1;
}

// Adds the 192-bit v2:v1:v0 to the words w[0..3], low first: each word's
// carry goes into the next, and addition commutes, so concurrent adds are
// exact (modulo 2^192).
GPQ_DEVICE void gpq_agg_add192(u64* w, u64 v0, u64 v1, u64 v2) {
  const u64 old0 = atomicAdd(&w[0], v0);
  const u64 c0 = old0 + v0 < old0 ? 1 : 0;
  const u64 a1 = v1 + c0;
  const u64 wrap1 = a1 < v1 ? 1 : 0;  // v1 all ones and a carry in
  u64 c1 = wrap1;
  if (a1 != 0) {
    const u64 old1 = atomicAdd(&w[1], a1);
    c1 += old1 + a1 < old1 ? 1 : 0;
  }
  if (v2 + c1 != 0) atomicAdd(&w[2], v2 + c1);
}

GPQ_DEVICE i128 gpq_agg_pow10(u32 k) {
  i128 p = 1;
  for (u32 i = 0; i < k && i < 38; i++) p *= 10;
  return p;
}

GPQ_DEVICE bool gpq_agg_mul(i128 a, i128 b, i128* r) {
  const i128 lim = ((i128)1) << 63;
  if (a >= -lim && a < lim && b >= -lim && b < lim) {
    *r = a * b;
    return true;
  }
  const bool neg = (a < 0) != (b < 0);
  const u128 ua = a < 0 ? (u128)0 - (u128)a : (u128)a;
  const u128 ub = b < 0 ? (u128)0 - (u128)b : (u128)b;
  const u128 max = neg ? ((u128)1) << 127 : (((u128)1) << 127) - 1;
  if (ua != 0 && ub > max / ua) return false;
  const u128 m = ua * ub;
  *r = neg ? (i128)((u128)0 - m) : (i128)m;
  return true;
}

// Row `r`'s (offset applied) value of a numeric column; false when the
// column's buffers do not hold it.
GPQ_DEVICE bool gpq_agg_number(const FilterColumn& c, u64 r, i128* v) {
  if (c.kind != FILTER_INT && c.kind != FILTER_UINT) return false;
  FilterKey k;
  if (!gpq_number_key(c, r, &k)) return false;
  *v = (i128)(((u128)(u64)k.hi << 64) | (u128)k.lo);
  return true;
}

// Whether row `r` of `c` is valid; sets *bad when the bitmap does not hold it.
GPQ_DEVICE bool gpq_agg_valid(const FilterColumn& c, u64 r, u32* bad) {
  if (c.validity == 0) return true;
  if ((r >> 3) >= c.validity_len) {
    *bad |= AGG_BAD_BUFFER;
    return false;
  }
  return gpq_bit((const u8*)c.validity, r);
}

// The packed key of row `row`; 0 or the AggStatus bits that stop it.
GPQ_DEVICE u32 gpq_agg_key(const AggProgram& p, u64 row, u64* out) {
  const AggKey* keys = (const AggKey*)p.keys;
  const FilterColumn* cols = (const FilterColumn*)p.columns;
  u64 key = 0;
  for (u32 i = 0; i < p.n_keys; i++) {
    const AggKey k = keys[i];
    if (k.column >= p.n_columns || k.bits < 2 || k.bits > 63 || k.shift > 63 - k.bits) return AGG_BAD_PROGRAM;
    const FilterColumn& c = cols[k.column];
    const u64 r = row + c.offset;
    u32 bad = 0;
    const bool valid = gpq_agg_valid(c, r, &bad);
    if (bad) return bad;
    if (!valid) {
      key |= 1ull << k.shift;
      continue;
    }
    u64 field = 0;
    const u32 vbits = k.bits - 1;
    if (c.kind >= FILTER_STRING) {
      const u8* s;
      u64 len;
      if (!gpq_string_at(c, r, &s, &len)) return AGG_BAD_BUFFER;
      if (k.len_bits == 0 || k.len_bits > vbits) return AGG_BAD_PROGRAM;
      const u64 max_len = (vbits - k.len_bits) / 8;
      if (len > max_len || len >= (1ull << k.len_bits)) return AGG_KEY_TOO_WIDE;
      field = len;
      for (u64 j = 0; j < len; j++) field |= (u64)s[j] << (k.len_bits + 8 * j);
    } else {
      i128 v;
      if (!gpq_agg_number(c, r, &v)) return AGG_BAD_BUFFER;
      const i128 half = ((i128)1) << (vbits - 1);
      if (c.kind == FILTER_UINT) {
        // Unsigned values zero-extended: every bit of the field is value.
        if (v < 0 || v >= 2 * half) return AGG_KEY_TOO_WIDE;
      } else if (v < -half || v >= half) {
        return AGG_KEY_TOO_WIDE;
      }
      field = (u64)v & ((1ull << vbits) - 1);
    }
    key |= (field << 1) << k.shift;
  }
  *out = key;
  return 0;
}

// Runs an aggregate's input program on row `row`: its value, or NULL
// (*present false); 0 or the AggStatus bits that stop it.
GPQ_DEVICE u32 gpq_agg_eval(const AggProgram& p, const AggFunc& f, u64 row, i128* out, bool* present) {
  const AggOp* ops = (const AggOp*)p.ops;
  const FilterColumn* cols = (const FilterColumn*)p.columns;
  i128 stack[AGG_MAX_DEPTH];
  u32 nulls = 0;  // bit i: stack[i] is NULL
  u32 depth = 0;
  for (u32 i = 0; i < f.n_ops; i++) {
    const AggOp op = ops[f.first_op + i];
    if (op.code == AGG_OP_COLUMN || op.code == AGG_OP_CONST) {
      if (depth >= AGG_MAX_DEPTH) return AGG_BAD_PROGRAM;
      i128 v = 0;
      bool is_null = false;
      if (op.code == AGG_OP_CONST) {
        v = (i128)(((u128)(u64)op.hi << 64) | (u128)op.lo);
        is_null = op.arg == 1;
      } else {
        if (op.column >= p.n_columns) return AGG_BAD_PROGRAM;
        const FilterColumn& c = cols[op.column];
        const u64 r = row + c.offset;
        u32 bad = 0;
        is_null = !gpq_agg_valid(c, r, &bad);
        if (bad) return bad;
        if (!is_null && !gpq_agg_number(c, r, &v)) return AGG_BAD_BUFFER;
      }
      stack[depth] = v;
      nulls = is_null ? nulls | (1u << depth) : nulls & ~(1u << depth);
      depth++;
    } else if (op.code == AGG_OP_ADD || op.code == AGG_OP_SUB || op.code == AGG_OP_MUL) {
      if (depth < 2) return AGG_BAD_PROGRAM;
      const i128 a = stack[depth - 2], b = stack[depth - 1];
      const bool is_null = ((nulls >> (depth - 2)) & 3) != 0;
      depth--;
      i128 r = 0;
      if (!is_null) {
        if (op.code == AGG_OP_MUL) {
          if (!gpq_agg_mul(a, b, &r)) return AGG_OVERFLOW;
        } else {
          const i128 bb = b;
          r = (i128)(op.code == AGG_OP_ADD ? (u128)a + (u128)bb : (u128)a - (u128)bb);
          const bool over = op.code == AGG_OP_ADD ? ((a ^ r) & (bb ^ r)) < 0 : ((a ^ bb) & (a ^ r)) < 0;
          if (over) return AGG_OVERFLOW;
        }
      }
      stack[depth - 1] = r;
      nulls = is_null ? nulls | (1u << (depth - 1)) : nulls & ~(1u << (depth - 1));
    } else if (op.code >= AGG_OP_SCALE && op.code <= AGG_OP_FIT_DIGITS) {
      if (depth < 1) return AGG_BAD_PROGRAM;
      if ((nulls >> (depth - 1)) & 1) continue;
      const i128 v = stack[depth - 1];
      if (op.code == AGG_OP_SCALE) {
        if (op.arg > 38) return AGG_BAD_PROGRAM;
        i128 r;
        if (!gpq_agg_mul(v, gpq_agg_pow10(op.arg), &r)) return AGG_OVERFLOW;
        stack[depth - 1] = r;
      } else if (op.code == AGG_OP_FIT_DIGITS) {
        if (op.arg > 38) return AGG_BAD_PROGRAM;
        const i128 lim = gpq_agg_pow10(op.arg);
        if (v >= lim || v <= -lim) return AGG_OVERFLOW;
      } else {
        if (op.arg == 0 || op.arg > (op.code == AGG_OP_FIT_SIGNED ? 127u : 126u)) return AGG_BAD_PROGRAM;
        const bool fits = op.code == AGG_OP_FIT_SIGNED ? (v >= -(((i128)1) << (op.arg - 1)) && v < (((i128)1) << (op.arg - 1)))
                                                       : (v >= 0 && v < (((i128)1) << op.arg));
        if (!fits) return AGG_OVERFLOW;
      }
    } else {
      return AGG_BAD_PROGRAM;
    }
  }
  if (depth != 1) return AGG_BAD_PROGRAM;
  *out = stack[0];
  *present = (nulls & 1) == 0;
  return 0;
}

// One lane's share of each aggregate for the warp's reduction: the rows it
// counts, and its value (SUM: 192 bits, low word first; MIN and MAX: the
// order-preserving encoding, 0 where absent, the identity of the max).
struct AggLane {
  u32 count[AGG_MAX_FUNCS];
  u64 w[AGG_MAX_FUNCS][3];
};

GPQ_DEVICE void gpq_agg_add192_local(u64* a, u64 b0, u64 b1, u64 b2) {
  const u64 s0 = a[0] + b0;
  const u64 c0 = s0 < b0 ? 1 : 0;
  const u64 s1 = a[1] + b1;
  const u64 c1 = s1 < b1 ? 1 : 0;
  const u64 s1c = s1 + c0;
  const u64 c1c = s1c < c0 ? 1 : 0;
  a[0] = s0;
  a[1] = s1c;
  a[2] = a[2] + b2 + c1 + c1c;
}

// Sums the lane shares of each group of `peers` (the lanes holding the
// same key) into the group's lowest lane, in as many steps as the largest
// group has bits (a tree over each group's lanes in lane order). Every lane
// of the warp calls it with the same functions.
GPQ_DEVICE void gpq_agg_reduce_peers(AggLane& x, u32 peers, const AggFunc* funcs, u32 n_funcs) {
  const u32 lane = threadIdx.x & 31;
  u32 rel = __popc(peers & ((1u << lane) - 1));  // my place in my group
  u32 above = peers & ~((2u << lane) - 1);       // my group's lanes after me
  while (__any_sync(0xffffffffu, above != 0)) {
    const int next = __ffs(above);  // 1 + the nearest one left, or 0
    const int from = next ? next - 1 : (int)lane;
    for (u32 f = 0; f < n_funcs; f++) {
      const u32 kind = funcs[f].kind;
      const u32 c = __shfl_sync(0xffffffffu, x.count[f], from);
      if (kind == AGG_SUM) {
        const u64 b0 = __shfl_sync(0xffffffffu, x.w[f][0], from);
        const u64 b1 = __shfl_sync(0xffffffffu, x.w[f][1], from);
        const u64 b2 = __shfl_sync(0xffffffffu, x.w[f][2], from);
        if (next) gpq_agg_add192_local(x.w[f], b0, b1, b2);
      } else if (kind == AGG_MIN || kind == AGG_MAX) {
        const u64 b = __shfl_sync(0xffffffffu, x.w[f][0], from);
        if (next && b > x.w[f][0]) x.w[f][0] = b;
      }
      if (next) x.count[f] += c;
    }
    // Lanes at odd places have been added into their left neighbour: the
    // others no longer look at them, and the places halve.
    above &= ~__ballot_sync(0xffffffffu, rel & 1);
    rel >>= 1;
  }
}

// Adds a group's reduced shares into the accumulator words `acc` of its slot.
GPQ_DEVICE void gpq_agg_accumulate(u64* acc, const AggFunc* funcs, u32 n_funcs, const AggLane& x) {
  for (u32 f = 0; f < n_funcs; f++) {
    if (x.count[f] == 0) continue;
    u64* w = acc + f * AGG_WORDS;
    atomicAdd(&w[0], (u64)x.count[f]);
    const u32 kind = funcs[f].kind;
    if (kind == AGG_SUM) {
      gpq_agg_add192(&w[1], x.w[f][0], x.w[f][1], x.w[f][2]);
    } else if (kind == AGG_MIN || kind == AGG_MAX) {
      atomicMax(&w[1], x.w[f][0]);
    }
  }
}

// Adds a shared slot's words into a global slot's.
GPQ_DEVICE void gpq_agg_merge(u64* dst, const u64* src, const AggFunc* funcs, u32 n_funcs) {
  for (u32 f = 0; f < n_funcs; f++) {
    u64* d = dst + f * AGG_WORDS;
    const u64* s = src + f * AGG_WORDS;
    if (s[0] == 0) continue;
    atomicAdd(&d[0], s[0]);
    if (funcs[f].kind == AGG_SUM) {
      gpq_agg_add192(&d[1], s[1], s[2], s[3]);
    } else if (funcs[f].kind == AGG_MIN || funcs[f].kind == AGG_MAX) {
      atomicMax(&d[1], s[1]);
    }
  }
}

// One launch aggregates every row into the global table. Any block count
// works; a block's size must be a multiple of 32. A warp takes 32 rows at a
// time in lockstep: its lanes with equal keys (__match_any_sync) add their
// shares together first, and only each group's first lane touches the
// table, so a batch of few groups (TPC-H q1 has four) does not serialize
// every row on the same slot's atomics. The barriers sit outside the loop
// over rows, which a warp leaves early, all lanes together, only once the
// launch has failed.
extern "C" __global__ void gpq_aggregate(AggProgram* p) {
  const AggProgram prog = *p;
  __shared__ u64 s_keys[AGG_SHARED_SLOTS];
  __shared__ u64 s_taken;
  __shared__ u64 s_acc[AGG_SHARED_SLOTS * AGG_MAX_FUNCS * AGG_WORDS];
  const AggFunc* funcs = (const AggFunc*)prog.funcs;
  const u32 words = prog.n_funcs * AGG_WORDS;
  u64* g_keys = (u64*)prog.table_keys;
  u64* g_acc = (u64*)prog.table_acc;
  const bool well_formed = prog.n_funcs <= AGG_MAX_FUNCS && prog.capacity != 0 && (prog.capacity & (prog.capacity - 1)) == 0 &&
                           prog.n_keys <= 63 && (blockDim.x & 31) == 0;
  u32 bad = well_formed ? 0 : AGG_BAD_PROGRAM;
  u64 taken = 0;
  if (threadIdx.x == 0) s_taken = 0;
  for (u32 i = threadIdx.x; i < AGG_SHARED_SLOTS; i += blockDim.x) s_keys[i] = AGG_EMPTY;
  for (u32 i = threadIdx.x; i < AGG_SHARED_SLOTS * AGG_MAX_FUNCS * AGG_WORDS; i += blockDim.x) s_acc[i] = 0;
  __syncthreads();
  const u32 lane = threadIdx.x & 31;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  // `base` is the same in every lane of a warp, so its lanes iterate together.
  for (u64 base = (u64)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); well_formed && base < prog.rows; base += stride) {
    const u64 row = base + lane;
    bool active = row < prog.rows;
    if (active && prog.allowed != 0 && ((row >> 3) >= prog.allowed_len || !gpq_bit((const u8*)prog.allowed, row))) active = false;
    AggLane x;  // only its first n_funcs entries are read (well_formed bounds n_funcs)
    for (u32 f = 0; f < prog.n_funcs; f++) {
      x.count[f] = 0;
      x.w[f][0] = x.w[f][1] = x.w[f][2] = 0;
    }
    u64 key = AGG_EMPTY;  // never a packed key (those have 63 bits): the idle lanes' group
    u32 e = 0;
    if (active) e = gpq_agg_key(prog, row, &key);
    for (u32 f = 0; active && f < prog.n_funcs && !e; f++) {
      if (funcs[f].kind == AGG_COUNT_ROWS) {
        x.count[f] = 1;
        continue;
      }
      bool is_present = false;
      i128 v = 0;
      e = gpq_agg_eval(prog, funcs[f], row, &v, &is_present);
      if (e || !is_present) continue;
      x.count[f] = 1;
      if (funcs[f].kind == AGG_SUM) {
        x.w[f][0] = (u64)v;
        x.w[f][1] = (u64)((u128)v >> 64);
        x.w[f][2] = v < 0 ? ~0ull : 0ull;
      } else if (funcs[f].kind == AGG_MIN || funcs[f].kind == AGG_MAX) {
        const i128 lim = ((i128)1) << 63;
        if (v < -lim || v >= lim) {
          e = AGG_OVERFLOW;
        } else {
          const u64 enc = (u64)(i64)v ^ AGG_SIGN;
          x.w[f][0] = funcs[f].kind == AGG_MIN ? ~enc : enc;
        }
      }
    }
    bad |= e;
    // Any condition fails the whole launch (the host discards the table): stop early.
    if (__any_sync(0xffffffffu, e != 0)) break;
    if (!active) key = AGG_EMPTY;
    const u32 peers = __match_any_sync(0xffffffffu, key);
    gpq_agg_reduce_peers(x, peers, funcs, prog.n_funcs);
    bool full = false;
    if (active && lane == (u32)(__ffs(peers) - 1)) {
      const i64 s = gpq_agg_insert(s_keys, AGG_SHARED_SLOTS, key, AGG_SHARED_PROBES);
      if (s >= 0) {
        gpq_agg_accumulate(s_acc + (u64)s * words, funcs, prog.n_funcs, x);
      } else {
        const i64 g = gpq_agg_insert(g_keys, prog.capacity, key, AGG_GLOBAL_PROBES);
        if (g < 0) {
          full = true;
        } else {
          gpq_agg_accumulate(g_acc + (u64)g * words, funcs, prog.n_funcs, x);
        }
      }
    }
    if (full) bad |= AGG_TABLE_FULL;
    if (__any_sync(0xffffffffu, full)) break;
    if (active) taken++;
  }
  if (taken) atomicAdd(&s_taken, taken);
  __syncthreads();
  for (u32 s = threadIdx.x; well_formed && s < AGG_SHARED_SLOTS; s += blockDim.x) {
    if (s_keys[s] == AGG_EMPTY) continue;
    const i64 g = gpq_agg_insert(g_keys, prog.capacity, s_keys[s], AGG_GLOBAL_PROBES);
    if (g < 0) {
      bad |= AGG_TABLE_FULL;
      continue;
    }
    gpq_agg_merge(g_acc + (u64)g * words, s_acc + (u64)s * words, funcs, prog.n_funcs);
  }
  if (bad) atomicOr((u32*)prog.status, bad);
  if (threadIdx.x == 0 && s_taken) atomicAdd((u64*)prog.status + 1, s_taken);
}
