//! TPC-H data as Parquet, generated with the `tpchgen` and `tpchgen-arrow`
//! crates and written by the parquet crate's Arrow writer.
//!
//! Each table is cut into parts (tpchgen's unit of parallel generation), one
//! row group per part, sized from an estimate of bytes per row as tpchgen-cli
//! does. Parts are generated and encoded on worker threads and appended to the
//! file in order. Defaults match tpchgen-cli: SNAPPY, about 7 MiB row groups,
//! version 1 data pages, dictionary encoding on, Arrow schema embedded.

pub mod queries;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnChunk, compute_leaves};
use parquet::basic::{Compression, Encoding, GzipLevel, ZstdLevel, BrotliLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;
use tpchgen::generators::*;
use tpchgen_arrow::*;

use gpq::{Error, Result};

/// The eight TPC-H tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `nation` (25 rows).
    Nation,
    /// `region` (5 rows).
    Region,
    /// `part`.
    Part,
    /// `supplier`.
    Supplier,
    /// `partsupp`.
    Partsupp,
    /// `customer`.
    Customer,
    /// `orders`.
    Orders,
    /// `lineitem`.
    Lineitem,
    /// Not a TPC-H table: `orders` with each order's line items as a
    /// `lineitems: list<struct<...>>` column (lineitem's columns but
    /// `l_orderkey`), for benchmarks of nested decoding. Not in [`Table::ALL`].
    OrdersLineitems,
}

impl Table {
    /// All tables, smallest first.
    pub const ALL: [Table; 8] = [
        Table::Region,
        Table::Nation,
        Table::Supplier,
        Table::Customer,
        Table::Part,
        Table::Partsupp,
        Table::Orders,
        Table::Lineitem,
    ];

    /// The table's name, as used for file and SQL table names.
    pub fn name(self) -> &'static str {
        match self {
            Table::Nation => "nation",
            Table::Region => "region",
            Table::Part => "part",
            Table::Supplier => "supplier",
            Table::Partsupp => "partsupp",
            Table::Customer => "customer",
            Table::Orders => "orders",
            Table::Lineitem => "lineitem",
            Table::OrdersLineitems => "orders_lineitems",
        }
    }

    /// Estimated rows at scale factor `sf`.
    pub fn row_count(self, sf: f64) -> u64 {
        let n = match self {
            Table::Nation => 25,
            Table::Region => 5,
            Table::Part => PartGenerator::calculate_row_count(sf, 1, 1),
            Table::Supplier => SupplierGenerator::calculate_row_count(sf, 1, 1),
            Table::Partsupp => PartSuppGenerator::calculate_row_count(sf, 1, 1),
            Table::Customer => CustomerGenerator::calculate_row_count(sf, 1, 1),
            Table::Orders | Table::OrdersLineitems => OrderGenerator::calculate_row_count(sf, 1, 1),
            // About four line items per order.
            Table::Lineitem => 4 * OrderGenerator::calculate_row_count(sf, 1, 1),
        };
        n.max(0) as u64
    }

    /// Average bytes of a row in TPC-H's text format, the size estimate tpchgen-cli plans parts with.
    fn avg_row_bytes(self) -> u64 {
        match self {
            Table::Nation => 88,
            Table::Region => 77,
            Table::Part => 115,
            Table::Supplier => 140,
            Table::Partsupp => 148,
            Table::Customer => 160,
            Table::Orders => 114,
            Table::Lineitem => 128,
            Table::OrdersLineitems => 114 + 4 * 128,
        }
    }

    /// Batches of part `part` (1-based) of `parts`.
    fn batches(self, sf: f64, part: i32, parts: i32, batch_size: usize) -> Box<dyn RecordBatchIterator> {
        match self {
            Table::Nation => Box::new(NationArrow::new(NationGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::Region => Box::new(RegionArrow::new(RegionGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::Part => Box::new(PartArrow::new(PartGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::Supplier => Box::new(SupplierArrow::new(SupplierGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::Partsupp => Box::new(PartSuppArrow::new(PartSuppGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::Customer => Box::new(CustomerArrow::new(CustomerGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::Orders => Box::new(OrderArrow::new(OrderGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::Lineitem => Box::new(LineItemArrow::new(LineItemGenerator::new(sf, part, parts)).with_batch_size(batch_size)),
            Table::OrdersLineitems => Box::new(OrdersWithLineitems::new(sf, part, parts, batch_size)),
        }
    }

    /// The table's Arrow schema.
    pub fn schema(self) -> SchemaRef {
        self.batches(0.01, 1, 1, 1).schema().clone()
    }
}

impl FromStr for Table {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Table::ALL
            .into_iter()
            .chain([Table::OrdersLineitems])
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| Error::InvalidOptions(format!("unknown TPC-H table {s:?}")))
    }
}

/// Batches of [`Table::OrdersLineitems`]: one part's orders, each with the
/// line items tpchgen generates for it (the two generators walk the same
/// orders in the same order).
struct OrdersWithLineitems {
    schema: SchemaRef,
    batches: std::vec::IntoIter<RecordBatch>,
}

impl OrdersWithLineitems {
    fn new(sf: f64, part: i32, parts: i32, batch_size: usize) -> Self {
        use arrow::array::{Array, AsArray, ListArray, StructArray};
        use arrow::buffer::OffsetBuffer;
        use arrow::datatypes::{Field, Int64Type, Schema};
        let orders: Vec<RecordBatch> = Table::Orders.batches(sf, part, parts, batch_size).collect();
        let items: Vec<RecordBatch> = Table::Lineitem.batches(sf, part, parts, 1 << 20).collect();
        let item_schema = Table::Lineitem.schema();
        let items = arrow::compute::concat_batches(&item_schema, &items).expect("line item batches share a schema");
        let item_keys = items.column(0).as_primitive::<Int64Type>().clone();
        let entries_fields: Vec<Arc<Field>> = item_schema.fields().iter().skip(1).cloned().collect();
        let entries = StructArray::new(entries_fields.clone().into(), items.columns()[1..].to_vec(), None);
        let element = Arc::new(Field::new("item", DataType::Struct(entries_fields.into()), false));
        let order_schema = Table::Orders.schema();
        let mut fields: Vec<Arc<Field>> = order_schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new("lineitems", DataType::List(element.clone()), false)));
        let schema = Arc::new(Schema::new(fields));
        let mut next = 0usize;
        let mut out = Vec::with_capacity(orders.len());
        for batch in orders {
            let keys = batch.column(0).as_primitive::<Int64Type>();
            let start = next;
            let mut offsets = Vec::with_capacity(keys.len() + 1);
            offsets.push(0i32);
            for &k in keys.values() {
                while next < item_keys.len() && item_keys.value(next) == k {
                    next += 1;
                }
                offsets.push((next - start) as i32);
            }
            let list = ListArray::new(element.clone(), OffsetBuffer::new(offsets.into()), Arc::new(entries.slice(start, next - start)), None);
            let mut columns = batch.columns().to_vec();
            columns.push(Arc::new(list) as Arc<dyn Array>);
            out.push(RecordBatch::try_new(schema.clone(), columns).expect("orders with line items"));
        }
        assert_eq!(next, item_keys.len(), "every line item belongs to an order of its part");
        OrdersWithLineitems { schema, batches: out.into_iter() }
    }
}

impl Iterator for OrdersWithLineitems {
    type Item = RecordBatch;
    fn next(&mut self) -> Option<RecordBatch> {
        self.batches.next()
    }
}

impl RecordBatchIterator for OrdersWithLineitems {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }
}

/// Which encodings the writer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingChoice {
    /// The writer's defaults: dictionary encoding with PLAIN fallback.
    Default,
    /// PLAIN only, dictionary off.
    Plain,
    /// Dictionary off; DELTA_BINARY_PACKED for integers, DELTA_LENGTH_BYTE_ARRAY for strings.
    Delta,
    /// Dictionary off; BYTE_STREAM_SPLIT for fixed-width numbers, PLAIN for strings.
    ByteStreamSplit,
}

impl FromStr for EncodingChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "default" | "dictionary" => Ok(EncodingChoice::Default),
            "plain" => Ok(EncodingChoice::Plain),
            "delta" => Ok(EncodingChoice::Delta),
            "byte-stream-split" | "bss" => Ok(EncodingChoice::ByteStreamSplit),
            other => Err(Error::InvalidOptions(format!(
                "unknown encoding {other:?}; expected default, plain, delta or byte-stream-split"
            ))),
        }
    }
}

/// Parses `snappy`, `zstd`, `zstd(3)`, `lz4_raw`, `gzip(6)`, `brotli(4)`, `none`.
pub fn parse_compression(s: &str) -> Result<Compression> {
    let s = s.trim().to_ascii_lowercase();
    let (name, level) = match s.find('(') {
        Some(i) if s.ends_with(')') => (&s[..i], Some(&s[i + 1..s.len() - 1])),
        _ => (s.as_str(), None),
    };
    let level: Option<u32> = match level {
        Some(l) => Some(l.trim().parse().map_err(|_| Error::InvalidOptions(format!("bad compression level in {s:?}")))?),
        None => None,
    };
    let bad = |e: parquet::errors::ParquetError| Error::InvalidOptions(format!("{s}: {e}"));
    Ok(match name {
        "none" | "uncompressed" => Compression::UNCOMPRESSED,
        "snappy" => Compression::SNAPPY,
        "lz4_raw" | "lz4-raw" => Compression::LZ4_RAW,
        "lz4" => Compression::LZ4,
        "zstd" => Compression::ZSTD(ZstdLevel::try_new(level.unwrap_or(1) as i32).map_err(bad)?),
        "gzip" => Compression::GZIP(GzipLevel::try_new(level.unwrap_or(6)).map_err(bad)?),
        "brotli" => Compression::BROTLI(BrotliLevel::try_new(level.unwrap_or(1)).map_err(bad)?),
        _ => return Err(Error::InvalidOptions(format!("unknown compression {s:?}"))),
    })
}

/// How to generate and write tables.
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// TPC-H scale factor (1.0 is about 1 GB of text).
    pub scale_factor: f64,
    /// Codec of every column.
    pub compression: Compression,
    /// Target row-group size, in bytes of TPC-H text (as tpchgen-cli estimates).
    pub row_group_bytes: u64,
    /// Data page size limit in bytes.
    pub page_bytes: usize,
    /// Encodings to use.
    pub encoding: EncodingChoice,
    /// Data page version 1 or 2.
    pub page_version: u8,
    /// Worker threads (0: all cores).
    pub threads: usize,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            scale_factor: 1.0,
            compression: Compression::SNAPPY,
            row_group_bytes: 7 * 1024 * 1024,
            page_bytes: 1024 * 1024,
            encoding: EncodingChoice::Default,
            page_version: 1,
            threads: 0,
        }
    }
}

impl GenOptions {
    fn writer_properties(&self, schema: &SchemaRef) -> WriterProperties {
        let mut b = WriterProperties::builder()
            .set_compression(self.compression)
            .set_data_page_size_limit(self.page_bytes)
            .set_writer_version(if self.page_version == 2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 });
        if self.encoding != EncodingChoice::Default {
            b = b.set_dictionary_enabled(false);
            for f in schema.fields() {
                let enc = match (self.encoding, f.data_type()) {
                    (EncodingChoice::Plain, _) => Encoding::PLAIN,
                    (EncodingChoice::Delta, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8) => {
                        Encoding::DELTA_LENGTH_BYTE_ARRAY
                    }
                    (EncodingChoice::Delta, DataType::Int32 | DataType::Int64 | DataType::Date32 | DataType::Decimal128(..)) => {
                        Encoding::DELTA_BINARY_PACKED
                    }
                    (EncodingChoice::ByteStreamSplit, DataType::Int32 | DataType::Int64 | DataType::Date32 | DataType::Decimal128(..) | DataType::Float64) => {
                        Encoding::BYTE_STREAM_SPLIT
                    }
                    _ => Encoding::PLAIN,
                };
                b = b.set_column_encoding(ColumnPath::from(f.name().as_str()), enc);
            }
        }
        b.build()
    }

    /// Rows per part (row group) for `table`.
    pub fn parts(&self, table: Table) -> i32 {
        if matches!(table, Table::Nation | Table::Region) {
            return 1;
        }
        let bytes = table.row_count(self.scale_factor) * table.avg_row_bytes();
        ((bytes / self.row_group_bytes.max(1)) + 1).min(32_767) as i32
    }
}

/// Generates `table` into `dir/<table>.parquet`; `progress` is called with the rows written so far.
pub fn generate_table(
    table: Table,
    dir: &Path,
    options: &GenOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Open { file: dir.to_path_buf(), source })?;
    let path = dir.join(format!("{}.parquet", table.name()));
    write_parts(table, &path, options, 0..options.parts(table), progress)?;
    Ok(path)
}

/// The eight tables at `sf` (default options) in `root/gpq-tpch-sf<sf>`,
/// generated once and reused: by later calls, later runs, and processes
/// running at the same time. One generator at a time per process, each
/// into a directory of its own that is then renamed into place; a process
/// that finds the place taken keeps what is there. For tests and
/// benchmarks that share generated data.
pub fn generate_once(root: &Path, sf: f64) -> Result<PathBuf> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = root.join(format!("gpq-tpch-sf{sf}"));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    let io = |file: &Path| {
        let file = file.to_path_buf();
        move |source| Error::Open { file, source }
    };
    let work = root.join(format!("gpq-tpch-sf{sf}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let options = GenOptions { scale_factor: sf, ..Default::default() };
    for t in Table::ALL {
        generate_table(t, &work, &options, &|_| {})?;
    }
    std::fs::write(work.join(".complete"), b"").map_err(io(&work))?;
    if std::fs::rename(&work, &dir).is_err() {
        if dir.join(".complete").exists() {
            // Another process published it first.
            std::fs::remove_dir_all(&work).map_err(io(&work))?;
        } else {
            // An incomplete copy from an interrupted run is in the way.
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
            std::fs::rename(&work, &dir).map_err(io(&dir))?;
        }
    }
    Ok(dir)
}

/// Generates `table` as `files` files (`dir/<table>/part-00000.parquet`, ...),
/// each a run of consecutive parts (row groups), the table's rows in order
/// across them: a directory of many files for reading as one table. Returns
/// the folder.
pub fn generate_table_files(
    table: Table,
    dir: &Path,
    options: &GenOptions,
    files: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<PathBuf> {
    let folder = dir.join(table.name());
    std::fs::create_dir_all(&folder).map_err(|source| Error::Open { file: folder.clone(), source })?;
    let parts = options.parts(table);
    let files = files.clamp(1, parts as usize) as i32;
    let mut written = 0u64;
    for f in 0..files {
        let range = parts * f / files..parts * (f + 1) / files;
        let path = folder.join(format!("part-{f:05}.parquet"));
        written += write_parts(table, &path, options, range, &|rows| progress(written + rows))?;
    }
    Ok(folder)
}

/// Writes parts `range` (of `options.parts(table)`) of `table` to `path`,
/// one row group each; returns the rows written.
fn write_parts(
    table: Table,
    path: &Path,
    options: &GenOptions,
    range: std::ops::Range<i32>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let path = path.to_path_buf();
    // A name no other writer uses, so generators running at the same time
    // (parallel tests) never write into one file; the rename publishes it.
    static UNIQUE: AtomicUsize = AtomicUsize::new(0);
    let tmp = dir.join(format!(
        ".{}.parquet.{}.{}.tmp",
        table.name(),
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    ));
    let io_err = |source: std::io::Error| Error::Open { file: tmp.clone(), source };
    let pq_err = |source: parquet::errors::ParquetError| Error::Metadata { file: path.clone(), source };

    let schema = table.schema();
    let props = options.writer_properties(&schema);
    let file = File::create(&tmp).map_err(io_err)?;
    let writer = ArrowWriter::try_new(BufWriter::with_capacity(8 << 20, file), schema.clone(), Some(props)).map_err(pq_err)?;
    let (mut file_writer, factory) = writer.into_serialized_writer().map_err(pq_err)?;
    let factory = Arc::new(factory);

    let all_parts = options.parts(table);
    let first_part = range.start;
    let parts = range.end - range.start;
    let threads = if options.threads == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4)
    } else {
        options.threads
    }
    .min(parts as usize)
    .max(1);
    let next_part = AtomicUsize::new(0);
    // Parts encoded but not yet written, bounded so memory stays flat.
    let done: Mutex<(BTreeMap<usize, Result<Vec<ArrowColumnChunk>>>, usize)> = Mutex::new((BTreeMap::new(), 0));
    let cv = Condvar::new();
    let window = 2 * threads;
    let sf = options.scale_factor;

    let encode = |index: usize| -> Result<(Vec<ArrowColumnChunk>, u64)> {
        let mut writers = factory.create_column_writers(index).map_err(pq_err)?;
        let mut rows = 0u64;
        for batch in table.batches(sf, first_part + index as i32 + 1, all_parts, 8192) {
            rows += batch.num_rows() as u64;
            write_batch(&batch, &schema, &mut writers).map_err(pq_err)?;
        }
        let chunks = writers.into_iter().map(|w| w.close()).collect::<parquet::errors::Result<Vec<_>>>().map_err(pq_err)?;
        Ok((chunks, rows))
    };

    let mut total_rows = 0u64;
    let write_result: Result<()> = std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next_part.fetch_add(1, Ordering::Relaxed);
                if index >= parts as usize {
                    return;
                }
                {
                    let mut g = done.lock().unwrap();
                    while index >= g.1 + window {
                        g = cv.wait(g).unwrap();
                    }
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encode(index)))
                    .unwrap_or_else(|_| Err(Error::Internal(format!("generating part {index} of {} panicked", table.name()))));
                let mut g = done.lock().unwrap();
                g.0.insert(index, r.map(|(c, _)| c));
                cv.notify_all();
            });
        }
        // Append parts in order as they arrive.
        for index in 0..parts as usize {
            let chunks = {
                let mut g = done.lock().unwrap();
                loop {
                    if let Some(r) = g.0.remove(&index) {
                        break r;
                    }
                    g = cv.wait(g).unwrap();
                }
            };
            let chunks = match chunks {
                Ok(c) => c,
                Err(e) => {
                    // Let the workers run out of parts quickly.
                    next_part.store(usize::MAX / 2, Ordering::Relaxed);
                    let mut g = done.lock().unwrap();
                    g.1 = usize::MAX / 4;
                    cv.notify_all();
                    return Err(e);
                }
            };
            let mut rg = file_writer.next_row_group().map_err(pq_err)?;
            for c in chunks {
                c.append_to_row_group(&mut rg).map_err(pq_err)?;
            }
            let meta = rg.close().map_err(pq_err)?;
            total_rows += meta.num_rows() as u64;
            progress(total_rows);
            let mut g = done.lock().unwrap();
            g.1 = index + 1;
            cv.notify_all();
        }
        Ok(())
    });
    let finished = write_result.and_then(|()| file_writer.close().map(|_| ()).map_err(pq_err));
    if let Err(e) = finished {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &path).map_err(|source| Error::Open { file: path.clone(), source })?;
    Ok(total_rows)
}

fn write_batch(
    batch: &RecordBatch,
    schema: &SchemaRef,
    writers: &mut [parquet::arrow::arrow_writer::ArrowColumnWriter],
) -> parquet::errors::Result<()> {
    let mut w = writers.iter_mut();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        for leaf in compute_leaves(field, column)? {
            w.next().expect("one writer per leaf").write(&leaf)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All rows of the Parquet files of `path` (a file or a folder), in order.
    fn read_all(path: &Path) -> Vec<RecordBatch> {
        let mut out = Vec::new();
        for f in gpq::parquet_files(path).unwrap() {
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(File::open(f).unwrap())
                .unwrap()
                .build()
                .unwrap();
            out.extend(reader.map(|b| b.unwrap()));
        }
        out
    }

    #[test]
    fn a_table_in_several_files_holds_the_rows_of_one() {
        let dir = std::env::temp_dir().join(format!("gpq-tpch-files-{}", std::process::id()));
        let options = GenOptions { scale_factor: 0.01, row_group_bytes: 256 << 10, ..GenOptions::default() };
        let parts = options.parts(Table::Orders);
        assert!(parts >= 3, "{parts} parts");
        let one = generate_table(Table::Orders, &dir.join("one"), &options, &|_| ()).unwrap();
        let folder = generate_table_files(Table::Orders, &dir.join("many"), &options, 3, &|_| ()).unwrap();
        assert_eq!(gpq::parquet_files(&folder).unwrap().len(), 3);
        let (a, b) = (read_all(&one), read_all(&folder));
        let schema = a[0].schema();
        let (a, b) = (arrow::compute::concat_batches(&schema, &a).unwrap(), arrow::compute::concat_batches(&schema, &b).unwrap());
        assert_eq!(a.num_rows(), b.num_rows());
        assert_eq!(a, b, "the same rows in the same order");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
