//! IO paths on a real GPU: every planned chunk's bytes in device memory must
//! equal the file's bytes. Skips with a notice where no device is present
//! (set GPQ_REQUIRE_GPU=1 to make that a failure).
//!
//! `GPQ_SF10_LINEITEM=/path/lineitem.parquet` adds the large-file checks.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use gpq::gpu::{DeviceBuffer, test_device};
use gpq::io::verify::{device_chunk_checksums, file_chunk_checksums};
use gpq::{Error, IoPath, ReadOptions};
use parquet::basic::Compression;

/// Compares every chunk in device memory with the file, byte for byte.
fn assert_exact(path: &Path, options: &ReadOptions) -> gpq::io::IoStats {
    let chunks = gpq::read_column_chunks(path, options).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let device = chunks.buffer.to_host().unwrap();
    let file = std::fs::File::open(path).unwrap();
    for c in &chunks.plan.chunks {
        let mut want = vec![0u8; c.len as usize];
        file.read_exact_at(&mut want, c.file_offset).unwrap();
        let got = &device[c.device_offset as usize..(c.device_offset + c.len) as usize];
        assert!(got == want.as_slice(), "{}: chunk rg {} col {} differs", path.display(), c.row_group, c.column);
    }
    let dev = device_chunk_checksums(&chunks).unwrap();
    let host = file_chunk_checksums(&chunks).unwrap();
    assert_eq!(dev, host, "device checksums differ from the file");
    assert_eq!(chunks.io.bytes_read, chunks.plan.io.bytes_read);
    assert_ne!(chunks.io.path, IoPath::Auto);
    chunks.io
}

fn test_files(dir: &Path) -> Vec<PathBuf> {
    let small = common::write_sample(&dir.join("small.parquet"), 1_000, 300, Compression::SNAPPY);
    let odd = common::write_sample(&dir.join("odd.parquet"), 77_777, 10_000, Compression::UNCOMPRESSED);
    assert_ne!(std::fs::metadata(&odd).unwrap().len() % 4096, 0, "odd file should not be a multiple of 4 KiB");
    let options = gpq::tpch::GenOptions { scale_factor: 0.05, ..Default::default() };
    let lineitem = gpq::tpch::generate_table(gpq::tpch::Table::Lineitem, dir, &options, &|_| {}).unwrap();
    vec![small, odd, lineitem]
}

#[test]
fn bounce_path_is_byte_exact() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    for path in test_files(dir.path()) {
        for (threads, task) in [(1, 8 << 20), (4, 64 << 10), (7, 4096), (16, 1 << 20)] {
            let o = ReadOptions::new().with_io_path(IoPath::Bounce).with_io_threads(threads).with_task_size(task);
            let stats = assert_exact(&path, &o);
            assert_eq!(stats.path, IoPath::Bounce);
            assert!(!stats.direct);
        }
        // Only some columns and row groups: gaps between chunks.
        let o = ReadOptions::new().with_io_path(IoPath::Bounce).with_columns([0usize, 2]).with_merge_gap(0);
        assert_exact(&path, &o);
    }
}

#[test]
fn bounce_path_with_o_direct_is_byte_exact() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    for path in test_files(dir.path()) {
        let mut o = ReadOptions::new().with_io_path(IoPath::Bounce).with_io_threads(4).with_task_size(1 << 20);
        o.io.direct = Some(true);
        match gpq::read_column_chunks(&path, &o) {
            // Some file systems (tmpfs) refuse O_DIRECT; that must be a clear IO error.
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("O_DIRECT refused on this file system: {source}");
                return;
            }
            Err(e) => panic!("{e}"),
            Ok(_) => {
                let stats = assert_exact(&path, &o);
                assert!(stats.direct);
            }
        }
    }
}

#[test]
fn cufile_compat_path() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let expect = std::env::var("GPQ_EXPECT_CUFILE_COMPAT").is_ok_and(|v| v == "1");
    for path in test_files(dir.path()) {
        let o = ReadOptions::new().with_io_path(IoPath::CufileCompat).with_io_threads(4);
        match gpq::read_column_chunks(&path, &o) {
            Ok(_) => {
                let stats = assert_exact(&path, &o);
                assert_eq!(stats.path, IoPath::CufileCompat);
            }
            Err(e @ Error::CufileUnavailable { .. }) if !expect => {
                eprintln!("cufile-compat unavailable here: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn gds_is_used_only_where_nvidia_fs_is_live() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("gds.parquet"), 5_000, 1_000, Compression::SNAPPY);
    let o = ReadOptions::new().with_io_path(IoPath::Gds);
    if gpq::io::cufile::nvidia_fs_loaded() {
        assert_eq!(assert_exact(&path, &o).path, IoPath::Gds);
    } else {
        match gpq::read_column_chunks(&path, &o) {
            Err(Error::CufileUnavailable { mode: "gds", reason }) => assert!(reason.contains("nvidia-fs"), "{reason}"),
            Err(e) => panic!("expected CufileUnavailable, got {e}"),
            Ok(_) => panic!("forced GDS must not silently fall back"),
        }
        // Auto falls back and says so.
        let stats = assert_exact(&path, &ReadOptions::new());
        assert_eq!(stats.path, IoPath::Bounce);
        assert!(stats.reason.contains("GDS unavailable"), "{}", stats.reason);
    }
}

#[test]
fn file_that_shrinks_after_planning_is_an_io_error() {
    let Some(_ctx) = test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("shrink.parquet"), 50_000, 10_000, Compression::UNCOMPRESSED);
    let options = ReadOptions::new().with_io_path(IoPath::Bounce);
    let plan = gpq::ReadPlan::new(&path, &options).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(plan.file_size / 2).unwrap();
    let ctx = gpq::gpu::GpuContext::get(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    match gpq::reader::read_planned_chunks(plan, Default::default(), &stream, &options) {
        Err(Error::Io { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof),
        Err(e) => panic!("expected an IO error, got {e}"),
        Ok(_) => panic!("a shrunken file must not read successfully"),
    }
    // The context is still healthy.
    common::write_sample(&path, 1000, 100, Compression::SNAPPY);
    assert_exact(&path, &options);
}

#[test]
fn allocation_failure_is_an_error() {
    let Some(ctx) = test_device() else { return };
    let stream = ctx.new_stream().unwrap();
    let too_much = ctx.total_memory * 4;
    match DeviceBuffer::alloc(&stream, too_much, "test") {
        Err(Error::OutOfDeviceMemory { requested, total, .. }) => {
            assert_eq!(requested, too_much);
            assert!(total > 0);
        }
        other => panic!("expected OutOfDeviceMemory, got {other:?}"),
    }
    match DeviceBuffer::alloc_plain(&ctx, too_much, "test") {
        Err(Error::OutOfDeviceMemory { .. }) => {}
        other => panic!("expected OutOfDeviceMemory, got {other:?}"),
    }
    // And a normal allocation still works afterwards.
    let b = DeviceBuffer::alloc(&stream, 1 << 20, "test").unwrap();
    b.fill(&stream, 7).unwrap();
    assert!(b.to_host().unwrap().iter().all(|&x| x == 7));
}

#[test]
fn sf10_lineitem_every_path() {
    let Some(_ctx) = test_device() else { return };
    let Some(path) = std::env::var("GPQ_SF10_LINEITEM").ok().filter(|p| !p.is_empty()) else {
        eprintln!("SKIPPED (set GPQ_SF10_LINEITEM to the SF10 lineitem.parquet)");
        return;
    };
    let path = PathBuf::from(path);
    let expect_compat = std::env::var("GPQ_EXPECT_CUFILE_COMPAT").is_ok_and(|v| v == "1");
    for p in [IoPath::Bounce, IoPath::CufileCompat] {
        let o = ReadOptions::new().with_io_path(p).with_io_threads(16);
        let chunks = match gpq::read_column_chunks(&path, &o) {
            Ok(c) => c,
            Err(e @ Error::CufileUnavailable { .. }) if !expect_compat => {
                eprintln!("NOTE: {p} unavailable here: {e}");
                continue;
            }
            Err(e) => panic!("{p}: {e}"),
        };
        let dev = device_chunk_checksums(&chunks).unwrap();
        let host = file_chunk_checksums(&chunks).unwrap();
        let bad = dev.iter().zip(&host).filter(|(a, b)| a != b).count();
        eprintln!("{p}: {} chunks, {} bytes, {:.2} GB/s, {bad} mismatches", dev.len(), chunks.io.bytes_read, chunks.io.throughput() / 1e9);
        assert_eq!(bad, 0);
    }
}
