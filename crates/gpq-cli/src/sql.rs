//! `gpq sql`, `gpq tpch` and `gpq bench tpch`: SQL over Parquet through
//! DataFusion, with gpq tables (GPU or CPU backend) or DataFusion's built-in
//! Parquet tables for comparison.
//!
//! Every command prints the scan metrics of the gpq scans it ran (bytes
//! read, pruning, IO/decompress/decode/copy time). Query errors are printed
//! and make the command exit with a failure code.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use clap::Args;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use gpq_bench::tpch::queries::{self, TableSource};
use gpq_datafusion::{Backend, GpqPartialAggregateExec, GpqScanExec, GpqTableOptions, register_gpq};

use crate::median;

/// Options shared by the SQL commands.
#[derive(Args, Clone)]
pub struct EngineArgs {
    /// Decoder of gpq tables: auto (GPU if present), gpu or cpu.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Partitions per scan (DataFusion's target_partitions; default: cores).
    #[arg(long)]
    pub partitions: Option<usize>,
    /// Rows per batch (DataFusion's batch_size).
    #[arg(long, default_value_t = 8192)]
    pub batch_size: usize,
    /// IO path of the GPU backend: auto, gds, cufile-compat or bounce (default: GPQ_IO, else auto).
    #[arg(long)]
    pub io: Option<String>,
    /// Decompressor of the GPU backend: auto, nvcomp or cpu (default: GPQ_DECOMPRESS, else auto).
    #[arg(long)]
    pub decompress: Option<String>,
    /// Do not prune pages with the page index.
    #[arg(long)]
    pub no_page_index: bool,
    /// Leave every filter to DataFusion (no filtering on the device).
    #[arg(long)]
    pub no_device_filters: bool,
    /// Leave partial aggregations over GPU scans to DataFusion (no
    /// aggregation on the device).
    #[arg(long)]
    pub no_device_aggregation: bool,
    /// Most groups the device aggregates in one batch; a batch with more
    /// is aggregated on the host.
    #[arg(long, default_value_t = gpq_datafusion::DEFAULT_DEVICE_AGGREGATION_MAX_GROUPS)]
    pub device_aggregation_max_groups: usize,
    /// With device filters, decode the filters' columns first and the other
    /// columns only where rows survive them (pays where survivors cluster).
    #[arg(long)]
    pub late_materialization: bool,
    /// GPU backend: cut each partition's reads into at least this many passes
    /// of 8 MiB or more, so that DataFusion works on one while the device
    /// decodes the next (default 1: passes of up to 64 MiB, however few).
    #[arg(long, default_value_t = gpq_datafusion::DEFAULT_GPU_MIN_PASSES)]
    pub min_passes: u64,
    /// Automatic backend: scans of fewer projected compressed bytes than
    /// this (after pruning; e.g. 32M, or 0 for none) decode on the CPU.
    #[arg(long, default_value_t = gpq_datafusion::DEFAULT_GPU_MIN_SCAN_BYTES, value_parser = crate::generate::parse_bytes)]
    pub gpu_min_scan_bytes: u64,
    /// GPU backend: cut a scan into no more partitions than it holds this
    /// many projected compressed bytes (e.g. 64M; default 0: the session's
    /// partitions).
    #[arg(long, default_value = "0", value_parser = crate::generate::parse_bytes)]
    pub gpu_min_partition_bytes: u64,
    /// GPUs the GPU backend spreads partitions over: `all`, or a comma-separated
    /// list of ordinals (default: the one device of GPQ_DEVICE, else 0).
    #[arg(long)]
    pub devices: Option<String>,
    /// Run the queries on a Ballista cluster: `df://host:port` (a scheduler
    /// started with `gpq scheduler`, executors with `gpq executor`), or
    /// `local:N` (a scheduler and N executors in this process). Every process
    /// must see the data at the same paths.
    #[cfg(feature = "ballista")]
    #[arg(long)]
    pub cluster: Option<String>,
}

/// Arguments of `gpq sql`.
#[derive(Args)]
pub struct SqlArgs {
    /// A directory: each `NAME.parquet` file and each subdirectory of .parquet
    /// files becomes table NAME (a single file becomes the table named by its stem).
    #[arg(long)]
    pub data: PathBuf,
    /// The SQL statement(s), separated by ';'; the rows of each query are printed.
    pub sql: String,
    /// Print the physical plan of each query before running it.
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Arguments of `gpq tpch`.
#[derive(Args)]
pub struct TpchArgs {
    /// Directory with the eight TPC-H tables (`gpq gen` output).
    #[arg(long)]
    pub data: PathBuf,
    /// Queries to run (1 to 22, comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub query: Vec<usize>,
    /// Print the physical plan of each query before running it.
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Arguments of `gpq bench tpch`.
#[derive(Args)]
pub struct TpchBenchArgs {
    /// Directory with the eight TPC-H tables (`gpq gen` output).
    #[arg(long)]
    pub data: PathBuf,
    /// Queries to time (comma-separated; default all 22).
    #[arg(long, value_delimiter = ',')]
    pub queries: Option<Vec<usize>>,
    /// Timed runs per query and engine, after one warm-up; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Also time gpq with device filters off and with late materialization
    /// the other way round, and report the bytes gpq's scans copied to the
    /// host with device filters and without.
    #[arg(long)]
    pub compare_device_filters: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl EngineArgs {
    fn table_options(&self) -> gpq::Result<GpqTableOptions> {
        let read = crate::read_options(self.io.as_deref(), None, self.decompress.as_deref())?;
        Ok(GpqTableOptions::new()
            .with_backend(self.backend.parse::<Backend>()?)
            .with_gpu_min_scan_bytes(self.gpu_min_scan_bytes)
            .with_gpu_min_partition_bytes(self.gpu_min_partition_bytes)
            .with_read_options(read)
            .with_page_index(!self.no_page_index)
            .with_device_filters(!self.no_device_filters)
            .with_late_materialization(self.late_materialization)
            .with_gpu_min_passes(self.min_passes)
            .with_devices(parse_devices(self.devices.as_deref())?))
    }

    /// A session: local, or on the cluster of `--cluster`.
    async fn context(&self) -> DfResult<SessionContext> {
        // DataFusion's own options from DATAFUSION_* variables (e.g.
        // DATAFUSION_OPTIMIZER_HASH_JOIN_SINGLE_PARTITION_THRESHOLD), then ours.
        let mut config = SessionConfig::from_env()?.with_batch_size(self.batch_size.max(1));
        if let Some(p) = self.partitions {
            config = config.with_target_partitions(p.max(1));
        }
        #[cfg(feature = "ballista")]
        if let Some(cluster) = &self.cluster {
            return crate::cluster::context(cluster, config).await;
        }
        let state = datafusion::execution::SessionStateBuilder::new().with_config(config).with_default_features();
        let state = if self.no_device_aggregation {
            state
        } else {
            let rule = gpq_datafusion::GpqAggregatePushdown::default().with_max_groups(self.device_aggregation_max_groups);
            state.with_physical_optimizer_rule(Arc::new(rule))
        };
        Ok(SessionContext::new_with_state(state.build()))
    }
}

/// The devices of `--devices` (`all`: every one the driver sees).
fn parse_devices(arg: Option<&str>) -> gpq::Result<Vec<usize>> {
    match arg.map(str::trim) {
        None | Some("") => Ok(Vec::new()),
        Some("all") => gpq::cuda::device_count().map(|n| (0..n).collect()),
        Some(list) => list
            .split(',')
            .map(|d| d.trim().parse::<usize>().map_err(|_| gpq::Error::InvalidOptions(format!("--devices: {d:?} is not a device ordinal"))))
            .collect(),
    }
}

/// A multi-threaded tokio runtime for a command's async work.
pub(crate) fn runtime() -> gpq::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| gpq::Error::Internal(format!("cannot start a tokio runtime: {e}")))
}

/// Prints a query failure and turns it into the exit code.
fn report(result: DfResult<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `gpq sql`: registers the tables of `--data` and runs the statement(s).
pub fn run_sql(args: SqlArgs) -> gpq::Result<ExitCode> {
    let options = args.engine.table_options()?;
    let rt = runtime()?;
    Ok(report(rt.block_on(async {
        let ctx = args.engine.context().await?;
        let names = register_dir(&ctx, &args.data, &options)?;
        eprintln!("tables: {}", names.join(", "));
        for statement in args.sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            run_and_print(&ctx, statement, args.explain).await?;
        }
        Ok(())
    })))
}

/// `gpq tpch`: runs TPC-H queries over gpq tables and prints their rows and scan metrics.
pub fn run_tpch(args: TpchArgs) -> gpq::Result<ExitCode> {
    let options = args.engine.table_options()?;
    for &n in &args.query {
        queries::query(n)?;
    }
    let rt = runtime()?;
    Ok(report(rt.block_on(async {
        let ctx = args.engine.context().await?;
        queries::register_tables(&ctx, &args.data, &TableSource::Gpq(options)).await?;
        for &n in &args.query {
            println!("-- TPC-H query {n}");
            let statements = queries::statements(n).map_err(gpq_datafusion::to_df_error)?;
            let mut failure = None;
            for s in statements {
                if failure.is_some() && !s.to_ascii_lowercase().starts_with("drop") {
                    continue;
                }
                let r = if queries::is_query_statement(s) {
                    run_and_print(&ctx, s, args.explain).await
                } else {
                    ctx.sql(s).await?.collect().await.map(|_| ())
                };
                if let Err(e) = r {
                    failure.get_or_insert(e);
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
        }
        Ok(())
    })))
}

/// `gpq bench tpch`: times queries over built-in Parquet tables and over gpq
/// tables and prints a Markdown table (median seconds after one warm-up).
/// Exits with a failure code when any query's result differs.
pub fn bench_tpch(args: TpchBenchArgs) -> gpq::Result<ExitCode> {
    let options = args.engine.table_options()?;
    let list: Vec<usize> = args.queries.clone().unwrap_or_else(|| (1..=queries::QUERY_COUNT).collect());
    for &n in &list {
        queries::query(n)?;
    }
    let rt = runtime()?;
    let mut wrong: Vec<usize> = Vec::new();
    let code = report(rt.block_on(async {
        let builtin = args.engine.context().await?;
        queries::register_tables(&builtin, &args.data, &TableSource::Parquet).await?;
        let ours = args.engine.context().await?;
        queries::register_tables(&ours, &args.data, &TableSource::Gpq(options.clone())).await?;
        let plain = args.engine.context().await?;
        let eager = args.engine.context().await?;
        if args.compare_device_filters {
            let off = options.clone().with_device_filters(false);
            queries::register_tables(&plain, &args.data, &TableSource::Gpq(off)).await?;
            let eager_options = options.clone().with_late_materialization(!options.late_materialization);
            queries::register_tables(&eager, &args.data, &TableSource::Gpq(eager_options)).await?;
        }
        // The compared column: late materialization the other way round.
        let other_late = if options.late_materialization { "without" } else { "with" };
        let partitions = ours.state().config().target_partitions();
        println!(
            "TPC-H over {}: backend {}, {partitions} partitions, batch size {}, median of {} after one warm-up",
            args.data.display(),
            options.backend,
            args.engine.batch_size,
            args.repeat.max(1)
        );
        #[cfg(feature = "ballista")]
        if let Some(cluster) = &args.engine.cluster {
            println!("Both engines run on the Ballista cluster {cluster} (built-in Parquet: Ballista's own scan).");
        }
        if args.compare_device_filters {
            println!(
                "\n| query | rows | built-in Parquet s | gpq s | speed-up | gpq without device filters s | gpq {other_late} late materialization s | MB to host (device filters / none) | same result |"
            );
            println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
        } else {
            println!("\n| query | rows | built-in Parquet s | gpq s | speed-up | gpq scans on the GPU / CPU | same result |");
            println!("| ---: | ---: | ---: | ---: | ---: | ---: | --- |");
        }
        let (mut total_b, mut total_g, mut total_p, mut total_e) = (0.0, 0.0, 0.0, 0.0);
        let (mut bytes_on, mut bytes_off) = (0u64, 0u64);
        for n in list {
            let (b, expected) = time_query(&builtin, n, args.repeat).await?;
            let (g, actual) = time_query(&ours, n, args.repeat).await?;
            let mut same = queries::same_rows(&expected, &actual)?;
            let rows: usize = actual.iter().map(|b| b.num_rows()).sum();
            total_b += b;
            total_g += g;
            let speedup = b / g.max(1e-9);
            if args.compare_device_filters {
                let (p, plain_rows) = time_query(&plain, n, args.repeat).await?;
                same &= queries::same_rows(&expected, &plain_rows)?;
                total_p += p;
                let (e, eager_rows) = time_query(&eager, n, args.repeat).await?;
                same &= queries::same_rows(&expected, &eager_rows)?;
                total_e += e;
                let (on, off) = (bytes_to_host(&ours, n).await?, bytes_to_host(&plain, n).await?);
                bytes_on += on;
                bytes_off += off;
                let mb = |b: u64| b as f64 / 1e6;
                println!(
                    "| q{n} | {rows} | {b:.3} | {g:.3} | {speedup:.2}x | {p:.3} | {e:.3} | {:.1} / {:.1} | {} |",
                    mb(on),
                    mb(off),
                    if same { "yes" } else { "NO" }
                );
            } else {
                let scans = match scan_backends(&ours, n).await? {
                    Some((gpu, cpu)) => format!("{gpu} / {cpu}"),
                    None => "-".to_string(),
                };
                println!("| q{n} | {rows} | {b:.3} | {g:.3} | {speedup:.2}x | {scans} | {} |", if same { "yes" } else { "NO" });
            }
            if !same {
                wrong.push(n);
            }
        }
        if args.compare_device_filters {
            println!(
                "| total | | {total_b:.3} | {total_g:.3} | {:.2}x | {total_p:.3} | {total_e:.3} | {:.1} / {:.1} | |",
                total_b / total_g.max(1e-9),
                bytes_on as f64 / 1e6,
                bytes_off as f64 / 1e6
            );
        } else {
            println!("| total | | {total_b:.3} | {total_g:.3} | {:.2}x | | |", total_b / total_g.max(1e-9));
        }
        Ok(())
    }));
    if code == ExitCode::SUCCESS && !wrong.is_empty() {
        eprintln!("error: queries {wrong:?} gave results that differ from DataFusion's built-in Parquet reader");
        return Ok(ExitCode::FAILURE);
    }
    Ok(code)
}

/// Whether `p` is a gpq scan or a device aggregation, which runs its GPU
/// scan itself (the scan is not its child) and whose metrics hold the scan's.
fn is_gpq_scan(p: &Arc<dyn ExecutionPlan>) -> bool {
    p.as_ref().downcast_ref::<GpqScanExec>().is_some() || p.as_ref().downcast_ref::<GpqPartialAggregateExec>().is_some()
}

/// The gpq scans of query `n`'s physical plans, a device aggregation standing
/// for the scan it runs (none where the plan shows none, as a plan run on a
/// Ballista cluster does); with `run`, after each plan ran once, so that
/// their metrics are filled in. Statements that are not queries (q15's
/// view) are executed as they come.
async fn gpq_scans(ctx: &SessionContext, n: usize, run: bool) -> DfResult<Vec<Arc<dyn ExecutionPlan>>> {
    let mut scans = Vec::new();
    for s in queries::statements(n).map_err(gpq_datafusion::to_df_error)? {
        if !queries::is_query_statement(s) {
            ctx.sql(s).await?.collect().await?;
            continue;
        }
        let plan = ctx.sql(s).await?.create_physical_plan().await?;
        if run {
            collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        }
        let mut stack = vec![plan];
        while let Some(p) = stack.pop() {
            stack.extend(p.children().into_iter().cloned());
            if is_gpq_scan(&p) {
                scans.push(p);
            }
        }
    }
    Ok(scans)
}

/// Runs query `n` once and returns the bytes its gpq scans copied to the
/// host (their `bytes_to_host` metric).
async fn bytes_to_host(ctx: &SessionContext, n: usize) -> DfResult<u64> {
    Ok(gpq_scans(ctx, n, true)
        .await?
        .iter()
        .map(|p| p.metrics().unwrap_or_default().sum_by_name("bytes_to_host").map_or(0, |m| m.as_usize() as u64))
        .sum())
}

/// How many of query `n`'s gpq scans decode on the GPU and how many on the
/// CPU, from its physical plans (`None` where the plan shows no gpq scan, as
/// a plan run on a Ballista cluster does).
async fn scan_backends(ctx: &SessionContext, n: usize) -> DfResult<Option<(usize, usize)>> {
    let scans = gpq_scans(ctx, n, false).await?;
    // The rest are device aggregations, over GPU scans.
    let gpu = scans.iter().filter(|p| p.as_ref().downcast_ref::<GpqScanExec>().is_none_or(GpqScanExec::uses_gpu)).count();
    Ok((!scans.is_empty()).then_some((gpu, scans.len() - gpu)))
}

/// Median seconds of `repeat` runs of query `n` after a warm-up, and its rows.
async fn time_query(ctx: &SessionContext, n: usize, repeat: usize) -> DfResult<(f64, Vec<RecordBatch>)> {
    let rows = queries::run_query(ctx, n).await?;
    let mut secs = Vec::new();
    for _ in 0..repeat.max(1) {
        let t0 = Instant::now();
        queries::run_query(ctx, n).await?;
        secs.push(t0.elapsed().as_secs_f64());
    }
    Ok((median(&mut secs), rows))
}

/// Registers every table of `data` (see [`SqlArgs::data`]) and returns their names.
fn register_dir(ctx: &SessionContext, data: &Path, options: &GpqTableOptions) -> DfResult<Vec<String>> {
    let stem = |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if !data.is_dir() {
        let name = stem(data);
        register_gpq(ctx, &name, data, options.clone())?;
        return Ok(vec![name]);
    }
    let mut names = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(data)
        .map_err(|e| DataFusionError::Execution(format!("cannot list {}: {e}", data.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        let name = stem(&p);
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let is_parquet = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
        let has_parquet = p.is_dir()
            && std::fs::read_dir(&p).is_ok_and(|mut d| {
                d.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x.eq_ignore_ascii_case("parquet"))))
            });
        if (p.is_file() && is_parquet) || has_parquet {
            register_gpq(ctx, &name, &p, options.clone())?;
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err(DataFusionError::Plan(format!("no Parquet tables in {}", data.display())));
    }
    Ok(names)
}

/// Runs one statement, prints its rows, its time and the metrics of its gpq scans.
async fn run_and_print(ctx: &SessionContext, sql: &str, explain: bool) -> DfResult<()> {
    let t0 = Instant::now();
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    if explain {
        println!("{}", displayable(plan.as_ref()).indent(true));
    }
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let secs = t0.elapsed().as_secs_f64();
    println!("{}", pretty_format_batches(&batches)?);
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    println!("{rows} rows in {secs:.3} s");
    print_scan_metrics(&plan);
    Ok(())
}

/// Prints each gpq scan of `plan` (see [`is_gpq_scan`]) with its metrics
/// summed over partitions.
pub fn print_scan_metrics(plan: &Arc<dyn ExecutionPlan>) {
    let mut stack = vec![Arc::clone(plan)];
    while let Some(p) = stack.pop() {
        if is_gpq_scan(&p) {
            println!("  {}", displayable(p.as_ref()).one_line().to_string().trim_end());
            if let Some(m) = p.metrics() {
                println!("    metrics: {}", m.aggregate_by_name().sorted_for_display().timestamps_removed());
            }
        }
        stack.extend(p.children().into_iter().cloned());
    }
}
