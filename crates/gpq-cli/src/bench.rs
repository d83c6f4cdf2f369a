//! `gpq bench`: benchmarks that print a Markdown table.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use gpq::{IoPath, ReadPlan};

use crate::{human_bytes, median};

/// Arguments of `gpq bench`: without a subcommand, the side-by-side TPC-H suite.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    #[command(flatten)]
    pub suite: crate::suite::SuiteArgs,
}

/// Which benchmark.
#[derive(Subcommand)]
pub enum BenchWhat {
    /// Raw IO throughput: all column chunks of a file into device memory, per path and thread count.
    Io(IoBenchArgs),
    /// Full reads (plan, IO, page headers, decompression, decode) of column sets of one file.
    Decode(DecodeBenchArgs),
    /// The 22 TPC-H queries through DataFusion: built-in Parquet tables vs gpq tables.
    #[cfg(feature = "datafusion")]
    Tpch(crate::sql::TpchBenchArgs),
}

/// Arguments of `gpq bench decode`.
#[derive(Args)]
pub struct DecodeBenchArgs {
    /// The Parquet file.
    pub file: PathBuf,
    /// Column sets, separated by ';' (columns within a set by ','); "all" reads every column.
    #[arg(long, default_value = "all;l_orderkey;l_extendedprice;l_shipdate;l_comment")]
    pub sets: String,
    /// Timed repetitions per set (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// IO path (default: GPQ_IO, else auto).
    #[arg(long)]
    pub io: Option<String>,
    /// IO threads (default: GPQ_IO_THREADS, else cores up to 16).
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// Decompressor: auto, nvcomp or cpu (default: GPQ_DECOMPRESS, else auto).
    #[arg(long)]
    pub decompress: Option<String>,
}

/// Arguments of `gpq bench io`.
#[derive(Args)]
pub struct IoBenchArgs {
    /// The Parquet file.
    pub file: PathBuf,
    /// IO paths to compare (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "bounce,cufile-compat")]
    pub paths: Vec<String>,
    /// Thread counts to compare (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    pub threads: Vec<usize>,
    /// Task sizes to compare (comma-separated, e.g. 4M,8M).
    #[arg(long, value_delimiter = ',', default_value = "4M")]
    pub task_sizes: Vec<String>,
    /// Timed repetitions per configuration (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Also measure O_DIRECT on the bounce path.
    #[arg(long)]
    pub direct: bool,
}

pub fn run(args: BenchArgs) -> gpq::Result<ExitCode> {
    match args.what {
        None => crate::suite::run(args.suite),
        Some(BenchWhat::Io(a)) => io(a),
        Some(BenchWhat::Decode(a)) => decode(a),
        #[cfg(feature = "datafusion")]
        Some(BenchWhat::Tpch(a)) => crate::sql::bench_tpch(a),
    }
}

fn io(args: IoBenchArgs) -> gpq::Result<ExitCode> {
    let base = crate::read_options(None, None, None)?;
    let plan = ReadPlan::new(&args.file, &base)?;
    println!(
        "file {} ({}), {} chunks, {} bytes requested, {} read",
        args.file.display(),
        human_bytes(plan.file_size()),
        plan.chunks().len(),
        plan.io().bytes_requested,
        plan.io().bytes_read
    );
    println!("\n| path | threads | task size | O_DIRECT | median s | GB/s | min s | max s |");
    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |");
    for path in &args.paths {
        let io_path: IoPath = path.parse()?;
        let directs: &[bool] = if io_path == IoPath::Bounce && args.direct { &[false, true] } else { &[false] };
        for &direct in directs {
            for ts in &args.task_sizes {
                let task = gpq::options::parse_size(ts).ok_or_else(|| gpq::Error::InvalidOptions(format!("bad task size {ts}")))?;
                for &threads in &args.threads {
                    let o = base
                        .clone()
                        .with_io_path(io_path)
                        .with_io_threads(threads)
                        .with_task_size(task)
                        .with_direct_io(direct);
                    let mut secs = Vec::new();
                    let mut failure = None;
                    for i in 0..=args.repeat {
                        match gpq::read_column_chunks(&args.file, &o) {
                            Ok(c) if i > 0 => secs.push(c.io().wall.as_secs_f64()),
                            Ok(_) => {}
                            Err(e) => {
                                failure = Some(e);
                                break;
                            }
                        }
                    }
                    if let Some(e) = failure {
                        println!("| {io_path} | {threads} | {ts} | {direct} | failed: {e} | | | |");
                        continue;
                    }
                    let min = secs.iter().cloned().fold(f64::MAX, f64::min);
                    let max = secs.iter().cloned().fold(0.0, f64::max);
                    let med = median(&mut secs);
                    println!(
                        "| {io_path} | {threads} | {ts} | {direct} | {med:.4} | {:.1} | {min:.4} | {max:.4} |",
                        plan.io().bytes_read as f64 / med / 1e9
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn decode(args: DecodeBenchArgs) -> gpq::Result<ExitCode> {
    let file_size = std::fs::metadata(&args.file).map(|m| m.len()).unwrap_or(0);
    println!("file {} ({}), median of {} after one warm-up", args.file.display(), human_bytes(file_size), args.repeat);
    println!("\n| columns | rows | median s | plan ms | io ms | headers ms | decompress ms | decode ms | io path | decompression | file GB/s | decoded MB | decoded GB/s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |");
    for set in args.sets.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let mut o = crate::read_options(args.io.as_deref(), args.io_threads, args.decompress.as_deref())?;
        if set != "all" {
            o = o.with_columns(set.split(',').map(str::trim));
        }
        let mut runs = Vec::new();
        // Bytes of the decoded Arrow buffers on the device (values, offsets,
        // validity of every level): the denominator for comparing files of
        // different shapes.
        let mut decoded = 0u64;
        for i in 0..=args.repeat.max(1) {
            let t = gpq::read_parquet_to_device(&args.file, &o)?;
            decoded = t.device_bytes();
            if i > 0 {
                runs.push(t.stats().clone());
            }
            drop(t);
        }
        // The run with the median total, so its stages add up to the time shown.
        runs.sort_by(|a, b| a.total.cmp(&b.total));
        let m = &runs[runs.len() / 2];
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let Some(io) = m.io.as_ref() else { continue };
        let rows = ReadPlan::new(&args.file, &o)?.num_rows();
        println!(
            "| {set} | {rows} | {:.4} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {:.1} | {:.1} |",
            m.total.as_secs_f64(),
            ms(m.plan),
            ms(io.wall),
            ms(m.page_headers),
            ms(m.decompress),
            ms(m.decode),
            io.path,
            m.decompression.path(),
            io.bytes_read as f64 / m.total.as_secs_f64() / 1e9,
            decoded as f64 / 1e6,
            decoded as f64 / m.total.as_secs_f64() / 1e9
        );
    }
    Ok(ExitCode::SUCCESS)
}
