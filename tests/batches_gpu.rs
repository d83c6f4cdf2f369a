//! The batch reader (`DeviceReaderBuilder`): batches in row and memory
//! bounds whose concatenation is what arrow-rs reads, an exact row limit
//! (nested columns included), arrow-rs projections, and an over-small memory
//! limit as a typed error. Runs on a GPU or the emulator; ignored without
//! either.

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int32Array, ListArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use common::{arrow_rs, assert_batches_equal, gpu_trial, probe_device, run_trials, write_sample};
use gpq::cuda::GpuContext;
use gpq::{DeviceReaderBuilder, Error};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::file::properties::{WriterProperties, WriterVersion};

fn main() -> ExitCode {
    let device = probe_device();
    run_trials(vec![
        gpu_trial(&device, "batches_concatenate_to_what_arrow_rs_reads", batches_concatenate),
        gpu_trial(&device, "row_limit_is_exact", row_limit_is_exact),
        gpu_trial(&device, "row_limit_cuts_nested_columns", row_limit_cuts_nested_columns),
        gpu_trial(&device, "memory_limit_bounds_every_pass", memory_limit_bounds_every_pass),
        gpu_trial(&device, "passes_over_their_estimate_are_split", passes_over_their_estimate_are_split),
        gpu_trial(&device, "memory_limit_too_small_is_a_typed_error", memory_limit_too_small),
        gpu_trial(&device, "projection_masks_select_leaves", projection_masks_select_leaves),
        gpu_trial(&device, "several_files_are_one_sequence", several_files_are_one_sequence),
        gpu_trial(&device, "row_selections_read_only_their_row_groups", row_selections),
        gpu_trial(&device, "offset_indexes_leave_unselected_pages_unread", page_pruning),
        gpu_trial(&device, "metadata_loaded_by_arrow_rs_is_planned_from", metadata_from_arrow_rs),
        gpu_trial(&device, "row_groups_over_the_limit_are_read_in_row_windows", row_windows_under_a_limit),
    ])
}

/// The batches of `reader`, copied to the host and concatenated.
fn collect(reader: gpq::DeviceBatchReader) -> (Vec<usize>, RecordBatch) {
    let schema = reader.schema().clone();
    let mut rows = Vec::new();
    let mut host = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        rows.push(batch.num_rows());
        host.push(batch.to_record_batch().unwrap());
    }
    (rows, arrow::compute::concat_batches(&schema, &host).unwrap())
}

fn batches_concatenate(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    // 13 row groups: 12 of 400 rows and one of 200.
    let path = write_sample(&dir.path().join("s.parquet"), 5000, 400, Compression::SNAPPY);
    let expected = arrow_rs(&path).unwrap();
    let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_batch_rows(1000).build().unwrap();
    // Two row groups a batch, three in the last (400 + 400 + 200 rows).
    assert_eq!(reader.num_passes(), 6, "passes {:?}", reader.pass_row_groups());
    let (rows, got) = collect(reader);
    assert!(rows.iter().all(|&r| r <= 1000), "batch rows {rows:?}");
    assert_eq!(rows.iter().sum::<usize>(), 5000);
    assert_batches_equal("batches", &expected, &got);
    // Without prefetch, the same.
    let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_batch_rows(1000).with_prefetch(false).build().unwrap();
    assert_batches_equal("batches without prefetch", &expected, &collect(reader).1);
    // Selected row groups only, in file order.
    let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_row_groups([12, 3, 4]).with_batch_rows(1).build().unwrap();
    assert_eq!(reader.pass_row_groups(), vec![vec![3], vec![4], vec![12]]);
    let (rows, got) = collect(reader);
    assert_eq!(rows, vec![400, 400, 200]);
    let want = arrow::compute::concat_batches(&expected.schema(), &[expected.slice(1200, 800), expected.slice(4800, 200)]).unwrap();
    assert_batches_equal("row groups 3, 4, 12", &want, &got);
}

fn row_limit_is_exact(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 5000, 400, Compression::ZSTD(Default::default()));
    let expected = arrow_rs(&path).unwrap();
    for limit in [0, 1, 399, 400, 1234, 4999, 5000, 9000] {
        let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_batch_rows(800).with_limit(limit).build().unwrap();
        let (rows, got) = collect(reader);
        let n = limit.min(5000);
        assert_eq!(rows.iter().sum::<usize>(), n, "limit {limit}: batch rows {rows:?}");
        // (`small` has nulls: a cut batch counts only the nulls it keeps.)
        assert_batches_equal(&format!("limit {limit}"), &expected.slice(0, n), &got);
    }
}

fn row_limit_cuts_nested_columns(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lists.parquet");
    let lists: ListArray = ListArray::from_iter_primitive::<Int32Type, _, _>((0..3000).map(|i| match i % 7 {
        0 => None,
        k => Some((0..k).map(|j| if j == 2 { None } else { Some(i * 10 + j) }).collect::<Vec<_>>()),
    }));
    let ids: Int32Array = (0..3000).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("l", lists.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids) as ArrayRef, Arc::new(lists)]).unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(1000)).build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let expected = arrow_rs(&path).unwrap();
    for limit in [1, 999, 1000, 1500, 2999] {
        let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_batch_rows(1000).with_limit(limit).build().unwrap();
        let (_, got) = collect(reader);
        assert_batches_equal(&format!("lists, limit {limit}"), &expected.slice(0, limit), &got);
    }
}

/// Every batch of `reader` on the host, and the reader's peak device memory.
fn drain_with_peak(mut reader: gpq::DeviceBatchReader) -> (Vec<RecordBatch>, u64) {
    let host: Vec<RecordBatch> = reader.by_ref().map(|b| b.unwrap().to_record_batch().unwrap()).collect();
    let peak = reader.peak_device_memory().unwrap();
    (host, peak)
}

fn memory_limit_bounds_every_pass(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 20_000, 1000, Compression::SNAPPY);
    let expected = arrow_rs(&path).unwrap();
    // The whole selection in one pass, to learn its peak.
    let one = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(u64::MAX / 2).build().unwrap();
    assert_eq!(one.num_passes(), 1);
    let mut one = one;
    let table = one.next().unwrap().unwrap();
    let whole = one.peak_device_memory().unwrap();
    drop(table);
    assert!(whole > 0);
    // A quarter of that: several passes, each within the limit.
    let limit = whole / 4;
    let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(limit).build().unwrap();
    let planned = reader.num_passes();
    assert!(planned > 1, "a limit of {limit} bytes (the whole read peaks at {whole}) should take several passes");
    assert!(reader.decode_ahead() > 1, "a quarter of the whole read leaves room for several passes at once");
    let (host, peak) = drain_with_peak(reader);
    eprintln!("whole read peaks at {whole} bytes; limit {limit}: {planned} passes planned, {} read, peak {peak}", host.len());
    assert!(peak <= limit, "peak {peak} over the limit {limit}");
    let got = arrow::compute::concat_batches(&expected.schema(), &host).unwrap();
    assert_batches_equal("memory-bounded batches", &expected, &got);
}

/// Dictionary-encoded long strings decode to far more bytes than their pages
/// hold: written without size statistics, the footer's estimate is short of
/// it, and passes planned to fit are read again in halves, each still within
/// the limit; with them (the writer's default), the plan fits at once.
fn passes_over_their_estimate_are_split(_: &Arc<GpuContext>) {
    for size_statistics in [false, true] {
        dictionary_strings_under_a_limit(size_statistics);
    }
}

fn dictionary_strings_under_a_limit(size_statistics: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dict.parquet");
    let values: Vec<String> = (0..3).map(|k| format!("{k}{}", "x".repeat(300))).collect();
    let strings: arrow::array::StringArray = (0..20_000).map(|i| Some(values[i % 3].as_str())).collect();
    let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(strings) as ArrayRef]).unwrap();
    let mut props = WriterProperties::builder().set_max_row_group_row_count(Some(1000));
    if !size_statistics {
        props = props.set_statistics_enabled(parquet::file::properties::EnabledStatistics::None);
    }
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props.build())).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let expected = arrow_rs(&path).unwrap();
    let mut one = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(u64::MAX / 2).build().unwrap();
    drop(one.next().unwrap().unwrap());
    let whole = one.peak_device_memory().unwrap();
    let limit = whole / 3;
    let mut reader = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(limit).build().unwrap();
    let planned = reader.num_passes();
    let mut host = Vec::new();
    for batch in reader.by_ref() {
        host.push(batch.unwrap().to_record_batch().unwrap());
    }
    let peak = reader.peak_device_memory().unwrap();
    eprintln!(
        "size statistics {size_statistics}: whole read peaks at {whole} bytes; limit {limit}: {planned} passes planned, {} read, peak {peak}",
        host.len()
    );
    if size_statistics {
        assert!(planned > 1 && host.len() == planned, "with the values' sizes the plan fits: {planned} planned, {} read", host.len());
    } else {
        assert!(host.len() > planned, "the footer's estimate is far below what the strings decode to: passes should have been split");
    }
    assert!(peak <= limit, "peak {peak} over the limit {limit}");
    assert_batches_equal("split passes", &expected, &arrow::compute::concat_batches(&expected.schema(), &host).unwrap());
    // Passes of a row group, four at once. With the sizes, four fit the
    // limit as planned; without them, under two thirds of what four took,
    // they take more than the limit together and the reader goes on with
    // fewer at once.
    let four_at_once = |limit: u64| {
        let mut reader =
            DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(limit).with_batch_rows(1000).with_decode_ahead(4).build().unwrap();
        let at_first = reader.decode_ahead();
        let mut host = Vec::new();
        for batch in reader.by_ref() {
            host.push(batch.unwrap().to_record_batch().unwrap());
        }
        let peak = reader.peak_device_memory().unwrap();
        eprintln!("size statistics {size_statistics}, limit {limit}: {at_first} passes at once, then {}; peak {peak}", reader.decode_ahead());
        assert_eq!(at_first, 4);
        assert!(peak <= limit, "peak {peak} over the limit {limit}");
        assert_batches_equal("passes at once under a limit", &expected, &arrow::compute::concat_batches(&expected.schema(), &host).unwrap());
        (reader.decode_ahead(), peak)
    };
    let (after, peak) = four_at_once(limit);
    if size_statistics {
        assert_eq!(after, 4, "with the values' sizes four passes fit the limit");
    } else {
        let (after, _) = four_at_once(peak / 3 * 2);
        assert!(after < 4, "the footer's estimate is far below what the strings decode to: fewer passes at once");
    }
}

fn memory_limit_too_small(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 4000, 1000, Compression::SNAPPY);
    let mut reader = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(4096).build().unwrap();
    match reader.next() {
        Some(Err(Error::OverBudget { budget, .. })) => assert_eq!(budget, 4096),
        other => panic!("expected OverBudget, got {:?}", other.map(|r| r.map(|t| t.num_rows()))),
    }
    assert!(reader.next().is_none(), "the reader ends after an error");
}

fn projection_masks_select_leaves(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("s.parquet"), 3000, 1000, Compression::SNAPPY);
    let expected = arrow_rs(&path).unwrap();
    let builder = DeviceReaderBuilder::try_new(&path).unwrap();
    let mask = ProjectionMask::leaves(builder.footer().metadata.file_metadata().schema_descr(), [3, 0]);
    let (_, got) = collect(builder.with_projection(&mask).build().unwrap());
    let want = expected.project(&[0, 3]).unwrap();
    assert_batches_equal("leaves 0 and 3", &want, &got);
    // No columns at all (arrow-rs's pattern for counting rows): the rows still count.
    let builder = DeviceReaderBuilder::try_new(&path).unwrap();
    let none = ProjectionMask::none(builder.footer().metadata.file_metadata().schema_descr().num_columns());
    let (rows, got) = collect(builder.with_projection(&none).with_batch_rows(1000).build().unwrap());
    assert_eq!((rows, got.num_columns()), (vec![1000, 1000, 1000], 0));
}

fn several_files_are_one_sequence(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    let mut expected = Vec::new();
    for (i, rows) in [700usize, 1, 2500, 1200].into_iter().enumerate() {
        let p = write_sample(&dir.path().join(format!("part-{i}.parquet")), rows, 500, Compression::SNAPPY);
        expected.push(arrow_rs(&p).unwrap());
        paths.push(p);
    }
    let want = arrow::compute::concat_batches(&expected[0].schema(), &expected).unwrap();
    let files = gpq::parquet_files(dir.path()).unwrap();
    assert_eq!(files, paths, "a folder's files in name order");
    let reader = DeviceReaderBuilder::try_new_files(&files).unwrap().with_batch_rows(1000).build().unwrap();
    // Passes never span files: 700 | 1 | 1000, 1000, 500 | 1000, 200.
    assert_eq!(reader.pass_files(), vec![0, 1, 2, 2, 2, 3, 3]);
    let (rows, got) = collect(reader);
    assert_eq!(rows, vec![700, 1, 1000, 1000, 500, 1000, 200]);
    assert_batches_equal("four files", &want, &got);
    // Several passes read and decoded at once: the same batches, in order.
    for depth in [1, 3, 8] {
        let reader = DeviceReaderBuilder::try_new_files(&files).unwrap().with_batch_rows(1000).with_decode_ahead(depth).build().unwrap();
        assert_eq!(reader.decode_ahead(), depth.min(7));
        let (rows, got) = collect(reader);
        assert_eq!(rows, vec![700, 1, 1000, 1000, 500, 1000, 200], "{depth} passes at once");
        assert_batches_equal(&format!("four files, {depth} passes at once"), &want, &got);
    }
    // A selection counts rows across the files, as if they were one: rows
    // 650..702 cross from the first file over the one-row file into the
    // third, 3150..3250 from the third into the fourth, 4390.. past the end.
    let selection = RowSelection::from(vec![
        RowSelector::skip(650),
        RowSelector::select(52),
        RowSelector::skip(2448),
        RowSelector::select(100),
        RowSelector::skip(1140),
        RowSelector::select(50),
    ]);
    let reader = DeviceReaderBuilder::try_new_files(&files).unwrap().with_row_selection(selection).build().unwrap();
    let (rows, got) = collect(reader);
    assert_eq!(rows.iter().sum::<usize>(), 52 + 100 + 11, "selected rows {rows:?}");
    let picked = [want.slice(650, 52), want.slice(3150, 100), want.slice(4390, 11)];
    assert_batches_equal("a selection across files", &arrow::compute::concat_batches(&want.schema(), &picked).unwrap(), &got);
    assert!(matches!(
        DeviceReaderBuilder::try_new_files(&files).unwrap().with_row_groups([0]).build(),
        Err(Error::InvalidOptions(_))
    ));
    // Under a memory limit the passes at once share it, or go one at a time.
    for depth in [1, 4] {
        let limited = DeviceReaderBuilder::try_new_files(&files).unwrap().with_decode_ahead(depth).with_device_memory_limit(1 << 30).build().unwrap();
        assert_eq!(limited.decode_ahead(), depth);
        let (rows, got) = collect(limited);
        assert_eq!(rows, vec![700, 1, 2500, 1200], "{depth} passes at once under a limit");
        assert_batches_equal(&format!("four files, {depth} passes at once under a limit"), &want, &got);
    }
    // A corrupt file among them: the batches before it, then its typed error, then nothing.
    let bad_dir = tempfile::tempdir().unwrap();
    for (i, p) in files.iter().enumerate() {
        let mut bytes = std::fs::read(p).unwrap();
        if i == 2 {
            let md = parquet::file::serialized_reader::SerializedFileReader::new(std::fs::File::open(p).unwrap()).unwrap();
            let start = parquet::file::reader::FileReader::metadata(&md).row_group(1).column(0).byte_range().0 as usize;
            bytes[start..start + 24].fill(0xFF);
        }
        std::fs::write(bad_dir.path().join(p.file_name().unwrap()), &bytes).unwrap();
    }
    let bad_files = gpq::parquet_files(bad_dir.path()).unwrap();
    let mut reader = DeviceReaderBuilder::try_new_files(&bad_files).unwrap().with_batch_rows(1000).with_decode_ahead(4).build().unwrap();
    assert_eq!(reader.next().unwrap().unwrap().num_rows(), 700);
    assert_eq!(reader.next().unwrap().unwrap().num_rows(), 1);
    // (The third file's first pass holds its row groups 0 and 1.)
    match reader.next() {
        Some(Err(Error::CorruptPage { file, row_group: 1, .. })) => assert_eq!(file, bad_files[2]),
        other => panic!("expected the third file's CorruptPage, got {:?}", other.map(|r| r.map(|t| t.num_rows()))),
    }
    assert!(reader.next().is_none(), "an error ends the batches");
    // A limit across files.
    let reader = DeviceReaderBuilder::try_new_files(&files).unwrap().with_limit(1800).build().unwrap();
    assert_batches_equal("four files, 1800 rows", &want.slice(0, 1800), &collect(reader).1);
    // Row groups are for one file; a file of other columns is a typed error.
    assert!(matches!(DeviceReaderBuilder::try_new_files(&files).unwrap().with_row_groups([0]).build(), Err(Error::InvalidOptions(_))));
    let other = dir.path().join("zz-other.parquet");
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, false)])),
        vec![Arc::new(Int32Array::from(vec![1, 2, 3])) as ArrayRef],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&other).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let mut with_other = files.clone();
    with_other.push(other.clone());
    match DeviceReaderBuilder::try_new_files(&with_other).unwrap().build() {
        Err(Error::SchemaMismatch { file, .. }) => assert_eq!(file, other),
        other => panic!("expected SchemaMismatch, got {:?}", other.map(|r| r.num_passes())),
    }
}

fn row_selections(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    // 13 row groups: 12 of 400 rows and one of 200; `small` has nulls.
    let path = write_sample(&dir.path().join("s.parquet"), 5000, 400, Compression::SNAPPY);
    let expected = arrow_rs(&path).unwrap();
    let sel = |parts: &[(bool, usize)]| RowSelection::from(parts.iter().map(|&(skip, n)| if skip { RowSelector::skip(n) } else { RowSelector::select(n) }).collect::<Vec<_>>());
    let want = |ranges: &[(usize, usize)]| {
        let parts: Vec<RecordBatch> = ranges.iter().map(|&(a, n)| expected.slice(a, n)).collect();
        arrow::compute::concat_batches(&expected.schema(), &parts).unwrap()
    };
    // Rows 100..150 (row group 0), 1150..2050 (row groups 2-5), 4900..5000 (the last).
    let selection = sel(&[(true, 100), (false, 50), (true, 1000), (false, 900), (true, 2850), (false, 100)]);
    let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_row_selection(selection.clone()).build().unwrap();
    assert_eq!(reader.pass_row_groups(), vec![vec![0], vec![2, 3, 4, 5], vec![12]], "only the row groups with selected rows");
    let (rows, got) = collect(reader);
    assert_eq!(rows, vec![50, 900, 100]);
    assert_batches_equal("selection", &want(&[(100, 50), (1150, 900), (4900, 100)]), &got);
    // With batches of at most 500 rows, a limit, and no prefetch.
    for prefetch in [true, false] {
        let reader = DeviceReaderBuilder::try_new(&path)
            .unwrap()
            .with_row_selection(selection.clone())
            .with_batch_rows(500)
            .with_limit(700)
            .with_prefetch(prefetch)
            .build()
            .unwrap();
        let (rows, got) = collect(reader);
        assert!(rows.iter().all(|&r| r <= 500), "batch rows {rows:?}");
        assert_batches_equal("selection, batches, limit", &want(&[(100, 50), (1150, 650)]), &got);
    }
    // Two runs in one row group read it twice; a selection past the end stops there.
    let twice = sel(&[(false, 10), (true, 10), (false, 10), (true, 370), (false, 9000)]);
    let (rows, got) = collect(DeviceReaderBuilder::try_new(&path).unwrap().with_row_selection(twice).build().unwrap());
    assert_eq!(rows.len(), 3);
    assert_batches_equal("runs in one row group", &want(&[(0, 10), (20, 10), (400, 4600)]), &got);
    // A memory limit that splits a run's passes: the cut rows stay right.
    let mut one = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(u64::MAX / 2).build().unwrap();
    drop(one.next().unwrap().unwrap());
    let limit = one.peak_device_memory().unwrap() / 6;
    let reader = DeviceReaderBuilder::try_new(&path)
        .unwrap()
        .with_row_selection(sel(&[(true, 390), (false, 4000)]))
        .with_device_memory_limit(limit)
        .build()
        .unwrap();
    assert!(reader.num_passes() > 1);
    assert_batches_equal("selection under a memory limit", &want(&[(390, 4000)]), &collect(reader).1);
}

/// A selection and a limit read, in flat columns, only the pages that hold
/// wanted rows (the offset index says which), the dictionary pages too, and
/// cut each column on the device at its own page boundaries.
/// The batches of `builder`'s reader concatenated on the host, and the bytes
/// their reads asked for.
fn read_counting_bytes(builder: DeviceReaderBuilder) -> (RecordBatch, u64) {
    let reader = builder.build().unwrap();
    let schema = reader.schema().clone();
    let (mut parts, mut requested) = (Vec::new(), 0u64);
    for batch in reader {
        let batch = batch.unwrap();
        requested += batch.stats().io.as_ref().map_or(0, |io| io.bytes_requested);
        parts.push(batch.to_record_batch().unwrap());
    }
    (arrow::compute::concat_batches(&schema, &parts).unwrap(), requested)
}

fn page_pruning(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
        // Two row groups of 2000 rows, pages of at most 100 rows (strings
        // dictionary-encoded, `small` with nulls).
        let path = common::write_paged_sample(&dir.path().join(format!("pages-{version:?}.parquet")), 4000, 2000, 100, version);
        let expected = arrow_rs(&path).unwrap();
        let (_, whole) = read_counting_bytes(DeviceReaderBuilder::try_new(&path).unwrap());
        // Rows 150..260 (inside row group 0) and 1950..2120 (across both).
        let selection = RowSelection::from(vec![
            RowSelector::skip(150),
            RowSelector::select(110),
            RowSelector::skip(1690),
            RowSelector::select(170),
            RowSelector::skip(1880),
        ]);
        let (got, requested) = read_counting_bytes(DeviceReaderBuilder::try_new(&path).unwrap().with_row_selection(selection));
        let want = arrow::compute::concat_batches(&expected.schema(), &[expected.slice(150, 110), expected.slice(1950, 170)]).unwrap();
        assert_batches_equal(&format!("{version:?}: selection"), &want, &got);
        assert!(requested * 3 < whole, "{version:?}: the selection asked for {requested} bytes, the whole file {whole}");
        // A limit reads only the first pages (2050 rows reach into the second row group).
        for limit in [1, 5, 100, 101, 2050] {
            let (got, requested) = read_counting_bytes(DeviceReaderBuilder::try_new(&path).unwrap().with_limit(limit));
            assert_batches_equal(&format!("{version:?}: limit {limit}"), &expected.slice(0, limit), &got);
            if limit <= 101 {
                assert!(requested * 5 < whole, "{version:?}: limit {limit} asked for {requested} bytes of {whole}");
            }
        }
    }
}

/// A builder over `ArrowReaderMetadata` that arrow-rs loaded, page index
/// included: the same rows as arrow-rs, a selection reads only its pages,
/// and a file that is gone is an open error.
fn metadata_from_arrow_rs(_: &Arc<GpuContext>) {
    use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_paged_sample(&dir.path().join("m.parquet"), 4000, 2000, 100, WriterVersion::PARQUET_2_0);
    let expected = arrow_rs(&path).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let loaded = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new().with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Required)).unwrap();
    assert!(loaded.metadata().offset_index().is_some(), "arrow-rs loaded the offset index");
    let (whole, all_bytes) = read_counting_bytes(DeviceReaderBuilder::new_with_metadata(&path, &loaded).unwrap());
    assert_batches_equal("whole file", &expected, &whole);
    let selection = RowSelection::from(vec![RowSelector::skip(2300), RowSelector::select(90), RowSelector::skip(1610)]);
    let (got, requested) = read_counting_bytes(DeviceReaderBuilder::new_with_metadata(&path, &loaded).unwrap().with_row_selection(selection));
    assert_batches_equal("selection", &expected.slice(2300, 90), &got);
    assert!(requested * 5 < all_bytes, "the selection asked for {requested} bytes, the whole file {all_bytes}");
    match DeviceReaderBuilder::new_with_metadata(dir.path().join("gone.parquet"), &loaded) {
        Err(Error::Open { file, .. }) => assert_eq!(file, dir.path().join("gone.parquet")),
        other => panic!("expected Error::Open, got {:?}", other.map(|_| ())),
    }
}

/// One row group larger than the memory limit: read in windows of its rows
/// (the file has an offset index), each within the limit, together what
/// arrow-rs reads. Before, a pass of one row group over the limit was the
/// error.
fn row_windows_under_a_limit(_: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_paged_sample(&dir.path().join("one.parquet"), 6000, 6000, 200, WriterVersion::PARQUET_2_0);
    let expected = arrow_rs(&path).unwrap();
    let mut one = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(u64::MAX / 2).build().unwrap();
    assert_eq!(one.num_passes(), 1);
    let table = one.next().unwrap().unwrap();
    let whole = one.peak_device_memory().unwrap();
    drop(table);
    let limit = whole / 3;
    let reader = DeviceReaderBuilder::try_new(&path).unwrap().with_device_memory_limit(limit).build().unwrap();
    let planned = reader.num_passes();
    assert!(planned > 1, "a limit of {limit} bytes (the row group peaks at {whole}) should take several windows");
    let (host, peak) = drain_with_peak(reader);
    eprintln!("one row group peaks at {whole} bytes; limit {limit}: {planned} windows planned, {} read, peak {peak}", host.len());
    assert!(peak <= limit, "peak {peak} over the limit {limit}");
    let got = arrow::compute::concat_batches(&expected.schema(), &host).unwrap();
    assert_batches_equal("row windows", &expected, &got);
}
