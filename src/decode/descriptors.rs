//! The `#[repr(C)]` tables the host fills and the kernels read (and write
//! statuses into). Each mirrors a struct in the `.cu` sources; the size
//! assertions catch a field added on one side only. Internal to the crate.

/// One column chunk to walk (page_headers.cu `ChunkDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChunkDesc {
    /// Chunk start in the device buffer.
    pub offset: u64,
    /// Chunk length (of its first span, where it has two).
    pub len: u64,
    /// The second span, after skipped pages (a row window): its start in the device buffer.
    pub resume_offset: u64,
    /// Its length (0: no second span).
    pub resume_len: u64,
    /// First slot of the chunk's pages in the page table.
    pub page_start: u32,
    /// Pages counted (pass 1) or slots reserved (pass 2).
    pub page_count: u32,
    /// Status of the walk.
    pub status: u32,
    /// Page number the status refers to (skipped pages counted).
    pub error_page: u32,
    /// Pages skipped between the two spans.
    pub skipped_pages: u32,
    pub pad: u32,
}

/// One page header as parsed on the device (page_headers.cu `PageInfo`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PageInfo {
    /// Offset of the header in the device buffer.
    pub header_offset: u64,
    /// Offset of the page body in the device buffer.
    pub data_offset: u64,
    /// Index of the chunk in the chunk table.
    pub chunk: u32,
    /// 0 data v1, 1 index, 2 dictionary, 3 data v2.
    pub page_type: u32,
    /// Bytes stored after the header.
    pub compressed_size: i32,
    /// Bytes after decompression (levels included for v2).
    pub uncompressed_size: i32,
    /// Values (levels) in the page, or dictionary entries.
    pub num_values: i32,
    /// v2: nulls; -1 otherwise.
    pub num_nulls: i32,
    /// v2: rows; -1 otherwise.
    pub num_rows: i32,
    /// Value encoding.
    pub encoding: u32,
    /// v1 definition level encoding.
    pub def_encoding: u32,
    /// v1 repetition level encoding.
    pub rep_encoding: u32,
    /// v2 definition level bytes.
    pub def_len: i32,
    /// v2 repetition level bytes.
    pub rep_len: i32,
    /// v2 `is_compressed` (1 for other pages).
    pub is_compressed: u32,
    /// Bytes of the Thrift header.
    pub header_len: u32,
    /// [`page_flags`] bits.
    pub flags: u32,
    /// The header's CRC-32 of the stored page bytes, if [`page_flags::HAS_CRC`].
    pub crc: u32,
}

/// Bits of [`PageInfo::flags`] (bit 0, a dictionary page's `is_sorted`,
/// is kept but not used).
pub(crate) mod page_flags {
    /// The header carries a CRC-32 of the page.
    pub const HAS_CRC: u32 = 2;
}

/// One page whose checksum is verified (page_checksums.cu `PageCrcDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PageCrcDesc {
    /// The page body in the device buffer.
    pub offset: u64,
    /// Stored bytes of the body.
    pub len: u64,
    /// The header's CRC-32.
    pub expected: u32,
    /// Verdict (a `GpqStatus`).
    pub status: u32,
    /// The CRC-32 the bytes give.
    pub computed: u32,
    /// Padding.
    pub pad: u32,
}

/// One column's views to build (views.cu `ViewsDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ViewsDesc {
    /// The characters.
    pub chars: u64,
    /// Bytes of the characters.
    pub chars_len: u64,
    /// `n + 1` offsets.
    pub offsets: u64,
    /// `n` views of 16 bytes.
    pub views: u64,
    /// Values.
    pub n: u64,
    /// 1: `i64` offsets.
    pub large: u32,
    /// Status (a `GpqStatus`).
    pub status: u32,
}

/// Bits of [`PageDesc::level_mode`] (page_decode.cuh `LEVELS_*`; a test
/// checks they agree).
pub(crate) mod levels {
    /// A v1 data page: level streams behind their lengths, or BIT_PACKED.
    pub const V1: u32 = 1;
    /// A v2 data page: level streams of the lengths the header gives.
    pub const V2: u32 = 2;
    /// v1: the repetition levels are BIT_PACKED.
    pub const REP_BIT_PACKED: u32 = 4;
    /// v1: the definition levels are BIT_PACKED.
    pub const DEF_BIT_PACKED: u32 = 8;
}

/// Page types.
pub(crate) mod page_type {
    /// DATA_PAGE (v1).
    pub const DATA_V1: u32 = 0;
    /// INDEX_PAGE.
    pub const INDEX: u32 = 1;
    /// DICTIONARY_PAGE.
    pub const DICTIONARY: u32 = 2;
    /// DATA_PAGE_V2.
    pub const DATA_V2: u32 = 3;
}

/// One output column (page_decode.cuh `ColumnDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ColumnDesc {
    /// Output values (bitmap for BOOLEAN).
    pub values: u64,
    /// Output validity bitmap, 0 for required columns.
    pub validity: u64,
    /// String offsets.
    pub offsets: u64,
    /// String characters.
    pub chars: u64,
    /// Per-row lengths (strings).
    pub scratch_len: u64,
    /// Per-row sources (strings).
    pub scratch_src: u64,
    /// Per-row prefix lengths (columns with DELTA_BYTE_ARRAY pages), else 0.
    pub scratch_pre: u64,
    /// Address of the column's null counter.
    pub null_count: u64,
    /// Rows of output (level positions, for a leaf of a nested column).
    pub num_rows: u64,
    /// Nested leaves: a u16 repetition level per level position, else 0.
    pub rep_levels: u64,
    /// Nested leaves: a u16 definition level per level position, else 0.
    pub def_levels: u64,
    /// Conversion multiplier.
    pub mul: i64,
    /// Conversion divisor.
    pub div: i64,
    /// Conversion kind (`Kind` as u32).
    pub kind: u32,
    /// Stored bytes per value.
    pub in_width: u32,
    /// Output bytes per value.
    pub out_width: u32,
    /// Maximum definition level.
    pub max_def: u32,
    /// 64-bit string offsets.
    pub large_offsets: u32,
    /// Maximum repetition level.
    pub max_rep: u32,
}

/// One data page to decode (page_decode.cuh `PageDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PageDesc {
    /// Page bytes (levels and values), uncompressed.
    pub data: u64,
    /// Dictionary values (fixed width) or entry table (strings).
    pub dict: u64,
    /// Dictionary page bytes (strings).
    pub dict_data: u64,
    /// First output row.
    pub row_start: u64,
    /// First output character (strings).
    pub char_base: u64,
    /// Page bytes.
    pub size: u32,
    /// Levels (rows) in the page.
    pub num_values: u32,
    /// Dictionary entries.
    pub dict_count: u32,
    /// Value encoding.
    pub encoding: u32,
    /// [`levels`] bits: the page version and its BIT_PACKED level streams.
    pub level_mode: u32,
    /// v2 definition level bytes.
    pub def_len: u32,
    /// v2 repetition level bytes.
    pub rep_len: u32,
    /// Column index.
    pub column: u32,
    /// Status written by the kernels.
    pub status: u32,
    /// v2 pages: the header's null count plus one, checked against the
    /// definition levels; 0 where the header gives none (v1).
    pub v2_nulls: u32,
}

/// One string dictionary page to index (decode_strings.cu `DictDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DictDesc {
    /// Dictionary page bytes.
    pub data: u64,
    /// Output entry table.
    pub entries: u64,
    /// Page bytes.
    pub size: u32,
    /// Entries.
    pub count: u32,
    /// Status.
    pub status: u32,
    /// Padding.
    pub pad: u32,
}

/// One device-to-device copy (copy.cu `CopyDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CopyDesc {
    /// Source address.
    pub src: u64,
    /// Destination address.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

/// A slot test of a nested column (nesting.cu `SlotTestDesc`; see `plan::nesting`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlotTestDesc {
    /// Highest repetition level that starts a slot.
    pub max_rep: u32,
    /// Lowest definition level at which the slot exists.
    pub min_def: u32,
}

/// One operation of `gpq_nest_apply` (nesting.cu `NestOp`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NestOp {
    /// `nest_op` kind.
    pub kind: u32,
    /// Slot test of the written array.
    pub test: u32,
    /// Offsets: slot test of the elements.
    pub element: u32,
    /// Validity: the valid definition level; gathers: bytes per value.
    pub arg: u32,
    /// Gathers: the level-position array.
    pub src: u64,
    /// Output.
    pub dst: u64,
    /// Slots the output holds (an offsets array's final entry excluded).
    pub capacity: u64,
    /// Validity: address of a u64 null counter.
    pub counter: u64,
}

/// `NestOpKind` (nesting.cu).
pub(crate) mod nest_op {
    /// i32 list offsets.
    pub const OFFSETS: u32 = 0;
    /// Validity bits from definition levels.
    pub const VALIDITY: u32 = 1;
    /// Fixed-width values.
    pub const GATHER: u32 = 2;
    /// Bits.
    pub const GATHER_BITS: u32 = 3;
    /// String offsets (4 or 8 bytes).
    pub const GATHER_OFFSETS: u32 = 4;
}

const _: () = assert!(std::mem::size_of::<ChunkDesc>() == 56);
const _: () = assert!(std::mem::size_of::<SlotTestDesc>() == 8);
const _: () = assert!(std::mem::size_of::<NestOp>() == 48);
const _: () = assert!(std::mem::size_of::<PageInfo>() == 80);
const _: () = assert!(std::mem::size_of::<PageCrcDesc>() == 32);
const _: () = assert!(std::mem::size_of::<ViewsDesc>() == 48);
const _: () = assert!(std::mem::size_of::<ColumnDesc>() == 128);
const _: () = assert!(std::mem::size_of::<PageDesc>() == 80);
const _: () = assert!(std::mem::size_of::<DictDesc>() == 32);
const _: () = assert!(std::mem::size_of::<CopyDesc>() == 24);

#[cfg(test)]
mod tests {
    #[test]
    fn level_modes_match_the_cuda_source() {
        let source = include_str!("../gpu/kernels/page_decode.cuh");
        let define = |name: &str| -> u32 {
            let line = source.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap_or_else(|| panic!("no {name}"));
            line.split_whitespace().nth(2).unwrap().trim_end_matches('u').parse().unwrap()
        };
        assert_eq!(define("LEVELS_V1"), super::levels::V1);
        assert_eq!(define("LEVELS_V2"), super::levels::V2);
        assert_eq!(define("LEVELS_REP_BIT_PACKED"), super::levels::REP_BIT_PACKED);
        assert_eq!(define("LEVELS_DEF_BIT_PACKED"), super::levels::DEF_BIT_PACKED);
    }
}
