// Shared definitions for gpq's kernels. NVRTC has no standard headers here,
// so fixed-width integer types are defined directly.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;

#define GPQ_DEVICE __device__ __forceinline__

// Error codes written by kernels into per-page (or per-chunk) status words.
// They are the kernel kinds of gpq::CorruptKind (src/error.rs), name for name
// and number for number; a test in src/gpu/status.rs checks this.
enum GpqStatus : u32 {
  GPQ_OK = 0,
  GPQ_ERR_TRUNCATED_HEADER = 1,      // page header runs past the end of the chunk
  GPQ_ERR_BAD_HEADER = 2,            // header fields malformed (thrift)
  GPQ_ERR_PAGE_OUT_OF_CHUNK = 3,     // page body runs past the end of the chunk
  GPQ_ERR_NEGATIVE_COUNT = 4,        // negative size or count in a header
  GPQ_ERR_UNKNOWN_PAGE_TYPE = 5,
  GPQ_ERR_PAGE_COUNT_CHANGED = 6,    // more pages than counted (chunk changed between passes)
  GPQ_ERR_TRUNCATED_PAGE = 7,        // a read inside a page body ran past its end
  GPQ_ERR_BAD_RLE_RUN = 8,           // RLE/bit-packed run header malformed or past the end
  GPQ_ERR_BIT_WIDTH = 9,             // bit width over 32 (or over the type's width)
  GPQ_ERR_DICTIONARY_INDEX = 10,     // dictionary index out of range
  GPQ_ERR_TOO_FEW_VALUES = 11,       // page holds fewer values than its header claims
  GPQ_ERR_OUTPUT_OVERFLOW = 12,      // a write would fall outside its output
  GPQ_ERR_UNSUPPORTED_ENCODING = 13,
  GPQ_ERR_NO_DICTIONARY = 14,        // dictionary-encoded page without a dictionary page
  GPQ_ERR_DECIMAL_TOO_WIDE = 15,     // decimal byte array longer than 16 bytes
  GPQ_ERR_LEVEL_OUT_OF_RANGE = 16,   // definition level above the maximum
  GPQ_ERR_MALFORMED_COMPRESSED_DATA = 17,  // a compressed page fails its structural check
  GPQ_ERR_BAD_DELTA_HEADER = 18,     // DELTA_BINARY_PACKED header or block header malformed
  GPQ_ERR_BAD_DELTA_LENGTH = 19,     // DELTA_*_BYTE_ARRAY length negative, prefix too long, counts disagree
  GPQ_ERR_CHECKSUM_MISMATCH = 20,    // page bytes do not give the header's CRC-32
};

// Keeps the first error a page reports.
GPQ_DEVICE void gpq_set_error(u32* status, u32 code) {
  atomicCAS(status, 0u, code);
}
