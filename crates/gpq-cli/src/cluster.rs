//! `gpq scheduler`, `gpq executor`, and the sessions of `--cluster`: the
//! SQL commands run their queries on a Ballista cluster, a running one
//! (`df://host:port`) or one started inside this process (`local:N`, a
//! scheduler and N executors on loopback, bound round robin to the GPUs
//! the process sees, or to the CPU where it sees none).

use std::process::ExitCode;

use clap::Args;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use gpq_ballista::{DEFAULT_SCHEDULER_PORT, ExecutorOptions, ScanDevice, SessionConfigExt};
use tokio::sync::OnceCell;

use crate::sql::runtime;

/// Arguments of `gpq scheduler`.
#[derive(Args)]
pub struct SchedulerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// gRPC port.
    #[arg(long, default_value_t = DEFAULT_SCHEDULER_PORT)]
    pub port: u16,
}

/// Arguments of `gpq executor`.
#[derive(Args)]
pub struct ExecutorArgs {
    /// The scheduler, `host:port` (or `df://host:port`).
    #[arg(long, default_value = "localhost:50050")]
    pub scheduler: String,
    /// Local address the executor's services bind to.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// Host name other executors and clients reach this one by (default: the bind address).
    #[arg(long)]
    pub external_host: Option<String>,
    /// Arrow Flight port (shuffle reads and results).
    #[arg(long, default_value_t = 50051)]
    pub port: u16,
    /// gRPC port.
    #[arg(long, default_value_t = 50052)]
    pub grpc_port: u16,
    /// The GPU gpq scans decode on (an ordinal among those the process sees;
    /// CUDA_VISIBLE_DEVICES narrows them). Default: 0 where a GPU is present.
    #[arg(long, conflicts_with = "cpu")]
    pub device: Option<usize>,
    /// Decode gpq scans on the CPU (the default where no GPU is present).
    #[arg(long)]
    pub cpu: bool,
    /// Tasks run at once (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub task_slots: usize,
    /// Directory for shuffle files (default: a temporary one).
    #[arg(long)]
    pub work_dir: Option<String>,
}

fn served(what: &str, result: DfResult<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: the {what} stopped: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `gpq scheduler`: serves a Ballista scheduler with gpq's codecs.
pub fn run_scheduler(args: SchedulerArgs) -> gpq::Result<ExitCode> {
    eprintln!("gpq scheduler listening on {}:{}", args.bind, args.port);
    Ok(served("scheduler", runtime()?.block_on(gpq_ballista::run_scheduler(&args.bind, args.port))))
}

/// `gpq executor`: serves a Ballista executor whose gpq scans decode on one GPU (or the CPU).
pub fn run_executor(args: ExecutorArgs) -> gpq::Result<ExitCode> {
    let (host, port) = host_port(&args.scheduler).map_err(gpq::Error::InvalidOptions)?;
    let device = match (args.cpu, args.device) {
        (true, _) => ScanDevice::Cpu,
        (false, Some(d)) => ScanDevice::Gpu(d),
        (false, None) => gpq_ballista::default_device(),
    };
    if let ScanDevice::Gpu(d) = device {
        // Fail now, not at the first task, when the GPU cannot be used.
        gpq::cuda::GpuContext::get(d)?;
    }
    let options = ExecutorOptions {
        scheduler_host: host,
        scheduler_port: port,
        bind_host: args.bind,
        external_host: args.external_host,
        port: args.port,
        grpc_port: args.grpc_port,
        task_slots: args.task_slots,
        device,
        work_dir: args.work_dir,
    };
    eprintln!(
        "gpq executor: scheduler {}:{}, flight port {}, gpq scans on {}",
        options.scheduler_host,
        options.scheduler_port,
        options.port,
        match device {
            ScanDevice::Gpu(d) => format!("GPU {d}"),
            ScanDevice::Cpu => "the CPU".into(),
            ScanDevice::AsOptions => "the tables' devices".into(),
        }
    );
    Ok(served("executor", runtime()?.block_on(gpq_ballista::run_executor(options))))
}

/// `host:port` of `df://host:port`, `host:port` or `host` (the default port).
fn host_port(url: &str) -> Result<(String, u16), String> {
    let rest = url.strip_prefix("df://").unwrap_or(url);
    match rest.rsplit_once(':') {
        Some((host, port)) => {
            let port = port.parse().map_err(|_| format!("{url:?}: {port:?} is not a port"))?;
            Ok((host.to_string(), port))
        }
        None if !rest.is_empty() => Ok((rest.to_string(), DEFAULT_SCHEDULER_PORT)),
        None => Err(format!("{url:?} names no scheduler")),
    }
}

/// The cluster a `local:N` argument started in this process (one per process).
static LOCAL: OnceCell<String> = OnceCell::const_new();

/// A session on the cluster `cluster` names (`df://host:port`, or
/// `local:N` to start one in this process), with `config`'s batch size and
/// partitions and gpq's codecs.
pub async fn context(cluster: &str, config: SessionConfig) -> DfResult<SessionContext> {
    let mut ballista = SessionConfig::new_with_ballista()
        .with_batch_size(config.batch_size())
        .with_target_partitions(config.target_partitions());
    if let Some(n) = cluster.strip_prefix("local:") {
        let n: usize = n
            .parse()
            .map_err(|_| DataFusionError::Configuration(format!("--cluster {cluster}: local:N wants a number of executors")))?;
        // Each executor runs as many tasks as a scan has partitions.
        ballista = ballista.with_ballista_standalone_parallelism(config.target_partitions());
        let state = SessionStateBuilder::new().with_default_features().with_config(gpq_ballista::with_gpq_codecs(ballista)).build();
        let url = LOCAL
            .get_or_try_init(|| async {
                let devices = gpq_ballista::devices_round_robin(n);
                eprintln!("cluster: a scheduler and {n} executors in this process ({devices:?})");
                gpq_ballista::start_standalone_cluster_on(&state, &devices).await
            })
            .await?;
        return gpq_ballista::remote_context(url, state).await;
    }
    if !cluster.starts_with("df://") {
        return Err(DataFusionError::Configuration(format!("--cluster {cluster}: expected df://host:port or local:N")));
    }
    let state = SessionStateBuilder::new().with_default_features().with_config(ballista).build();
    gpq_ballista::remote_context(cluster, state).await
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn scheduler_addresses() {
        assert_eq!(host_port("df://sched:6000"), Ok(("sched".into(), 6000)));
        assert_eq!(host_port("10.0.0.1:50050"), Ok(("10.0.0.1".into(), 50050)));
        assert_eq!(host_port("sched"), Ok(("sched".into(), 50050)));
        assert!(host_port("df://").is_err());
        assert!(host_port("sched:port").is_err());
    }
}
