//! Sessions that run on a Ballista cluster with gpq's codecs: installing
//! the codecs in a session's configuration ([`with_gpq_codecs`]),
//! connecting to a running scheduler ([`remote_context`]), and starting a
//! cluster inside this process, a scheduler and executors on loopback, for
//! tests and for trying it on one machine ([`start_standalone_cluster`],
//! [`standalone_context`]).

use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::{SessionConfigExt, SessionContextExt};
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};

use gpq_datafusion::ScanDevice;

use crate::codec::{GpqLogicalCodec, GpqPhysicalCodec};
use crate::scan_source::GpqSchedulerPlanner;

/// How long [`start_standalone_cluster`] waits for its scheduler to answer.
const SCHEDULER_WAIT: Duration = Duration::from_secs(30);

/// `config` with gpq's codecs as Ballista's extension codecs, each wrapping
/// the codec `config` had (Ballista's own where it had none). A config that
/// has them already is returned as it is.
///
/// The client, the scheduler and every executor need them.
pub fn with_gpq_codecs(config: SessionConfig) -> SessionConfig {
    let logical = config.ballista_logical_extension_codec();
    let config = if is_a::<GpqLogicalCodec>(logical.as_ref()) {
        config
    } else {
        config.with_ballista_logical_extension_codec(Arc::new(GpqLogicalCodec::wrapping(logical)))
    };
    let physical = config.ballista_physical_extension_codec();
    if is_a::<GpqPhysicalCodec>(physical.as_ref()) {
        config
    } else {
        config.with_ballista_physical_extension_codec(Arc::new(GpqPhysicalCodec::wrapping(physical)))
    }
}

fn is_a<T: 'static>(codec: &dyn std::any::Any) -> bool {
    codec.is::<T>()
}

/// `state` with gpq's codecs in its configuration (see [`with_gpq_codecs`]).
fn with_codecs(state: SessionState) -> SessionState {
    let mut builder = SessionStateBuilder::new_from_existing(state);
    // The builder's own copy of the configuration: it knows not to create
    // the default catalog again over the one the state shares with its
    // context (its tables would be gone).
    let config = builder.config().take().map(with_gpq_codecs);
    *builder.config() = config;
    builder.build()
}

/// `state` as a Ballista scheduler running gpq scans needs it: with gpq's
/// codecs (see [`with_gpq_codecs`]) and its query planner wrapped in a
/// [`GpqSchedulerPlanner`], so that each task runs only its own partitions
/// of a gpq scan. Without the planner, Ballista would run a scan's first
/// partitions in every task of a stage.
pub fn scheduler_state(state: SessionState) -> SessionState {
    let state = with_codecs(state);
    let planner = Arc::clone(state.query_planner());
    if (planner.as_ref() as &dyn std::any::Any).is::<GpqSchedulerPlanner>() {
        return state;
    }
    SessionStateBuilder::new_from_existing(state).with_query_planner(Arc::new(GpqSchedulerPlanner::wrapping(planner))).build()
}

/// A session on the Ballista scheduler at `url` (`df://host:port`; port
/// 50050 when left out), planning with `state` (its functions, its
/// configuration) and gpq's codecs.
///
/// Queries over gpq tables registered in it are planned by the scheduler
/// and run by its executors, which must see the tables' files at the same
/// paths as this process and have gpq's codecs too.
pub async fn remote_context(url: &str, state: SessionState) -> Result<SessionContext> {
    SessionContext::remote_with_state(url, with_codecs(state)).await
}

/// Starts a Ballista scheduler and `executors` executors in this process, on
/// loopback ports the system picks, all with `state`'s configuration and
/// functions and gpq's codecs (the scheduler's state made by
/// [`scheduler_state`]); returns the scheduler's `df://` URL for
/// [`remote_context`].
///
/// Each executor runs as many tasks at once as Ballista's standalone
/// parallelism says (`SessionConfigExt::with_ballista_standalone_parallelism`).
/// The servers are tasks of the current tokio runtime: they stop with it.
pub async fn start_standalone_cluster(state: &SessionState, executors: usize) -> Result<String> {
    start_standalone_cluster_on(state, &vec![ScanDevice::AsOptions; executors]).await
}

/// [`start_standalone_cluster`] with one executor per entry of `devices`,
/// each decoding its scans there: `ScanDevice::Gpu(i)` binds an executor to
/// GPU `i` of this process, so that two executors of one process can use
/// two GPUs.
pub async fn start_standalone_cluster_on(state: &SessionState, devices: &[ScanDevice]) -> Result<String> {
    let executors = devices.len();
    if executors == 0 {
        return Err(DataFusionError::Configuration("a cluster needs at least one executor".into()));
    }
    let state = with_codecs(state.clone());
    let address = ballista_scheduler::standalone::new_standalone_scheduler_from_state(&scheduler_state(state.clone()))
        .await
        .map_err(|e| DataFusionError::Configuration(format!("cannot start a Ballista scheduler: {e}")))?;
    let http = format!("http://localhost:{}", address.port());
    let started = tokio::time::Instant::now();
    let scheduler = loop {
        match SchedulerGrpcClient::connect(http.clone()).await {
            Ok(client) => break client,
            Err(e) if started.elapsed() > SCHEDULER_WAIT => {
                return Err(DataFusionError::Configuration(format!(
                    "the Ballista scheduler at {http} did not answer within {SCHEDULER_WAIT:?}: {e}"
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let task_slots = state.config().ballista_standalone_parallelism();
    for &device in devices {
        let state = on_device(&state, device);
        ballista_executor::new_standalone_executor_from_state(scheduler.clone(), task_slots, &state)
            .await
            .map_err(|e| DataFusionError::Configuration(format!("cannot start a Ballista executor: {e}")))?;
    }
    Ok(format!("df://localhost:{}", address.port()))
}

/// `state` (with gpq's codecs) with its physical codec decoding scans on `device`.
pub(crate) fn on_device(state: &SessionState, device: ScanDevice) -> SessionState {
    let config = state.config().clone();
    let physical = config.ballista_physical_extension_codec();
    let codec = match (physical.as_ref() as &dyn std::any::Any).downcast_ref::<GpqPhysicalCodec>() {
        Some(gpq) => gpq.on_device(device),
        None => GpqPhysicalCodec::wrapping(physical).with_scan_device(device),
    };
    let mut builder = SessionStateBuilder::new_from_existing(state.clone());
    *builder.config() = Some(config.with_ballista_physical_extension_codec(Arc::new(codec)));
    builder.build()
}

/// A session on a cluster started in this process (see
/// [`start_standalone_cluster`]): a scheduler and `executors` executors,
/// with `state`'s configuration and functions and gpq's codecs.
pub async fn standalone_context(state: SessionState, executors: usize) -> Result<SessionContext> {
    let url = start_standalone_cluster(&state, executors).await?;
    remote_context(&url, state).await
}
