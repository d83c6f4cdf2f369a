//! What the test binaries of this crate share: TPC-H data generated once
//! per scale factor (shared with the other crates' tests through
//! `gpq_bench::tpch::generate_once`).

use std::path::{Path, PathBuf};

/// TPC-H data at `sf`, generated once per scale factor.
pub fn tpch_dir(sf: f64) -> PathBuf {
    gpq_bench::tpch::generate_once(Path::new(env!("CARGO_TARGET_TMPDIR")), sf).unwrap()
}
