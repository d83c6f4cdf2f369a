//! A table notices files rewritten in place after it was registered: before
//! each scan every file's size and modification time are compared with those
//! recorded when its footer was read, and a changed file's footer is re-read,
//! so the scan neither prunes with the old statistics nor decodes under the
//! old metadata. A rewritten file whose schema no longer fits the table fails
//! the scan with an error naming it. CPU backend.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::TableProvider;
use datafusion::common::stats::Precision;
use datafusion::prelude::{SessionConfig, SessionContext};
use gpq_datafusion::{Backend, GpqTable, GpqTableOptions};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

/// Writes rows `values` (`a` = the value, `b` = twice it) to `path`,
/// replacing what is there, in row groups of 64 rows.
fn write_values(path: &Path, values: std::ops::Range<i64>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Int64, false),
    ]));
    let a: Vec<i64> = values.collect();
    let b: Vec<i64> = a.iter().map(|v| v * 2).collect();
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(Int64Array::from(a)), Arc::new(Int64Array::from(b))],
    )
    .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(64))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Gives `path` a modification time no earlier call gave any file, so that
/// a rewrite is noticed even where it kept the size and the clock is coarse.
fn touch(path: &Path) {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::SeqCst);
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 60 * n))
        .unwrap();
}

/// The error of running `q` (at planning or execution).
async fn error(ctx: &SessionContext, q: &str) -> String {
    match ctx.sql(q).await {
        Ok(df) => df
            .collect()
            .await
            .expect_err("the query should have failed"),
        Err(e) => e,
    }
    .to_string()
}

fn context() -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2))
}

fn cpu() -> GpqTableOptions {
    GpqTableOptions::new().with_backend(Backend::Cpu)
}

/// The single row of `q` as integers (nulls as `None`).
async fn row(ctx: &SessionContext, q: &str) -> Vec<Option<i64>> {
    let batches = ctx.sql(q).await.unwrap().collect().await.unwrap();
    let batch = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .unwrap_or_else(|| panic!("{q}: no rows"));
    batch
        .columns()
        .iter()
        .map(|c| {
            let c = arrow::compute::cast(c, &DataType::Int64).unwrap();
            let c = c.as_any().downcast_ref::<Int64Array>().unwrap();
            (!c.is_null(0)).then(|| c.value(0))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_file_is_read_with_its_new_footer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_values(&path, 0..100);
    let table = Arc::new(GpqTable::try_new(&path, cpu()).unwrap());
    let ctx = context();
    ctx.register_table("t", Arc::clone(&table) as Arc<dyn TableProvider>)
        .unwrap();

    let all = "select count(*), sum(a), min(a), max(a), sum(b) from t";
    let new_only = "select count(*), min(a), max(a) from t where a >= 1000";
    assert_eq!(
        row(&ctx, all).await,
        [Some(100), Some(4950), Some(0), Some(99), Some(9900)]
    );
    assert_eq!(row(&ctx, new_only).await, [Some(0), None, None]);
    assert_eq!(table.num_rows(), 100);

    // Rewritten in place: more rows, other values, another size. The old
    // statistics say no row group holds a >= 1000; the new rows must be found.
    let size = std::fs::metadata(&path).unwrap().len();
    write_values(&path, 500..3000);
    assert_ne!(std::fs::metadata(&path).unwrap().len(), size);
    let sum: i64 = (500..3000).sum();
    assert_eq!(
        row(&ctx, all).await,
        [Some(2500), Some(sum), Some(500), Some(2999), Some(2 * sum)]
    );
    assert_eq!(
        row(&ctx, new_only).await,
        [Some(2000), Some(1000), Some(2999)]
    );
    let q = "select a, b from t where a > 2996 order by a";
    let batches = ctx.sql(q).await.unwrap().collect().await.unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    assert!(
        text.contains("| 2997 | 5994 |") && text.contains("| 2999 | 5998 |"),
        "{text}"
    );
    // The provider's own view follows the new footer.
    assert_eq!(table.num_rows(), 2500);
    assert_eq!(table.statistics().unwrap().num_rows, Precision::Exact(2500));

    // Rewritten again with fewer rows: no row past the new end is read.
    write_values(&path, 0..10);
    touch(&path);
    assert_eq!(
        row(&ctx, all).await,
        [Some(10), Some(45), Some(0), Some(9), Some(90)]
    );
    assert_eq!(row(&ctx, new_only).await, [Some(0), None, None]);

    // Same size, other values: the modification time gives it away.
    write_values(&path, 10..20);
    touch(&path);
    assert_eq!(
        row(&ctx, all).await,
        [Some(10), Some(145), Some(10), Some(19), Some(290)]
    );
    assert_eq!(table.num_rows(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_file_of_another_schema_fails_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let (first, second) = (data.join("part-0.parquet"), data.join("part-1.parquet"));
    write_values(&first, 0..100);
    write_values(&second, 100..200);
    let table = Arc::new(GpqTable::try_new(&data, cpu()).unwrap());
    let ctx = context();
    ctx.register_table("t", Arc::clone(&table) as Arc<dyn TableProvider>)
        .unwrap();
    assert_eq!(row(&ctx, "select count(*) from t").await, [Some(200)]);

    // Column `a` becomes a string: the scan fails and names the file.
    let other = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Utf8, false),
        Field::new("b", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&other),
        vec![
            Arc::new(StringArray::from(vec!["x"])),
            Arc::new(Int64Array::from(vec![1])),
        ],
    )
    .unwrap();
    let file = std::fs::File::create(&second).unwrap();
    let mut w = ArrowWriter::try_new(file, other, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    touch(&second);
    for q in ["select count(*) from t", "select sum(b) from t"] {
        let err = error(&ctx, q).await;
        assert!(
            err.contains("part-1.parquet") && err.contains("schema") && err.contains("\"a\""),
            "{q}: {err}"
        );
    }
    // The table's schema did not change under it.
    assert_eq!(table.schema().field(0).data_type(), &DataType::Int64);

    // Back to the table's schema: the scan works again, with the new rows.
    write_values(&second, 100..150);
    touch(&second);
    assert_eq!(row(&ctx, "select count(*) from t").await, [Some(150)]);

    // A file that is gone fails the scan and is named.
    std::fs::remove_file(&second).unwrap();
    let err = error(&ctx, "select count(*) from t").await;
    assert!(err.contains("part-1.parquet"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_files_keep_their_footers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_values(&path, 0..100);
    let table = GpqTable::try_new(&path, cpu()).unwrap();
    let ctx = context();
    let state = ctx.state();
    // A scan of an unchanged file is planned from the footer read at
    // registration: the same pruning as before.
    for _ in 0..3 {
        let plan = table.scan(&state, None, &[], Some(1)).await.unwrap();
        let scan = plan
            .as_ref()
            .downcast_ref::<gpq_datafusion::GpqScanExec>()
            .unwrap();
        assert_eq!(scan.pruning().row_groups, 2);
        assert_eq!(scan.pruning().pruned_by_limit, 1);
    }
}
