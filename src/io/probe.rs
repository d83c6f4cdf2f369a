//! What IO paths this process can use, probed once.
//!
//! GDS is checked first and cheaply (is nvidia-fs loaded?); the cuFile driver
//! is opened only where GDS may work or cuFile's compatibility mode is asked
//! for, so a plain `auto` read on a machine without nvidia-fs never starts it.

use std::sync::OnceLock;

use tracing::info;

use super::cufile;

/// The outcome of probing the IO paths; `Err` holds why a path is unusable.
#[derive(Debug)]
pub struct IoProbe {
    gds: OnceLock<Result<(), String>>,
    cufile_compat: OnceLock<Result<(), String>>,
}

impl IoProbe {
    /// True GPUDirect Storage (cuFile with nvidia-fs).
    pub fn gds(&self) -> &Result<(), String> {
        self.gds.get_or_init(|| {
            let r = cufile::check_available(cufile::Mode::Gds);
            info!(gds = ?r, "GDS probed");
            r
        })
    }

    /// cuFile's compatibility mode (the driver opens; a file handle may still
    /// fail to register, see [`super::cufile`]).
    pub fn cufile_compat(&self) -> &Result<(), String> {
        self.cufile_compat.get_or_init(|| {
            let r = cufile::check_available(cufile::Mode::Compat);
            info!(cufile_compat = ?r, "cuFile compatibility mode probed");
            r
        })
    }
}

static PROBE: IoProbe = IoProbe { gds: OnceLock::new(), cufile_compat: OnceLock::new() };

/// The process-wide probe; each path is checked on first use and logged.
pub fn probe() -> &'static IoProbe {
    &PROBE
}
