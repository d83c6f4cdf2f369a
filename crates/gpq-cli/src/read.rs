//! `gpq read`: read files onto the GPU and report what happened.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use gpq::ReadOptions;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{human_bytes, median};

/// Arguments of `gpq read`.
#[derive(Args)]
pub struct ReadArgs {
    /// A Parquet file, or a directory whose .parquet files are read one after another.
    pub path: PathBuf,
    /// Columns to read (comma-separated names or dotted paths); all by default.
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Row groups to read (comma-separated indices); all by default.
    #[arg(long, value_delimiter = ',')]
    pub row_groups: Option<Vec<usize>>,
    /// IO path: auto, gds, cufile-compat or bounce (default: GPQ_IO, else auto).
    #[arg(long)]
    pub io: Option<String>,
    /// IO worker threads (default: GPQ_IO_THREADS, else cores up to 16).
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// Repeat each read this many times and report the median.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Only move the column-chunk bytes (no decode).
    #[arg(long)]
    pub io_only: bool,
    /// With --io-only: check on the device that every chunk's bytes match the file.
    /// Otherwise: compare the decoded columns with arrow-rs reading the same file.
    #[arg(long)]
    pub verify: bool,
    /// Decompressor: auto (nvCOMP where possible), nvcomp, or cpu (default: GPQ_DECOMPRESS, else auto).
    #[arg(long)]
    pub decompress: Option<String>,
    /// Read in batches of at most this many rows (whole row groups), through the batch reader.
    #[arg(long)]
    pub batch_rows: Option<usize>,
    /// Read in batches that keep the reader's device memory under this size
    /// (e.g. 1GiB), through the batch reader; the peak is reported.
    #[arg(long, value_parser = parse_size_arg)]
    pub memory_limit: Option<u64>,
    /// Read only rows START..END of the file (e.g. 1000000..1010000), through
    /// the batch reader: only the row groups, and in flat columns only the
    /// pages where the file has an offset index, that hold them.
    #[arg(long, value_parser = parse_row_range)]
    pub rows: Option<(u64, u64)>,
    /// Read at most this many rows, through the batch reader.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Through the batch reader: how many passes are read and decoded at
    /// once (default: as many as a quarter of the free device memory holds,
    /// at most 16; under --memory-limit, 4, sharing the limit).
    #[arg(long)]
    pub decode_ahead: Option<usize>,
    /// Split a whole read into this many groups of row groups whose IO, page
    /// headers and decompression overlap (1: none; default: chosen from the
    /// read's size).
    #[arg(long)]
    pub groups: Option<usize>,
}

fn parse_row_range(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("not a row range: {s:?} (e.g. 1000..2000)");
    let (a, b) = s.split_once("..").ok_or_else(bad)?;
    let (a, b) = (a.trim().parse::<u64>().map_err(|_| bad())?, b.trim().parse::<u64>().map_err(|_| bad())?);
    if a > b {
        return Err(bad());
    }
    Ok((a, b))
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    gpq::options::parse_size(s).ok_or_else(|| format!("not a size: {s:?} (e.g. 512MiB, 1GiB)"))
}

pub fn options_from(args: &ReadArgs) -> gpq::Result<ReadOptions> {
    let mut o = crate::read_options(args.io.as_deref(), args.io_threads, args.decompress.as_deref())?;
    if let Some(c) = &args.columns {
        o = o.with_columns(c.iter().map(|s| s.as_str()));
    }
    if let Some(r) = &args.row_groups {
        o = o.with_row_groups(r.iter().copied());
    }
    if let Some(g) = args.groups {
        o = o.with_overlap_groups(g);
    }
    Ok(o)
}

/// A progress bar over the files of a long read (none for a single file).
fn progress(files: usize) -> ProgressBar {
    if files < 2 {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{prefix:>6} [{bar:30}] {pos}/{len} files ({eta})")
        .expect("valid template")
        .progress_chars("=> ");
    ProgressBar::new(files as u64).with_style(style).with_prefix("read")
}

pub fn run(args: ReadArgs) -> gpq::Result<ExitCode> {
    if !args.io_only {
        return run_decode(&args);
    }
    let options = options_from(&args)?;
    let files = gpq::parquet_files(&args.path)?;
    let bar = progress(files.len());
    for file in files {
        let mut secs = Vec::new();
        let mut last = None;
        for _ in 0..args.repeat.max(1) {
            let chunks = gpq::read_column_chunks(&file, &options)?;
            secs.push(chunks.io().wall.as_secs_f64());
            last = Some(chunks);
        }
        let Some(chunks) = last else { continue };
        let io = chunks.io();
        let t = median(&mut secs);
        bar.inc(1);
        bar.suspend(|| println!("{}", file.display()));
        println!("  IO path:     {} ({})", io.path, io.reason);
        println!("  threads:     {} ({} tasks{})", io.threads, io.tasks, if io.direct { ", O_DIRECT" } else { "" });
        println!("  bytes:       requested {}, read {}", human_bytes(io.bytes_requested), human_bytes(io.bytes_read));
        println!("  plan:        {:.3} ms", chunks.plan_time().as_secs_f64() * 1e3);
        println!("  IO:          {:.3} ms (median of {}), {:.2} GB/s", t * 1e3, secs.len(), io.bytes_read as f64 / t / 1e9);
        if args.verify {
            let dev = gpq::gpu::verify::device_chunk_checksums(&chunks)?;
            let host = gpq::gpu::verify::file_chunk_checksums(&chunks)?;
            let bad = dev.iter().zip(&host).filter(|(a, b)| a != b).count();
            println!("  verify:      {} of {} chunks match the file", dev.len() - bad, dev.len());
            if bad > 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_decode(args: &ReadArgs) -> gpq::Result<ExitCode> {
    if args.batch_rows.is_some() || args.memory_limit.is_some() || args.rows.is_some() || args.limit.is_some() || args.decode_ahead.is_some() {
        return run_batches(args);
    }
    let options = options_from(args)?;
    let mut failed = false;
    let files = gpq::parquet_files(&args.path)?;
    let bar = progress(files.len());
    for file in files {
        // One table alive at a time: a read's outputs are freed before the
        // next read, as in a consumer that uses each table and drops it (the
        // memory pool then serves the next read from what the last one freed;
        // keeping every table would measure the pool's growth instead).
        let mut runs: Vec<gpq::ReadStats> = Vec::new();
        let mut kept: Option<gpq::DeviceTable> = None;
        let repeat = args.repeat.max(1);
        for _ in 0..repeat {
            drop(kept.take());
            let t = gpq::read_parquet_to_device(&file, &options)?;
            runs.push(t.stats().clone());
            kept = Some(t);
        }
        bar.inc(1);
        let Some(table) = kept else { continue };
        // The run with the median total, so that its stages add up to the time shown.
        runs.sort_by(|a, b| a.total.cmp(&b.total));
        let s = &runs[runs.len() / 2];
        let med = s.total.as_secs_f64();
        let Some(io) = s.io.as_ref() else { continue };
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        bar.suspend(|| println!("{}", file.display()));
        println!("  rows x cols:   {} x {}", table.num_rows(), table.columns().len());
        println!("  IO path:       {} ({})", io.path, io.reason);
        println!("  decompression: {}{}", s.decompression.path(), match &s.decompression.fallback {
            Some(f) => format!(" (on the CPU: {f})"),
            None => String::new(),
        });
        println!("  pages:         {} ({} on GPU, {} on CPU decompressed)", s.pages, s.decompression.gpu_pages, s.decompression.cpu_pages);
        println!(
            "  stages (ms):   plan {:.2} | io {:.2} | page headers {:.2} | decompress {:.2} | decode {:.2} | total {:.2}",
            ms(s.plan), ms(io.wall), ms(s.page_headers), ms(s.decompress), ms(s.decode), ms(s.total)
        );
        if let Some(o) = &s.overlap {
            println!(
                "  overlap:       {} groups; their page headers, decompression and values (stage times summed over the groups) ran beside the IO, ending {:.2} ms after it",
                o.groups,
                ms(o.after_io)
            );
        }
        println!(
            "  throughput:    {:.2} GB/s of file bytes, {:.2} GB/s decoded ({} in, {} out; median of {})",
            io.bytes_read as f64 / med / 1e9,
            s.decoded_bytes as f64 / med / 1e9,
            human_bytes(io.bytes_read),
            human_bytes(s.decoded_bytes),
            runs.len()
        );
        if args.verify {
            let same = same_rows(&table.to_record_batch()?, &arrow_rs_read(&file, &options)?);
            println!("  verify:        {}", if same { "equal to arrow-rs" } else { "DIFFERS from arrow-rs" });
            failed |= !same;
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// What arrow-rs reads for the same selection, as one batch.
pub fn arrow_rs_read(file: &Path, options: &ReadOptions) -> gpq::Result<arrow::array::RecordBatch> {
    use arrow::array::RecordBatchReader;
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let plan = gpq::ReadPlan::new(file, options)?;
    let perr = |source| gpq::Error::Metadata { file: file.to_path_buf(), source };
    let f = std::fs::File::open(file).map_err(|source| gpq::Error::Open { file: file.to_path_buf(), source })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(f).map_err(perr)?;
    let leaves: Vec<usize> = plan.columns().iter().flat_map(|c| c.leaves.iter().map(|l| l.leaf_index)).collect();
    let mask = ProjectionMask::leaves(builder.parquet_schema(), leaves);
    let reader = builder.with_projection(mask).with_row_groups(plan.row_groups().to_vec()).build().map_err(perr)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    let batch = arrow::compute::concat_batches(&schema, &batches)?;
    // arrow-rs returns file order; put columns in gpq's order.
    let cols = plan
        .schema()
        .fields()
        .iter()
        .map(|f| {
            batch
                .column_by_name(f.name())
                .cloned()
                .ok_or_else(|| gpq::Error::Internal(format!("arrow-rs did not return column {}", f.name())))
        })
        .collect::<gpq::Result<Vec<_>>>()?;
    Ok(arrow::array::RecordBatch::try_new(plan.schema().clone(), cols)?)
}

/// Whether two batches hold the same rows (column by column, in order).
fn same_rows(got: &arrow::array::RecordBatch, expected: &arrow::array::RecordBatch) -> bool {
    got.num_rows() == expected.num_rows() && got.columns().iter().zip(expected.columns()).all(|(a, b)| a == b)
}

/// `gpq read --batch-rows/--memory-limit/--rows/--limit`: the file, or all of a
/// directory's files as one sequence, through the batch reader, every batch
/// freed before the next (a consumer that keeps none).
fn run_batches(args: &ReadArgs) -> gpq::Result<ExitCode> {
    let options = options_from(args)?;
    let files = gpq::parquet_files(&args.path)?;
    let mut walls = Vec::new();
    let mut last = None;
    for _ in 0..args.repeat.max(1) {
        let t = std::time::Instant::now();
        let mut builder = gpq::DeviceReaderBuilder::try_new_files(&files)?.with_options(options.clone());
        if let Some(r) = args.batch_rows {
            builder = builder.with_batch_rows(r);
        }
        if let Some(m) = args.memory_limit {
            builder = builder.with_device_memory_limit(m);
        }
        if let Some((a, b)) = args.rows {
            use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
            let select = usize::try_from(b - a).unwrap_or(usize::MAX);
            builder = builder.with_row_selection(RowSelection::from(vec![RowSelector::skip(a as usize), RowSelector::select(select)]));
        }
        if let Some(n) = args.limit {
            builder = builder.with_limit(n);
        }
        if let Some(n) = args.decode_ahead {
            builder = builder.with_decode_ahead(n);
        }
        let mut reader = builder.build()?;
        let ahead = reader.decode_ahead();
        let (mut batches, mut rows, mut decoded, mut requested) = (0usize, 0usize, 0u64, 0u64);
        let mut host = Vec::new();
        for batch in reader.by_ref() {
            let batch = batch?;
            batches += 1;
            rows += batch.num_rows();
            decoded += batch.device_bytes();
            requested += batch.stats().io.as_ref().map_or(0, |io| io.bytes_requested);
            if args.verify {
                host.push(batch.to_record_batch()?);
            }
        }
        walls.push(t.elapsed().as_secs_f64());
        // (Fewer at the end where the passes at once took more than a memory limit.)
        let ahead = (ahead, reader.decode_ahead());
        last = Some((batches, rows, decoded, requested, reader.peak_device_memory(), reader.schema().clone(), host, ahead));
    }
    let Some((batches, rows, decoded, requested, peak, schema, host, ahead)) = last else { return Ok(ExitCode::SUCCESS) };
    let med = median(&mut walls);
    println!("{} ({} file{})", args.path.display(), files.len(), if files.len() == 1 { "" } else { "s" });
    match ahead {
        (first, end) if first == end => println!("  batches:       {batches} ({rows} rows; {first} decoded at once)"),
        (first, end) => println!("  batches:       {batches} ({rows} rows; {first} decoded at once, {end} after the memory limit was reached)"),
    }
    println!("  bytes:         requested {}", human_bytes(requested));
    println!("  wall:          {:.2} ms (median of {}), {:.2} GB/s decoded ({})", med * 1e3, walls.len(), decoded as f64 / med / 1e9, human_bytes(decoded));
    match (peak, args.memory_limit) {
        (Some(p), Some(l)) => println!("  device memory: peak {} of the {} limit", human_bytes(p), human_bytes(l)),
        _ => println!("  device memory: no limit"),
    }
    if args.verify {
        let got = arrow::compute::concat_batches(&schema, &host)?;
        let parts = files.iter().map(|f| arrow_rs_read(f, &options)).collect::<gpq::Result<Vec<_>>>()?;
        let mut expected = arrow::compute::concat_batches(&schema, &parts)?;
        if let Some((a, b)) = args.rows {
            let a = (a as usize).min(expected.num_rows());
            expected = expected.slice(a, (b as usize).min(expected.num_rows()) - a);
        }
        if let Some(n) = args.limit {
            expected = expected.slice(0, n.min(expected.num_rows()));
        }
        let same = same_rows(&got, &expected);
        println!("  verify:        {}", if same { "equal to arrow-rs" } else { "DIFFERS from arrow-rs" });
        if !same {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
