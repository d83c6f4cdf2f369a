//! `device_table_stream`: the batch reader's tables as an async stream, the
//! same tables in the same order, its errors ending it. Runs on a CUDA
//! device, else on gpq's CPU emulator of the kernels (the `emulator`
//! feature), else it is reported as ignored.

mod common;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use futures::StreamExt;
use gpq::DeviceReaderBuilder;
use gpq_datafusion::device_table_stream;
use common::{gpu_trial, runtime};
use libtest_mimic::{Arguments, Failed};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let trials = vec![
        gpu_trial("the_stream_yields_the_readers_batches", the_stream_yields_the_readers_batches),
        gpu_trial("an_error_ends_the_stream", an_error_ends_the_stream),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}


/// 5,000 rows in row groups of 1,000: an id and a string.
fn write_sample(path: &Path) -> RecordBatch {
    let ids = Int64Array::from_iter_values(0..5000);
    let names: StringArray = (0..5000).map(|i| Some(format!("name-{}", i * 7 % 333))).collect();
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("name", DataType::Utf8, true)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids) as ArrayRef, Arc::new(names)]).unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(1000)).build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    batch
}

fn the_stream_yields_the_readers_batches() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.parquet");
    let expected = write_sample(&path);
    for ahead in [1, 3] {
        let reader = DeviceReaderBuilder::try_new(&path)?.with_batch_rows(1000).with_decode_ahead(ahead).build()?;
        let stream = device_table_stream(reader)?;
        assert_eq!(stream.schema().fields().len(), 2);
        let tables: Vec<gpq::Result<gpq::DeviceTable>> = runtime()?.block_on(stream.collect());
        let mut host = Vec::new();
        for t in tables {
            host.push(t?.to_record_batch()?);
        }
        assert_eq!(host.iter().map(|b| b.num_rows()).collect::<Vec<_>>(), vec![1000; 5], "{ahead} at once");
        let got = arrow::compute::concat_batches(&host[0].schema(), &host)?;
        assert_eq!(got.columns(), expected.columns(), "{ahead} at once");
    }
    // Dropped after its first batch: the reader stops, nothing hangs.
    let reader = DeviceReaderBuilder::try_new(&path)?.with_batch_rows(1000).build()?;
    let mut stream = device_table_stream(reader)?;
    let first = runtime()?.block_on(stream.next());
    assert_eq!(first.expect("a first batch")?.num_rows(), 1000);
    drop(stream);
    Ok(())
}

fn an_error_ends_the_stream() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.parquet");
    write_sample(&path);
    // The second row group's first page header overwritten.
    let mut bytes = std::fs::read(&path)?;
    let md = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path)?)?.metadata().clone();
    let start = md.row_group(1).column(0).byte_range().0 as usize;
    bytes[start..start + 24].fill(0xFF);
    std::fs::write(&path, &bytes)?;
    let reader = DeviceReaderBuilder::try_new(&path)?.with_batch_rows(1000).build()?;
    let items: Vec<gpq::Result<gpq::DeviceTable>> = runtime()?.block_on(device_table_stream(reader)?.collect());
    assert_eq!(items.len(), 2, "the first batch, then the error, then nothing");
    assert_eq!(items[0].as_ref().map(|t| t.num_rows()).ok(), Some(1000));
    match &items[1] {
        Err(e) => assert!(e.to_string().contains("s.parquet"), "the error names the file: {e}"),
        Ok(_) => return Err("the corrupt row group read without an error".into()),
    }
    Ok(())
}
