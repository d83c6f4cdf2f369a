//! Opening a file and loading its footer (and page index, where present)
//! with the parquet crate, with errors that tell a truncated file from one
//! that is not Parquet at all.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"PAR1";

/// The footer of one file, with the file's size at the time it was read.
#[derive(Debug, Clone)]
pub struct Footer {
    /// Size of the file in bytes.
    pub file_size: u64,
    /// Parsed metadata, including the page index when the file has one.
    pub metadata: Arc<ParquetMetaData>,
}

impl Footer {
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

fn read_footer_impl(path: &Path, page_index: bool) -> Result<Footer> {
    let open_err = |source| Error::Open { file: path.to_path_buf(), source };
    let mut file = File::open(path).map_err(open_err)?;
    let file_size = file.metadata().map_err(open_err)?.len();
    check_magic(path, &mut file, file_size)?;

    let parse = |policy| ParquetMetaDataReader::new().with_page_index_policy(policy).parse_and_finish(&file);
    // A damaged or unreadable page index is not worth failing the read for:
    // gpq only uses it for planning hints, so retry without it.
    let first = if page_index { PageIndexPolicy::Optional } else { PageIndexPolicy::Skip };
    let metadata = parse(first)
        .or_else(|first| {
            parse(PageIndexPolicy::Skip).inspect(|_| {
                tracing::warn!(file = %path.display(), error = %first, "page index unreadable; reading without it")
            })
        })
        .map_err(|source| {
            let text = source.to_string();
            if text.contains("EOF") || text.contains("out of bound") || text.contains("range") {
                Error::NotParquet {
                    file: path.to_path_buf(),
                    reason: format!("footer is damaged or the file is truncated: {text}"),
                }
            } else {
                Error::Metadata { file: path.to_path_buf(), source }
            }
        })?;
    Ok(Footer { file_size, metadata: Arc::new(metadata) })
}

fn check_magic(path: &Path, file: &mut File, file_size: u64) -> Result<()> {
    let not_parquet = |reason: String| Error::NotParquet { file: path.to_path_buf(), reason };
    if file_size < 12 {
        return Err(not_parquet(format!("only {file_size} bytes, too short for a Parquet file")));
    }
    let mut head = [0u8; 4];
    let mut tail = [0u8; 4];
    let read = |file: &mut File, at: u64, buf: &mut [u8; 4]| -> Result<()> {
        file.seek(SeekFrom::Start(at))
            .and_then(|_| file.read_exact(buf))
            .map_err(|source| Error::Io { file: path.to_path_buf(), offset: at, len: 4, source })
    };
    read(file, 0, &mut head)?;
    read(file, file_size - 4, &mut tail)?;
    match (&head == MAGIC, &tail == MAGIC) {
        (true, true) => Ok(()),
        (true, false) => Err(not_parquet(
            "it starts with PAR1 but does not end with it: truncated, or still being written".into(),
        )),
        (false, true) => Err(not_parquet("it ends with PAR1 but does not start with it".into())),
        (false, false) => Err(not_parquet(format!("no PAR1 magic (first bytes {head:02x?})"))),
    }
}
