//! The `gpq` command line: generate TPC-H Parquet, inspect files and their IO
//! plans, read files onto the GPU, and benchmark.

mod bench;
#[cfg(feature = "ballista")]
mod cluster;
mod demo;
mod generate;
mod inspect;
mod read;
#[cfg(feature = "datafusion")]
mod sql;
mod suite;

pub use gpq_bench::suite::human_bytes;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// gpq reads Apache Parquet straight into GPU memory.
#[derive(Parser)]
#[command(name = "gpq", version, about, long_about = None)]
struct Cli {
    /// More logging (-v: info, -vv: debug). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: generate a small TPC-H set and read it onto the GPU, printing IO path and stage times.
    Demo(demo::DemoArgs),
    /// Generate TPC-H tables as Parquet files.
    Gen(generate::GenArgs),
    /// Show a file's row groups, columns, pages and the IO plan gpq would make.
    Inspect(inspect::InspectArgs),
    /// Read a file (or every .parquet file in a directory) onto the GPU.
    Read(read::ReadArgs),
    /// Run benchmarks.
    Bench(bench::BenchArgs),
    /// Run SQL over a directory of Parquet tables scanned by gpq (DataFusion).
    #[cfg(feature = "datafusion")]
    Sql(sql::SqlArgs),
    /// Run TPC-H queries over `gpq gen` output scanned by gpq (DataFusion).
    #[cfg(feature = "datafusion")]
    Tpch(sql::TpchArgs),
    /// Serve a Ballista scheduler that plans gpq scans (for `--cluster df://HOST:PORT`).
    #[cfg(feature = "ballista")]
    Scheduler(cluster::SchedulerArgs),
    /// Serve a Ballista executor whose gpq scans decode on one GPU (or the CPU).
    #[cfg(feature = "ballista")]
    Executor(cluster::ExecutorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("gpq={level}")));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();

    let result = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Gen(a) => generate::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Read(a) => read::run(a),
        Command::Bench(a) => bench::run(a),
        #[cfg(feature = "datafusion")]
        Command::Sql(a) => sql::run_sql(a),
        #[cfg(feature = "datafusion")]
        Command::Tpch(a) => sql::run_tpch(a),
        #[cfg(feature = "ballista")]
        Command::Scheduler(a) => cluster::run_scheduler(a),
        #[cfg(feature = "ballista")]
        Command::Executor(a) => cluster::run_executor(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Median of a non-empty list (0 for an empty one).
pub fn median(v: &mut [f64]) -> f64 {
    gpq_bench::median(v).unwrap_or(0.0)
}

/// Read options from the `GPQ_*` environment variables, then the flags given.
pub fn read_options(io: Option<&str>, io_threads: Option<usize>, decompress: Option<&str>) -> gpq::Result<gpq::ReadOptions> {
    let mut o = gpq::ReadOptions::from_env()?;
    if let Some(io) = io {
        o.io.path = io.parse()?;
    }
    if let Some(t) = io_threads {
        o.io.threads = Some(t);
    }
    if let Some(d) = decompress {
        o.decompress = d.parse()?;
    }
    Ok(o)
}
