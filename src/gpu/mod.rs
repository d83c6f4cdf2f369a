//! The GPU side: finding a device, its context and streams, device and
//! pinned memory, and the kernels (CUDA C++ compiled at run time with NVRTC).
//!
//! All of it sits on cudarc's `sys`/`result` layers with the CUDA libraries
//! loaded at run time, so a machine without CUDA can still build gpq and use
//! its CPU parts; there [`GpuContext::get`] returns [`crate::Error::NoCudaDevice`].

pub mod context;
pub mod kernels;
pub mod memory;

pub use context::{GpuContext, GpuStream};
pub use kernels::{KernelArgs, Kernels};
pub use memory::{DeviceBuffer, PinnedBuffer};

use cudarc::driver::sys;

use crate::error::{Error, Result};

/// Turns a CUDA driver result into a gpq error naming the call.
pub fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let err = cudarc::driver::DriverError(r);
    let name = err.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{r:?}"));
    let text = err.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Err(Error::Cuda { call, message: format!("{name}: {text}") })
}

/// Returns the device for tests, or prints why there is none and returns `None`.
///
/// With `GPQ_REQUIRE_GPU=1` a missing device is a test failure instead, so a
/// device run cannot pass by skipping.
///
/// Without a GPU, a build with the `emulator` feature runs the test on the
/// CPU emulator instead (and says so), so kernel logic is still exercised.
pub fn test_device() -> Option<std::sync::Arc<GpuContext>> {
    match GpuContext::get(0) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            if std::env::var("GPQ_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("GPQ_REQUIRE_GPU=1 but no usable GPU: {e}");
            }
            if context::emulator_compiled() {
                eprintln!("NOTE: no GPU ({e}); running on the CPU emulator");
                context::use_emulator().ok()?;
                return GpuContext::get(0).ok();
            }
            eprintln!("SKIPPED (no GPU): {e}");
            None
        }
    }
}
