// Nested columns: repetition and definition levels, and the Arrow arrays
// they describe.
//   gpq_decode_levels - per page of a nested leaf, its levels as u16 arrays
//                       (the value kernels decode the leaf's values at the
//                       same level positions).
//   gpq_nest_count    - per tile of level positions, how many pass each slot
//                       test (host: a prefix sum over tiles gives each tile's
//                       first slot, and the totals that size the outputs).
//   gpq_nest_apply    - per tile, the operations of decode/nesting.rs: list
//                       offsets, validity bits, and the gathers that move a
//                       leaf's values from level positions to its slots.
// See plan/nesting.rs for the slot tests. Every write is checked against the
// size its output was given; a disagreement (which only corrupt levels can
// cause) is reported in the status word, never written.

// Mirrors decode/nesting.rs (SlotTestDesc).
struct SlotTestDesc {
  u32 max_rep;
  u32 min_def;
};

enum NestOpKind : u32 {
  NEST_OFFSETS = 0,         // i32 list offsets: dst[slot] = element slots before it; dst[total] = all
  NEST_VALIDITY = 1,        // dst bit slot = def >= arg; nulls counted into *counter
  NEST_GATHER = 2,          // arg-byte values: dst[slot] = src[position]
  NEST_GATHER_BITS = 3,     // bits: dst bit slot = src bit position
  NEST_GATHER_OFFSETS = 4,  // arg-byte (4 or 8) string offsets, and dst[total] = src[positions]
};

// Mirrors decode/nesting.rs (NestOp, 48 bytes).
struct NestOp {
  u32 kind;      // NestOpKind
  u32 test;      // slot test of the written array
  u32 element;   // NEST_OFFSETS: slot test of the elements
  u32 arg;       // NEST_VALIDITY: valid definition level; gathers: bytes per value
  u64 src;       // gathers: level-position array
  u64 dst;       // output
  u64 capacity;  // slots (entries, bits, values) dst holds, offsets' final entry excluded
  u64 counter;   // NEST_VALIDITY: address of a u64 null counter
};

#define NEST_PER_THREAD 8
#define NEST_TILE (GPQ_BLOCK * NEST_PER_THREAD)
#define NEST_MAX_TESTS 16

GPQ_DEVICE u32 level_at(const u16* levels, u64 i) { return levels ? levels[i] : 0u; }

// Per page of a nested leaf: the page's repetition and definition levels,
// batch by batch, into the column's u16 arrays at the page's level positions.
extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_decode_levels(PageDesc* pages, const ColumnDesc* columns) {
  __shared__ HybridStream rep;
  __shared__ HybridStream def;
  __shared__ u32 error;
  PageDesc* pg = &pages[blockIdx.x];
  const ColumnDesc& col = columns[pg->column];
  if (threadIdx.x == 0) {
    error = 0;
    hybrid_init(rep, nullptr, 0, 0);
    hybrid_init(def, nullptr, 0, 0);
    const u8* p = (const u8*)pg->data;
    u32 left = pg->size;
    if (pg->row_start + pg->num_values > col.num_rows || !col.def_levels) error = GPQ_ERR_OUTPUT_OVERFLOW;
    else if ((pg->level_mode & LEVELS_VERSION_MASK) == LEVELS_V2) {
      if ((u64)pg->rep_len + pg->def_len > left) error = GPQ_ERR_TRUNCATED_PAGE;
      else {
        if (col.max_rep) hybrid_init(rep, p, pg->rep_len, level_bit_width(col.max_rep));
        if (col.max_def) hybrid_init(def, p + pg->rep_len, pg->def_len, level_bit_width(col.max_def));
      }
    } else {
      if (col.max_rep) error = v1_level_stream(&p, &left, col.max_rep, pg->level_mode & LEVELS_REP_BIT_PACKED, pg->num_values, &rep);
      if (!error && col.max_def) error = v1_level_stream(&p, &left, col.max_def, pg->level_mode & LEVELS_DEF_BIT_PACKED, pg->num_values, &def);
    }
  }
  __syncthreads();
  u16* rep_out = (u16*)col.rep_levels;
  u16* def_out = (u16*)col.def_levels;
  const u32 n = pg->num_values;
  bool stop = error != 0;
  for (u32 lo = 0; lo < n && !stop; lo += GPQ_BATCH) {
    u32 hi = min(n, lo + GPQ_BATCH);
    if (threadIdx.x == 0) {
      if (col.max_rep) hybrid_fill(rep, lo, hi);
      if (col.max_def) hybrid_fill(def, lo, hi);
    }
    __syncthreads();
    u32 local_err = rep.error ? rep.error : def.error;
    if (!local_err) {
      for (u32 k = 0; k < GPQ_PER_THREAD; k++) {
        u32 i = lo + k * blockDim.x + threadIdx.x;
        if (i >= hi) break;
        u32 r = col.max_rep ? hybrid_get(rep, i) : 0u;
        u32 d = col.max_def ? hybrid_get(def, i) : 0u;
        if (r > col.max_rep || d > col.max_def) { local_err = GPQ_ERR_LEVEL_OUT_OF_RANGE; break; }
        if (rep_out) rep_out[pg->row_start + i] = (u16)r;
        def_out[pg->row_start + i] = (u16)d;
      }
    }
    // The barrier also orders this batch's reads of the run tables before
    // the next batch's fill.
    stop = stop_at_barrier(&error, local_err);
  }
  __syncthreads();
  if (threadIdx.x == 0 && error) atomicCAS(&pg->status, 0u, error);
}

GPQ_DEVICE bool passes(SlotTestDesc t, u32 r, u32 d) { return r <= t.max_rep && d >= t.min_def; }

// Exclusive prefix sum of `v` over the block; *total gets the block's sum.
// Every thread must call.
GPQ_DEVICE u32 block_exclusive_sum(u32 v, u32* warp_sums, u32* total) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x / 32;
  u32 incl = v;
  for (u32 d = 1; d < 32; d <<= 1) {
    u32 y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 acc = 0;
    for (u32 w = 0; w < nwarps; w++) { u32 c = warp_sums[w]; warp_sums[w] = acc; acc += c; }
    warp_sums[nwarps] = acc;
  }
  __syncthreads();
  u32 r = warp_sums[warp] + incl - v;
  *total = warp_sums[nwarps];
  __syncthreads();
  return r;
}

// Per tile of NEST_TILE level positions: counts[t * num_tiles + tile] =
// positions passing slot test t. Launched with GPQ_BLOCK threads.
extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_nest_count(const u16* rep, const u16* def, u64 n,
                                                                      const SlotTestDesc* tests, u32 num_tests,
                                                                      u64* counts) {
  __shared__ u32 warp_sums[GPQ_BLOCK / 32 + 1];
  const u64 num_tiles = gridDim.x;
  const u64 first = (u64)blockIdx.x * NEST_TILE + (u64)threadIdx.x * NEST_PER_THREAD;
  u32 r[NEST_PER_THREAD], d[NEST_PER_THREAD];
  for (u32 k = 0; k < NEST_PER_THREAD; k++) {
    u64 i = first + k;
    r[k] = i < n ? level_at(rep, i) : 0xffffffffu;   // past the end: passes no test
    d[k] = i < n ? level_at(def, i) : 0u;
  }
  for (u32 t = 0; t < num_tests && t < NEST_MAX_TESTS; t++) {
    SlotTestDesc test = tests[t];
    u32 c = 0;
    for (u32 k = 0; k < NEST_PER_THREAD; k++) c += passes(test, r[k], d[k]);
    u32 total;
    block_exclusive_sum(c, warp_sums, &total);
    if (threadIdx.x == 0) counts[t * num_tiles + blockIdx.x] = total;
  }
}

// Sets bit `i` of a u32 bitmap.
GPQ_DEVICE void set_bit(u32* bitmap, u64 i) { atomicOr(bitmap + (i >> 5), 1u << (i & 31)); }

// Per tile: every operation, given each test's first slot in the tile
// (`bases[t * num_tiles + tile]`, the exclusive prefix sum of gpq_nest_count's
// counts) and its total over all tiles (`totals[t]`). A write past an
// output's capacity is not made; *status records it.
extern "C" __global__ void __launch_bounds__(GPQ_BLOCK) gpq_nest_apply(const u16* rep, const u16* def, u64 n,
                                                                      const SlotTestDesc* tests, u32 num_tests,
                                                                      const u64* bases, const u64* totals,
                                                                      const NestOp* ops, u32 num_ops, u32* status) {
  __shared__ u32 warp_sums[GPQ_BLOCK / 32 + 1];
  const u64 num_tiles = gridDim.x;
  const bool last_tile = blockIdx.x + 1 == gridDim.x;
  const u64 first = (u64)blockIdx.x * NEST_TILE + (u64)threadIdx.x * NEST_PER_THREAD;
  u32 r[NEST_PER_THREAD], d[NEST_PER_THREAD];
  for (u32 k = 0; k < NEST_PER_THREAD; k++) {
    u64 i = first + k;
    r[k] = i < n ? level_at(rep, i) : 0xffffffffu;
    d[k] = i < n ? level_at(def, i) : 0u;
  }
  u32 overflow = 0;
  for (u32 o = 0; o < num_ops; o++) {
    const NestOp op = ops[o];
    if (op.test >= num_tests || op.test >= NEST_MAX_TESTS) { overflow = 1; continue; }   // uniform: op is the same for all threads
    const SlotTestDesc test = tests[op.test];
    u32 c = 0;
    for (u32 k = 0; k < NEST_PER_THREAD; k++) c += passes(test, r[k], d[k]);
    u32 block_total;
    u64 slot = bases[op.test * num_tiles + blockIdx.x] + block_exclusive_sum(c, warp_sums, &block_total);
    u64 elem = 0;
    SlotTestDesc etest = test;
    if (op.kind == NEST_OFFSETS) {
      if (op.element >= num_tests || op.element >= NEST_MAX_TESTS) { overflow = 1; continue; }
      etest = tests[op.element];
      u32 e = 0;
      for (u32 k = 0; k < NEST_PER_THREAD; k++) e += passes(etest, r[k], d[k]);
      elem = bases[op.element * num_tiles + blockIdx.x] + block_exclusive_sum(e, warp_sums, &block_total);
    }
    u64 nulls = 0;
    for (u32 k = 0; k < NEST_PER_THREAD; k++) {
      u64 i = first + k;
      const bool here = passes(test, r[k], d[k]);
      if (here) {
        if (slot >= op.capacity) overflow = 1;
        else switch (op.kind) {
          case NEST_OFFSETS:
            ((i32*)op.dst)[slot] = (i32)elem;
            break;
          case NEST_VALIDITY:
            if (d[k] >= op.arg) set_bit((u32*)op.dst, slot);
            else nulls++;
            break;
          case NEST_GATHER: {
            const u8* s = (const u8*)op.src + i * op.arg;
            u8* t = (u8*)op.dst + slot * op.arg;
            // Level-position arrays and outputs start 256-byte aligned.
            if (op.arg == 4) *(u32*)t = *(const u32*)s;
            else if (op.arg == 8) *(u64*)t = *(const u64*)s;
            else if (op.arg == 16) { ((u64*)t)[0] = ((const u64*)s)[0]; ((u64*)t)[1] = ((const u64*)s)[1]; }
            else if (op.arg == 2) *(u16*)t = *(const u16*)s;
            else for (u32 b = 0; b < op.arg; b++) t[b] = s[b];
            break;
          }
          case NEST_GATHER_BITS:
            if ((((const u32*)op.src)[i >> 5] >> (i & 31)) & 1) set_bit((u32*)op.dst, slot);
            break;
          case NEST_GATHER_OFFSETS:
            if (op.arg == 8) ((u64*)op.dst)[slot] = ((const u64*)op.src)[i];
            else ((u32*)op.dst)[slot] = ((const u32*)op.src)[i];
            break;
          default:
            overflow = 1;
        }
        slot++;
      }
      if (op.kind == NEST_OFFSETS && passes(etest, r[k], d[k])) elem++;
    }
    if (nulls && op.counter) atomicAdd((unsigned long long*)op.counter, (unsigned long long)nulls);
    // The final entry of an offsets array.
    if (last_tile && threadIdx.x == 0) {
      u64 total = totals[op.test];
      if (op.kind == NEST_OFFSETS) {
        if (total > op.capacity) overflow = 1;
        else ((i32*)op.dst)[total] = (i32)totals[op.element];
      } else if (op.kind == NEST_GATHER_OFFSETS) {
        if (total > op.capacity) overflow = 1;
        else if (op.arg == 8) ((u64*)op.dst)[total] = ((const u64*)op.src)[n];
        else ((u32*)op.dst)[total] = ((const u32*)op.src)[n];
      }
    }
  }
  if (overflow) atomicCAS(status, 0u, (u32)GPQ_ERR_OUTPUT_OVERFLOW);
}
