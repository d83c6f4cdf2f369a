//! Builds the CPU emulator of gpq's kernels when the `emulator` feature is on.
fn main() {
    println!("cargo:rerun-if-changed=src/gpu/emu");
    println!("cargo:rerun-if-changed=src/gpu/kernels");
    if std::env::var_os("CARGO_FEATURE_EMULATOR").is_some() {
        cc::Build::new()
            .cpp(true)
            .file("src/gpu/emu/emu.cpp")
            .flag("-std=c++17")
            .flag("-fno-strict-aliasing")
            .opt_level(2)
            .warnings(false)
            .compile("gpq_emu");
    }
}
