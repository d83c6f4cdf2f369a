//! `gpq gen`: TPC-H tables as Parquet, with a progress bar per table.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use gpq_bench::tpch::{self, EncodingChoice, GenOptions, Table};
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `gpq gen`.
#[derive(Args)]
pub struct GenArgs {
    /// TPC-H scale factor (1 is about 1 GB of text; lineitem has about 6 million rows per unit).
    #[arg(short = 's', long, default_value_t = 1.0)]
    pub scale_factor: f64,
    /// Output directory; each table is written as <DIR>/<table>.parquet.
    #[arg(short, long)]
    pub out: PathBuf,
    /// Tables to generate (comma-separated); all eight by default. Also
    /// `orders_lineitems`: orders with each order's line items as a
    /// `list<struct>` column, for benchmarks of nested decoding.
    #[arg(long, value_delimiter = ',')]
    pub tables: Option<Vec<String>>,
    /// Codec: snappy, zstd(N), lz4_raw, gzip(N), brotli(N) or none.
    #[arg(long, default_value = "snappy")]
    pub compression: String,
    /// Target row-group size in bytes of TPC-H text, as tpchgen-cli estimates it (e.g. 7M, 128M).
    #[arg(long, default_value = "7M", value_parser = parse_bytes)]
    pub row_group_bytes: u64,
    /// Data page size limit in bytes.
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    pub page_bytes: u64,
    /// Encodings: default (dictionary, PLAIN fallback), plain, delta, byte-stream-split.
    #[arg(long, default_value = "default")]
    pub encoding: String,
    /// Data page version (1 or 2).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub page_version: u8,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Regenerate tables whose file already exists.
    #[arg(long)]
    pub force: bool,
    /// Write each table as this many files in OUT/<table>/ (runs of row
    /// groups, rows in order), a folder to read as one table; 1: OUT/<table>.parquet.
    #[arg(long, default_value_t = 1)]
    pub files: usize,
}

pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    gpq::options::parse_size(s).ok_or_else(|| format!("{s:?} is not a size (e.g. 4096, 64k, 7M, 1G)"))
}

/// Generates the tables; returns the files written.
pub fn generate(args: &GenArgs) -> gpq::Result<Vec<PathBuf>> {
    let tables: Vec<Table> = match &args.tables {
        None => Table::ALL.to_vec(),
        Some(names) => names.iter().map(|n| n.parse()).collect::<gpq::Result<_>>()?,
    };
    let options = GenOptions {
        scale_factor: args.scale_factor,
        compression: tpch::parse_compression(&args.compression)?,
        row_group_bytes: args.row_group_bytes,
        page_bytes: args.page_bytes as usize,
        encoding: args.encoding.parse::<EncodingChoice>()?,
        page_version: args.page_version,
        threads: args.threads,
    };
    let style = ProgressStyle::with_template("{prefix:>9} [{bar:30}] {pos}/{len} rows ({per_sec}, {eta})")
        .expect("valid template")
        .progress_chars("=> ");
    let mut written = Vec::new();
    for table in tables {
        let path = match args.files {
            0 | 1 => args.out.join(format!("{}.parquet", table.name())),
            _ => args.out.join(table.name()),
        };
        if path.exists() && !args.force {
            eprintln!("{:>9} exists, kept ({})", table.name(), path.display());
            written.push(path);
            continue;
        }
        let bar = ProgressBar::new(table.row_count(options.scale_factor)).with_style(style.clone()).with_prefix(table.name());
        let t = Instant::now();
        let path = match args.files {
            0 | 1 => tpch::generate_table(table, &args.out, &options, &|rows| bar.set_position(rows))?,
            n => tpch::generate_table_files(table, &args.out, &options, n, &|rows| bar.set_position(rows))?,
        };
        bar.finish_and_clear();
        let size = gpq::parquet_files(&path)
            .map(|files| files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        eprintln!(
            "{:>9} {} in {:.1} s -> {}",
            table.name(),
            crate::human_bytes(size),
            t.elapsed().as_secs_f64(),
            path.display()
        );
        written.push(path);
    }
    Ok(written)
}

pub fn run(args: GenArgs) -> gpq::Result<ExitCode> {
    generate(&args)?;
    Ok(ExitCode::SUCCESS)
}
