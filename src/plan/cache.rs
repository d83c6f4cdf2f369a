//! Decoded footers kept for the next read of the same file.
//!
//! Every read starts with its file's footer, and decoding one (after the
//! structural walk that keeps hostile footers away from the parquet crate)
//! costs 10 to 25 µs per row group of a 16-column table: 11 to 28 ms for
//! TPC-H SF10 lineitem's 1,047 row groups, more than the rest of a
//! one-column read on the GPU. The footer's bytes are still read on every call (a few megabytes
//! at most, from the page cache as a rule); only their decoding is saved:
//! an entry is used when the same file (device and inode) of the same size
//! has a footer of exactly the same bytes, so a file rewritten in place,
//! however quickly, is decoded anew.
//!
//! Bounded: at most [`MAX_ENTRIES`] footers and [`MAX_BYTES`] bytes of them
//! (decoded metadata as the parquet crate sizes it, plus the footer bytes
//! kept for the comparison), the least recently used going first. Footers
//! read with their page index are not kept. `GPQ_FOOTER_CACHE=0` turns the
//! cache off; [`clear_footer_cache`] empties it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use parquet::file::metadata::ParquetMetaData;

/// Most footers kept.
pub const MAX_ENTRIES: usize = 64;
/// Most bytes of footers kept (decoded, plus their Thrift bytes).
pub const MAX_BYTES: usize = 256 << 20;

/// One version of a file, as far as the footer's bytes go: device, inode
/// and size (the bytes themselves are compared on lookup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
}

impl FileId {
    /// The identity of an open file.
    pub(crate) fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId { dev: meta.dev(), ino: meta.ino(), size: meta.len() }
    }
}

struct Entry {
    id: FileId,
    footer: Vec<u8>,
    metadata: Arc<ParquetMetaData>,
    bytes: usize,
    used: u64,
}

fn entries() -> &'static Mutex<Vec<Entry>> {
    static ENTRIES: OnceLock<Mutex<Vec<Entry>>> = OnceLock::new();
    ENTRIES.get_or_init(Default::default)
}

fn tick() -> u64 {
    static CLOCK: AtomicU64 = AtomicU64::new(0);
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

fn enabled() -> bool {
    crate::env::footer_cache()
}

/// The decoded footer of `id` whose Thrift bytes are `footer`, if kept.
pub(crate) fn get(id: FileId, footer: &[u8]) -> Option<Arc<ParquetMetaData>> {
    if !enabled() {
        return None;
    }
    let mut entries = entries().lock().unwrap_or_else(|p| p.into_inner());
    let e = entries.iter_mut().find(|e| e.id == id && e.footer == footer)?;
    e.used = tick();
    Some(e.metadata.clone())
}

/// Keeps a footer just decoded (replacing what was kept for the file).
pub(crate) fn put(id: FileId, footer: &[u8], metadata: &Arc<ParquetMetaData>) {
    if !enabled() {
        return;
    }
    let bytes = metadata.memory_size().saturating_add(footer.len());
    if bytes > MAX_BYTES {
        return;
    }
    let mut entries = entries().lock().unwrap_or_else(|p| p.into_inner());
    entries.retain(|e| e.id != id);
    let mut held: usize = entries.iter().map(|e| e.bytes).sum();
    while !entries.is_empty() && (entries.len() >= MAX_ENTRIES || held + bytes > MAX_BYTES) {
        let oldest = entries.iter().enumerate().min_by_key(|(_, e)| e.used).map_or(0, |(i, _)| i);
        held -= entries.swap_remove(oldest).bytes;
    }
    entries.push(Entry { id, footer: footer.to_vec(), metadata: metadata.clone(), bytes, used: tick() });
}

/// Forgets every decoded footer gpq keeps for later reads (see
/// [`read_footer`](crate::read_footer)); the next read of each file decodes
/// its footer again.
pub fn clear_footer_cache() {
    entries().lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// Footers kept now (for tests and logs).
pub fn cached_footers() -> usize {
    entries().lock().unwrap_or_else(|p| p.into_inner()).len()
}
