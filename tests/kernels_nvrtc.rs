//! The kernels compiled ahead of time are exactly what NVRTC builds from the
//! sources, for every architecture gpq ships, and NVRTC's errors reach the
//! caller. Needs libnvrtc (the pip package `nvidia-cuda-nvrtc`, at the
//! version `scripts/nvrtc-env.sh` pins) but no GPU; skips with a notice when
//! NVRTC is absent, unless GPQ_REQUIRE_NVRTC=1 (as in CI).

/// Whether NVRTC is here; without it the test is skipped with a notice, or
/// fails under GPQ_REQUIRE_NVRTC=1.
fn nvrtc_or_skip() -> bool {
    if gpq::gpu::nvrtc_available() {
        return true;
    }
    if std::env::var("GPQ_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("GPQ_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded (LD_LIBRARY_PATH?)");
    }
    eprintln!("SKIPPED (NVRTC not found; install nvidia-cuda-nvrtc and put its lib dir on LD_LIBRARY_PATH)");
    false
}

/// Every prebuilt image is what NVRTC builds from the current sources, byte
/// for byte. With GPQ_UPDATE_KERNELS=1 (scripts/build-kernels.sh) the images
/// and the manifest are written instead.
#[test]
fn prebuilt_kernels_match_the_sources() {
    use gpq::gpu::prebuilt::{self, IMAGES, ImageKind};
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = gpq::gpu::nvrtc_version().unwrap();
    let nvrtc = format!("{major}.{minor}");
    let update = std::env::var("GPQ_UPDATE_KERNELS").is_ok_and(|v| v == "1");
    if !update && prebuilt::manifest_value("nvrtc") != Some(nvrtc.as_str()) {
        panic!(
            "the prebuilt kernels were built with NVRTC {:?}, this is {nvrtc}: install the version scripts/nvrtc-env.sh pins",
            prebuilt::manifest_value("nvrtc")
        );
    }
    // With -lineinfo NVRTC writes the working directory into the images'
    // line tables: they are built from "/", so that they do not depend on
    // where the repository lies. (This test's binary reads no relative path.)
    std::env::set_current_dir("/").unwrap();
    // Two at a time: each compile takes a core for about ten seconds.
    let built: Vec<Vec<u8>> = IMAGES
        .chunks(2)
        .flat_map(|pair| {
            std::thread::scope(|s| {
                let handles: Vec<_> = pair
                    .iter()
                    .map(|image| {
                        s.spawn(move || match image.kind {
                            ImageKind::Cubin => gpq::gpu::compile_cubin(image.arch),
                            ImageKind::Ptx => gpq::gpu::compile_ptx(image.arch),
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
            })
        })
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    if update {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gpu/prebuilt");
        let mut manifest = String::from(
            "# Kernels compiled ahead of time by scripts/build-kernels.sh (do not edit): the digest of\n\
             # the sources and options, NVRTC's version, and the SHA-256 of each image before compression.\n",
        );
        manifest += &format!("sources {}\nnvrtc {nvrtc}\n", prebuilt::source_digest());
        for (image, bytes) in IMAGES.iter().zip(&built) {
            let compressed = zstd::bulk::compress(bytes, 19).unwrap();
            std::fs::write(dir.join(image.file_name()), compressed).unwrap();
            manifest += &format!("{} {}\n", image.file_name(), prebuilt::digest(bytes));
        }
        std::fs::write(dir.join("manifest.txt"), manifest).unwrap();
        eprintln!("wrote {} images and the manifest to {}", IMAGES.len(), dir.display());
        return;
    }
    for (image, bytes) in IMAGES.iter().zip(&built) {
        match image.kind {
            ImageKind::Cubin => assert_eq!(&bytes[..4], b"\x7fELF", "{}: not a cubin", image.arch),
            ImageKind::Ptx => assert!(bytes.ends_with(b"\0"), "{}: PTX not NUL-terminated", image.arch),
        }
        assert!(
            image.bytes().unwrap() == *bytes,
            "the prebuilt {} image is not what NVRTC {nvrtc} builds from the sources: run scripts/build-kernels.sh",
            image.arch
        );
    }
}

#[test]
fn compile_errors_carry_the_log() {
    if !nvrtc_or_skip() {
        return;
    }
    // An undeclared identifier on line 2 of a file NVRTC names "bad.cu" (the
    // `#line` marker numbers the line after it 1): the error must carry
    // NVRTC's own diagnostic, line number included.
    let source = "#line 1 \"bad.cu\"\nextern \"C\" __global__ void k(int* p) {\n  *p = not_declared_anywhere;\n}\n";
    let err = gpq::gpu::kernels::compile_source_for_test(source, "sm_90").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, gpq::Error::Kernel { stage: "nvrtc", .. }), "{err:?}");
    assert!(text.contains("not_declared_anywhere") && text.contains("bad.cu(2)"), "{text}");
}
