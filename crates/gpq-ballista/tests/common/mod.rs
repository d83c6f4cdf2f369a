//! What the test binaries of this crate share: TPC-H data generated once
//! per scale factor.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use gpq_bench::tpch::{GenOptions, Table, generate_table};

/// TPC-H data at `sf`, generated once per scale factor into a directory of
/// its own that is then renamed into place (a process that finds the place
/// taken keeps what is there).
pub fn tpch_dir(sf: f64) -> PathBuf {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.join(format!("gpq-tpch-sf{sf}"));
    if dir.join(".complete").exists() {
        return dir;
    }
    let t0 = Instant::now();
    let work = tmp.join(format!("gpq-tpch-sf{sf}.{}.ballista.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let options = GenOptions { scale_factor: sf, ..Default::default() };
    for t in Table::ALL {
        generate_table(t, &work, &options, &|_| {}).unwrap();
    }
    std::fs::write(work.join(".complete"), b"").unwrap();
    if std::fs::rename(&work, &dir).is_err() {
        if dir.join(".complete").exists() {
            std::fs::remove_dir_all(&work).unwrap();
        } else {
            std::fs::remove_dir_all(&dir).unwrap();
            std::fs::rename(&work, &dir).unwrap();
        }
    }
    eprintln!("generated TPC-H SF {sf} in {:.1} s into {}", t0.elapsed().as_secs_f64(), dir.display());
    dir
}

