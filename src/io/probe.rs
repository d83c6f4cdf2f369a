//! What IO paths this process can use, probed once.

use std::sync::OnceLock;

use tracing::info;

use super::cufile;

/// The outcome of probing the IO paths; `Err` holds why a path is unusable.
#[derive(Debug, Clone)]
pub struct IoProbe {
    /// True GPUDirect Storage (cuFile with nvidia-fs).
    pub gds: Result<(), String>,
    /// cuFile's compatibility mode (the driver opens; a file handle may still fail to register).
    pub cufile_compat: Result<(), String>,
}

static PROBE: OnceLock<IoProbe> = OnceLock::new();

/// Probes GDS and cuFile once per process and logs the result.
pub fn probe() -> &'static IoProbe {
    PROBE.get_or_init(|| {
        let gds = cufile::check_available(cufile::Mode::Gds);
        let cufile_compat = cufile::check_available(cufile::Mode::Compat);
        info!(gds = ?gds, cufile_compat = ?cufile_compat, "IO paths probed");
        IoProbe { gds, cufile_compat }
    })
}
