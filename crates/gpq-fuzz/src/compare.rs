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
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| e.to_string())?;
        let builder = match with_row_groups_total(builder.metadata()) {
            Some(metadata) => {
                let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
                let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new();
                let metadata = parquet::arrow::arrow_reader::ArrowReaderMetadata::try_new(std::sync::Arc::new(metadata), options)
                    .map_err(|e| e.to_string())?;
                ParquetRecordBatchReaderBuilder::new_with_metadata(file, metadata)
            }
            None => builder,
        };
        let reader = builder.build().map_err(|e| e.to_string())?;
        let schema = arrow::array::RecordBatchReader::schema(&reader);
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
        arrow::compute::concat_batches(&schema, &batches).map_err(|e| e.to_string())
    };
    match crate::check::guarded(read) {
        Ok(r) => r,
        Err(panic) => Err(format!("arrow-rs panicked: {panic}")),
    }
}

/// The footer with its total row count set to what its row groups hold,
/// where the two disagree (`None` where they agree). arrow-rs caps its batch
/// size at the footer's total, so a total below the row groups' makes it
/// return fewer rows than the file holds; gpq reads what the row groups hold
/// (as for parquet-testing's `repeated_no_annotation.parquet`, see the
/// decode tests), and so does the reference here.
fn with_row_groups_total(metadata: &parquet::file::metadata::ParquetMetaData) -> Option<parquet::file::metadata::ParquetMetaData> {
    use parquet::file::metadata::{FileMetaData, ParquetMetaDataBuilder};
    let held = metadata.row_groups().iter().try_fold(0i64, |acc, rg| acc.checked_add(rg.num_rows().max(0)))?;
    let footer = metadata.file_metadata();
    if footer.num_rows() == held {
        return None;
    }
    let fixed = FileMetaData::new(
        footer.version(),
        held,
        footer.created_by().map(str::to_owned),
        footer.key_value_metadata().cloned(),
        footer.schema_descr_ptr(),
        footer.column_orders().cloned(),
    );
    let mut builder = metadata.clone().into_builder();
    let row_groups = builder.take_row_groups();
    Some(ParquetMetaDataBuilder::new(fixed).set_row_groups(row_groups).build())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int32Array};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::{FileMetaData, ParquetMetaDataBuilder};
    use parquet::file::properties::WriterProperties;

    use super::*;

    #[test]
    fn the_reference_reads_what_the_row_groups_hold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("two_groups.parquet");
        let batch = RecordBatch::try_from_iter(vec![("v", Arc::new(Int32Array::from_iter_values(0..10)) as ArrayRef)]).unwrap();
        let props = WriterProperties::builder().set_max_row_group_size(6).build();
        let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        assert_eq!(read_arrow_rs(&path).unwrap().num_rows(), 10);

        let file = std::fs::File::open(&path).unwrap();
        let metadata = parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        assert!(with_row_groups_total(&metadata).is_none(), "the totals agree");
        // The footer's total says 0 rows over row groups of 6 and 4.
        let footer = metadata.file_metadata();
        let zero = FileMetaData::new(footer.version(), 0, None, footer.key_value_metadata().cloned(), footer.schema_descr_ptr(), None);
        let mut builder = metadata.clone().into_builder();
        let row_groups = builder.take_row_groups();
        let broken = ParquetMetaDataBuilder::new(zero).set_row_groups(row_groups).build();
        let fixed = with_row_groups_total(&broken).expect("the totals disagree");
        assert_eq!(fixed.file_metadata().num_rows(), 10);
        assert_eq!(fixed.num_row_groups(), 2);
    }
}
