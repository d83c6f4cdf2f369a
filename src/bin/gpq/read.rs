//! `gpq read`: read files onto the GPU and report what happened.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use gpq::{IoPath, ReadOptions};

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
    /// IO path: auto, gds, cufile-compat or bounce.
    #[arg(long, default_value = "auto")]
    pub io: String,
    /// IO worker threads (default: GPQ_IO_THREADS, else cores up to 16).
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// Repeat each read this many times and report the median.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Only move the column-chunk bytes (no decode).
    #[arg(long)]
    pub io_only: bool,
    /// After the read, check on the device that every chunk's bytes match the file.
    #[arg(long)]
    pub verify: bool,
}

pub fn files_in(path: &Path) -> gpq::Result<Vec<PathBuf>> {
    if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| gpq::Error::Io { file: path.to_path_buf(), offset: 0, len: 0, source })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
            .collect();
        v.sort();
        Ok(v)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

pub fn options_from(args: &ReadArgs) -> gpq::Result<ReadOptions> {
    let mut o = ReadOptions::new().with_io_path(args.io.parse::<IoPath>()?);
    if let Some(c) = &args.columns {
        o = o.with_columns(c.iter().map(|s| s.as_str()));
    }
    if let Some(r) = &args.row_groups {
        o = o.with_row_groups(r.iter().copied());
    }
    if let Some(t) = args.io_threads {
        o = o.with_io_threads(t);
    }
    Ok(o)
}

pub fn run(args: ReadArgs) -> gpq::Result<ExitCode> {
    let options = options_from(&args)?;
    for file in files_in(&args.path)? {
        let mut secs = Vec::new();
        let mut last = None;
        for _ in 0..args.repeat.max(1) {
            let chunks = gpq::read_column_chunks(&file, &options)?;
            secs.push(chunks.io.wall.as_secs_f64());
            last = Some(chunks);
        }
        let chunks = last.expect("at least one read");
        let io = &chunks.io;
        let t = median(&mut secs);
        println!("{}", file.display());
        println!("  IO path:     {} ({})", io.path, io.reason);
        println!("  threads:     {} ({} tasks{})", io.threads, io.tasks, if io.direct { ", O_DIRECT" } else { "" });
        println!("  bytes:       requested {}, read {}", human_bytes(io.bytes_requested), human_bytes(io.bytes_read));
        println!("  plan:        {:.3} ms", chunks.plan_time.as_secs_f64() * 1e3);
        println!("  IO:          {:.3} ms (median of {}), {:.2} GB/s", t * 1e3, secs.len(), io.bytes_read as f64 / t / 1e9);
        if args.verify {
            let dev = gpq::io::verify::device_chunk_checksums(&chunks)?;
            let host = gpq::io::verify::file_chunk_checksums(&chunks)?;
            let bad = dev.iter().zip(&host).filter(|(a, b)| a != b).count();
            println!("  verify:      {} of {} chunks match the file", dev.len() - bad, dev.len());
            if bad > 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
