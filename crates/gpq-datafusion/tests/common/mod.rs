//! Shared by the test binaries that need a GPU: how a test runs where there
//! is none, and the runtime the async ones block on.

use libtest_mimic::{Failed, Trial};

/// A test that runs on a CUDA device, else on gpq's CPU emulator of the
/// kernels (the `emulator` feature), else is reported as ignored (never as
/// passed).
pub fn gpu_trial(name: &str, test: fn() -> Result<(), Failed>) -> Trial {
    if gpq::cuda::device_available() {
        Trial::test(name, test)
    } else if gpq::cuda::emulator_compiled() {
        Trial::test(name, move || {
            gpq::cuda::use_emulator()?;
            test()
        })
    } else {
        Trial::test(name, test).with_ignored_flag(true)
    }
}

/// A small multi-threaded tokio runtime.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
}
