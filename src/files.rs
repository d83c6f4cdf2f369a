//! Which Parquet files a path names: the file itself, or the `*.parquet`
//! files of a directory. Used by the CLI and the DataFusion provider to turn
//! what a user typed into files; planning a read starts from one file.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The Parquet files at `path`: the file itself, or the `*.parquet` files of a
/// directory (not recursive; names starting with `.` or `_` are skipped), sorted.
pub fn parquet_files(path: &Path) -> Result<Vec<PathBuf>> {
    let open_err = |source| Error::Open { file: path.to_path_buf(), source };
    let meta = std::fs::metadata(path).map_err(open_err)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(open_err)? {
        let entry = entry.map_err(open_err)?;
        let p = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_parquet = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
        if is_parquet && !name.starts_with('.') && !name.starts_with('_') && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parquet_files_sorted_and_skips_hidden() {
        let dir = std::env::temp_dir().join(format!("gpq-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["b.parquet", "a.PARQUET", "_meta.parquet", ".hidden.parquet", "c.csv"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let got: Vec<String> =
            parquet_files(&dir).unwrap().iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(got, ["a.PARQUET", "b.parquet"]);
        assert_eq!(parquet_files(&dir.join("b.parquet")).unwrap(), vec![dir.join("b.parquet")]);
        match parquet_files(&dir.join("missing")) {
            Err(Error::Open { file, .. }) => assert_eq!(file, dir.join("missing")),
            other => panic!("expected Open, got {other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
