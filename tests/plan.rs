//! CPU-only tests of read planning: ranges, projections, row groups and the
//! errors bad requests and bad files produce.

mod common;

use std::path::Path;

use gpq::{ColumnSelector, Error, ReadOptions, ReadPlan};
use parquet::basic::Compression;
use parquet::file::properties::WriterVersion;

fn sample(dir: &Path) -> std::path::PathBuf {
    common::write_sample(&dir.join("sample.parquet"), 10_000, 3_000, Compression::SNAPPY)
}

#[test]
fn chunks_match_metadata_and_ranges_cover_them_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let plan = ReadPlan::new(&path, &ReadOptions::new()).unwrap();
    assert_eq!(plan.row_groups(), [0, 1, 2, 3]);
    assert_eq!(plan.num_rows(), 10_000);
    assert_eq!(plan.chunks().len(), 4 * 4);
    assert_eq!(plan.schema().fields().len(), 4);
    // The footer as the parquet crate reads it, independently of gpq.
    let md = parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(&std::fs::File::open(&path).unwrap()).unwrap();
    for c in plan.chunks() {
        let leaf = plan.leaf_of(c).leaf_index;
        let (start, len) = md.row_group(c.row_group).column(leaf).byte_range();
        assert_eq!((c.file_offset, c.len), (start, len));
        // Exactly one range holds the chunk, and maps it to the chunk's device offset.
        let holders: Vec<_> = plan
            .io()
            .ranges
            .iter()
            .filter(|r| r.file_offset <= c.file_offset && c.file_offset + c.len <= r.file_offset + r.read_len)
            .collect();
        assert_eq!(holders.len(), 1);
        assert_eq!(c.device_offset, holders[0].device_offset + c.file_offset - holders[0].file_offset);
    }
    for r in &plan.io().ranges {
        assert_eq!(r.file_offset % 4096, 0);
        assert_eq!(r.device_offset % 4096, 0);
    }
    let requested: u64 = plan.chunks().iter().map(|c| c.len).sum();
    assert_eq!(plan.io().bytes_requested, requested);
}

#[test]
fn knobs_change_merging_and_splitting() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    // With every other column skipped, a zero gap keeps ranges apart and a huge gap merges all.
    let cols = ReadOptions::new().with_columns(["id", "price"]);
    let apart = ReadPlan::new(&path, &cols.clone().with_merge_gap(0)).unwrap();
    let merged = ReadPlan::new(&path, &cols.clone().with_merge_gap(1 << 30)).unwrap();
    assert!(apart.io().ranges.len() > 1);
    assert_eq!(merged.io().ranges.len(), 1);
    assert!(merged.io().over_read() > apart.io().over_read());
    let small_tasks = ReadPlan::new(&path, &cols.with_merge_gap(1 << 30).with_task_size(4096)).unwrap();
    assert!(small_tasks.io().tasks.iter().all(|t| t.len <= 4096));
    assert_eq!(small_tasks.io().tasks.len() as u64, small_tasks.io().bytes_read.div_ceil(4096));
}

#[test]
fn projection_by_name_index_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let plan = ReadPlan::new(&path, &ReadOptions::new().with_columns([ColumnSelector::from("name"), ColumnSelector::Index(0)])).unwrap();
    let names: Vec<_> = plan.schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["name", "id"]);
    assert_eq!(plan.chunks().len(), 2 * 4);
    for c in plan.chunks() {
        let expect_leaf = if c.column == 0 { 3 } else { 0 };
        assert_eq!(plan.leaf_of(c).leaf_index, expect_leaf);
    }
    // A duplicate selection is read once.
    let dup = ReadPlan::new(&path, &ReadOptions::new().with_columns(["id", "id"])).unwrap();
    assert_eq!(dup.columns().len(), 1);
}

#[test]
fn nested_paths_select_leaves() {
    use arrow::array::{ArrayRef, Int32Array, RecordBatch, StructArray};
    use arrow::datatypes::{DataType, Field, Fields};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested.parquet");
    let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
    let b: ArrayRef = Arc::new(Int32Array::from(vec![4, 5, 6]));
    let fields = Fields::from(vec![Field::new("a", DataType::Int32, false), Field::new("b", DataType::Int32, false)]);
    let s = StructArray::new(fields, vec![a.clone(), b], None);
    let batch = RecordBatch::try_from_iter(vec![("top", a), ("s", Arc::new(s) as ArrayRef)]).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let plan = ReadPlan::new(&path, &ReadOptions::new().with_columns(["s.b"])).unwrap();
    assert_eq!(plan.columns().len(), 1);
    assert_eq!(plan.columns()[0].leaves.len(), 1);
    assert_eq!(plan.columns()[0].leaves[0].path, "s.b");
    assert!(!plan.columns()[0].is_flat());
    let whole = ReadPlan::new(&path, &ReadOptions::new().with_columns(["s"])).unwrap();
    assert_eq!(whole.columns()[0].leaves.len(), 2);
    let top = ReadPlan::new(&path, &ReadOptions::new().with_columns(["top"])).unwrap();
    assert!(top.columns()[0].is_flat());
}

#[test]
fn row_group_selection() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let plan = ReadPlan::new(&path, &ReadOptions::new().with_row_groups([3, 1])).unwrap();
    assert_eq!(plan.row_groups(), [3, 1]);
    assert_eq!(plan.num_rows(), 1_000 + 3_000);
    assert!(plan.chunks()[..4].iter().all(|c| c.row_group == 3));
    assert!(plan.chunks()[4..].iter().all(|c| c.row_group == 1));
    match ReadPlan::new(&path, &ReadOptions::new().with_row_groups([1, 1])) {
        Err(Error::InvalidOptions(m)) => assert!(m.contains("twice")),
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
}

#[test]
fn unknown_column_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let err = ReadPlan::new(&path, &ReadOptions::new().with_columns(["nope"])).unwrap_err();
    match &err {
        Error::ColumnNotFound { column, available, file } => {
            assert_eq!(column, "nope");
            assert!(available.contains("price"));
            assert_eq!(file, &path);
        }
        other => panic!("expected ColumnNotFound, got {other:?}"),
    }
    assert!(err.to_string().contains("sample.parquet"));
    let err = ReadPlan::new(&path, &ReadOptions::new().with_columns([ColumnSelector::Index(9)])).unwrap_err();
    assert!(matches!(err, Error::ColumnNotFound { .. }), "{err:?}");
}

#[test]
fn row_group_out_of_range_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let err = ReadPlan::new(&path, &ReadOptions::new().with_row_groups([4])).unwrap_err();
    assert!(matches!(err, Error::RowGroupOutOfRange { row_group: 4, num_row_groups: 4, .. }), "{err:?}");
}

#[test]
fn not_parquet_and_truncated_files() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.parquet");
    std::fs::write(&text, "this is not a parquet file at all, just text").unwrap();
    assert!(matches!(ReadPlan::new(&text, &ReadOptions::new()), Err(Error::NotParquet { .. })));

    let tiny = dir.path().join("tiny.parquet");
    std::fs::write(&tiny, b"PAR1").unwrap();
    assert!(matches!(ReadPlan::new(&tiny, &ReadOptions::new()), Err(Error::NotParquet { .. })));

    let good = sample(dir.path());
    let bytes = std::fs::read(&good).unwrap();

    // Cut off the tail: the footer is gone.
    let cut = dir.path().join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = ReadPlan::new(&cut, &ReadOptions::new()).unwrap_err();
    assert!(matches!(err, Error::NotParquet { .. }), "{err:?}");
    assert!(err.to_string().contains("truncated"), "{err}");

    // Keep the footer but drop the data: the footer claims bytes the file does not have.
    let footer_len = u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap()) as usize;
    let mut hollow = b"PAR1".to_vec();
    hollow.extend_from_slice(&bytes[bytes.len() - 8 - footer_len..]);
    let hollow_path = dir.path().join("hollow.parquet");
    std::fs::write(&hollow_path, &hollow).unwrap();
    match ReadPlan::new(&hollow_path, &ReadOptions::new()) {
        Err(Error::Truncated { row_group, column, file_size, .. }) => {
            assert_eq!(file_size, hollow.len() as u64);
            assert_eq!(row_group, 0);
            assert_eq!(column, "id");
        }
        other => panic!("expected Truncated, got {other:?}"),
    }

    // A footer length that points before the start of the file.
    let mut bad_len = bytes.clone();
    let n = bad_len.len();
    bad_len[n - 8..n - 4].copy_from_slice(&(u32::MAX / 2).to_le_bytes());
    let bad_len_path = dir.path().join("badlen.parquet");
    std::fs::write(&bad_len_path, &bad_len).unwrap();
    let err = ReadPlan::new(&bad_len_path, &ReadOptions::new()).unwrap_err();
    assert!(matches!(err, Error::NotParquet { .. } | Error::Metadata { .. }), "{err:?}");

    let missing = dir.path().join("missing.parquet");
    match ReadPlan::new(&missing, &ReadOptions::new()) {
        Err(Error::Open { file, source }) => {
            assert_eq!(file, missing);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Open, got {other:?}"),
    }
}

#[test]
fn io_knobs_from_options_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let err = ReadPlan::new(&path, &ReadOptions::new().with_task_size(10)).unwrap_err();
    assert!(matches!(err, Error::InvalidOptions(_)));
}

#[test]
fn plans_real_files_from_other_writers() {
    use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
    let Some(dir) = common::parquet_testing_dir() else { return };
    let mut planned = 0;
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "parquet") {
            continue;
        }
        // Where arrow-rs can load the footer and schema, gpq must plan the
        // read; where it cannot, gpq must fail with an error blaming the file.
        let arrow_rs = std::fs::File::open(&path)
            .map_err(parquet::errors::ParquetError::from)
            .and_then(|f| ArrowReaderMetadata::load(&f, ArrowReaderOptions::new()));
        match (ReadPlan::new(&path, &ReadOptions::new()), arrow_rs) {
            (Ok(plan), Ok(meta)) => {
                planned += 1;
                let md = meta.metadata();
                let rows: i64 = md.row_groups().iter().map(|rg| rg.num_rows()).sum();
                assert_eq!(plan.num_rows(), rows as u64, "{}", path.display());
                for c in plan.chunks() {
                    assert!(c.file_offset + c.len <= plan.file_size(), "{}", path.display());
                    let (start, len) = md.row_group(c.row_group).column(plan.leaf_of(c).leaf_index).byte_range();
                    assert_eq!((c.file_offset, c.len), (start, len), "{}", path.display());
                }
            }
            (Err(e), Err(_)) if e.is_bad_input() => {}
            (got, expected) => problems.push(format!(
                "{}: gpq {}, arrow-rs {}",
                path.display(),
                got.map(|_| "plans it".to_string()).unwrap_or_else(|e| format!("fails ({e})")),
                expected.map(|_| "loads it".to_string()).unwrap_or_else(|e| format!("fails ({e})")),
            )),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(planned > 0);
}

/// Files with Parquet modular encryption get `Error::Encrypted`, not "no
/// PAR1 magic" or a schema error: an encrypted footer (magic `PARE` at both
/// ends), and a plaintext footer that names an encryption algorithm
/// (crafted, and parquet-mr's from apache/parquet-testing, `testdata/README.md`).
#[test]
fn encrypted_files_are_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let good = sample(dir.path());
    let bytes = std::fs::read(&good).unwrap();
    let expect_encrypted = |path: &Path, needle: &str| match ReadPlan::new(path, &ReadOptions::new()) {
        Err(e @ Error::Encrypted { .. }) => {
            let text = e.to_string();
            assert!(text.contains("encrypted") && text.contains(needle), "{}: {text}", path.display());
            assert!(text.contains(&*path.to_string_lossy()), "{text}");
            assert_eq!(e.kind(), "encrypted");
            assert!(!e.is_bad_input(), "an encrypted file is not a corrupt one");
        }
        other => panic!("{}: expected Error::Encrypted, got {other:?}", path.display()),
    };

    // Encrypted footer: the same bytes between PARE magics.
    let mut pare = bytes.clone();
    let n = pare.len();
    pare[..4].copy_from_slice(b"PARE");
    pare[n - 4..].copy_from_slice(b"PARE");
    let path = dir.path().join("encrypted_footer.parquet");
    std::fs::write(&path, &pare).unwrap();
    expect_encrypted(&path, "PARE");

    // Plaintext footer with FileMetaData.encryption_algorithm (field 8, long
    // form header) = AES_GCM_V1 {}, added before the footer's final stop byte.
    let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let footer = &bytes[n - 8 - footer_len..n - 8];
    assert_eq!(footer.last(), Some(&0));
    let mut plaintext = bytes[..n - 8 - footer_len].to_vec();
    plaintext.extend_from_slice(&footer[..footer_len - 1]);
    plaintext.extend_from_slice(&[0x0c, 0x10, 0x1c, 0x00, 0x00, 0x00]);
    plaintext.extend_from_slice(&(footer_len as u32 + 5).to_le_bytes());
    plaintext.extend_from_slice(b"PAR1");
    let path = dir.path().join("plaintext_footer.parquet");
    std::fs::write(&path, &plaintext).unwrap();
    expect_encrypted(&path, "encryption_algorithm");

    expect_encrypted(&common::testdata("encrypt_columns_plaintext_footer.parquet.encrypted"), "plaintext footer");
}

/// Row groups of zero rows have no chunks to read: pyarrow's empty table (its
/// chunks at offset 0 with 0 bytes, or a dictionary page of 0 entries) and a
/// zero-row row group between two others (`testdata/README.md`).
#[test]
fn zero_row_row_groups_have_no_chunks() {
    let plan = ReadPlan::new(common::testdata("pyarrow_empty_table.parquet"), &ReadOptions::new()).unwrap();
    assert_eq!((plan.num_rows(), plan.row_groups().len(), plan.chunks().len()), (0, 1, 0));
    assert_eq!(plan.schema().fields().len(), 5);
    assert!(plan.io().ranges.is_empty());

    let plan = ReadPlan::new(common::testdata("pyarrow_middle_empty_row_group.parquet"), &ReadOptions::new()).unwrap();
    assert_eq!(plan.num_rows(), 6);
    let groups: Vec<usize> = plan.chunks().iter().map(|c| c.row_group).collect();
    assert_eq!(groups, [0, 0, 0, 0, 0, 2, 2, 2, 2, 2]);
}

#[test]
fn row_windows_plan_only_the_pages_holding_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    // Two row groups of 2000 rows, pages of at most 100 rows, an offset index.
    let path = common::write_paged_sample(&dir.path().join("paged.parquet"), 4000, 2000, 100, WriterVersion::PARQUET_1_0);
    let io = ReadOptions::default().io;
    let footer = gpq::read_footer_with_page_index(&path).unwrap();
    assert!(footer.has_offset_index());
    let whole = ReadPlan::from_footer(&path, footer.clone(), &ReadOptions::default()).unwrap();

    // Rows 150..260: row group 0 only, each chunk from the page holding row
    // 150 to the one holding row 259, and the dictionary page in front
    // (`small`: a second span; the others have none, so one span).
    let cut = whole.clone().with_row_window(150, 110, &io).unwrap();
    assert_eq!((cut.num_rows(), cut.row_groups()), (110, &[0usize][..]));
    for (c, &lead) in cut.chunks().iter().zip(cut.lead_rows()) {
        assert!(c.first_row <= 150 && c.first_row + c.num_rows >= 260 && c.num_rows <= 300, "{c:?}");
        assert_eq!((c.num_values, lead), (c.num_rows, 150 - c.first_row), "{c:?}");
        let r = c.resume.expect("pages before row 100 are skipped");
        assert!(r.skipped_pages >= 1 && r.file_offset >= c.file_offset + c.len, "{c:?}");
        assert_eq!(c.len > 0, c.has_dictionary_page, "{c:?}");
    }
    assert!(cut.io().bytes_requested * 5 < whole.io().bytes_requested, "{} of {}", cut.io().bytes_requested, whole.io().bytes_requested);

    // Rows 1950..2120: the end of row group 0 and the start of 1 (no pages skipped in front there).
    let across = whole.clone().with_row_window(1950, 170, &io).unwrap();
    assert_eq!(across.row_groups(), &[0, 1]);
    for c in across.chunks() {
        if c.row_group == 0 {
            assert!(c.first_row <= 1950 && c.first_row + c.num_rows == 2000 && c.resume.is_some(), "{c:?}");
        } else {
            assert!(c.first_row == 0 && (120..=200).contains(&c.num_rows) && c.resume.is_none(), "{c:?}");
        }
    }
    // The whole plan, unchanged; no rows, nothing to read; a cut plan is not cut again.
    let same = whole.clone().with_row_window(0, u64::MAX, &io).unwrap();
    assert_eq!(same.io(), whole.io());
    let none = whole.clone().with_row_window(2000, 0, &io).unwrap();
    assert!(none.chunks().is_empty() && none.num_rows() == 0 && none.lead_rows() == [0; 4]);
    assert!(matches!(cut.clone().with_row_window(10, 10, &io), Err(Error::InvalidOptions(_))));

    // Without an offset index: whole row groups, each column cut after decoding.
    let plain = ReadPlan::from_footer(&path, gpq::read_footer(&path).unwrap(), &ReadOptions::default()).unwrap();
    let cut = plain.with_row_window(150, 110, &io).unwrap();
    assert!(cut.chunks().iter().all(|c| c.resume.is_none() && c.num_rows == 2000 && c.first_row == 0));
    assert_eq!(cut.lead_rows(), &[150; 4]);
}

#[test]
fn plans_split_into_runs_of_row_groups_that_add_up_to_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    // 10 row groups of 1,000 rows.
    let path = common::write_sample(&dir.path().join("ten.parquet"), 10_000, 1_000, Compression::SNAPPY);
    let options = ReadOptions::new();
    let plan = ReadPlan::new(&path, &options).unwrap();
    let key = |p: &ReadPlan| p.chunks().iter().map(|c| (c.row_group, c.column, c.leaf, c.file_offset, c.len)).collect::<Vec<_>>();
    for groups in [2, 3, 4, 10, 50] {
        let parts = plan.split_row_groups(groups, &options.io).unwrap();
        assert_eq!(parts.len(), groups.min(10), "{groups} groups");
        // In order, without gaps or overlaps: the runs' chunks are the plan's.
        assert_eq!(parts.iter().flat_map(key).collect::<Vec<_>>(), key(&plan));
        assert_eq!(parts.iter().map(|p| p.num_rows()).sum::<u64>(), plan.num_rows());
        for p in &parts {
            assert!(!p.chunks().is_empty());
            let requested: u64 = p.chunks().iter().map(|c| c.len).sum();
            assert_eq!(p.io().bytes_requested, requested, "each run has its own IO layout");
            assert!(p.chunks().iter().all(|c| c.device_offset + c.len <= p.io().device_bytes));
        }
        // About equal bytes: no run more than twice the mean plus a row group.
        let mean = plan.chunk_bytes() / parts.len() as u64;
        let rg = plan.chunk_bytes() / 10;
        assert!(parts.iter().all(|p| p.chunk_bytes() <= 2 * mean + rg), "{groups}: {:?}", parts.iter().map(|p| p.chunk_bytes()).collect::<Vec<_>>());
    }
    // Nothing to split: one group asked for, or one row group.
    assert_eq!(plan.split_row_groups(1, &options.io).unwrap().len(), 1);
    let one = ReadPlan::new(&path, &ReadOptions::new().with_row_groups([4])).unwrap();
    assert_eq!(one.split_row_groups(8, &options.io).unwrap().len(), 1);
    // A plan cut to a row window is read in one go.
    let window = plan.clone().with_row_window(1_500, 5_000, &options.io).unwrap();
    assert_eq!(window.split_row_groups(4, &options.io).unwrap().len(), 1);
    let head = plan.clone().with_row_window(0, 1_500, &options.io).unwrap();
    assert_eq!(head.split_row_groups(4, &options.io).unwrap().len(), 1, "a window ending inside a row group");
}

#[test]
fn decoded_footers_are_kept_while_their_bytes_are_unchanged() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let first = gpq::read_footer(&path).unwrap();
    let again = gpq::read_footer(&path).unwrap();
    assert!(Arc::ptr_eq(&first.metadata, &again.metadata), "the second read reuses the decoded footer");
    assert!(gpq::cached_footers() >= 1);
    // Rewritten in place at once, same size, one byte of the footer changed
    // (the writer's name): decoded anew, and what the new bytes say.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(10).rposition(|w| w == b"parquet-rs").expect("the writer's name is in the footer");
    bytes[at] = b'P';
    std::fs::write(&path, &bytes).unwrap();
    let changed = gpq::read_footer(&path).unwrap();
    assert!(!Arc::ptr_eq(&first.metadata, &changed.metadata));
    assert!(changed.metadata.file_metadata().created_by().unwrap().starts_with("Parquet-rs"));
    // Footers read with their page index are decoded each time.
    let a = gpq::read_footer_with_page_index(&path).unwrap();
    let b = gpq::read_footer_with_page_index(&path).unwrap();
    assert!(!Arc::ptr_eq(&a.metadata, &b.metadata));
    // Emptied: the next read decodes again.
    let kept = gpq::read_footer(&path).unwrap();
    gpq::clear_footer_cache();
    let fresh = gpq::read_footer(&path).unwrap();
    assert!(!Arc::ptr_eq(&kept.metadata, &fresh.metadata));
}
