// Page checksums: the CRC-32 (IEEE 802.3, as zlib computes it) of each page's
// stored bytes, compared with the `crc` field of its page header. The format
// defines it over the page as written, after the header: compressed bytes,
// and for v2 pages the level streams in front of them too.
//
// One warp per page. Each lane checksums one contiguous share of the page
// with a byte table held in shared memory; lane 0 then joins the 32 partial
// checksums in order with the zlib combination rule
//   crc(A || B) = crc(A) * x^(8 |B|) mod P  xor  crc(B),
// where the multiplication is carry-less modulo the CRC polynomial.

#define CRC_WARPS 4
#define CRC_POLY 0xedb88320u   // reflected IEEE polynomial

struct PageCrcDesc {
  u64 offset;     // page body in the device buffer
  u64 len;        // stored bytes of the page body
  u32 expected;   // the header's crc field
  u32 status;     // GPQ_OK or GPQ_ERR_CHECKSUM_MISMATCH
  u32 computed;   // what the bytes give (for the error message)
  u32 pad;
};

// a * b modulo the polynomial, both in the reflected representation.
GPQ_DEVICE u32 crc_mul(u32 a, u32 b) {
  u32 p = 0;
  for (int i = 0; i < 32; i++) {
    if (a & 0x80000000u) p ^= b;
    a <<= 1;
    b = (b & 1) ? (b >> 1) ^ CRC_POLY : b >> 1;
  }
  return p;
}

// x^(8 n) modulo the polynomial: square-and-multiply over the bits of n
// (x^8, x^16, x^32, ... squared from x^8).
GPQ_DEVICE u32 crc_shift_of(u64 n) {
  u32 result = 0x80000000u;   // x^0
  u32 power = 0x00800000u;    // x^8
  while (n) {
    if (n & 1) result = crc_mul(power, result);
    power = crc_mul(power, power);
    n >>= 1;
  }
  return result;
}

extern "C" __global__ void __launch_bounds__(CRC_WARPS * 32)
gpq_page_crc(const u8* base, PageCrcDesc* pages, u32 num_pages) {
  __shared__ u32 table[256];
  for (u32 i = threadIdx.x; i < 256; i += blockDim.x) {
    u32 c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC_POLY : c >> 1;
    table[i] = c;
  }
  __syncthreads();   // reached by every thread: no thread has left yet
  u32 page = blockIdx.x * CRC_WARPS + (threadIdx.x >> 5);
  u32 lane = threadIdx.x & 31;
  if (page >= num_pages) return;   // whole warps leave; no block barrier follows
  const u8* p = base + pages[page].offset;
  u64 n = pages[page].len;
  u64 share = (n + 31) / 32;
  u64 lo = share * lane < n ? share * lane : n;
  u64 hi = lo + share < n ? lo + share : n;
  u32 c = 0xffffffffu;
  for (u64 i = lo; i < hi; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  c ^= 0xffffffffu;
  u32 crc = 0;
  u64 joined = 0;   // bytes covered by crc so far (lane 0)
  for (int k = 0; k < 32; k++) {
    u32 part = __shfl_sync(0xffffffffu, c, k);
    u64 part_lo = share * (u64)k < n ? share * (u64)k : n;
    u64 part_hi = part_lo + share < n ? part_lo + share : n;
    u64 part_len = part_hi - part_lo;
    if (lane == 0 && part_len > 0) {
      crc = joined == 0 ? part : crc_mul(crc_shift_of(part_len), crc) ^ part;
      joined += part_len;
    }
  }
  if (lane == 0) {
    pages[page].computed = crc;
    pages[page].status = crc == pages[page].expected ? GPQ_OK : GPQ_ERR_CHECKSUM_MISMATCH;
  }
}
