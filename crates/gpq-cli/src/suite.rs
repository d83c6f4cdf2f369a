//! `gpq bench` (without a subcommand): the side-by-side suite over TPC-H
//! (measurements in `gpq_bench::suite`); prints a Markdown table and writes
//! it with a JSON copy.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use gpq::cuda::GpuContext;
use gpq_bench::suite::{self, SuiteConfig};
use gpq_bench::tpch::Table;

/// Arguments of the suite.
#[derive(Args, Clone)]
pub struct SuiteArgs {
    /// TPC-H scale factor of the data (generated where missing).
    #[arg(short = 's', long, default_value_t = 10.0)]
    pub scale_factor: f64,
    /// Data directory; each layout goes in <DATA>/<layout>/. Default: data/sf<SF>.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Layouts to run (comma-separated): default, gpu, zstd.
    #[arg(long, value_delimiter = ',', default_value = "default,gpu,zstd")]
    pub layouts: Vec<String>,
    /// Tables to run (comma-separated); all eight by default.
    #[arg(long, value_delimiter = ',')]
    pub tables: Option<Vec<String>>,
    /// Timed repetitions (median, after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Also measure with a cold page cache (needs root to drop caches).
    #[arg(long)]
    pub cold: bool,
    /// Where to write <OUT>.md and <OUT>.json.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// CPU threads for arrow-rs (default: all cores).
    #[arg(long)]
    pub cpu_threads: Option<usize>,
}

pub fn run(args: SuiteArgs) -> gpq::Result<ExitCode> {
    let tables = match &args.tables {
        None => Table::ALL.to_vec(),
        Some(names) => names.iter().map(|n| n.parse()).collect::<gpq::Result<_>>()?,
    };
    let config = SuiteConfig {
        scale_factor: args.scale_factor,
        data: args.data.clone().unwrap_or_else(|| PathBuf::from(format!("data/sf{}", args.scale_factor))),
        layouts: args.layouts.clone(),
        tables,
        repeat: args.repeat.max(1),
        cold: args.cold,
        cpu_threads: args.cpu_threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4)),
    };
    let ctx = GpuContext::get(0)?;
    eprintln!("device {} ({} SMs); arrow-rs on {} threads", ctx.name, ctx.sm_count, config.cpu_threads);
    let rows = suite::run(&ctx, &config, &|r| {
        eprintln!(
            "{:>7} {:>9} {:<16} {}: gpq {:.4} s, arrow-rs+copy {:.4} s ({:.1}x), pinned copy {:.4} s",
            r.layout, r.table, r.columns, r.cache, r.gpq_s, r.arrow_rs_h2d_s, r.speedup, r.pinned_copy_s
        )
    })?;
    let md = suite::markdown(&rows, &ctx, &config);
    println!("{md}");
    let io = |source| gpq::Error::Open { file: args.out.clone(), source };
    std::fs::write(args.out.with_extension("md"), &md).map_err(io)?;
    let json = serde_json::json!({
        "device": ctx.name,
        "cpu_threads": config.cpu_threads,
        "scale_factor": config.scale_factor,
        "repeat": config.repeat,
        "rows": rows,
    });
    let text = serde_json::to_string_pretty(&json).map_err(|e| gpq::Error::Internal(format!("JSON: {e}")))?;
    std::fs::write(args.out.with_extension("json"), text).map_err(io)?;
    Ok(ExitCode::SUCCESS)
}
