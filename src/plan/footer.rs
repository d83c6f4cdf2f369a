//! Opening a file and loading its footer (and page index, where present)
//! with the parquet crate, with errors that tell a truncated file from one
//! that is not Parquet at all.
//!
//! The footer is hostile input. Before the parquet crate decodes it, the
//! footer's Thrift is walked the way the parquet crate reads it (`precheck`
//! below) and rejected where decoding would allocate or loop in proportion to
//! a declared count instead of the bytes present (a list claiming 2^31 row
//! groups, a schema element claiming 2^31 children or nesting hundreds deep,
//! an unknown list of booleans that the crate skips without consuming input):
//! those abort the process or hang, which no `catch_unwind` can undo. The
//! page index gets the same walk. Every call into the parquet crate on the
//! file's metadata runs under `catch_parquet_panic`, so a panic there (the
//! crate and arrow-ipc assert on some malformed values) becomes an
//! [`Error::Metadata`] naming the file.
//!
//! A footer decoded once is kept for the next read of the same file, as
//! long as its bytes are the same (`cache`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"PAR1";
/// The magic of files whose footer is encrypted (Parquet modular encryption).
const ENCRYPTED_MAGIC: &[u8; 4] = b"PARE";

/// Start of the message a caught panic of the parquet crate becomes.
const PANIC_NOTE: &str = "the parquet crate panicked";

/// The footer of one file, with the file's size at the time it was read.
#[derive(Debug, Clone)]
pub struct Footer {
    /// Size of the file in bytes.
    pub file_size: u64,
    /// Parsed metadata, including the page index when the file has one.
    pub metadata: Arc<ParquetMetaData>,
}

impl Footer {
    /// The footer with the file's page index added (read now, with the
    /// footer's checks), unless it has one already. A page index that cannot
    /// be read leaves the footer as it was (it only serves to skip pages).
    pub fn with_page_index(self, path: &Path) -> Result<Footer> {
        if self.metadata.offset_index().is_some() {
            return Ok(self);
        }
        let open_err = |source| Error::Open { file: path.to_path_buf(), source };
        let mut file = File::open(path).map_err(open_err)?;
        let (footer_start, _) = read_footer_bytes(path, &mut file, self.file_size)?;
        let metadata = Arc::unwrap_or_clone(self.metadata);
        Ok(Footer { file_size: self.file_size, metadata: Arc::new(with_page_index(path, &file, metadata, footer_start)) })
    }

    /// Whether every column chunk of every row group has an offset index.
    pub fn has_offset_index(&self) -> bool {
        self.metadata
            .offset_index()
            .is_some_and(|oi| oi.iter().all(|rg| !rg.is_empty()))
    }
}

/// Reads the footer of `path`, without the page index (decoding does not need it,
/// and on files with many row groups it is most of the footer's cost).
pub fn read_footer(path: &Path) -> Result<Footer> {
    read_footer_impl(path, false)
}

/// Reads the footer of `path` with its page index (column and offset indexes), where present.
pub fn read_footer_with_page_index(path: &Path) -> Result<Footer> {
    read_footer_impl(path, true)
}

/// Runs `f`, a call into the parquet crate on a file's metadata, turning a
/// panic into a [`ParquetError::General`] that says so (the panic hook still
/// prints the panic's message).
pub(crate) fn catch_parquet_panic<T>(
    what: &str,
    f: impl FnOnce() -> parquet::errors::Result<T>,
) -> parquet::errors::Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let message = crate::error::panic_message(payload.as_ref());
            Err(ParquetError::General(format!("{PANIC_NOTE} {what}: {message}")))
        }
    }
}

/// Whether `e` is a panic caught by [`catch_parquet_panic`].
fn is_caught_panic(e: &ParquetError) -> bool {
    matches!(e, ParquetError::General(m) if m.starts_with(PANIC_NOTE))
}

/// An [`Error::Metadata`] for `path` with gpq's own message.
pub(crate) fn metadata_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Metadata { file: path.to_path_buf(), source: ParquetError::General(message.into()) }
}

fn read_footer_impl(path: &Path, page_index: bool) -> Result<Footer> {
    let open_err = |source| Error::Open { file: path.to_path_buf(), source };
    let mut file = File::open(path).map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    let file_size = meta.len();
    check_magic(path, &mut file, file_size)?;
    let (footer_start, footer) = read_footer_bytes(path, &mut file, file_size)?;
    let id = super::cache::FileId::of(&meta);
    if !page_index && let Some(metadata) = super::cache::get(id, &footer) {
        return Ok(Footer { file_size, metadata });
    }

    let walked = precheck::check(&footer, precheck::FILE_META_DATA)
        .map_err(|reason| metadata_error(path, format!("footer rejected before decoding: {reason}")))?;
    if let Some(field) = walked.encryption {
        return Err(Error::Encrypted {
            file: path.to_path_buf(),
            detail: format!("a plaintext footer with {field}"),
        });
    }
    let metadata = catch_parquet_panic("decoding the footer", || ParquetMetaDataReader::decode_metadata(&footer))
        .map_err(|source| {
            let text = source.to_string();
            if !is_caught_panic(&source)
                && (text.contains("EOF") || text.contains("out of bound") || text.contains("range"))
            {
                Error::NotParquet {
                    file: path.to_path_buf(),
                    reason: format!("footer is damaged or the file is truncated: {text}"),
                }
            } else {
                Error::Metadata { file: path.to_path_buf(), source }
            }
        })?;
    if page_index {
        let metadata = with_page_index(path, &file, metadata, footer_start);
        return Ok(Footer { file_size, metadata: Arc::new(metadata) });
    }
    let metadata = Arc::new(metadata);
    super::cache::put(id, &footer, &metadata);
    Ok(Footer { file_size, metadata })
}

/// Reads the footer's Thrift bytes; returns them with the offset they start at.
fn read_footer_bytes(path: &Path, file: &mut File, file_size: u64) -> Result<(u64, Vec<u8>)> {
    // check_magic made sure of at least 12 bytes.
    let tail_at = file_size.saturating_sub(8);
    let mut len_bytes = [0u8; 4];
    read_at(path, file, tail_at, &mut len_bytes)?;
    let footer_len = u64::from(u32::from_le_bytes(len_bytes));
    // The footer sits between the leading magic and the 8-byte tail.
    let footer_start = tail_at
        .checked_sub(footer_len)
        .filter(|&start| start >= MAGIC.len() as u64)
        .ok_or_else(|| Error::NotParquet {
            file: path.to_path_buf(),
            reason: format!(
                "footer is damaged or the file is truncated: the footer claims {footer_len} bytes but the file has {file_size}"
            ),
        })?;
    let len = usize::try_from(footer_len)
        .map_err(|_| Error::OutOfHostMemory { requested: footer_len, what: "Parquet footer" })?;
    let mut footer = vec![0u8; len];
    read_at(path, file, footer_start, &mut footer)?;
    Ok((footer_start, footer))
}

fn read_at(path: &Path, mut file: &File, at: u64, buf: &mut [u8]) -> Result<()> {
    file.seek(SeekFrom::Start(at))
        .and_then(|_| file.read_exact(buf))
        .map_err(|source| Error::Io { file: path.to_path_buf(), offset: at, len: buf.len() as u64, source })
}

/// Adds the page index to `metadata` where the file has a readable one. A
/// damaged or unreadable page index is not worth failing the read for: gpq
/// only uses it for planning hints, so the footer is returned without it.
fn with_page_index(path: &Path, file: &File, metadata: ParquetMetaData, footer_start: u64) -> ParquetMetaData {
    match precheck_page_index(path, file, &metadata, footer_start) {
        Ok(true) => {}
        Ok(false) => return metadata,
        Err(reason) => {
            tracing::warn!(file = %path.display(), error = %reason, "page index unreadable; reading without it");
            return metadata;
        }
    }
    let without = metadata.clone();
    let loaded = catch_parquet_panic("decoding the page index", || {
        let mut reader =
            ParquetMetaDataReader::new_with_metadata(metadata).with_page_index_policy(PageIndexPolicy::Optional);
        reader.read_page_indexes(file)?;
        reader.finish()
    });
    loaded.unwrap_or_else(|e| {
        tracing::warn!(file = %path.display(), error = %e, "page index unreadable; reading without it");
        without
    })
}

/// Walks every column and offset index of the file the way the parquet crate
/// will read them (see `precheck`); `Ok(false)` when the footer locates none.
fn precheck_page_index(
    path: &Path,
    file: &File,
    metadata: &ParquetMetaData,
    footer_start: u64,
) -> std::result::Result<bool, String> {
    // Where the parquet crate looks for each index: offset and length both
    // present and non-negative, else the index is absent.
    let range = |offset: Option<i64>, len: Option<i32>| -> Option<(u64, u64)> {
        let offset = u64::try_from(offset?).ok()?;
        let len = u64::try_from(len?).ok()?;
        Some((offset, offset.checked_add(len)?))
    };
    let mut indexes = Vec::new();
    for rg in metadata.row_groups() {
        for c in rg.columns() {
            if let Some(r) = range(c.column_index_offset(), c.column_index_length()) {
                indexes.push((r, precheck::COLUMN_INDEX));
            }
            if let Some(r) = range(c.offset_index_offset(), c.offset_index_length()) {
                indexes.push((r, precheck::OFFSET_INDEX));
            }
        }
    }
    let (Some(start), Some(end)) =
        (indexes.iter().map(|((s, _), _)| *s).min(), indexes.iter().map(|((_, e), _)| *e).max())
    else {
        return Ok(false);
    };
    if end > footer_start {
        return Err(format!("page index bytes {start}..{end} run past the footer's start at byte {footer_start}"));
    }
    let len = usize::try_from(end - start).map_err(|_| format!("page index of {} bytes", end - start))?;
    let mut bytes = vec![0u8; len];
    read_at(path, file, start, &mut bytes).map_err(|e| e.to_string())?;
    for ((s, e), ty) in indexes {
        let slice = usize::try_from(s - start)
            .ok()
            .zip(usize::try_from(e - start).ok())
            .and_then(|(s, e)| bytes.get(s..e))
            .ok_or_else(|| format!("page index bytes {s}..{e} out of range"))?;
        precheck::check(slice, ty).map_err(|reason| format!("page index at byte {s}: {reason}"))?;
    }
    Ok(true)
}

fn check_magic(path: &Path, file: &mut File, file_size: u64) -> Result<()> {
    let not_parquet = |reason: String| Error::NotParquet { file: path.to_path_buf(), reason };
    if file_size < 12 {
        return Err(not_parquet(format!("only {file_size} bytes, too short for a Parquet file")));
    }
    let mut head = [0u8; 4];
    let mut tail = [0u8; 4];
    read_at(path, file, 0, &mut head)?;
    read_at(path, file, file_size - 4, &mut tail)?;
    if &head == ENCRYPTED_MAGIC || &tail == ENCRYPTED_MAGIC {
        return Err(Error::Encrypted { file: path.to_path_buf(), detail: "an encrypted footer (magic PARE)".into() });
    }
    match (&head == MAGIC, &tail == MAGIC) {
        (true, true) => Ok(()),
        (true, false) => Err(not_parquet(
            "it starts with PAR1 but does not end with it: truncated, or still being written".into(),
        )),
        (false, true) => Err(not_parquet("it ends with PAR1 but does not start with it".into())),
        (false, false) => Err(not_parquet(format!("no PAR1 magic (first bytes {head:02x?})"))),
    }
}

/// A walk over Thrift compact-protocol bytes that mirrors how the parquet
/// crate (59) decodes the footer and the page index, rejecting what would make
/// the crate allocate or loop beyond the input's size.
///
/// The crate reads a known field as the type its schema gives, whatever the
/// wire type says, and skips an unknown field by its wire type; the walk does
/// the same, but rejects a known field whose wire type differs (a valid
/// writer never does that, and past it the crate's reading could no longer
/// be followed). While skipping, the crate walks list elements of type bool
/// without consuming input, so the walk counts every value it visits and
/// stops at one value per byte (plus slack); every collection must also fit
/// in the bytes that are left, and the schema's tree must be consistent and
/// at most `MAX_SCHEMA_DEPTH` groups deep.
mod precheck {
    /// How the parquet crate reads a value.
    #[derive(Clone, Copy)]
    pub(super) enum Ty {
        Bool,
        I8,
        I16,
        I32,
        I64,
        Double,
        Binary,
        List(&'static Ty),
        Struct(&'static [(i16, Ty)]),
        /// `FileMetaData.schema`: a list of `SchemaElement`s, whose tree is checked too.
        Schema,
        /// A field only files with Parquet modular encryption have (named
        /// for the error), of the inner type: the walk reports having seen it.
        Encryption(&'static str, &'static Ty),
    }

    use Ty::{Binary, Bool, Double, I8, I16, I32, I64, List, Struct};

    /// Deepest nesting of schema groups (the root counts) accepted: the
    /// parquet and arrow crates recurse once per level, several times over.
    pub(super) const MAX_SCHEMA_DEPTH: usize = 256;
    /// The parquet crate's limit on nesting while skipping unknown fields.
    const SKIP_DEPTH: u32 = 64;

    const EMPTY: Ty = Struct(&[]);
    const KEY_VALUE: Ty = Struct(&[(1, Binary), (2, Binary)]);
    const TIME_UNIT: Ty = Struct(&[(1, EMPTY), (2, EMPTY), (3, EMPTY)]);
    const TIME: Ty = Struct(&[(1, Bool), (2, TIME_UNIT)]);
    const LOGICAL_TYPE: Ty = Struct(&[
        (1, EMPTY),
        (2, EMPTY),
        (3, EMPTY),
        (4, EMPTY),
        (5, Struct(&[(1, I32), (2, I32)])),
        (6, EMPTY),
        (7, TIME),
        (8, TIME),
        (10, Struct(&[(1, I8), (2, Bool)])),
        (11, EMPTY),
        (12, EMPTY),
        (13, EMPTY),
        (14, EMPTY),
        (15, EMPTY),
        (16, Struct(&[(1, I8)])),
        (17, Struct(&[(1, Binary)])),
        (18, Struct(&[(1, Binary), (2, I32)])),
    ]);
    /// Field 5 is `num_children`.
    const SCHEMA_ELEMENT: &[(i16, Ty)] = &[
        (1, I32),
        (2, I32),
        (3, I32),
        (4, Binary),
        (5, I32),
        (6, I32),
        (7, I32),
        (8, I32),
        (9, I32),
        (10, LOGICAL_TYPE),
    ];
    const NUM_CHILDREN: i16 = 5;
    const STATISTICS: Ty = Struct(&[
        (1, Binary),
        (2, Binary),
        (3, I64),
        (4, I64),
        (5, Binary),
        (6, Binary),
        (7, Bool),
        (8, Bool),
    ]);
    const PAGE_ENCODING_STATS: Ty = Struct(&[(1, I32), (2, I32), (3, I32)]);
    const SIZE_STATISTICS: Ty = Struct(&[(1, I64), (2, List(&I64)), (3, List(&I64))]);
    const BOUNDING_BOX: Ty = Struct(&[
        (1, Double),
        (2, Double),
        (3, Double),
        (4, Double),
        (5, Double),
        (6, Double),
        (7, Double),
        (8, Double),
    ]);
    const GEOSPATIAL_STATISTICS: Ty = Struct(&[(1, BOUNDING_BOX), (2, List(&I32))]);
    const COLUMN_META_DATA: Ty = Struct(&[
        (1, I32),
        (2, List(&I32)),
        (3, List(&Binary)),
        (4, I32),
        (5, I64),
        (6, I64),
        (7, I64),
        (8, List(&KEY_VALUE)),
        (9, I64),
        (10, I64),
        (11, I64),
        (12, STATISTICS),
        (13, List(&PAGE_ENCODING_STATS)),
        (14, I64),
        (15, I32),
        (16, SIZE_STATISTICS),
        (17, GEOSPATIAL_STATISTICS),
    ]);
    const COLUMN_CRYPTO_META_DATA: Ty = Struct(&[(1, EMPTY), (2, Struct(&[(1, List(&Binary)), (2, Binary)]))]);
    const COLUMN_CHUNK: Ty = Struct(&[
        (1, Binary),
        (2, I64),
        (3, COLUMN_META_DATA),
        (4, I64),
        (5, I32),
        (6, I64),
        (7, I32),
        (8, Ty::Encryption("encrypted columns (ColumnChunk.crypto_metadata)", &COLUMN_CRYPTO_META_DATA)),
        (9, Ty::Encryption("encrypted column metadata (ColumnChunk.encrypted_column_metadata)", &Binary)),
    ]);
    const SORTING_COLUMN: Ty = Struct(&[(1, I32), (2, Bool), (3, Bool)]);
    const ROW_GROUP: Ty = Struct(&[
        (1, List(&COLUMN_CHUNK)),
        (2, I64),
        (3, I64),
        (4, List(&SORTING_COLUMN)),
        (5, I64),
        (6, I64),
        (7, I16),
    ]);
    const COLUMN_ORDER: Ty = Struct(&[(1, EMPTY)]);
    const AES_GCM: Ty = Struct(&[(1, Binary), (2, Binary), (3, Bool)]);
    const ENCRYPTION_ALGORITHM: Ty = Struct(&[(1, AES_GCM), (2, AES_GCM)]);
    /// Parquet's `FileMetaData`, the footer.
    pub(super) const FILE_META_DATA: Ty = Struct(&[
        (1, I32),
        (2, Ty::Schema),
        (3, I64),
        (4, List(&ROW_GROUP)),
        (5, List(&KEY_VALUE)),
        (6, Binary),
        (7, List(&COLUMN_ORDER)),
        (8, Ty::Encryption("an encryption algorithm (FileMetaData.encryption_algorithm)", &ENCRYPTION_ALGORITHM)),
        (9, Ty::Encryption("a footer signing key (FileMetaData.footer_signing_key_metadata)", &Binary)),
    ]);
    const PAGE_LOCATION: Ty = Struct(&[(1, I64), (2, I32), (3, I64)]);
    /// One column chunk's `OffsetIndex`.
    pub(super) const OFFSET_INDEX: Ty = Struct(&[(1, List(&PAGE_LOCATION)), (2, List(&I64))]);
    /// One column chunk's `ColumnIndex`.
    pub(super) const COLUMN_INDEX: Ty = Struct(&[
        (1, List(&Bool)),
        (2, List(&Binary)),
        (3, List(&Binary)),
        (4, I32),
        (5, List(&I64)),
        (6, List(&I64)),
        (7, List(&I64)),
    ]);

    /// What a walk saw besides a sound structure.
    #[derive(Debug, Default)]
    pub(super) struct Walked {
        /// The first field seen that only encrypted files have, by name.
        pub(super) encryption: Option<&'static str>,
    }

    /// Walks one value of type `root` at the start of `buf` (trailing bytes are ignored, as the parquet crate does).
    pub(super) fn check(buf: &[u8], root: Ty) -> Result<Walked, String> {
        let mut walker = Walker { buf, pos: 0, budget: buf.len().saturating_add(64), walked: Walked::default() };
        walker.value(root)?;
        Ok(walker.walked)
    }

    /// The compact-protocol type code a value of `ty` is written with.
    fn wire_type(ty: Ty) -> u8 {
        match ty {
            Bool => 2,
            I8 => 3,
            I16 => 4,
            I32 => 5,
            I64 => 6,
            Double => 7,
            Binary => 8,
            List(_) | Ty::Schema => 9,
            Struct(_) => 12,
            Ty::Encryption(_, inner) => wire_type(*inner),
        }
    }

    /// Whether a struct field of wire type `wire` holds a `ty` the way the parquet crate reads it.
    fn field_matches(ty: Ty, wire: u8) -> bool {
        match ty {
            Bool => wire == 1 || wire == 2,
            List(_) | Ty::Schema => wire == 9 || wire == 10,
            Ty::Encryption(_, inner) => field_matches(*inner, wire),
            _ => wire == wire_type(ty),
        }
    }

    struct Walker<'a> {
        buf: &'a [u8],
        pos: usize,
        /// Values still allowed to be visited.
        budget: usize,
        walked: Walked,
    }

    impl Walker<'_> {
        fn remaining(&self) -> usize {
            self.buf.len().saturating_sub(self.pos)
        }

        fn byte(&mut self) -> Result<u8, String> {
            let b = *self.buf.get(self.pos).ok_or_else(|| format!("ends early (at byte {})", self.pos))?;
            self.pos += 1;
            Ok(b)
        }

        fn skip_bytes(&mut self, n: u64) -> Result<(), String> {
            match usize::try_from(n) {
                Ok(n) if n <= self.remaining() => {
                    self.pos += n;
                    Ok(())
                }
                _ => Err(format!("{n} bytes needed at byte {} but only {} left", self.pos, self.remaining())),
            }
        }

        /// An unsigned LEB128 varint (at most 10 bytes, the most a 64-bit value needs).
        fn varint(&mut self) -> Result<u64, String> {
            let mut value = 0u64;
            for i in 0..10u32 {
                let b = self.byte()?;
                value |= u64::from(b & 0x7f).wrapping_shl(7 * i);
                if b & 0x80 == 0 {
                    return Ok(value);
                }
            }
            Err(format!("varint longer than 10 bytes before byte {}", self.pos))
        }

        fn zigzag(&mut self) -> Result<i64, String> {
            let v = self.varint()?;
            Ok((v >> 1) as i64 ^ -((v & 1) as i64))
        }

        /// Counts one visited value.
        fn tick(&mut self) -> Result<(), String> {
            self.budget = self
                .budget
                .checked_sub(1)
                .ok_or_else(|| format!("more values than bytes (at byte {})", self.pos))?;
            Ok(())
        }

        /// A field header: `None` at the end of the struct, else (wire type, field id).
        fn field(&mut self, last_id: i16) -> Result<Option<(u8, i16)>, String> {
            let at = self.pos;
            let b = self.byte()?;
            let wire = b & 0x0f;
            if wire == 0 {
                return Ok(None);
            }
            if wire > 13 {
                return Err(format!("invalid field type {wire} at byte {at}"));
            }
            let delta = b >> 4;
            let id = if delta != 0 {
                last_id
                    .checked_add(i16::from(delta))
                    .ok_or_else(|| format!("field id overflows at byte {at}"))?
            } else {
                self.zigzag()? as i16
            };
            Ok(Some((wire, id)))
        }

        /// A list or set header: (element type, with both bool codes as 2; size).
        fn list_header(&mut self) -> Result<(u8, usize), String> {
            let at = self.pos;
            let h = self.byte()?;
            if h == 0 {
                return Ok((3, 0));
            }
            let elem = match h & 0x0f {
                1 | 2 => 2,
                e @ 3..=13 => e,
                e => return Err(format!("invalid list element type {e} at byte {at}")),
            };
            let size = match h >> 4 {
                15 => self.varint()?,
                n => u64::from(n),
            };
            self.collection_size(size, at).map(|size| (elem, size))
        }

        /// A declared element count, which must fit the i32 of the format and the bytes left.
        fn collection_size(&self, size: u64, at: usize) -> Result<usize, String> {
            match usize::try_from(size) {
                Ok(n) if size <= i32::MAX as u64 && n <= self.remaining() => Ok(n),
                _ => Err(format!(
                    "a collection at byte {at} claims {size} elements but only {} bytes are left",
                    self.remaining()
                )),
            }
        }

        /// A value of `ty` as the parquet crate reads it, after its field header (if any).
        fn value(&mut self, ty: Ty) -> Result<(), String> {
            self.tick()?;
            match ty {
                // A bool field's value is in its header.
                Bool => Ok(()),
                I8 => self.skip_bytes(1),
                I16 | I32 | I64 => self.varint().map(drop),
                Double => self.skip_bytes(8),
                Binary => {
                    let n = self.varint()?;
                    self.skip_bytes(n)
                }
                List(elem) => {
                    let at = self.pos;
                    let (wire, size) = self.list_header()?;
                    if size > 0 && wire != wire_type(*elem) {
                        return Err(format!("list at byte {at} has elements of type {wire}, expected {}", wire_type(*elem)));
                    }
                    for _ in 0..size {
                        match elem {
                            // A bool list element takes one byte.
                            Bool => {
                                self.tick()?;
                                self.byte()?;
                            }
                            other => self.value(*other)?,
                        }
                    }
                    Ok(())
                }
                Struct(fields) => self.structure(fields, false).map(drop),
                Ty::Schema => self.schema(),
                Ty::Encryption(name, inner) => {
                    self.walked.encryption.get_or_insert(name);
                    self.value(*inner)
                }
            }
        }

        /// A struct's fields up to its end; for a `SchemaElement` (`schema_element`)
        /// returns the last `num_children` seen.
        fn structure(&mut self, fields: &[(i16, Ty)], schema_element: bool) -> Result<Option<i32>, String> {
            let mut last_id = 0i16;
            let mut num_children = None;
            while let Some((wire, id)) = self.field(last_id)? {
                match fields.iter().find(|(f, _)| *f == id) {
                    Some(&(_, ty)) if !field_matches(ty, wire) => {
                        return Err(format!(
                            "field {id} before byte {} has type {wire}, expected {}",
                            self.pos,
                            wire_type(ty)
                        ));
                    }
                    Some(&(_, I32)) if schema_element && id == NUM_CHILDREN => {
                        self.tick()?;
                        num_children = Some(self.zigzag()? as i32);
                    }
                    Some(&(_, ty)) => self.value(ty)?,
                    None => self.skip(wire, SKIP_DEPTH)?,
                }
                last_id = id;
            }
            Ok(num_children)
        }

        /// `FileMetaData.schema`. The parquet crate builds the tree depth-first,
        /// recursing once per level and reserving room for each group's
        /// children before reading them.
        fn schema(&mut self) -> Result<(), String> {
            let at = self.pos;
            let (wire, size) = self.list_header()?;
            if size > 0 && wire != 12 {
                return Err(format!("schema list at byte {at} has elements of type {wire}"));
            }
            // Children still to come, per open group, innermost last.
            let mut open: Vec<usize> = Vec::new();
            for i in 0..size {
                self.tick()?;
                let children = self.structure(SCHEMA_ELEMENT, true)?;
                if let Some(top) = open.last_mut() {
                    *top = top.saturating_sub(1);
                }
                match children {
                    Some(n) if n < 0 => return Err(format!("schema element {i} has {n} children")),
                    Some(n) if n > 0 => {
                        let n = n as usize;
                        let left = size - i - 1;
                        if n > left {
                            return Err(format!(
                                "schema element {i} claims {n} children but only {left} elements follow"
                            ));
                        }
                        open.push(n);
                        if open.len() > MAX_SCHEMA_DEPTH {
                            return Err(format!("schema nests deeper than {MAX_SCHEMA_DEPTH} levels"));
                        }
                    }
                    _ => {}
                }
                while open.last() == Some(&0) {
                    open.pop();
                }
            }
            Ok(())
        }

        /// Skips a value of wire type `wire` exactly as the parquet crate does
        /// (a bool inside a collection takes no bytes there).
        fn skip(&mut self, wire: u8, depth: u32) -> Result<(), String> {
            if depth == 0 {
                return Err(format!("unknown fields nest deeper than {SKIP_DEPTH} levels"));
            }
            self.tick()?;
            match wire {
                1 | 2 => Ok(()),
                3 => self.skip_bytes(1),
                4..=6 => self.varint().map(drop),
                7 => self.skip_bytes(8),
                8 => {
                    let n = self.varint()?;
                    self.skip_bytes(n)
                }
                9 | 10 => {
                    let (elem, size) = self.list_header()?;
                    for _ in 0..size {
                        self.skip(elem, depth - 1)?;
                    }
                    Ok(())
                }
                11 => {
                    let at = self.pos;
                    let size = self.varint()?;
                    let size = self.collection_size(size, at)?;
                    if size > 0 {
                        let kv = self.byte()?;
                        let code = |t: u8| match t {
                            1 | 2 => Ok(2),
                            3..=13 => Ok(t),
                            _ => Err(format!("invalid map element type {t} at byte {at}")),
                        };
                        let (k, v) = (code(kv >> 4)?, code(kv & 0x0f)?);
                        for _ in 0..size {
                            self.skip(k, depth - 1)?;
                            self.skip(v, depth - 1)?;
                        }
                    }
                    Ok(())
                }
                12 => {
                    while let Some((w, _)) = self.field(0)? {
                        self.skip(w, depth - 1)?;
                    }
                    Ok(())
                }
                13 => self.skip_bytes(16),
                other => Err(format!("invalid type {other} at byte {}", self.pos)),
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn rejects_collections_larger_than_the_input() {
            // FileMetaData { 4: list<struct> of 2^31-1 elements }
            let huge_row_groups = [0x49, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00];
            let e = check(&huge_row_groups, FILE_META_DATA).unwrap_err();
            assert!(e.contains("claims"), "{e}");
            // An unknown field 20: a list of lists of bools (the crate skips bools without consuming input).
            let mut bools = vec![0x09, 0x28, 0xf1];
            bools.extend([0xff, 0xff, 0xff, 0xff, 0x07]);
            assert!(check(&bools, FILE_META_DATA).is_err());
            let mut nested = vec![0x09, 0x28, 0xf9, 0xc8, 0x01];
            nested.extend(std::iter::repeat_n([0xf1, 0x7f], 200).flatten());
            nested.push(0x00);
            assert!(check(&nested, FILE_META_DATA).is_err());
        }

        #[test]
        fn rejects_deep_and_inconsistent_schemas() {
            // FileMetaData { 2: list<SchemaElement> } with `n` elements, each a group of one child.
            let varint = |b: &mut Vec<u8>, mut v: u64| loop {
                let byte = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    b.push(byte);
                    break;
                }
                b.push(byte | 0x80);
            };
            let schema = |n: usize, children: i32| {
                let mut b = vec![0x29, 0xfc];
                varint(&mut b, n as u64);
                for _ in 0..n {
                    // 4: name "a", 5: num_children (zigzag)
                    b.extend([0x48, 0x01, b'a', 0x15]);
                    let z = (children.wrapping_shl(1) ^ (children >> 31)) as u32;
                    varint(&mut b, u64::from(z));
                    b.push(0x00);
                }
                b.push(0x00);
                b
            };
            assert!(check(&schema(10, 1), FILE_META_DATA).is_err(), "last group lacks its child");
            let e = check(&schema(MAX_SCHEMA_DEPTH + 2, 1), FILE_META_DATA).unwrap_err();
            assert!(e.contains("deeper"), "{e}");
            let e = check(&schema(3, i32::MAX), FILE_META_DATA).unwrap_err();
            assert!(e.contains("claims"), "{e}");
            assert!(check(&schema(3, -1), FILE_META_DATA).is_err());
        }

        #[test]
        fn rejects_known_fields_of_the_wrong_type() {
            // FileMetaData { 1: version as a string }
            assert!(check(&[0x18, 0x01, b'x', 0x00], FILE_META_DATA).is_err());
            // ... and as an i32 it passes.
            assert!(check(&[0x15, 0x02, 0x00], FILE_META_DATA).is_ok());
        }
    }
}
