//! Ballista executors bound to GPUs: a scheduler and two executors in this
//! process, each bound to a GPU (round robin over the GPUs this machine
//! has; both on GPU 0 of gpq's CPU emulator of the kernels where there is
//! none), over gpq tables with the automatic backend: TPC-H queries give
//! the rows of DataFusion's built-in Parquet tables, and every scan decoded
//! on its executor's GPU, with the CPU fallback off. Without a GPU and
//! without the emulator the test is reported as ignored (as failed with
//! `GPQ_REQUIRE_GPU=1`).
//!
//! On a GPU: the 22 queries at `GPQ_BALLISTA_TPCH_SF` (default 1); on the
//! emulator: five queries at SF 0.01.

use std::any::Any;
use std::process::ExitCode;
use std::time::Instant;

use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use gpq_ballista::{GpqPhysicalCodec, ScanDevice, SessionConfigExt, remote_context, start_standalone_cluster_on, with_gpq_codecs};
use gpq_bench::tpch::queries::{self, TableSource};
use gpq_datafusion::GpqTableOptions;
use libtest_mimic::{Arguments, Trial};

mod common;
use common::tpch_dir;

const PARTITIONS: usize = 4;

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let name = "tpch_on_gpu_executors";
    let required = std::env::var("GPQ_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let trial = if gpq::cuda::device_available() {
        Trial::test(name, || run(false))
    } else if required {
        Trial::test(name, || Err("GPQ_REQUIRE_GPU=1 but there is no CUDA device".into()))
    } else if gpq::cuda::emulator_compiled() {
        Trial::test(name, || run(true))
    } else {
        Trial::test(name, || Err("no CUDA device and no emulator".into())).with_ignored_flag(true)
    };
    libtest_mimic::run(&args, vec![trial]).exit_code()
}

fn run(emulated: bool) -> Result<(), libtest_mimic::Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(tpch_on_gpu_executors(emulated));
    Ok(())
}

async fn tpch_on_gpu_executors(emulated: bool) {
    let (sf, list, devices): (f64, Vec<usize>, Vec<ScanDevice>) = if emulated {
        eprintln!("NOTE: no GPU; the executors decode on gpq's CPU emulator of the kernels");
        gpq::cuda::use_emulator().unwrap();
        (0.01, vec![1, 3, 6, 12, 14], vec![ScanDevice::Gpu(0); 2])
    } else {
        let sf = std::env::var("GPQ_BALLISTA_TPCH_SF").ok().and_then(|v| v.parse().ok()).unwrap_or(1.0);
        let gpus = gpq::cuda::device_count().unwrap();
        (sf, (1..=queries::QUERY_COUNT).collect(), (0..2).map(|i| ScanDevice::Gpu(i % gpus)).collect())
    };
    eprintln!("executors: {devices:?}");
    let dir = tpch_dir(sf);
    let config = with_gpq_codecs(
        SessionConfig::new_with_ballista().with_target_partitions(PARTITIONS).with_ballista_standalone_parallelism(2),
    );
    let state = || SessionStateBuilder::new().with_default_features().with_config(config.clone()).build();
    let url = start_standalone_cluster_on(&state(), &devices).await.unwrap();
    let cluster = remote_context(&url, state()).await.unwrap();
    // Automatic backend, no scan too small for the GPU, no CPU fallback: a scan passes only on the GPU.
    let options = GpqTableOptions::new().with_gpu_min_scan_bytes(0).with_gpu_fallback(false);
    queries::register_tables(&cluster, &dir, &TableSource::Gpq(options)).await.unwrap();
    let builtin = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(PARTITIONS));
    queries::register_tables(&builtin, &dir, &TableSource::Parquet).await.unwrap();

    let physical = cluster.state().config().ballista_physical_extension_codec();
    let codec = (physical.as_ref() as &dyn Any).downcast_ref::<GpqPhysicalCodec>().expect("gpq's physical codec");
    for n in list {
        let t0 = Instant::now();
        let expected = queries::run_query(&builtin, n).await.unwrap();
        let t1 = Instant::now();
        let actual = queries::run_query(&cluster, n).await.unwrap_or_else(|e| panic!("q{n} on GPU executors: {e}"));
        let t2 = Instant::now();
        eprintln!("q{n:02}: built-in {:.3} s, Ballista on GPU executors {:.3} s", (t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64());
        assert_eq!(queries::sorted_lines(&actual).unwrap(), queries::sorted_lines(&expected).unwrap(), "TPC-H q{n} at SF {sf} on GPU executors");
    }
    let (decoded, on_gpu) = (codec.scans_decoded(), codec.scans_decoded_on_gpu());
    eprintln!("{decoded} scans decoded by the executors, {on_gpu} on a GPU");
    assert!(decoded > 0);
    assert_eq!(on_gpu, decoded, "every scan decodes on its executor's GPU");
}
