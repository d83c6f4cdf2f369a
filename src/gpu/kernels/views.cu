// String and binary views (Arrow's Utf8View / BinaryView) from decoded
// offsets and characters: one thread per value, grid-stride. A view is 16
// bytes: the length, then up to 12 bytes inline for short values, or a
// 4-byte prefix, the data buffer's index and the offset inside it.
//
// The characters stay one device allocation; the host hands them to Arrow as
// data buffers that overlap: buffer k starts at byte k * 2^30 and is at most
// 2^31 bytes long, so a value of at most 2^30 bytes starting in
// [k * 2^30, (k + 1) * 2^30) lies wholly inside buffer k at an offset that
// fits Arrow's i32. A longer value is refused (GPQ_ERR_OUTPUT_OVERFLOW).

#define VIEW_BUFFER_SHIFT 30

struct ViewsDesc {
  u64 chars;        // characters
  u64 chars_len;    // bytes of the characters
  u64 offsets;      // n + 1 offsets, i32 or i64
  u64 views;        // n views of 16 bytes (16-byte aligned)
  u64 n;
  u32 large;        // 1: i64 offsets
  u32 status;       // GPQ_OK or the first problem
};

extern "C" __global__ void gpq_make_views(ViewsDesc* d) {
  const u8* chars = (const u8*)d->chars;
  const u64 n = d->n, chars_len = d->chars_len;
  const bool large = d->large != 0;
  u32* views = (u32*)d->views;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    i64 start, end;
    if (large) {
      start = ((const i64*)d->offsets)[i];
      end = ((const i64*)d->offsets)[i + 1];
    } else {
      start = ((const i32*)d->offsets)[i];
      end = ((const i32*)d->offsets)[i + 1];
    }
    u32 w[4] = {0, 0, 0, 0};
    if (start < 0 || end < start || (u64)end > chars_len || (u64)(end - start) > (1ull << VIEW_BUFFER_SHIFT)) {
      atomicCAS(&d->status, 0u, (u32)GPQ_ERR_OUTPUT_OVERFLOW);
    } else {
      u32 len = (u32)(end - start);
      const u8* s = chars + start;
      w[0] = len;
      if (len <= 12) {
        u8* inline_bytes = (u8*)&w[1];
        for (u32 b = 0; b < len; b++) inline_bytes[b] = s[b];
      } else {
        w[1] = (u32)s[0] | ((u32)s[1] << 8) | ((u32)s[2] << 16) | ((u32)s[3] << 24);
        w[2] = (u32)((u64)start >> VIEW_BUFFER_SHIFT);
        w[3] = (u32)((u64)start & ((1ull << VIEW_BUFFER_SHIFT) - 1));
      }
    }
    u32* v = views + 4 * i;
    v[0] = w[0]; v[1] = w[1]; v[2] = w[2]; v[3] = w[3];
  }
}
