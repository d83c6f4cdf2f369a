//! DataFusion over gpq tables gives the same answers as DataFusion's built-in
//! Parquet tables on the same files: all 22 TPC-H queries (CPU backend; scale
//! factor `GPQ_TPCH_SF`, default 0.05 so CI stays quick, SF 1 in the device
//! script), plus edge cases on small hand-written files, and with the GPU
//! backend (on a device all 22 queries, with the CPU fallback off so every
//! scan must decode on the GPU; on gpq's CPU emulator of the kernels, with
//! the `emulator` feature, a few). Without a device or the emulator the GPU
//! test is reported as ignored.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::pretty::pretty_format_batches;
use datafusion::common::stats::Precision;
use datafusion::catalog::TableProvider;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use gpq_bench::tpch::queries::{self, TableSource};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use gpq_datafusion::{Backend, GpqPartialAggregateExec, GpqScanExec, GpqTable, GpqTableOptions, register_gpq};
use libtest_mimic::{Arguments, Trial};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

type TestFuture = Pin<Box<dyn Future<Output = ()>>>;

/// Runs `test` on a two-worker tokio runtime of its own.
fn run(test: TestFuture) -> Result<(), libtest_mimic::Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(test);
    Ok(())
}

/// A test run on a runtime of its own.
fn trial(name: &str, test: fn() -> TestFuture) -> Trial {
    Trial::test(name, move || run(test()))
}

/// A test that needs a device: run on a CUDA device, else on gpq's emulator
/// (the `emulator` feature; `test` gets `true`), else reported as ignored
/// (with GPQ_REQUIRE_GPU=1, as failed).
fn device_trial(name: &str, test: fn(bool) -> TestFuture) -> Trial {
    let required = std::env::var("GPQ_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let emulated = if gpq::cuda::device_available() {
        false
    } else if required {
        return Trial::test(name, || Err("GPQ_REQUIRE_GPU=1 but there is no CUDA device".into()));
    } else if gpq::cuda::emulator_compiled() {
        true
    } else {
        return Trial::test(name, || Err("no CUDA device and no emulator".into())).with_ignored_flag(true);
    };
    Trial::test(name, move || run(test(emulated)))
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let gpu = device_trial("gpu_backend_tpch", |emulated| Box::pin(gpu_backend_tpch(emulated)));
    let filters = device_trial("device_filters_match_builtin", |emulated| Box::pin(device_filters_match_builtin(emulated)));
    let aggregation = device_trial("device_aggregation_matches_builtin", |emulated| Box::pin(device_aggregation_matches_builtin(emulated)));
    let trials = vec![
        trial("tpch_22_queries_match_builtin_parquet", || Box::pin(tpch_22_queries_match_builtin_parquet())),
        trial("empty_projection_counts_rows", || Box::pin(empty_projection_counts_rows())),
        trial("filters_prune_row_groups_and_pages", || Box::pin(filters_prune_row_groups_and_pages())),
        trial("nulls_round_trip", || Box::pin(nulls_round_trip())),
        trial("limit_is_pushed_down", || Box::pin(limit_is_pushed_down())),
        trial("directory_of_files", || Box::pin(directory_of_files())),
        trial("bad_input_is_an_error_not_a_panic", || Box::pin(bad_input_is_an_error_not_a_panic())),
        trial("auto_backend_picks_and_shows_the_decoder", || Box::pin(auto_backend_picks_and_shows_the_decoder())),
        gpu,
        filters,
        aggregation,
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

fn context(partitions: usize) -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(partitions))
}

fn cpu() -> GpqTableOptions {
    GpqTableOptions::new().with_backend(Backend::Cpu)
}

/// TPC-H data at `sf`, generated once per scale factor (see
/// `gpq_bench::tpch::generate_once`).
fn tpch_dir(sf: f64) -> PathBuf {
    let t0 = Instant::now();
    let dir = gpq_bench::tpch::generate_once(Path::new(env!("CARGO_TARGET_TMPDIR")), sf).unwrap();
    eprintln!("TPC-H SF {sf} ready in {:.1} s at {}", t0.elapsed().as_secs_f64(), dir.display());
    dir
}

/// `GPQ_TPCH_SF`, default 0.05: CI-sized; the device script runs SF 1.
fn scale_factor() -> f64 {
    std::env::var("GPQ_TPCH_SF").ok().and_then(|v| v.parse().ok()).unwrap_or(0.05)
}

/// Same rows: the same text, or (ties under ORDER BY) the same rows in another order.
fn assert_same_rows(what: &str, expected: &[RecordBatch], actual: &[RecordBatch]) {
    let e = pretty_format_batches(expected).unwrap().to_string();
    let a = pretty_format_batches(actual).unwrap().to_string();
    if e == a {
        return;
    }
    assert!(queries::same_rows(expected, actual).unwrap(), "{what}: results differ\nbuilt-in Parquet:\n{e}\ngpq:\n{a}");
    eprintln!("{what}: same rows, tied rows in another order");
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// Runs `sql`, returning the batches and the gpq scans of the executed plan.
async fn run_with_scans(ctx: &SessionContext, sql: &str) -> (Vec<RecordBatch>, Vec<Arc<dyn ExecutionPlan>>) {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap();
    let mut scans = Vec::new();
    let mut stack = vec![plan];
    while let Some(p) = stack.pop() {
        if p.as_ref().downcast_ref::<GpqScanExec>().is_some() {
            scans.push(Arc::clone(&p));
        }
        stack.extend(p.children().into_iter().cloned());
    }
    (batches, scans)
}

/// The sum over partitions of the metric `name` of `scan`; a metric the
/// scan does not have is a test failure, not a zero.
fn metric(scan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let metrics = scan.metrics().expect("a gpq scan has metrics");
    let values: Vec<usize> = metrics.iter().filter(|m| m.value().name() == name).map(|m| m.value().as_usize()).collect();
    assert!(!values.is_empty(), "the scan has no metric {name}: {metrics}");
    values.iter().sum()
}

fn gpq_scan(scan: &Arc<dyn ExecutionPlan>) -> &GpqScanExec {
    scan.as_ref().downcast_ref::<GpqScanExec>().unwrap()
}

async fn sql(ctx: &SessionContext, q: &str) -> Vec<RecordBatch> {
    ctx.sql(q).await.unwrap().collect().await.unwrap()
}

async fn tpch_22_queries_match_builtin_parquet() {
    let sf = scale_factor();
    let dir = tpch_dir(sf);
    let builtin = context(2);
    queries::register_tables(&builtin, &dir, &TableSource::Parquet).await.unwrap();
    let ours = context(2);
    queries::register_tables(&ours, &dir, &TableSource::Gpq(cpu())).await.unwrap();

    let (mut total_builtin, mut total_gpq) = (0.0, 0.0);
    for n in 1..=queries::QUERY_COUNT {
        let t0 = Instant::now();
        let expected = queries::run_query(&builtin, n).await.unwrap();
        let t1 = Instant::now();
        let actual = queries::run_query(&ours, n)
            .await
            .unwrap_or_else(|e| panic!("q{n} over gpq tables failed: {e}"));
        let t2 = Instant::now();
        let (b, g) = ((t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64());
        total_builtin += b;
        total_gpq += g;
        eprintln!("q{n:02}: {} rows, built-in {b:.2} s, gpq cpu {g:.2} s", rows(&expected));
        assert_same_rows(&format!("TPC-H q{n} at SF {sf}"), &expected, &actual);
    }
    eprintln!("total: built-in {total_builtin:.1} s, gpq cpu {total_gpq:.1} s");
}

/// Writes `batches` to `path` with small row groups and pages (page index on).
fn write_file(path: &Path, batches: &[RecordBatch], rows_per_group: usize, rows_per_page: usize) {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows_per_group))
        .set_data_page_row_count_limit(rows_per_page)
        .set_write_batch_size(rows_per_page)
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, batches[0].schema(), Some(props)).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.close().unwrap();
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

/// A file of 300 rows: 3 row groups of 100, pages of 10 rows.
fn small_file(dir: &Path) -> PathBuf {
    let path = dir.join("small.parquet");
    write_file(&path, &[batch(0, 300)], 100, 10);
    path
}

async fn both(path: &Path, options: GpqTableOptions) -> (SessionContext, SessionContext) {
    let builtin = context(2);
    builtin.register_parquet("t", path.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
    let ours = context(2);
    register_gpq(&ours, "t", path, options).unwrap();
    (builtin, ours)
}

async fn empty_projection_counts_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_file(dir.path());
    let (builtin, ours) = both(&path, cpu()).await;
    for q in ["select count(*) from t", "select count(*) from t where a >= 150", "select count(*) from t where b is null"] {
        assert_same_rows(q, &sql(&builtin, q).await, &sql(&ours, q).await);
    }
    // The scan itself, with no column: batches of row counts only.
    let table = GpqTable::try_new(&path, cpu()).unwrap();
    let state = ours.state();
    let plan = table.scan(&state, Some(&vec![]), &[], None).await.unwrap();
    let batches = collect(plan, ours.task_ctx()).await.unwrap();
    assert_eq!(rows(&batches), 300);
    assert!(batches.iter().all(|b| b.num_columns() == 0));
}

async fn filters_prune_row_groups_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_file(dir.path());
    let (builtin, ours) = both(&path, cpu()).await;

    // Nothing matches: every row group is pruned by its statistics.
    let (batches, scans) = run_with_scans(&ours, "select * from t where a > 1000").await;
    assert_eq!(rows(&batches), 0);
    assert_eq!(scans.len(), 1);
    assert_eq!(metric(&scans[0], "row_groups_pruned_statistics"), 3);
    assert_eq!(metric(&scans[0], "bytes_read"), 0);
    assert_eq!(gpq_scan(&scans[0]).pruning().scanned, 0);

    // One row group survives, and the page index keeps two of its ten pages.
    let q = "select a, b, s from t where a between 105 and 115 order by a";
    let (batches, scans) = run_with_scans(&ours, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &batches);
    assert_eq!(rows(&batches), 11);
    assert_eq!(metric(&scans[0], "row_groups_pruned_statistics"), 2);
    assert_eq!(metric(&scans[0], "page_index_rows_pruned"), 80);
    let shown = format!("{}", datafusion::physical_plan::displayable(scans[0].as_ref()).one_line());
    assert!(shown.contains("backend=cpu") && shown.contains("row_groups=1/3"), "{shown}");

    // Without the page index only whole row groups are pruned; same answer.
    let plain = context(2);
    register_gpq(&plain, "t", &path, cpu().with_page_index(false)).unwrap();
    let (batches, scans) = run_with_scans(&plain, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &batches);
    assert_eq!(metric(&scans[0], "page_index_rows_pruned"), 0);

    // Filters on strings and on several columns.
    for q in [
        "select count(*), sum(a) from t where s = 's3' and a < 200",
        "select a from t where a % 7 = 0 and b > 5 order by a",
        "select s, count(*) from t where a >= 50 and a < 250 group by s order by s",
    ] {
        assert_same_rows(q, &sql(&builtin, q).await, &sql(&ours, q).await);
    }
}

async fn nulls_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_file(dir.path());
    let (builtin, ours) = both(&path, cpu()).await;
    for q in [
        "select count(b), count(s), count(*), sum(b) from t",
        "select a, b, s from t where b is null order by a limit 20",
        "select a, s from t where s is not null and a > 280 order by a",
        "select b, count(*) from t group by b order by b nulls first",
        "select * from t order by a",
    ] {
        assert_same_rows(q, &sql(&builtin, q).await, &sql(&ours, q).await);
    }
    // Statistics reach the planner: row count exact, null counts from the footer.
    let table = GpqTable::try_new(&path, cpu()).unwrap();
    let stats = table.statistics().unwrap();
    assert_eq!(stats.num_rows.get_value(), Some(&300));
    assert_eq!(stats.column_statistics[1].null_count.get_value(), Some(&100));
    assert_eq!(stats.column_statistics[0].null_count.get_value(), Some(&0));
    // And the output's size, as the built-in scan reports it: exact for
    // fixed-width columns (rows times widths), an estimate from the
    // footers' uncompressed sizes with a string column.
    let state = ours.state();
    let size = |projection: Vec<usize>| {
        let table = &table;
        let state = &state;
        async move { size_of(&table.scan(state, Some(&projection), &[], None).await.unwrap()) }
    };
    assert_eq!(size(vec![0, 1]).await, Precision::Exact(300 * (8 + 4)));
    assert_eq!(size(vec![0]).await, Precision::Exact(300 * 8));
    let with_strings = size(vec![0, 2]).await;
    assert!(matches!(with_strings, Precision::Inexact(n) if n > 300 * 8), "{with_strings:?}");
    let builtin_size = builtin.table_provider("t").await.unwrap().scan(&builtin.state(), Some(&vec![0, 1]), &[], None).await.unwrap();
    assert_eq!(size_of(&builtin_size), Precision::Exact(300 * (8 + 4)), "the built-in scan's size");
    // Per column too, as the built-in scan reports them: the operators above a
    // scan that sum their columns' sizes (semi and anti joins, for one) lose
    // their own size where one column's is unknown.
    let column_sizes = |plan: &Arc<dyn ExecutionPlan>| statistics_of(plan).column_statistics.iter().map(|c| c.byte_size).collect::<Vec<_>>();
    let ours_scan = table.scan(&state, Some(&vec![0, 1, 2]), &[], None).await.unwrap();
    let builtin_scan = builtin.table_provider("t").await.unwrap().scan(&builtin.state(), Some(&vec![0, 1, 2]), &[], None).await.unwrap();
    let sizes = column_sizes(&ours_scan);
    assert_eq!(sizes[..2], [Precision::Exact(300 * 8), Precision::Exact(300 * 4)]);
    assert_eq!(sizes, column_sizes(&builtin_scan), "the built-in scan's column sizes");
}

/// The statistics a plan reports to the planner.
fn statistics_of(plan: &Arc<dyn ExecutionPlan>) -> datafusion::common::Statistics {
    use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
    StatisticsContext::new().compute(plan.as_ref(), &StatisticsArgs::new()).unwrap().as_ref().clone()
}

/// The output size a plan reports to the planner.
fn size_of(plan: &Arc<dyn ExecutionPlan>) -> Precision<usize> {
    statistics_of(plan).total_byte_size
}

async fn limit_is_pushed_down() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_file(dir.path());
    let (builtin, ours) = both(&path, cpu()).await;

    let (batches, scans) = run_with_scans(&ours, "select a, s from t limit 5").await;
    assert_eq!(rows(&batches), 5);
    let scan = gpq_scan(&scans[0]);
    assert_eq!(scan.pruning().pruned_by_limit, 2, "{:?}", scan.pruning());
    // One row group is left, so one partition, and the scan stops at the limit.
    assert_eq!(scan.partition_row_groups().len(), 1);
    assert_eq!(metric(&scans[0], "output_rows"), 5);

    // The scan's own limit. DataFusion asks a scan for at least `limit` rows;
    // gpq keeps the row groups needed to reach it (100 rows each here) and
    // each partition stops after `limit` rows, so the output is exactly the
    // sum over partitions of min(limit, the partition's rows).
    let table = GpqTable::try_new(&path, cpu()).unwrap();
    for limit in [1, 99, 100, 101, 150, 299, 300, 1000] {
        let plan = table.scan(&ours.state(), None, &[], Some(limit)).await.unwrap();
        let scan = plan.as_ref().downcast_ref::<GpqScanExec>().unwrap();
        let partitions = scan.partition_row_groups();
        let row_groups: usize = partitions.iter().map(Vec::len).sum();
        assert_eq!(row_groups, limit.div_ceil(100).min(3), "limit {limit}: row groups kept");
        let expected: usize = partitions.iter().map(|p| limit.min(100 * p.len())).sum();
        let batches = collect(Arc::clone(&plan), ours.task_ctx()).await.unwrap();
        assert_eq!(rows(&batches), expected, "limit {limit}");
        assert!(rows(&batches) >= limit.min(300), "limit {limit}: fewer rows than asked for");
    }

    for q in ["select a from t order by a limit 7", "select a from t where b = 3 order by a limit 3"] {
        assert_same_rows(q, &sql(&builtin, q).await, &sql(&ours, q).await);
    }
}

async fn directory_of_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    for (i, (start, end)) in [(0, 250), (250, 300), (300, 1000)].into_iter().enumerate() {
        write_file(&data.join(format!("part-{i}.parquet")), &[batch(start, end)], 64, 16);
    }
    std::fs::write(data.join("_SUCCESS"), b"").unwrap();
    let (builtin, ours) = both(&data, cpu()).await;
    assert_eq!(GpqTable::try_new(&data, cpu()).unwrap().files().count(), 3);
    for q in [
        "select count(*), sum(a), min(a), max(a), count(b) from t",
        "select s, count(*), sum(b) from t group by s order by s",
        "select a, b from t where a between 240 and 310 order by a",
    ] {
        assert_same_rows(q, &sql(&builtin, q).await, &sql(&ours, q).await);
    }
    // More partitions than row groups in a file: partitions span files.
    let many = context(7);
    register_gpq(&many, "t", &data, cpu()).unwrap();
    let q = "select count(*), sum(a) from t where a > 100";
    assert_same_rows(q, &sql(&builtin, q).await, &sql(&many, q).await);
}

async fn bad_input_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.parquet");
    std::fs::write(&bogus, b"this is not parquet at all").unwrap();
    let ctx = context(2);
    let err = register_gpq(&ctx, "t", &bogus, cpu()).unwrap_err().to_string();
    assert!(err.contains("not a Parquet file"), "{err}");
    let err = register_gpq(&ctx, "t", dir.path().join("missing"), cpu()).unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");

    // Files of one directory must share a schema.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    write_file(&mixed.join("a.parquet"), &[batch(0, 10)], 100, 10);
    let other = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("a", DataType::Utf8, false)])),
        vec![Arc::new(StringArray::from(vec!["x"]))],
    )
    .unwrap();
    write_file(&mixed.join("b.parquet"), &[other], 100, 10);
    let err = register_gpq(&ctx, "t", &mixed, cpu()).unwrap_err().to_string();
    assert!(err.contains("does not share the schema"), "{err}");

    // Explicit GPU without a device (and without the emulator) fails at planning.
    if !gpq::cuda::device_available() && !gpq::cuda::emulator_compiled() {
        let path = small_file(dir.path());
        register_gpq(&ctx, "g", &path, GpqTableOptions::new().with_backend(Backend::Gpu)).unwrap();
        let err = ctx.sql("select * from g").await.unwrap().collect().await.unwrap_err().to_string();
        assert!(err.contains("no CUDA device"), "{err}");
    }
}

async fn auto_backend_picks_and_shows_the_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_file(dir.path());
    let (builtin, ours) = both(&path, GpqTableOptions::new()).await;
    let q = "select b, count(*) from t where a < 120 group by b order by b";
    let (batches, scans) = run_with_scans(&ours, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &batches);
    let scan = gpq_scan(&scans[0]);
    let explain = sql(&ours, &format!("explain {q}")).await;
    let text = pretty_format_batches(&explain).unwrap().to_string();
    assert!(text.contains("GpqScanExec: backend="), "{text}");
    if gpq::cuda::device_available() {
        // A file of a few KiB is under the default gpu_min_scan_bytes.
        assert!(!scan.uses_gpu(), "{}", scan.backend());
        assert!(scan.backend().starts_with("cpu (auto: ") && scan.backend().contains("gpu_min_scan_bytes"), "{}", scan.backend());
        assert!(text.contains("backend=cpu (auto: "), "{text}");
        let (_, any_size) = both(&path, GpqTableOptions::new().with_gpu_min_scan_bytes(0)).await;
        let (batches, scans) = run_with_scans(&any_size, q).await;
        assert_same_rows(q, &sql(&builtin, q).await, &batches);
        assert!(gpq_scan(&scans[0]).uses_gpu(), "{}", gpq_scan(&scans[0]).backend());
    } else {
        assert_eq!(scan.backend(), "cpu (auto: no CUDA device)");
        assert!(text.contains("backend=cpu (auto: no CUDA device)"), "{text}");
    }
}

/// The GPU backend on a real device (all 22 queries at `GPQ_TPCH_SF`), or on
/// the CPU emulator of the kernels (five queries at SF 0.01). The CPU
/// fallback is off, so a query passes only if every scan decoded on the GPU.
async fn gpu_backend_tpch(emulated: bool) {
    if emulated {
        eprintln!("NOTE: no GPU; running the GPU backend on the CPU emulator");
        gpq::cuda::use_emulator().unwrap();
    }
    let (sf, list): (f64, Vec<usize>) =
        if emulated { (0.01, vec![1, 3, 6, 12, 14]) } else { (scale_factor(), (1..=queries::QUERY_COUNT).collect()) };
    let dir = tpch_dir(sf);
    let builtin = context(2);
    queries::register_tables(&builtin, &dir, &TableSource::Parquet).await.unwrap();
    let ours = context(2);
    let gpu = GpqTableOptions::new().with_backend(Backend::Gpu).with_gpu_read_bytes(1 << 20).with_gpu_fallback(false);
    queries::register_tables(&ours, &dir, &TableSource::Gpq(gpu.clone())).await.unwrap();
    for n in list {
        let t0 = Instant::now();
        let expected = queries::run_query(&builtin, n).await.unwrap();
        let actual = queries::run_query(&ours, n).await.unwrap_or_else(|e| panic!("q{n} on the GPU backend: {e}"));
        eprintln!("q{n:02} gpu backend: {} rows in {:.2} s", rows(&actual), t0.elapsed().as_secs_f64());
        assert_same_rows(&format!("TPC-H q{n} at SF {sf}, GPU backend"), &expected, &actual);
    }
    // A scan on its own: it ran on the device, read bytes, decoded on the GPU
    // only, and pages pruned by the index are sliced away (same answer).
    let q = "select count(*), sum(l_quantity) from lineitem where l_shipdate < date '1992-03-01'";
    let (batches, scans) = run_with_scans(&ours, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &batches);
    assert_eq!(scans.len(), 1);
    let scan = gpq_scan(&scans[0]);
    assert!(scan.uses_gpu(), "{}", scan.backend());
    let reads = metric(&scans[0], "device_reads");
    let scanned: usize = scan.partition_row_groups().iter().map(Vec::len).sum();
    // At most one read per row group, and per phase of late materialization
    // (the filter's column, then the others).
    assert!(reads > 0 && reads <= 2 * scanned, "{reads} device reads for {scanned} row groups");
    assert!(metric(&scans[0], "bytes_read") > 0);
    assert_eq!(metric(&scans[0], "gpu_fallback_row_groups"), 0);

    // No column at all (row counts only), and a limit: the reader's own paths.
    for q in ["select count(*) from lineitem", "select count(*) from lineitem where l_orderkey < 3000", "select l_orderkey from lineitem limit 7"] {
        let expected = sql(&builtin, q).await;
        let got = sql(&ours, q).await;
        assert_eq!(rows(&got), rows(&expected), "{q}");
        if !q.contains("limit") {
            assert_same_rows(q, &expected, &got);
        }
    }

    // Pages the index prunes are neither read nor decoded where that saves
    // half a pass of bytes (passes of 4 KiB here, so any page counts): the
    // same scan without the page index reads more bytes for the same answer.
    let q = "select count(*), sum(l_quantity), max(l_comment) from lineitem where l_orderkey < 3000";
    let small_passes = gpu.clone().with_gpu_read_bytes(4 << 10);
    let indexed = context(2);
    queries::register_tables(&indexed, &dir, &TableSource::Gpq(small_passes.clone())).await.unwrap();
    let (batches, scans) = run_with_scans(&indexed, q).await;
    let expected = sql(&builtin, q).await;
    assert_same_rows(q, &expected, &batches);
    let (pruned, with_index) = (metric(&scans[0], "page_index_rows_pruned"), metric(&scans[0], "bytes_read"));
    let plain = context(2);
    queries::register_tables(&plain, &dir, &TableSource::Gpq(small_passes.with_page_index(false))).await.unwrap();
    let (batches, scans) = run_with_scans(&plain, q).await;
    assert_same_rows(q, &expected, &batches);
    let without = metric(&scans[0], "bytes_read");
    assert!(pruned > 0, "the page index prunes rows of {q}");
    assert!(with_index < without, "{with_index} bytes read with the page index, {without} without");
}

/// Whether the executed plan has a `FilterExec` (DataFusion filtering rows itself).
fn has_filter_exec(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.name() == "FilterExec" || plan.children().into_iter().any(has_filter_exec)
}

async fn physical(ctx: &SessionContext, q: &str) -> Arc<dyn ExecutionPlan> {
    ctx.sql(q).await.unwrap().create_physical_plan().await.unwrap()
}

/// A file of the cases three-valued logic and Arrow's orderings make
/// tricky: nulls in every column, NaN, -0.0 and infinities, empty strings.
fn edge_file(dir: &Path) -> PathBuf {
    use arrow::array::{BooleanArray, Decimal128Array, Float64Array};
    let n = 400;
    let i: Int32Array = (0..n).map(|k| (k % 7 != 0).then_some(k % 23 - 11)).collect();
    let specials = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY];
    let f: Float64Array = (0..n).map(|k| (k % 11 != 0).then(|| if k % 4 == 0 { specials[(k / 4) as usize % 5] } else { k as f64 / 8.0 - 20.0 })).collect();
    let s: StringArray =
        (0..n).map(|k| (k % 5 != 0).then(|| ["", "ab", "abc", "special requests", "xyz special", "PROMO BRASS"][k as usize % 6].to_string())).collect();
    let b: BooleanArray = (0..n).map(|k| (k % 3 != 0).then_some(k % 2 == 0)).collect();
    let d = (0..n).map(|k| (k % 9 != 0).then_some(i128::from(k) * 7 - 1000)).collect::<Decimal128Array>().with_precision_and_scale(10, 2).unwrap();
    let batch = RecordBatch::try_from_iter([
        ("i", Arc::new(i) as ArrayRef),
        ("f", Arc::new(f)),
        ("s", Arc::new(s)),
        ("b", Arc::new(b)),
        ("d", Arc::new(d)),
    ])
    .unwrap();
    let path = dir.join("edges.parquet");
    write_file(&path, &[batch], 150, 40);
    path
}

async fn device_filters_match_builtin(emulated: bool) {
    if emulated {
        eprintln!("NOTE: no GPU; running device filters on the CPU emulator");
        gpq::cuda::use_emulator().unwrap();
    }
    let dir = tpch_dir(0.01);
    let builtin = context(2);
    queries::register_tables(&builtin, &dir, &TableSource::Parquet).await.unwrap();
    // Late materialization on (it is off by default; gpu_backend_tpch covers
    // device filters without it).
    let gpu = GpqTableOptions::new().with_backend(Backend::Gpu).with_gpu_read_bytes(1 << 20).with_gpu_fallback(false).with_late_materialization(true);
    let ours = context(2);
    queries::register_tables(&ours, &dir, &TableSource::Gpq(gpu.clone())).await.unwrap();
    // All 22: filters on dates, decimals, IN lists, LIKE, NOT LIKE, NOT IN, ORs of ANDs.
    for n in 1..=queries::QUERY_COUNT {
        let expected = queries::run_query(&builtin, n).await.unwrap();
        let actual = queries::run_query(&ours, n).await.unwrap_or_else(|e| panic!("q{n} with device filters: {e}"));
        assert_same_rows(&format!("TPC-H q{n} at SF 0.01 with device filters"), &expected, &actual);
    }
    // Which filters ran where, for the log.
    for n in 1..=queries::QUERY_COUNT {
        let Some(statement) = queries::statements(n).unwrap().into_iter().find(|s| queries::is_query_statement(s)) else { continue };
        let Ok(df) = ours.sql(statement).await else { continue };
        let Ok(plan) = df.create_physical_plan().await else { continue };
        let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
        let on_device = shown.matches("scan_filters[device]").count();
        let filter_execs = shown.matches("FilterExec").count();
        eprintln!("q{n:02}: {on_device} scans filter on the device, {filter_execs} FilterExec left");
    }

    // A filter the device takes is exact: no FilterExec, the scan shows it,
    // counts the rows in and out, and copies fewer bytes than without it.
    let q = "select sum(l_extendedprice), count(*) from lineitem where l_shipdate >= date '1994-01-01' and l_shipdate < date '1995-01-01' and l_quantity < 24";
    let plan = physical(&ours, q).await;
    assert!(!has_filter_exec(&plan), "exact filters need no FilterExec");
    // Its row estimate is DataFusion's for the same filter (a FilterExec over
    // the built-in scan's), not every row: joins are planned alike over both.
    let estimate = |plan: &Arc<dyn ExecutionPlan>, name: &str| {
        let mut stack = vec![Arc::clone(plan)];
        while let Some(p) = stack.pop() {
            if p.name() == name {
                let s = StatisticsContext::new().compute(p.as_ref(), &StatisticsArgs::new()).unwrap();
                return s.num_rows;
            }
            stack.extend(p.children().into_iter().cloned());
        }
        panic!("no {name} in the plan");
    };
    let ours_rows = estimate(&plan, "GpqScanExec");
    assert_eq!(ours_rows, estimate(&physical(&builtin, q).await, "FilterExec"), "{q}");
    let all_rows = rows(&sql(&builtin, "select * from lineitem").await);
    assert!(ours_rows.get_value().is_some_and(|&n| n < all_rows), "{ours_rows:?} of {all_rows} rows");
    let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
    assert!(shown.contains("scan_filters[device]=["), "{shown}");
    let (batches, scans) = run_with_scans(&ours, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &batches);
    let (rows_in, rows_out) = (metric(&scans[0], "device_filter_rows_in"), metric(&scans[0], "device_filter_rows_out"));
    assert!(rows_in > rows_out && rows_out > 0, "device filter kept {rows_out} of {rows_in} rows");
    assert_eq!(metric(&scans[0], "device_filter_fallbacks"), 0);
    assert_eq!(metric(&scans[0], "host_filter_rows_in"), 0);
    let filtered_bytes = metric(&scans[0], "bytes_to_host");
    let off = context(2);
    queries::register_tables(&off, &dir, &TableSource::Gpq(gpu.clone().with_device_filters(false))).await.unwrap();
    assert!(has_filter_exec(&physical(&off, q).await), "without device filters DataFusion filters");
    let (batches, scans) = run_with_scans(&off, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &batches);
    let all_bytes = metric(&scans[0], "bytes_to_host");
    assert!(filtered_bytes < all_bytes, "{filtered_bytes} bytes copied with device filters, {all_bytes} without");

    // Filter columns the query does not project are read, filtered on and
    // dropped; counts are not taken from the footers; a limit counts kept rows.
    for q in [
        "select count(*) from lineitem where l_quantity < 5",
        "select count(*) from lineitem where l_shipmode in ('AIR', 'RAIL') and l_comment like '%furious%'",
        "select l_orderkey from lineitem where l_returnflag = 'R' and l_linestatus <> 'O' order by l_orderkey limit 20",
    ] {
        assert_same_rows(q, &sql(&builtin, q).await, &sql(&ours, q).await);
    }
    let q = "select l_orderkey, l_shipmode from lineitem where l_shipmode = 'AIR' limit 5";
    let got = sql(&ours, q).await;
    assert_eq!(rows(&got), 5, "{q}");
    for b in &got {
        let modes = arrow::compute::cast(b.column(1), &DataType::Utf8).unwrap();
        let modes = modes.as_any().downcast_ref::<StringArray>().unwrap();
        assert!(modes.iter().all(|m| m == Some("AIR")), "{q}: {modes:?}");
    }

    // The CPU backend leaves filtering to DataFusion.
    let cpu_ctx = context(2);
    queries::register_tables(&cpu_ctx, &dir, &TableSource::Gpq(cpu())).await.unwrap();
    assert!(has_filter_exec(&physical(&cpu_ctx, q).await));

    // A context lost after the first pass: the rest of the run is read and
    // filtered on the CPU, from the first row the device did not consume.
    let lossy = context(1);
    let options = gpu.clone().with_gpu_read_bytes(64 << 10).with_injected_gpu_context_loss_after(1).with_injected_gpu_context_loss(1);
    queries::register_tables(&lossy, &dir, &TableSource::Gpq(options)).await.unwrap();
    let q = "select l_orderkey, l_linenumber, l_quantity from lineitem where l_quantity < 10 and l_shipinstruct like 'DELIVER%' order by l_orderkey, l_linenumber";
    let (batches, scans) = run_with_scans(&lossy, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &batches);
    assert_eq!(metric(&scans[0], "gpu_context_lost_fallbacks"), 1);
    assert!(metric(&scans[0], "host_filter_rows_in") > 0 && metric(&scans[0], "device_filter_rows_in") > 0);

    // Late materialization: lineitem is sorted by l_orderkey, so without the
    // page index (spans of whole row groups) only the first rows of the first
    // row group survive; the other output columns are decoded for them only,
    // and the answer is the one read without late materialization.
    let q = "select l_orderkey, l_comment, l_extendedprice from lineitem where l_orderkey < 200 and l_quantity > 10 order by l_orderkey, l_comment";
    let late_ctx = context(2);
    queries::register_tables(&late_ctx, &dir, &TableSource::Gpq(gpu.clone().with_page_index(false))).await.unwrap();
    let (late_rows, late_scans) = run_with_scans(&late_ctx, q).await;
    assert_same_rows(q, &sql(&builtin, q).await, &late_rows);
    let skipped = metric(&late_scans[0], "late_rows_skipped");
    let eager_ctx = context(2);
    queries::register_tables(&eager_ctx, &dir, &TableSource::Gpq(gpu.clone().with_page_index(false).with_late_materialization(false))).await.unwrap();
    let (eager_rows, eager_scans) = run_with_scans(&eager_ctx, q).await;
    assert_same_rows(q, &late_rows, &eager_rows);
    assert_eq!(metric(&eager_scans[0], "late_rows_skipped"), 0);
    let (late_read, eager_read) = (metric(&late_scans[0], "bytes_read"), metric(&eager_scans[0], "bytes_read"));
    eprintln!("late materialization: {skipped} rows not decoded; {late_read} bytes read, {eager_read} without");
    assert!(skipped > 0, "no rows skipped by late materialization");
    assert!(late_read < eager_read, "late materialization read {late_read} bytes, {eager_read} without");

    // A context lost at several points of a late read (in either phase) is
    // finished on the CPU without losing or repeating rows.
    let q = "select l_orderkey, l_linenumber, l_comment from lineitem where l_quantity < 10 and l_shipinstruct like 'DELIVER%' order by l_orderkey, l_linenumber";
    let expected = sql(&builtin, q).await;
    for after in [2, 5, 9, 14] {
        let lossy = context(1);
        let options = gpu.clone().with_gpu_read_bytes(64 << 10).with_injected_gpu_context_loss_after(after).with_injected_gpu_context_loss(1);
        queries::register_tables(&lossy, &dir, &TableSource::Gpq(options)).await.unwrap();
        let (batches, scans) = run_with_scans(&lossy, q).await;
        assert_same_rows(&format!("{q} (context lost after {after} passes)"), &expected, &batches);
        assert!(metric(&scans[0], "gpu_context_lost_fallbacks") <= 1);
    }

    // Three-valued logic, NaN and -0.0, empty strings, decimal literals between steps.
    let tmp = tempfile::tempdir().unwrap();
    let path = edge_file(tmp.path());
    let (expected_ctx, got_ctx) = (context(2), context(2));
    expected_ctx.register_parquet("t", path.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
    register_gpq(&got_ctx, "t", &path, gpu.clone()).unwrap();
    for filter in [
        "i > 3",
        "not (i > 3)",
        "i is null or s like 'ab%'",
        "not (i is null or b)",
        "b",
        "not b",
        "b = false",
        "b is not true",
        "f = 'NaN'::double",
        "f > 0.0",
        "f <= -0.0",
        "f < 'Infinity'::double",
        "s = ''",
        "s < 'abc'",
        "s not like '%special%'",
        "s like '%'",
        "s in ('ab', '', 'xyz special')",
        "i not in (1, 2, -3)",
        "i between -2 and 2",
        "i not between -2 and 2",
        "d > 1.234",
        "d <= -5.005",
        "d = 0.105",
        "d <> 0.105",
        "d between -1 and 1.5",
        "i > 0 and f > 0 or s like 'PROMO%' and not b",
        "i = null",
        "f in (0.0, 1.0, 2.0, 3.0, -1.5)",
        "i < d",
        "cast(i as bigint) >= i",
    ] {
        let q = format!("select i, f, s, b, d from t where {filter} order by i, f, s, b, d");
        let expected = sql(&expected_ctx, &q).await;
        let got = sql(&got_ctx, &q).await;
        assert_same_rows(&q, &expected, &got);
    }
    // Pages pruned inside a span stay cut with device filters: statistics
    // leave NaN out of a page's range, so a page of 2.0 and NaN is pruned
    // for `f > 2.5` although NaN sorts above 2.5; the built-in reader drops
    // its rows, and so must every gpq path.
    use arrow::array::Float64Array;
    let nan = RecordBatch::try_from_iter([
        ("f", Arc::new(Float64Array::from(vec![3.0, 3.0, 2.0, f64::NAN, 4.0, 4.0])) as ArrayRef),
        ("k", Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5, 6])) as ArrayRef),
    ])
    .unwrap();
    let nan_path = tmp.path().join("nan_pages.parquet");
    write_file(&nan_path, &[nan], 6, 2);
    let (builtin_n, ours_n) = (context(1), context(1));
    builtin_n.register_parquet("n", nan_path.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
    register_gpq(&ours_n, "n", &nan_path, gpu.clone()).unwrap();
    let q = "select k, f from n where f > 2.5 order by k";
    assert_same_rows(q, &sql(&builtin_n, q).await, &sql(&ours_n, q).await);

    // Strings the file stores as plain Utf8 come back as views when the
    // session asks for them (DataFusion's default), built on the device,
    // as DataFusion's own tables give them; or as the file has them.
    let ctx_views = context(2);
    register_gpq(&ctx_views, "t", &path, gpu.clone()).unwrap();
    let table = ctx_views.table_provider("t").await.unwrap();
    assert_eq!(table.schema().field_with_name("s").unwrap().data_type(), &DataType::Utf8View);
    let builtin_type = expected_ctx.table_provider("t").await.unwrap().schema().field_with_name("s").unwrap().data_type().clone();
    assert_eq!(builtin_type, DataType::Utf8View, "DataFusion's own table");
    let q = "select s, count(*) from t where s like 'ab%' or s is null group by s order by s";
    let got = sql(&ctx_views, q).await;
    assert_same_rows(q, &sql(&expected_ctx, q).await, &got);
    assert_eq!(got[0].schema().field(0).data_type(), &DataType::Utf8View);
    let ctx_plain = context(2);
    register_gpq(&ctx_plain, "t", &path, gpu.clone().with_string_views(false)).unwrap();
    assert_eq!(ctx_plain.table_provider("t").await.unwrap().schema().field_with_name("s").unwrap().data_type(), &DataType::Utf8);
    assert_same_rows(q, &sql(&expected_ctx, q).await, &sql(&ctx_plain, q).await);

    // Partitions spread over the devices (on the emulator every ordinal is
    // the one emulated device): same answers, and EXPLAIN names them.
    let devices: Vec<usize> = if emulated { vec![0, 1] } else { (0..gpq::cuda::device_count().unwrap()).collect() };
    let multi = context(4);
    queries::register_tables(&multi, &dir, &TableSource::Gpq(gpu.clone().with_devices(devices.clone()))).await.unwrap();
    for n in [1, 6, 12] {
        let expected = queries::run_query(&builtin, n).await.unwrap();
        let actual = queries::run_query(&multi, n).await.unwrap_or_else(|e| panic!("q{n} on devices {devices:?}: {e}"));
        assert_same_rows(&format!("TPC-H q{n} on devices {devices:?}"), &expected, &actual);
    }
    let shown = datafusion::physical_plan::displayable(physical(&multi, "select count(*) from lineitem where l_quantity < 3").await.as_ref())
        .indent(false)
        .to_string();
    let list: Vec<String> = devices.iter().map(usize::to_string).collect();
    assert!(shown.contains(&format!("devices={}", list.join("+"))), "{shown}");

    // Which of those ran on the device, for the log.
    for filter in ["d > 1.234", "f = 'NaN'::double", "b is not true", "i = null"] {
        let q = format!("select i from t where {filter}");
        let on_device = !has_filter_exec(&physical(&got_ctx, &q).await);
        eprintln!("{filter}: {}", if on_device { "on the device" } else { "DataFusion's FilterExec" });
    }
}

/// Partial aggregations over GPU scans computed on the device
/// (`with_device_aggregation`) give the built-in Parquet tables' answers:
/// TPC-H q1 and q6, and groupings that exercise every state and every way
/// back to the host (more groups than the device table holds, grouping
/// strings too long for the key, a scan with and without filters).
async fn device_aggregation_matches_builtin(emulated: bool) {
    if emulated {
        gpq::cuda::use_emulator().unwrap();
    }
    let dir = tpch_dir(0.01);
    let builtin = context(2);
    queries::register_tables(&builtin, &dir, &TableSource::Parquet).await.unwrap();
    let state = datafusion::execution::SessionStateBuilder::new().with_config(SessionConfig::new().with_target_partitions(2)).with_default_features();
    let ours = SessionContext::new_with_state(gpq_datafusion::with_device_aggregation(state).build());
    let gpu = GpqTableOptions::new().with_backend(Backend::Gpu).with_gpu_read_bytes(1 << 20).with_gpu_fallback(false);
    queries::register_tables(&ours, &dir, &TableSource::Gpq(gpu)).await.unwrap();
    let device_nodes = |plan: &Arc<dyn ExecutionPlan>| {
        let mut found = Vec::new();
        let mut stack = vec![Arc::clone(plan)];
        while let Some(p) = stack.pop() {
            if p.as_ref().downcast_ref::<GpqPartialAggregateExec>().is_some() {
                found.push(Arc::clone(&p));
            }
            stack.extend(p.children().into_iter().cloned());
        }
        found
    };
    for n in [1, 6] {
        let sql_text = queries::query(n).unwrap();
        let plan = ours.sql(sql_text).await.unwrap().create_physical_plan().await.unwrap();
        let nodes = device_nodes(&plan);
        assert_eq!(nodes.len(), 1, "q{n}: no device aggregation in\n{}", datafusion::physical_plan::displayable(plan.as_ref()).indent(true));
        let actual = collect(Arc::clone(&plan), ours.task_ctx()).await.unwrap();
        let expected = queries::run_query(&builtin, n).await.unwrap();
        assert_same_rows(&format!("TPC-H q{n}, device aggregation"), &expected, &actual);
        assert!(metric(&nodes[0], "device_aggregate_rows_in") > 0, "q{n} aggregated nothing on the device");
    }
    // (query, whether every batch must be aggregated on the device)
    let cases = [
        ("select l_returnflag, l_linestatus, count(*), count(l_tax), sum(l_quantity), min(l_shipdate), max(l_shipdate), \
          min(l_extendedprice), max(l_discount), avg(l_discount) from lineitem group by l_returnflag, l_linestatus", true),
        ("select l_shipmode, sum(l_quantity * 2 + l_tax), sum(l_linenumber), avg(l_extendedprice * (1 - l_discount)) \
          from lineitem where l_shipinstruct = 'NONE' group by l_shipmode", true),
        ("select l_linenumber, l_suppkey % 3 = 0 as k, count(*) from lineitem group by l_linenumber, l_suppkey % 3 = 0", false),
        ("select sum(l_quantity), count(*) from lineitem where l_shipdate >= date '1995-01-01'", true),
        ("select l_orderkey, sum(l_quantity), count(*) from lineitem group by l_orderkey", false),
        ("select l_comment, count(*) from lineitem group by l_comment", false),
        ("select o_orderpriority, o_orderstatus, count(*), sum(o_totalprice), min(o_orderdate) from orders group by o_orderpriority, o_orderstatus", false),
    ];
    for (q, all_on_device) in cases {
        let plan = ours.sql(q).await.unwrap().create_physical_plan().await.unwrap();
        let actual = collect(Arc::clone(&plan), ours.task_ctx()).await.unwrap();
        let expected = sql(&builtin, q).await;
        let sort = |b: &[RecordBatch]| {
            let mut lines: Vec<String> = pretty_format_batches(b).unwrap().to_string().lines().map(str::to_string).collect();
            lines.sort();
            lines
        };
        assert_eq!(sort(&expected), sort(&actual), "{q}");
        let nodes = device_nodes(&plan);
        if all_on_device {
            assert_eq!(nodes.len(), 1, "{q}: no device aggregation in\n{}", datafusion::physical_plan::displayable(plan.as_ref()).indent(true));
            assert_eq!(metric(&nodes[0], "device_aggregate_fallbacks"), 0, "{q}");
            assert!(metric(&nodes[0], "device_aggregate_rows_in") > 0, "{q}");
        }
        eprintln!("device aggregation: {} rows, {} device nodes: {q}", rows(&actual), nodes.len());
    }
    // Order keys span 60,000 values, more than the default table (4096): the
    // rule leaves that aggregation to DataFusion. With room for 2^17 groups
    // it goes to the device.
    let by_order = "select l_orderkey, sum(l_quantity), count(*) from lineitem group by l_orderkey";
    let plan = ours.sql(by_order).await.unwrap().create_physical_plan().await.unwrap();
    assert!(device_nodes(&plan).is_empty(), "a key span over max_groups planned on the device:\n{}", datafusion::physical_plan::displayable(plan.as_ref()).indent(true));
    let state = datafusion::execution::SessionStateBuilder::new().with_config(SessionConfig::new().with_target_partitions(2)).with_default_features();
    let rule = gpq_datafusion::GpqAggregatePushdown::default().with_max_groups(1 << 17);
    let roomy = SessionContext::new_with_state(state.with_physical_optimizer_rule(Arc::new(rule)).build());
    let gpu = GpqTableOptions::new().with_backend(Backend::Gpu).with_gpu_read_bytes(1 << 20).with_gpu_fallback(false);
    queries::register_tables(&roomy, &dir, &TableSource::Gpq(gpu)).await.unwrap();
    let plan = roomy.sql(by_order).await.unwrap().create_physical_plan().await.unwrap();
    let nodes = device_nodes(&plan);
    assert_eq!(nodes.len(), 1, "{by_order} with 2^17 groups: no device aggregation");
    let actual = collect(Arc::clone(&plan), roomy.task_ctx()).await.unwrap();
    assert_same_rows(by_order, &sql(&builtin, by_order).await, &actual);
    assert_eq!(metric(&nodes[0], "device_aggregate_fallbacks"), 0, "{by_order} with 2^17 groups");
    assert!(metric(&nodes[0], "device_aggregate_rows_in") > 0, "{by_order} with 2^17 groups aggregated nothing on the device");
}
