//! Where the parts of a Parquet file lie: the footer (with every integer
//! field in it), the column chunks, and each chunk's page headers and bodies.
//!
//! Found with [`crate::thrift`] alone: a column chunk starts at its
//! dictionary page offset (or its data page offset) in the footer and spans
//! `total_compressed_size` bytes; inside it, each page header is followed by
//! `compressed_page_size` bytes of body.

use std::ops::Range;

use crate::thrift::{IntField, walk_struct};

/// Footer field ids (`FileMetaData` and what it holds).
pub mod ids {
    /// `FileMetaData.row_groups[].columns[].meta_data` (`ColumnMetaData`).
    pub const COLUMN_META: &[i16] = &[4, 1, 3];
    /// `ColumnMetaData.total_compressed_size`.
    pub const TOTAL_COMPRESSED_SIZE: i16 = 7;
    /// `ColumnMetaData.data_page_offset`.
    pub const DATA_PAGE_OFFSET: i16 = 9;
    /// `ColumnMetaData.dictionary_page_offset`.
    pub const DICTIONARY_PAGE_OFFSET: i16 = 11;
    /// `PageHeader.compressed_page_size`.
    pub const PAGE_COMPRESSED_SIZE: &[i16] = &[3];
}

/// One page: its header and its body.
#[derive(Clone, Debug)]
pub struct Page {
    /// The Thrift page header.
    pub header: Range<usize>,
    /// The page's (possibly compressed) bytes after the header, clamped to the file.
    pub body: Range<usize>,
    /// Integer fields of the header (positions in the file).
    pub ints: Vec<IntField>,
}

/// One column chunk.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// Row group index.
    pub row_group: usize,
    /// Column index within the row group.
    pub column: usize,
    /// The bytes the footer gives the chunk, clamped to the file.
    pub range: Range<usize>,
    /// The struct instance number of the chunk's `ColumnMetaData` in the
    /// footer walk (see [`IntField::owners`]).
    pub meta_owner: usize,
    /// The struct instance number of the chunk's `RowGroup`.
    pub row_group_owner: usize,
    /// The pages found by walking the chunk, in order; the walk stops at the
    /// first header that does not parse.
    pub pages: Vec<Page>,
}

/// The parts of a Parquet file.
#[derive(Clone, Debug)]
pub struct Layout {
    /// File length.
    pub len: usize,
    /// The Thrift `FileMetaData`.
    pub footer: Range<usize>,
    /// Integer fields of the footer (positions in the file).
    pub footer_ints: Vec<IntField>,
    /// Column chunks in footer order.
    pub chunks: Vec<Chunk>,
}

impl Layout {
    /// Finds the parts of `bytes`; fails when there is no readable footer.
    pub fn parse(bytes: &[u8]) -> Result<Layout, String> {
        let len = bytes.len();
        if len < 12 || &bytes[len - 4..] != b"PAR1" || &bytes[..4] != b"PAR1" {
            return Err("no PAR1 magic at both ends".into());
        }
        let footer_len = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
        if footer_len > len - 12 {
            return Err(format!("footer length {footer_len} exceeds the file"));
        }
        let footer = len - 8 - footer_len..len - 8;
        let walk = walk_struct(&bytes[..footer.end], footer.start)?;
        let footer_ints = walk.ints;

        // Group the ColumnMetaData fields by struct instance, in order.
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut by_owner: Vec<(usize, usize, [Option<i64>; 3])> = Vec::new(); // (meta owner, rg owner, [size, data, dict])
        for f in footer_ints.iter().filter(|f| f.ids.len() == 4 && f.ids[..3] == *ids::COLUMN_META) {
            let owner = *f.owners.last().unwrap();
            if by_owner.last().map(|e| e.0) != Some(owner) {
                by_owner.push((owner, f.owners[1], [None; 3]));
            }
            let slot = &mut by_owner.last_mut().unwrap().2;
            match f.ids[3] {
                ids::TOTAL_COMPRESSED_SIZE => slot[0] = Some(f.value),
                ids::DATA_PAGE_OFFSET => slot[1] = Some(f.value),
                ids::DICTIONARY_PAGE_OFFSET => slot[2] = Some(f.value),
                _ => {}
            }
        }
        let mut row_group = 0;
        let mut column = 0;
        let mut last_rg = None;
        for (meta_owner, row_group_owner, [size, data, dict]) in by_owner {
            if let Some(prev) = last_rg
                && prev != row_group_owner
            {
                row_group += 1;
                column = 0;
            }
            last_rg = Some(row_group_owner);
            let (Some(size), Some(data)) = (size, data) else { continue };
            let start = match dict {
                Some(d) if d > 0 && d < data => d,
                _ => data,
            };
            let clamp = |v: i64| v.clamp(0, footer.start as i64) as usize;
            let range = clamp(start)..clamp(start.saturating_add(size));
            let pages = walk_pages(bytes, range.clone());
            chunks.push(Chunk { row_group, column, range, meta_owner, row_group_owner, pages });
            column += 1;
        }
        Ok(Layout { len, footer, footer_ints, chunks })
    }

    /// Every page of every chunk, with its chunk's index.
    pub fn pages(&self) -> impl Iterator<Item = (usize, usize, &Page)> {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| chunk.pages.iter().enumerate().map(move |(p, page)| (c, p, page)))
    }
}

fn walk_pages(bytes: &[u8], range: Range<usize>) -> Vec<Page> {
    let mut pages = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let Ok(walk) = walk_struct(&bytes[..range.end], at) else { break };
        let size = walk.ints.iter().find(|f| f.is(ids::PAGE_COMPRESSED_SIZE)).map(|f| f.value);
        let Some(size) = size.filter(|&s| s >= 0) else { break };
        let body_end = (walk.end as u64 + size as u64).min(range.end as u64) as usize;
        pages.push(Page { header: at..walk.end, body: walk.end..body_end, ints: walk.ints });
        at = body_end;
    }
    pages
}
