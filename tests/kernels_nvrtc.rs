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

/// What one kernel of a cubin asks of an SM, read from its ELF: registers a
/// thread and local frame (`.nv.info` attributes REGCOUNT and FRAME_SIZE of
/// its symbol) and shared memory a block (its `.nv.shared.` section, which
/// on sm_90 includes the 1 KB the system reserves a block).
#[derive(Debug, PartialEq)]
struct KernelResources {
    registers: u32,
    frame_bytes: u32,
    shared_bytes: u64,
}

fn kernel_resources(elf: &[u8], kernel: &str) -> KernelResources {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..5], b"\x7fELF\x02", "a 64-bit ELF image");
    let (shoff, shentsize, shnum, shstrndx) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    // (name, type, offset, size, link) of each section
    let sections: Vec<(u32, u32, usize, usize, u32)> = (0..shnum)
        .map(|i| {
            let h = shoff + i * shentsize;
            (u32_at(h), u32_at(h + 4), u64_at(h + 0x18) as usize, u64_at(h + 0x20) as usize, u32_at(h + 0x28))
        })
        .collect();
    let c_str = |o: usize| std::str::from_utf8(&elf[o..o + elf[o..].iter().position(|&b| b == 0).unwrap()]).unwrap();
    let section_name = |s: &(u32, u32, usize, usize, u32)| c_str(sections[shstrndx].2 + s.0 as usize);
    let find = |name: &str| sections.iter().find(|s| section_name(s) == name).unwrap_or_else(|| panic!("no section {name}"));
    let symtab = sections.iter().find(|s| s.1 == 2).expect("a symbol table");
    let strings = sections[symtab.4 as usize].2;
    let symbol = (0..symtab.3 / 24)
        .find(|&i| c_str(strings + u32_at(symtab.2 + i * 24) as usize) == kernel)
        .unwrap_or_else(|| panic!("no symbol {kernel}")) as u32;
    // .nv.info: attributes of 4-byte headers (format, attribute, size);
    // format 4 carries `size` bytes: (symbol, value) for the two read here.
    let info = find(".nv.info");
    let (mut registers, mut frame_bytes) = (None, None);
    let mut at = info.2;
    while at < info.2 + info.3 {
        let (format, attribute) = (elf[at], elf[at + 1]);
        let size = if format == 4 { u16_at(at + 2) } else { 0 };
        if format == 4 && size == 8 && u32_at(at + 4) == symbol {
            match attribute {
                0x2f => registers = Some(u32_at(at + 8)),
                0x11 => frame_bytes = Some(u32_at(at + 8)),
                _ => {}
            }
        }
        at += 4 + size;
    }
    KernelResources {
        registers: registers.expect("REGCOUNT"),
        frame_bytes: frame_bytes.expect("FRAME_SIZE"),
        // (no section: the kernel has no shared memory)
        shared_bytes: sections.iter().find(|s| section_name(s) == format!(".nv.shared.{kernel}")).map_or(0, |s| s.3 as u64),
    }
}

/// gpq's ZSTD decoder is bound by how many pages an SM keeps in flight
/// (src/gpu/kernels/unzstd.cu): on an H100 or H200 (sm_90, 228 KB of shared
/// memory and 64 K registers an SM) its blocks of 64 threads must fit 14 an
/// SM by shared memory and by registers, spilling little to local memory.
/// An edit that grows its shared memory or its register needs fails here,
/// not as a slower read on the device.
#[test]
fn zstd_decoder_keeps_fourteen_blocks_an_sm_on_sm_90() {
    let image = gpq::gpu::prebuilt::IMAGES.iter().find(|i| i.arch == "sm_90").unwrap();
    let r = kernel_resources(&image.bytes().unwrap(), "gpq_unzstd");
    eprintln!("gpq_unzstd on sm_90: {r:?}");
    let blocks_by_shared = (228 * 1024) / r.shared_bytes;
    let blocks_by_registers = 65536 / (64 * r.registers.next_multiple_of(8) as u64);
    assert!(blocks_by_shared >= 14, "{} bytes of shared memory a block: {blocks_by_shared} blocks an SM", r.shared_bytes);
    assert!(blocks_by_registers >= 14, "{} registers a thread: {blocks_by_registers} blocks an SM", r.registers);
    // Under that cap a few registers spill (lane 0's block planning, one
    // value in the execution rounds); more is a change to look at.
    assert!(r.frame_bytes <= 32, "the decoder spills {} bytes to local memory", r.frame_bytes);
    // The sequence kernel keeps its threads' tables in shared memory: under
    // the 48 KB a block has without opting in, and five blocks an SM (the
    // default of GPQ_UNZSTD_LIST_BLOCKS), without local memory.
    let lists = kernel_resources(&image.bytes().unwrap(), "gpq_unzstd_sequences");
    eprintln!("gpq_unzstd_sequences on sm_90: {lists:?}");
    assert!(lists.shared_bytes <= 48 * 1024 + 1024 && (228 * 1024) / lists.shared_bytes >= 5, "{lists:?}");
    assert_eq!(lists.frame_bytes, 0, "{lists:?}");
    // The parser itself, on a kernel with a frame: the aggregation kernel
    // keeps arrays in local memory.
    let aggregate = kernel_resources(&image.bytes().unwrap(), "gpq_aggregate");
    assert!(aggregate.frame_bytes > 0 && aggregate.registers > 0, "{aggregate:?}");
}
