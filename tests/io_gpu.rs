//! IO paths on a device: every column chunk's bytes in device memory must
//! equal the file's bytes at the offsets the footer gives, and the IO report
//! must say what ran. Reported as ignored where no device (or emulator) is
//! present; GPQ_REQUIRE_GPU=1 makes that a failure.
//!
//! `GPQ_SF10_LINEITEM=/path/lineitem.parquet` adds the large-file checks.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use common::{Device, gpu_trial, probe_device, run_trials};
use gpq::cuda::{DeviceBuffer, GpuContext};
use gpq::gpu::verify::{device_chunk_checksums, file_chunk_checksums};
use gpq::{Error, IoPath, IoStats, ReadOptions};
use parquet::basic::Compression;
use parquet::file::metadata::ParquetMetaDataReader;

fn main() -> ExitCode {
    let device = probe_device();
    let real_gpu = matches!(device, Device::Gpu(_));
    let mut trials = vec![
        gpu_trial(&device, "bounce_path_is_byte_exact", bounce_path_is_byte_exact),
        gpu_trial(&device, "bounce_path_with_o_direct_is_byte_exact", bounce_path_with_o_direct_is_byte_exact),
        gpu_trial(&device, "file_that_shrinks_after_planning_is_an_io_error", file_that_shrinks_after_planning_is_an_io_error),
        gpu_trial(&device, "allocation_failure_is_an_error", allocation_failure_is_an_error),
    ];
    // cuFile and GDS exist on real devices only.
    if real_gpu || common::gpu_required() {
        trials.push(gpu_trial(&device, "cufile_compat_path", cufile_compat_path));
        trials.push(gpu_trial(&device, "gds_is_used_only_where_nvidia_fs_is_live", gds_is_used_only_where_nvidia_fs_is_live));
        trials.push(gpu_trial(&device, "sf10_lineitem_every_path", sf10_lineitem_every_path));
    }
    run_trials(trials)
}

/// The (offset, length) of every column chunk of the selected row groups
/// and columns, straight from the footer (not from gpq's plan).
fn footer_spans(path: &Path, row_groups: &[usize], leaves: &[usize]) -> Vec<(u64, u64)> {
    let file = std::fs::File::open(path).unwrap();
    let md = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
    let mut spans = Vec::new();
    for &rg in row_groups {
        for &leaf in leaves {
            spans.push(md.row_group(rg).column(leaf).byte_range());
        }
    }
    spans
}

/// Reads `path` through `options` and checks every chunk against the file,
/// byte for byte and by the checksum kernel; returns the IO report.
fn assert_exact(path: &Path, options: &ReadOptions, expect_path: IoPath) -> IoStats {
    let chunks = gpq::read_column_chunks(path, options).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let plan = chunks.plan();
    let leaves: Vec<usize> = plan.columns().iter().flat_map(|c| c.leaves.iter().map(|l| l.leaf_index)).collect();
    let spans = footer_spans(path, plan.row_groups(), &leaves);
    let planned: Vec<(u64, u64)> = plan.chunks().iter().map(|c| (c.file_offset, c.len)).collect();
    assert_eq!(planned, spans, "{}: the plan's chunks are not the footer's", path.display());

    let device = chunks.buffer().to_host().unwrap();
    let file = std::fs::File::open(path).unwrap();
    for c in plan.chunks() {
        let mut want = vec![0u8; c.len as usize];
        file.read_exact_at(&mut want, c.file_offset).unwrap();
        let got = &device[c.device_offset as usize..(c.device_offset + c.len) as usize];
        assert!(got == want.as_slice(), "{}: chunk rg {} col {} differs", path.display(), c.row_group, c.column);
    }
    assert_eq!(device_chunk_checksums(&chunks).unwrap(), file_chunk_checksums(&chunks).unwrap(), "device checksums differ");

    let io = chunks.io().clone();
    assert_eq!(io.path, expect_path);
    let requested: u64 = spans.iter().map(|s| s.1).sum();
    assert_eq!(io.bytes_requested, requested, "bytes requested, against the footer");
    // What was read is the requested bytes plus alignment and merge
    // over-read: at most two 4 KiB blocks and one merge gap per chunk.
    let slack = spans.len() as u64 * (2 * 4096 + options.io.merge_gap);
    assert!(io.bytes_read >= requested && io.bytes_read <= requested + slack, "read {} for {requested} requested", io.bytes_read);
    assert_eq!(io.tasks, plan.io().tasks.len());
    let threads = options.io.threads.unwrap_or(io.threads);
    assert_eq!(io.threads, threads.min(io.tasks.max(1)));
    io
}

fn test_files(dir: &Path) -> Vec<PathBuf> {
    let small = common::write_sample(&dir.join("small.parquet"), 1_000, 300, Compression::SNAPPY);
    let odd = common::write_sample(&dir.join("odd.parquet"), 77_777, 10_000, Compression::UNCOMPRESSED);
    assert_ne!(std::fs::metadata(&odd).unwrap().len() % 4096, 0, "odd file should not be a multiple of 4 KiB");
    let lineitem = common::tpch_table(dir, gpq_bench::tpch::Table::Lineitem, 0.02);
    vec![small, odd, lineitem]
}

fn bounce_path_is_byte_exact(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    for path in test_files(dir.path()) {
        for (threads, task) in [(1, 8 << 20), (4, 64 << 10), (7, 4096), (16, 1 << 20)] {
            let o = ReadOptions::new().with_io_path(IoPath::Bounce).with_io_threads(threads).with_task_size(task);
            let stats = assert_exact(&path, &o, IoPath::Bounce);
            assert!(!stats.direct);
            assert!(stats.reason.contains("forced"), "{}", stats.reason);
        }
        // Only some columns: gaps between chunks.
        let o = ReadOptions::new().with_io_path(IoPath::Bounce).with_columns([0usize, 2]).with_merge_gap(0);
        assert_exact(&path, &o, IoPath::Bounce);
    }
}

fn bounce_path_with_o_direct_is_byte_exact(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    for path in test_files(dir.path()) {
        let o = ReadOptions::new().with_io_path(IoPath::Bounce).with_io_threads(4).with_task_size(1 << 20).with_direct_io(true);
        match gpq::read_column_chunks(&path, &o) {
            // Some file systems (tmpfs) refuse O_DIRECT; that must be a clear open error.
            Err(Error::Open { source, .. }) if source.raw_os_error() == Some(libc_einval()) => {
                eprintln!("O_DIRECT refused on this file system: {source}");
                return;
            }
            Err(e) => panic!("{e}"),
            Ok(_) => assert!(assert_exact(&path, &o, IoPath::Bounce).direct),
        }
    }
}

fn libc_einval() -> i32 {
    22
}

fn cufile_compat_path(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let expect = std::env::var("GPQ_EXPECT_CUFILE_COMPAT").is_ok_and(|v| v == "1");
    for path in test_files(dir.path()) {
        let o = ReadOptions::new().with_io_path(IoPath::CufileCompat).with_io_threads(4);
        match gpq::read_column_chunks(&path, &o) {
            Ok(_) => {
                assert_exact(&path, &o, IoPath::CufileCompat);
            }
            // Without a udev record of the disk cuFile refuses every file (see
            // BENCHMARKS.md); the device script runs this again with one in
            // place and GPQ_EXPECT_CUFILE_COMPAT=1.
            Err(Error::CufileUnavailable { mode: "cufile-compat", reason }) if !expect => {
                assert!(reason.contains("cuFile") || reason.contains("udev"), "{reason}");
                eprintln!("cufile-compat unavailable here: {reason}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn gds_is_used_only_where_nvidia_fs_is_live(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("gds.parquet"), 5_000, 1_000, Compression::SNAPPY);
    let o = ReadOptions::new().with_io_path(IoPath::Gds);
    if gpq::io::cufile::nvidia_fs_loaded() {
        assert_exact(&path, &o, IoPath::Gds);
    } else {
        match gpq::read_column_chunks(&path, &o) {
            Err(Error::CufileUnavailable { mode: "gds", reason }) => assert!(reason.contains("nvidia-fs"), "{reason}"),
            Err(e) => panic!("expected CufileUnavailable, got {e}"),
            Ok(_) => panic!("forced GDS must not silently fall back"),
        }
        // Auto falls back to the bounce path and says why.
        let stats = assert_exact(&path, &ReadOptions::new(), IoPath::Bounce);
        assert!(stats.reason.contains("GDS unavailable"), "{}", stats.reason);
    }
}

fn file_that_shrinks_after_planning_is_an_io_error(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_sample(&dir.path().join("shrink.parquet"), 50_000, 10_000, Compression::UNCOMPRESSED);
    let options = ReadOptions::new().with_io_path(IoPath::Bounce);
    let plan = gpq::ReadPlan::new(&path, &options).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(plan.file_size() / 2).unwrap();
    let stream = ctx.new_stream().unwrap();
    match gpq::io::read_chunks(plan, Default::default(), &stream, &options.io) {
        Err(Error::Io { source, file, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
            assert_eq!(file, path);
        }
        Err(e) => panic!("expected an IO error, got {e}"),
        Ok(_) => panic!("a shrunken file must not read successfully"),
    }
    // The process can still read, and reads right.
    common::write_sample(&path, 1000, 100, Compression::SNAPPY);
    assert_exact(&path, &options, IoPath::Bounce);
}

fn allocation_failure_is_an_error(ctx: &Arc<GpuContext>) {
    let stream = ctx.new_stream().unwrap();
    let too_much = ctx.total_memory * 4;
    match DeviceBuffer::alloc(&stream, too_much, "test") {
        Err(Error::OutOfDeviceMemory { requested, total, what, .. }) => {
            assert_eq!(requested, too_much);
            assert_eq!(total, ctx.total_memory);
            assert_eq!(what, "test");
        }
        other => panic!("expected OutOfDeviceMemory, got {other:?}"),
    }
    if !ctx.is_emulated() {
        match DeviceBuffer::alloc_plain(ctx, too_much, "test") {
            Err(Error::OutOfDeviceMemory { requested, .. }) => assert_eq!(requested, too_much),
            other => panic!("expected OutOfDeviceMemory, got {other:?}"),
        }
    }
    // And a normal allocation still works afterwards.
    let b = DeviceBuffer::alloc(&stream, 1 << 20, "test").unwrap();
    b.fill(&stream, 7).unwrap();
    let host = b.to_host().unwrap();
    assert_eq!(host.len(), 1 << 20);
    assert!(host.iter().all(|&x| x == 7));
}

fn sf10_lineitem_every_path(_ctx: &Arc<GpuContext>) {
    let Some(path) = std::env::var("GPQ_SF10_LINEITEM").ok().filter(|p| !p.is_empty()) else {
        eprintln!("NOTE: GPQ_SF10_LINEITEM is not set; the SF10 file is not checked");
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
        assert_eq!(chunks.io().path, p);
        let dev = device_chunk_checksums(&chunks).unwrap();
        let host = file_chunk_checksums(&chunks).unwrap();
        let bad = dev.iter().zip(&host).filter(|(a, b)| a != b).count();
        eprintln!("{p}: {} chunks, {} bytes, {:.2} GB/s, {bad} mismatches", dev.len(), chunks.io().bytes_read, chunks.io().throughput() / 1e9);
        assert_eq!(dev.len(), chunks.plan().chunks().len());
        assert_eq!(bad, 0);
    }
}
