//! The CUDA driver layer every stage stands on: finding a device, its
//! primary context, streams and events, device memory and page-locked host
//! memory (and a per-device pool of it).
//!
//! It sits on cudarc's raw `sys` bindings with the CUDA libraries loaded at
//! run time, so a machine without CUDA can still build gpq and use its CPU
//! parts; there [`GpuContext::get`] returns [`crate::Error::NoCudaDevice`].
//! Each raw call goes through `check`, which keeps the driver's code in the
//! error. With the `emulator` feature a context can instead be the CPU
//! emulator (device memory is host memory, kernels run on the CPU), which
//! exists to test kernel logic on machines without a GPU.

mod context;
mod memory;
mod pinned_pool;

pub use context::{
    BoundContext, ContextKey, DEADLINE, GpuContext, GpuEvent, GpuStream, device_available, device_count, emulator_compiled, keeping_current_context,
    use_emulator,
};
pub use memory::{DeviceBuffer, MemoryBudget, PinnedBuffer};
pub(crate) use memory::{as_bytes, from_bytes};
pub use pinned_pool::PinnedHostPool;
pub(crate) use pinned_pool::SlabLease;


use cudarc::driver::sys;

use crate::error::{Error, Result};

/// Turns a CUDA driver result into a gpq error naming the call.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::Cuda { call, source: cudarc::driver::DriverError(r) })
}
