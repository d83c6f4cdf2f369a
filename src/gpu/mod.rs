//! The GPU programs: gpq's CUDA C++ kernels (sources in `kernels/`),
//! compiled ahead of time for the architectures gpq ships ([`prebuilt`]) or
//! with NVRTC for any other (or run on the CPU emulator in `emu/`), loaded
//! once per device, and launched through a typed [`Kernel`] name. Also the
//! status words the kernels report ([`status`]) and a device-side check that
//! IO placed every byte where the plan says ([`verify`]).
//!
//! Kernels bound every loop by their input, check every read and write, and
//! report problems through status words that the host turns into
//! [`crate::Error::CorruptPage`].

pub mod kernels;
pub mod prebuilt;
pub mod status;
pub mod verify;

pub use kernels::{Kernel, compile_cubin, compile_ptx, nvrtc_available, nvrtc_version};
pub(crate) use kernels::{KernelArgs, Kernels};
