//! The GPU backend answers a device read that lost the GPU context on the
//! CPU instead of failing the query, and counts it
//! (`gpu_context_lost_fallbacks`); the loss is injected through the
//! test-only `GpqTableOptions::inject_gpu_context_loss`. Runs on a CUDA
//! device, else on gpq's CPU emulator of the kernels (the `emulator`
//! feature), else it is reported as ignored.

mod common;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use gpq_datafusion::{Backend, GpqScanExec, GpqTableOptions, register_gpq};
use common::{gpu_trial, runtime};
use libtest_mimic::Arguments;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let trials = vec![
        gpu_trial("lost_context_read_is_answered_on_the_cpu", || {
            runtime()?.block_on(lost_context_read_is_answered_on_the_cpu());
            Ok(())
        }),
        gpu_trial("lost_context_mid_run_resumes_where_it_stopped", || {
            runtime()?.block_on(lost_context_mid_run_resumes_where_it_stopped());
            Ok(())
        }),
        gpu_trial("corrupt_data_still_fails_on_the_gpu_backend", || {
            runtime()?.block_on(corrupt_data_still_fails_on_the_gpu_backend());
            Ok(())
        }),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}


/// 1000 rows in row groups of 100: `a` = 0..1000, `b` = `a % 13`.
fn write_file(path: &Path) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Int32, false),
    ]));
    let a: Vec<i64> = (0..1000).collect();
    let b: Vec<i32> = a.iter().map(|v| (v % 13) as i32).collect();
    let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(a)), Arc::new(Int32Array::from(b))];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(100))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn context() -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2))
}

/// GPU backend, one row group per device read, no fallback for what the GPU
/// cannot decode (so only a lost context can send a read to the CPU).
fn gpu() -> GpqTableOptions {
    GpqTableOptions::new()
        .with_backend(Backend::Gpu)
        .with_gpu_read_bytes(1)
        .with_gpu_fallback(false)
}

/// Runs `sql`, returning the batches and the gpq scan of the executed plan.
async fn run(ctx: &SessionContext, sql: &str) -> (Vec<RecordBatch>, Arc<dyn ExecutionPlan>) {
    let plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap();
    let mut stack = vec![plan];
    while let Some(p) = stack.pop() {
        if p.as_ref().downcast_ref::<GpqScanExec>().is_some() {
            return (batches, p);
        }
        stack.extend(p.children().into_iter().cloned());
    }
    panic!("{sql}: no gpq scan in the plan");
}

/// The sum over partitions of the metric `name` of `scan`; a metric the
/// scan does not have is a test failure, not a zero.
fn metric(scan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let metrics = scan.metrics().expect("a gpq scan has metrics");
    let values: Vec<usize> = metrics
        .iter()
        .filter(|m| m.value().name() == name)
        .map(|m| m.value().as_usize())
        .collect();
    assert!(
        !values.is_empty(),
        "the scan has no metric {name}: {metrics}"
    );
    values.iter().sum()
}

fn text(batches: &[RecordBatch]) -> String {
    pretty_format_batches(batches).unwrap().to_string()
}

async fn lost_context_read_is_answered_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_file(&path);
    let cpu = context();
    register_gpq(
        &cpu,
        "t",
        &path,
        GpqTableOptions::new().with_backend(Backend::Cpu),
    )
    .unwrap();
    let healthy = context();
    register_gpq(&healthy, "t", &path, gpu()).unwrap();
    let lossy = context();
    register_gpq(&lossy, "t", &path, gpu().with_injected_gpu_context_loss(1)).unwrap();

    for q in [
        "select count(*), sum(a), sum(b), min(a), max(a) from t",
        "select b, count(*), sum(a) from t group by b order by b",
        "select a, b from t where a between 95 and 205 order by a",
    ] {
        let (expected, _) = run(&cpu, q).await;
        let (clean, scan) = run(&healthy, q).await;
        assert_eq!(text(&clean), text(&expected), "{q}: healthy GPU backend");
        assert_eq!(metric(&scan, "gpu_context_lost_fallbacks"), 0, "{q}");

        // The first device read of the scan loses the context: the CPU
        // answers it and the rest of its partition's run of row groups (one
        // file: a run is one batch reader), the other partition stays on the
        // device (one row group a pass), same answer.
        let (actual, scan) = run(&lossy, q).await;
        assert_eq!(text(&actual), text(&expected), "{q}: after a lost context");
        assert_eq!(metric(&scan, "gpu_context_lost_fallbacks"), 1, "{q}");
        assert_eq!(metric(&scan, "gpu_fallback_row_groups"), 0, "{q}");
        let partitions: Vec<usize> = scan
            .as_ref()
            .downcast_ref::<GpqScanExec>()
            .unwrap()
            .partition_row_groups()
            .iter()
            .map(Vec::len)
            .collect();
        let scanned: usize = partitions.iter().sum();
        let reads = metric(&scan, "device_reads");
        assert!(
            partitions.iter().any(|&p| p > 0 && reads == scanned - p),
            "{q}: {reads} device reads of partitions of {partitions:?} row groups, one partition on the CPU"
        );
    }
}

/// A context lost in the middle of a run (after some of its passes were
/// sent): the CPU finishes it from the first row not sent, with and without
/// a limit; one partition, so that the rows' order is the file's.
async fn lost_context_mid_run_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_file(&path);
    let one = || SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
    let cpu = one();
    register_gpq(&cpu, "t", &path, GpqTableOptions::new().with_backend(Backend::Cpu)).unwrap();
    for after in [1, 3, 9] {
        let lossy = one();
        register_gpq(&lossy, "t", &path, gpu().with_injected_gpu_context_loss(1).with_injected_gpu_context_loss_after(after)).unwrap();
        for q in ["select a, b from t", "select a, b from t limit 450", "select a from t where a >= 150 limit 333", "select count(*), sum(a) from t"] {
            let (expected, _) = run(&cpu, q).await;
            let (actual, scan) = run(&lossy, q).await;
            assert_eq!(text(&actual), text(&expected), "{q}: lost after {after} passes");
            let reads = metric(&scan, "device_reads");
            let fallbacks = metric(&scan, "gpu_context_lost_fallbacks");
            // Either the loss came after `after` passes (and the CPU finished the
            // run), or the scan needed no more passes than that.
            assert!((fallbacks == 1 && reads == after) || (fallbacks == 0 && reads <= after), "{q}: {reads} reads, {fallbacks} fallbacks");
        }
    }
}

async fn corrupt_data_still_fails_on_the_gpu_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_file(&path);
    // Overwrite the page header of the first column chunk with garbage: the
    // file's fault, which must fail the query, not fall back to the CPU.
    let meta =
        parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&path).unwrap())
            .map(|r| parquet::file::reader::FileReader::metadata(&r).clone())
            .unwrap();
    let start = meta.row_group(0).column(0).byte_range().0;
    let mut bytes = std::fs::read(&path).unwrap();
    let at = usize::try_from(start).unwrap();
    bytes[at..at + 16].fill(0xff);
    std::fs::write(&path, &bytes).unwrap();

    let ctx = context();
    register_gpq(&ctx, "t", &path, gpu()).unwrap();
    let result = ctx
        .sql("select sum(a) from t")
        .await
        .unwrap()
        .collect()
        .await;
    let err = result
        .expect_err("a corrupt page must fail the query")
        .to_string();
    assert!(err.contains("t.parquet"), "{err}");
}
