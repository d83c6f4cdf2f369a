//! gpq scans inside Apache DataFusion Ballista.
//!
//! Ballista runs a query by shipping plans: the client sends the logical
//! plan to the scheduler, the scheduler plans it, cuts the physical plan
//! into stages at its shuffles and sends each stage's tasks to executors. A
//! [`GpqTable`](gpq_datafusion::GpqTable) and its
//! [`GpqScanExec`](gpq_datafusion::GpqScanExec) live in one process; this
//! crate's extension codecs carry them across those boundaries as
//! descriptions (files, schema, options; a scan's partitions, columns,
//! filters and limit), handing every other node to Ballista's own codecs:
//!
//! - [`GpqLogicalCodec`]: gpq tables in logical plans, client to scheduler.
//!   The scheduler opens the files again, reads their footers and plans the
//!   scan (pruning, partitions) as a local session would.
//! - [`GpqPhysicalCodec`]: gpq scans in stage plans, scheduler to
//!   executors. An executor reads exactly the row groups the scheduler
//!   planned for its partitions, reading only the footers of their files.
//!
//! Ballista gives each task its share of a stage by restricting the
//! stage's leaves to the task's partitions, and reads a small broadcast
//! join side inside the joining task; it does both only for leaves it
//! knows, file scans among them. The scheduler's [`GpqSchedulerPlanner`]
//! therefore plans each gpq scan as a file scan (a `DataSourceExec`) of one
//! file group per scan partition, whose file source runs the scan partition
//! each group names: each task runs exactly its own partitions of the scan,
//! and broadcast sides over gpq scans are read where they are joined.
//!
//! The client, the scheduler and every executor need both codecs:
//! [`with_gpq_codecs`] installs them in a `SessionConfig`,
//! [`scheduler_state`] makes a scheduler's session (codecs and planner),
//! [`remote_context`] connects a session to a running scheduler, and
//! [`standalone_context`] starts a scheduler and executors inside this
//! process (loopback) and connects to them. Every process opens the
//! tables' files by path, so all must see them at the same paths.
//!
//! ```no_run
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::SessionConfig;
//! use ballista::prelude::SessionConfigExt;
//! use gpq_ballista::{standalone_context, with_gpq_codecs};
//! use gpq_datafusion::{GpqTableOptions, register_gpq};
//!
//! # async fn demo() -> datafusion::error::Result<()> {
//! let config = with_gpq_codecs(SessionConfig::new_with_ballista());
//! let state = SessionStateBuilder::new().with_default_features().with_config(config).build();
//! // A scheduler and two executors in this process.
//! let ctx = standalone_context(state, 2).await?;
//! register_gpq(&ctx, "lineitem", "data/lineitem.parquet", GpqTableOptions::new())?;
//! ctx.sql("select l_returnflag, count(*) from lineitem group by l_returnflag").await?.show().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Where a scan decodes is decided by the executor that runs it, not by the
//! scheduler: the scheduler plans gpq tables [for
//! executors](gpq_datafusion::GpqTable::planned_for_executors) (filters the
//! device can evaluate are the scan's own, whatever hardware the scheduler
//! has), and each executor's physical codec resolves the backend with its
//! [`ScanDevice`]: its GPU, or the CPU, where scans apply those filters on
//! the host. [`start_standalone_cluster_on`] binds in-process executors to
//! GPUs; [`run_scheduler`] and [`run_executor`] (the `gpq scheduler` and
//! `gpq executor` commands) serve them as processes of their own.

#![warn(missing_docs)]

mod cluster;
mod codec;
mod process;
mod scan_source;

pub use cluster::{remote_context, scheduler_state, standalone_context, start_standalone_cluster, start_standalone_cluster_on, with_gpq_codecs};
pub use codec::{GpqLogicalCodec, GpqPhysicalCodec};
pub use gpq_datafusion::ScanDevice;
/// Ballista's settings of a `SessionConfig` (`new_with_ballista`, its codecs, standalone parallelism).
pub use ballista::prelude::SessionConfigExt;
pub use process::{DEFAULT_SCHEDULER_PORT, ExecutorOptions, default_device, devices_round_robin, run_executor, run_scheduler};
pub use scan_source::GpqSchedulerPlanner;
