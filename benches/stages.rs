//! Criterion benchmarks of gpq's stages in isolation, on TPC-H lineitem:
//! planning (CPU), IO into device memory, and on device-resident bytes the
//! page-header parse, decompression and decode. Device stages synchronize
//! inside every iteration, so wall time is device time.
//!
//! `GPQ_BENCH_FILE` picks the file; otherwise lineitem at `GPQ_BENCH_SF`
//! (default 1) is generated under `target/bench-data`. Device stages are
//! skipped with a notice where no GPU is present.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpq::cuda::GpuContext;
use gpq::decode::{decode_values, decompress_pages, read_page_headers};
use gpq::{DecompressMode, ReadOptions, ReadPlan, read_column_chunks};

fn bench_file() -> PathBuf {
    if let Ok(f) = std::env::var("GPQ_BENCH_FILE") {
        return PathBuf::from(f);
    }
    let sf: f64 = std::env::var("GPQ_BENCH_SF").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/bench-data/sf{sf}"));
    let path = dir.join("lineitem.parquet");
    if !path.exists() {
        let options = gpq_bench::tpch::GenOptions { scale_factor: sf, ..Default::default() };
        gpq_bench::tpch::generate_table(gpq_bench::tpch::Table::Lineitem, &dir, &options, &|_| {}).expect("generate lineitem");
    }
    path
}

fn stages(c: &mut Criterion) {
    let file = bench_file();
    let options = ReadOptions::new();
    let file_size = std::fs::metadata(&file).unwrap().len();

    let mut g = c.benchmark_group("cpu");
    g.throughput(Throughput::Bytes(file_size));
    g.bench_function("plan", |b| b.iter(|| black_box(ReadPlan::new(&file, &options).unwrap())));
    // The two halves of a plan: the footer, and planning from it.
    g.bench_function("footer", |b| b.iter(|| black_box(gpq::read_footer(&file).unwrap())));
    let footer = gpq::read_footer(&file).unwrap();
    g.bench_function("plan_from_footer", |b| {
        b.iter(|| black_box(ReadPlan::from_footer(&file, footer.clone(), &options).unwrap()))
    });
    g.finish();

    if let Err(e) = GpuContext::get(0) {
        eprintln!("SKIPPED device stages (no GPU): {e}");
        return;
    }
    let chunks = read_column_chunks(&file, &options).unwrap();
    let mut g = c.benchmark_group("device");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(chunks.io().bytes_read));
    g.bench_function("io", |b| b.iter(|| black_box(read_column_chunks(&file, &options).unwrap())));

    g.bench_function("page_headers", |b| b.iter(|| black_box(read_page_headers(&chunks).unwrap())));

    let table = read_page_headers(&chunks).unwrap();
    let dec = decompress_pages(&chunks, &table, DecompressMode::Auto).unwrap();
    g.throughput(Throughput::Bytes(dec.stats().compressed_bytes.max(1)));
    g.bench_function("decompress", |b| b.iter(|| black_box(decompress_pages(&chunks, &table, DecompressMode::Auto).unwrap())));

    let cols = decode_values(&chunks, &table, &dec).unwrap();
    let out_bytes: u64 = cols.iter().map(|c| c.values.len() + c.offsets.as_ref().map_or(0, |o| o.len())).sum();
    g.throughput(Throughput::Bytes(out_bytes));
    g.bench_function("decode", |b| b.iter(|| black_box(decode_values(&chunks, &table, &dec).unwrap())));
    g.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
