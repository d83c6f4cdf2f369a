//! arrow-rs as the reference reader, and a loose comparison of gpq's result
//! with it.
//!
//! "Loose": column names, nullability and metadata are not compared, and
//! where gpq's column has another type than arrow-rs's, it is cast to
//! arrow-rs's type first (a cast that fails counts as a difference). What
//! must agree are the row count, the column count and every value and null.

use std::path::Path;

use arrow::array::{Array, ArrayRef, RecordBatch};

/// Reads `path` with arrow-rs into one batch; a panic inside arrow-rs is
/// caught and reported as an error.
pub fn read_arrow_rs(path: &Path) -> Result<RecordBatch, String> {
    let read = || -> Result<RecordBatch, String> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| e.to_string())?.build().map_err(|e| e.to_string())?;
        let schema = arrow::array::RecordBatchReader::schema(&reader);
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
        arrow::compute::concat_batches(&schema, &batches).map_err(|e| e.to_string())
    };
    match crate::check::guarded(read) {
        Ok(r) => r,
        Err(panic) => Err(format!("arrow-rs panicked: {panic}")),
    }
}

/// Compares gpq's batch `got` with arrow-rs's `expected`; `Err` names the
/// first difference.
pub fn compare(expected: &RecordBatch, got: &RecordBatch) -> Result<(), String> {
    if got.num_rows() != expected.num_rows() {
        return Err(format!("{} rows, arrow-rs has {}", got.num_rows(), expected.num_rows()));
    }
    if got.num_columns() != expected.num_columns() {
        return Err(format!("{} columns, arrow-rs has {}", got.num_columns(), expected.num_columns()));
    }
    for (i, field) in expected.schema().fields().iter().enumerate() {
        compare_column(field.name(), expected.column(i), got.column(i))?;
    }
    Ok(())
}

/// Compares one column, casting `got` to `expected`'s type where they differ.
pub fn compare_column(name: &str, expected: &ArrayRef, got: &ArrayRef) -> Result<(), String> {
    let cast;
    let got = if got.data_type() == expected.data_type() {
        got
    } else {
        cast = arrow::compute::cast(got, expected.data_type())
            .map_err(|e| format!("column {name}: cannot cast {} to arrow-rs's {}: {e}", got.data_type(), expected.data_type()))?;
        &cast
    };
    if got.len() != expected.len() {
        return Err(format!("column {name}: {} values, arrow-rs has {}", got.len(), expected.len()));
    }
    if expected.to_data() == got.to_data() {
        return Ok(());
    }
    let first = (0..expected.len()).find(|&r| expected.slice(r, 1).to_data() != got.slice(r, 1).to_data()).unwrap_or(0);
    Err(format!(
        "column {name} differs first at row {first}: arrow-rs {}, gpq {} (nulls {} vs {})",
        one_line(&format!("{:?}", expected.slice(first, 1)), 120),
        one_line(&format!("{:?}", got.slice(first, 1)), 120),
        expected.null_count(),
        got.null_count()
    ))
}

/// `s` on one line (whitespace runs collapsed, other control characters
/// shown as `?`), at most `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let joined: String = joined.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
    if joined.chars().count() <= max { joined } else { joined.chars().take(max).collect::<String>() + "..." }
}
