//! Tables and scans survive the trip through bytes (`to_bytes`/`from_bytes`,
//! what a distributed engine ships between processes): a decoded scan reads
//! the same row groups and rows and gives the same batches, in every
//! partition, as the scan it was encoded from; a decoded table has the same
//! files, schema and options; bytes that are corrupt, foreign or stale are
//! errors, not panics. CPU backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::pretty::pretty_format_batches;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_plan::{ExecutionPlan, collect, collect_partitioned, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use gpq::{DecompressMode, IoPath, ReadOptions};
use gpq_datafusion::{Backend, GpqScanExec, GpqTable, GpqTableOptions, ScanDevice, register_gpq};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use serde_json::Value;

fn cpu() -> GpqTableOptions {
    GpqTableOptions::new().with_backend(Backend::Cpu)
}

fn context() -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(3))
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Int32, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// Rows `start..end`: `a` ascending, `b` null every third row, `s` null every fifth.
fn batch(start: i64, end: i64) -> RecordBatch {
    let a: Vec<i64> = (start..end).collect();
    let b: Vec<Option<i32>> = a.iter().map(|&v| (v % 3 != 0).then_some((v % 17) as i32)).collect();
    let s: Vec<Option<String>> = a.iter().map(|&v| (v % 5 != 0).then(|| format!("s{}", v % 7))).collect();
    let columns: Vec<ArrayRef> =
        vec![Arc::new(Int64Array::from(a)), Arc::new(Int32Array::from(b)), Arc::new(StringArray::from(s))];
    RecordBatch::try_new(schema(), columns).unwrap()
}

/// Rows `start..end` in row groups of 100 rows and pages of 10 (page index on).
fn write_file(path: &Path, start: i64, end: i64) {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(100))
        .set_data_page_row_count_limit(10)
        .set_write_batch_size(10)
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema(), Some(props)).unwrap();
    w.write(&batch(start, end)).unwrap();
    w.close().unwrap();
}

/// A directory of two files: rows 0..300 and 300..600.
fn two_files(dir: &Path) -> PathBuf {
    let tables = dir.join("t");
    std::fs::create_dir(&tables).unwrap();
    write_file(&tables.join("part-0.parquet"), 0, 300);
    write_file(&tables.join("part-1.parquet"), 300, 600);
    tables
}

fn gpq_scans(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut scans = Vec::new();
    let mut stack = vec![Arc::clone(plan)];
    while let Some(p) = stack.pop() {
        if p.downcast_ref::<GpqScanExec>().is_some() {
            scans.push(Arc::clone(&p));
        }
        stack.extend(p.children().into_iter().cloned());
    }
    scans
}

/// Each partition's batches, as text.
async fn partitions(plan: Arc<dyn ExecutionPlan>, ctx: &SessionContext) -> Vec<String> {
    let parts = collect_partitioned(plan, ctx.task_ctx()).await.unwrap();
    parts.iter().map(|p| pretty_format_batches(p).unwrap().to_string()).collect()
}

/// The rows of `batches` as sorted lines of text.
fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort_unstable();
    lines
}

/// The planned scan of `sql`'s plan, encoded and decoded.
async fn round_trip(ctx: &SessionContext, sql: &str) -> (Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>, GpqScanExec, Vec<u8>) {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let scans = gpq_scans(&plan);
    assert_eq!(scans.len(), 1, "{sql}");
    let scan = scans[0].downcast_ref::<GpqScanExec>().unwrap();
    let bytes = scan.to_bytes().unwrap();
    let decoded = GpqScanExec::from_bytes(&bytes, &ctx.task_ctx()).unwrap();
    (plan, Arc::clone(&scans[0]), decoded, bytes)
}

#[tokio::test]
async fn decoded_scans_read_and_return_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_files(dir.path());
    let ctx = context();
    register_gpq(&ctx, "t", &path, cpu()).unwrap();
    for sql in [
        "select * from t",
        // Page-index selections inside one row group.
        "select a, s from t where a between 105 and 115 or a between 431 and 447",
        "select * from t where b > 5 and s = 's3'",
        "select a from t limit 7",
        "select b, s from t where a > 20 limit 30",
        "select count(*) from t where a >= 250",
        "select s, count(*), sum(b) from t where a < 200 group by s",
        "select a from t where a > 10000",
    ] {
        let (plan, original, decoded, _) = round_trip(&ctx, sql).await;
        let scan = original.downcast_ref::<GpqScanExec>().unwrap();
        assert_eq!(
            displayable(&decoded).one_line().to_string(),
            displayable(original.as_ref()).one_line().to_string(),
            "{sql}"
        );
        assert_eq!(decoded.partition_row_groups(), scan.partition_row_groups(), "{sql}");
        assert_eq!(decoded.schema(), original.schema(), "{sql}");
        assert_eq!(decoded.fetch(), original.fetch(), "{sql}");
        assert_eq!(decoded.pruning(), scan.pruning(), "{sql}");
        assert_eq!(
            decoded.properties().partitioning.partition_count(),
            original.properties().partitioning.partition_count(),
            "{sql}"
        );

        // The scans alone: the same batches in every partition.
        let decoded = Arc::new(decoded) as Arc<dyn ExecutionPlan>;
        assert_eq!(partitions(Arc::clone(&decoded), &ctx).await, partitions(original, &ctx).await, "{sql}");

        // The query with the decoded scan in place of the planned one.
        let expected = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap();
        let swapped = plan
            .transform_up(|node| {
                Ok(if node.downcast_ref::<GpqScanExec>().is_some() {
                    Transformed::yes(Arc::clone(&decoded))
                } else {
                    Transformed::no(node)
                })
            })
            .unwrap()
            .data;
        let actual = collect(swapped, ctx.task_ctx()).await.unwrap();
        if sql.contains("limit") {
            // Which rows a limit without an order keeps depends on which partition answers first.
            let count = |b: &[RecordBatch]| b.iter().map(RecordBatch::num_rows).sum::<usize>();
            assert_eq!(count(&actual), count(&expected), "{sql}");
        } else {
            assert_eq!(sorted_rows(&actual), sorted_rows(&expected), "{sql}");
        }
    }
}

#[tokio::test]
async fn a_scan_of_no_column_counts_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_files(dir.path());
    let ctx = context();
    let table = GpqTable::try_new(&path, cpu()).unwrap();
    let scan = table.scan(&ctx.state(), Some(&vec![]), &[], None).await.unwrap();
    let bytes = scan.downcast_ref::<GpqScanExec>().unwrap().to_bytes().unwrap();
    let decoded = Arc::new(GpqScanExec::from_bytes(&bytes, &ctx.task_ctx()).unwrap());
    let batches = collect(decoded, ctx.task_ctx()).await.unwrap();
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 600);
    assert!(batches.iter().all(|b| b.num_columns() == 0));
}

#[tokio::test]
async fn a_scan_lists_and_opens_only_the_files_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_files(dir.path());
    let ctx = context();
    register_gpq(&ctx, "t", &path, cpu()).unwrap();
    let (_, _, decoded, bytes) = round_trip(&ctx, "select a, b from t where a >= 450").await;
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    let files = doc["body"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{doc}");
    assert!(files[0]["path"].as_str().unwrap().ends_with("part-1.parquet"), "{doc}");
    // The table still has both (EXPLAIN says files=2).
    assert_eq!(doc["body"]["table"]["paths"].as_array().unwrap().len(), 2);
    let read: Vec<PathBuf> = decoded.partition_row_groups().into_iter().flatten().map(|(p, _)| p).collect();
    assert!(!read.is_empty() && read.iter().all(|p| p.ends_with("part-1.parquet")), "{read:?}");

    // The other file may be gone: it is not opened.
    std::fs::remove_file(path.join("part-0.parquet")).unwrap();
    let decoded = GpqScanExec::from_bytes(&bytes, &ctx.task_ctx()).unwrap();
    let batches = collect(Arc::new(decoded), ctx.task_ctx()).await.unwrap();
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 150);
}

#[tokio::test]
async fn tables_round_trip_with_their_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_files(dir.path());
    let mut read = ReadOptions::new();
    read.io.path = IoPath::Bounce;
    read.io.threads = Some(3);
    read.io.task_size = 1 << 20;
    read.io.merge_gap = 4096;
    read.io.direct = true;
    read.device = 1;
    read.decompress = DecompressMode::Cpu;
    read.device_memory_limit = Some(1 << 30);
    read.skip_compressed_page_checks = true;
    read.verify_page_checksums = true;
    read.overlap_groups = Some(2);
    read.string_views = true;
    let options = cpu()
        .with_read_options(read)
        .with_page_index(false)
        .with_gpu_read_bytes(1 << 22)
        .with_gpu_min_scan_bytes(7 << 20)
        .with_gpu_min_partition_bytes(5 << 20)
        .with_gpu_fallback(false)
        .with_device_filters(false)
        .with_late_materialization(false)
        .with_devices([0, 1])
        .with_string_views(true);
    let table = GpqTable::try_new(&path, options.clone()).unwrap();
    let decoded = GpqTable::from_bytes(&table.to_bytes().unwrap()).unwrap();
    assert_eq!(decoded.options(), &options);
    assert_eq!(decoded.schema(), table.schema());
    assert_eq!(decoded.files().collect::<Vec<_>>(), table.files().collect::<Vec<_>>());
    assert_eq!(decoded.num_rows(), 600);
    assert_eq!(decoded.schema().field_with_name("s").unwrap().data_type(), &DataType::Utf8View);
}

/// `bytes` as JSON, changed by `edit`, as bytes again.
fn edited(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut doc: Value = serde_json::from_slice(bytes).unwrap();
    edit(&mut doc);
    serde_json::to_vec(&doc).unwrap()
}

#[tokio::test]
async fn corrupt_foreign_or_stale_bytes_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_files(dir.path());
    let ctx = context();
    register_gpq(&ctx, "t", &path, cpu()).unwrap();
    let task = ctx.task_ctx();
    let (_, _, _, scan) = round_trip(&ctx, "select a, s from t where a between 105 and 115").await;
    let table = GpqTable::try_new(&path, cpu()).unwrap().to_bytes().unwrap();

    let fails = |what: &str, result: datafusion::error::Result<GpqScanExec>| match result {
        Ok(_) => panic!("{what}: decoded"),
        Err(e) => eprintln!("{what}: {e}"),
    };
    fails("empty", GpqScanExec::from_bytes(b"", &task));
    fails("not JSON", GpqScanExec::from_bytes(b"\x08\x96\x01 protobuf", &task));
    fails("an empty object", GpqScanExec::from_bytes(b"{}", &task));
    fails("a table", GpqScanExec::from_bytes(&table, &task));
    fails("truncated", GpqScanExec::from_bytes(&scan[..scan.len() / 2], &task));
    assert!(GpqTable::from_bytes(&scan).is_err(), "a scan decoded as a table");
    assert!(GpqTable::from_bytes(&table[..table.len() - 3]).is_err());

    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("another version", Box::new(|d| d["version"] = 99.into())),
        ("a row group the file lacks", Box::new(|d| d["body"]["partitions"][0][0]["row_group"] = 7.into())),
        ("rows the row group lacks", Box::new(|d| d["body"]["partitions"][0][0]["rg_rows"] = 101.into())),
        ("a file the scan lacks", Box::new(|d| d["body"]["partitions"][0][0]["file"] = 5.into())),
        ("a selection of too few rows", Box::new(|d| d["body"]["partitions"][0][0]["selection"] = serde_json::json!([[0, 5]]))),
        ("a selection that overflows", Box::new(|d| d["body"]["partitions"][0][0]["selection"] = serde_json::json!([[u64::MAX, 5]]))),
        ("a column the table lacks", Box::new(|d| d["body"]["read_columns"] = serde_json::json!([0, 9]))),
        ("read columns not starting with the output", Box::new(|d| d["body"]["read_columns"] = serde_json::json!([2, 0]))),
        ("a schema that is not hex", Box::new(|d| d["body"]["table"]["schema"] = "zz".into())),
        ("a schema of odd length", Box::new(|d| d["body"]["table"]["schema"] = "abc".into())),
        ("a schema that is not protobuf", Box::new(|d| d["body"]["table"]["schema"] = "ffffffff".into())),
        ("a filter that is not protobuf", Box::new(|d| d["body"]["pushed_filters"][0] = "ff00".into())),
        ("an unknown backend", Box::new(|d| d["body"]["backend"] = "tpu".into())),
        ("a negative limit", Box::new(|d| d["body"]["fetch"] = (-1).into())),
    ];
    for (what, edit) in cases {
        fails(what, GpqScanExec::from_bytes(&edited(&scan, edit), &task));
    }

    // A file rewritten after the scan was planned.
    write_file(&path.join("part-0.parquet"), 0, 250);
    match GpqScanExec::from_bytes(&scan, &task) {
        Ok(_) => panic!("a scan of a rewritten file decoded"),
        Err(e) => assert!(e.to_string().contains("changed since the scan was planned"), "{e}"),
    }
    // A file gone.
    std::fs::remove_file(path.join("part-0.parquet")).unwrap();
    fails("a file gone", GpqScanExec::from_bytes(&scan, &task));
    assert!(GpqTable::from_bytes(&table).is_err(), "a table of a missing file decoded");
}

/// A scheduler plans tables for executors elsewhere: without a GPU of its
/// own it still makes the device-evaluable filters the scan's (`Exact`,
/// no `FilterExec`), and each executor resolves the backend where it decodes
/// the scan. On an executor without a GPU (`ScanDevice::Cpu`) the scan
/// decodes on the CPU and applies those filters on the host: the answer is
/// the one of a local scan. A table that must run on the GPU cannot be
/// scanned there.
#[tokio::test]
async fn executors_resolve_the_backend_and_apply_planned_filters() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_files(dir.path());
    let local = context();
    register_gpq(&local, "t", &path, cpu()).unwrap();
    let scheduler = context();
    // Automatic backend, no scan too small for the GPU.
    let table = GpqTable::try_new(&path, GpqTableOptions::new().with_gpu_min_scan_bytes(0)).unwrap().planned_for_executors();
    assert!(table.is_planned_for_executors());
    scheduler.register_table("t", Arc::new(table)).unwrap();

    let sql = "select a, s from t where b > 5 and s = 's3' and a < 500";
    let plan = scheduler.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let text = displayable(plan.as_ref()).indent(true).to_string();
    assert!(!text.contains("FilterExec"), "the scan applies every filter itself:\n{text}");
    assert!(text.contains("resolved by each executor"), "{text}");
    let scans = gpq_scans(&plan);
    let bytes = scans[0].downcast_ref::<GpqScanExec>().unwrap().to_bytes().unwrap();

    let on_cpu = GpqScanExec::from_bytes_on(&bytes, &scheduler.task_ctx(), ScanDevice::Cpu).unwrap();
    assert!(!on_cpu.uses_gpu());
    assert_eq!(on_cpu.backend(), "cpu (this executor has no GPU)");
    let decoded = Arc::new(on_cpu) as Arc<dyn ExecutionPlan>;
    let swapped = plan
        .transform_up(|node| {
            Ok(if node.downcast_ref::<GpqScanExec>().is_some() { Transformed::yes(Arc::clone(&decoded)) } else { Transformed::no(node) })
        })
        .unwrap()
        .data;
    let actual = collect(swapped, scheduler.task_ctx()).await.unwrap();
    let expected = local.sql(sql).await.unwrap().collect().await.unwrap();
    assert!(expected.iter().map(RecordBatch::num_rows).sum::<usize>() > 0);
    assert_eq!(sorted_rows(&actual), sorted_rows(&expected));

    // As the options say: here that is the CPU unless a GPU is present.
    let as_options = GpqScanExec::from_bytes_on(&bytes, &scheduler.task_ctx(), ScanDevice::AsOptions).unwrap();
    assert_eq!(as_options.uses_gpu(), gpq::cuda::device_available(), "{}", as_options.backend());

    // A table whose backend is gpu is refused by a CPU-only executor.
    let gpu_only = context();
    let table = GpqTable::try_new(&path, GpqTableOptions::new().with_backend(Backend::Gpu)).unwrap().planned_for_executors();
    gpu_only.register_table("t", Arc::new(table)).unwrap();
    let plan = gpu_only.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let bytes = gpq_scans(&plan)[0].downcast_ref::<GpqScanExec>().unwrap().to_bytes().unwrap();
    let err = GpqScanExec::from_bytes_on(&bytes, &gpu_only.task_ctx(), ScanDevice::Cpu).unwrap_err().to_string();
    assert!(err.contains("decodes on the CPU only"), "{err}");
}
