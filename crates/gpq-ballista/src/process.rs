//! A Ballista scheduler and executors as processes of their own, with
//! gpq's codecs: [`run_scheduler`] serves Ballista's own scheduler (gRPC,
//! unchanged but for gpq's codecs and the
//! [`GpqSchedulerPlanner`](crate::GpqSchedulerPlanner)), and
//! [`run_executor`] serves a standard Ballista executor whose gpq scans
//! decode on one GPU, or on the CPU where it has none ([`ExecutorOptions`]).
//! The `gpq scheduler` and `gpq executor` commands call them.

use std::net::SocketAddr;
use std::sync::Arc;

use ballista::prelude::SessionConfigExt;
use ballista_core::extension::{ballista_aggregate_functions, ballista_scalar_functions, ballista_window_functions};
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionConfig;
use gpq_datafusion::ScanDevice;
use tracing::info;

use crate::cluster::{scheduler_state, with_gpq_codecs};
use crate::codec::{GpqLogicalCodec, GpqPhysicalCodec};

/// The port Ballista's scheduler listens on unless told otherwise.
pub const DEFAULT_SCHEDULER_PORT: u16 = 50050;

/// Serves a Ballista scheduler with gpq's codecs and planner on
/// `bind:port` until the process ends. Its state (jobs, executors) is kept
/// in memory, as Ballista's scheduler does by default.
pub async fn run_scheduler(bind: &str, port: u16) -> Result<()> {
    let address: SocketAddr = format!("{bind}:{port}")
        .parse()
        .map_err(|e| DataFusionError::Configuration(format!("scheduler address {bind}:{port}: {e}")))?;
    let mut config = SchedulerConfig::default().with_hostname(bind).with_port(port);
    config.override_logical_codec = Some(Arc::new(GpqLogicalCodec::new()));
    config.override_physical_codec = Some(Arc::new(GpqPhysicalCodec::new()));
    config.override_config_producer = Some(Arc::new(|| with_gpq_codecs(SessionConfig::new_with_ballista())));
    config.override_session_builder = Some(Arc::new(|config: SessionConfig| {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(with_gpq_codecs(config))
            .with_scalar_functions(ballista_scalar_functions())
            .with_aggregate_functions(ballista_aggregate_functions())
            .with_window_functions(ballista_window_functions())
            .build();
        Ok(scheduler_state(state))
    }));
    let cluster = BallistaCluster::new_from_config(&config).await.map_err(ballista_error)?;
    info!(%address, "gpq: Ballista scheduler with gpq's codecs");
    start_server(cluster, address, Arc::new(config)).await.map_err(ballista_error)
}

/// What a gpq executor process is: where its scheduler is, where it
/// listens, and where its gpq scans decode.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's host name or address.
    pub scheduler_host: String,
    /// The scheduler's gRPC port.
    pub scheduler_port: u16,
    /// The local address the executor's services bind to.
    pub bind_host: String,
    /// The host name other executors and clients reach this one by (the
    /// bind address when `None`).
    pub external_host: Option<String>,
    /// The Arrow Flight port (shuffle reads and results).
    pub port: u16,
    /// The executor's gRPC port.
    pub grpc_port: u16,
    /// Tasks run at once (0: one per core).
    pub task_slots: usize,
    /// Where gpq scans decode: the executor's GPU, or the CPU.
    pub device: ScanDevice,
    /// Directory for shuffle files (a temporary one when `None`).
    pub work_dir: Option<String>,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        ExecutorOptions {
            scheduler_host: "localhost".into(),
            scheduler_port: DEFAULT_SCHEDULER_PORT,
            bind_host: "127.0.0.1".into(),
            external_host: None,
            port: 50051,
            grpc_port: 50052,
            task_slots: 0,
            device: default_device(),
            work_dir: None,
        }
    }
}

/// GPU 0 of those the process sees (`CUDA_VISIBLE_DEVICES` picks which)
/// where there is one, else the CPU.
pub fn default_device() -> ScanDevice {
    if gpq::cuda::device_available() { ScanDevice::Gpu(0) } else { ScanDevice::Cpu }
}

/// Where `n` executors of one machine decode: its GPUs round robin where
/// it has any, else the CPU (as `--cluster local:N` binds them).
pub fn devices_round_robin(n: usize) -> Vec<ScanDevice> {
    match gpq::cuda::device_count() {
        Ok(gpus) if gpus > 0 && gpq::cuda::device_available() => (0..n).map(|i| ScanDevice::Gpu(i % gpus)).collect(),
        _ => vec![ScanDevice::Cpu; n],
    }
}

/// Serves a Ballista executor registered with the scheduler of `options`,
/// its gpq scans decoding on `options.device`, until the process ends.
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    let device = options.device;
    let codec = Arc::new(GpqPhysicalCodec::new().with_scan_device(device));
    let config_codec = Arc::clone(&codec);
    let mut config = ExecutorProcessConfig {
        scheduler_host: options.scheduler_host,
        scheduler_port: options.scheduler_port,
        bind_host: options.bind_host,
        external_host: options.external_host,
        port: options.port,
        grpc_port: options.grpc_port,
        vcores: options.task_slots,
        work_dir: options.work_dir,
        ..Default::default()
    };
    config.override_logical_codec = Some(Arc::new(GpqLogicalCodec::new()));
    config.override_physical_codec = Some(codec);
    config.override_config_producer = Some(Arc::new(move || {
        with_gpq_codecs(SessionConfig::new_with_ballista().with_ballista_physical_extension_codec(config_codec.clone()))
    }));
    info!(?device, scheduler = %format!("{}:{}", config.scheduler_host, config.scheduler_port), "gpq: Ballista executor");
    start_executor_process(Arc::new(config)).await.map_err(ballista_error)
}

fn ballista_error(e: ballista_core::error::BallistaError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}
