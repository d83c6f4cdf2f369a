//! Hostile input: the device's structural check of compressed pages agrees
//! with the CPU decoders, every file in `testdata/regressions` (inputs that
//! once broke gpq) is a typed error returned quickly with the process still
//! healthy afterwards, a read's memory budget holds, and a failed read leaves
//! device memory as it found it. Runs on a GPU or the emulator; ignored
//! without either. The context-loss trial runs only with
//! `GPQ_TEST_CONTEXT_LOSS=1` (it resets the device under every other trial).

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Device, Rng, arrow_rs, assert_batches_equal, gpu_trial, probe_device, run_trials, write_sample};
use gpq::cuda::GpuContext;
use gpq::{Error, ReadOptions, read_parquet_to_device};
use parquet::basic::{Compression, ZstdLevel};

fn main() -> ExitCode {
    let device = probe_device();
    let mut trials = vec![
        gpu_trial(&device, "snappy_check_agrees_with_the_cpu_decoder", snappy_check_agrees_with_the_cpu_decoder),
        gpu_trial(&device, "snappy_check_reasons_match_a_sequential_walk", snappy_check_reasons_match_a_sequential_walk),
        gpu_trial(&device, "snappy_decoder_agrees_with_snap", snappy_decoder_agrees_with_snap),
        gpu_trial(&device, "lz4_check_accepts_only_what_decodes", lz4_check_accepts_only_what_decodes),
        gpu_trial(&device, "zstd_check_accepts_every_valid_frame", zstd_check_accepts_every_valid_frame),
        gpu_trial(&device, "zstd_decoder_agrees_with_the_library", zstd_decoder_agrees_with_the_library),
        gpu_trial(&device, "regression_pages_and_the_device_check", regression_pages_and_the_device_check),
        gpu_trial(&device, "regressions_are_quick_typed_errors", regressions_are_quick_typed_errors),
        gpu_trial(&device, "memory_budget_is_enforced", memory_budget_is_enforced),
        gpu_trial(&device, "failed_read_returns_its_memory", failed_read_returns_its_memory),
        gpu_trial(&device, "zstd_hang_costs_only_the_worker", zstd_hang_costs_only_the_worker),
        gpu_trial(&device, "gzip_trailer_mismatch_is_an_error", gzip_trailer_mismatch_is_an_error),
    ];
    if std::env::var("GPQ_TEST_CONTEXT_LOSS").is_ok_and(|v| v == "1") && matches!(device, Device::Gpu(_)) {
        trials.push(gpu_trial(&device, "lost_context_is_reset_and_the_next_read_works", lost_context_is_reset));
    }
    run_trials(trials)
}

/// `testdata/` of the repository (the crate root at build time, else the
/// working directory; `GPQ_TESTDATA` overrides).
fn testdata() -> PathBuf {
    let candidates = [
        std::env::var("GPQ_TESTDATA").ok().map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata")),
        Some(PathBuf::from("testdata")),
    ];
    candidates.into_iter().flatten().find(|p| p.join("regressions").is_dir()).expect("testdata/regressions not found")
}

/// Sample inputs of several shapes: repetitive text, random bytes, runs.
fn inputs() -> Vec<Vec<u8>> {
    let mut r = Rng::new(7);
    let text: Vec<u8> = (0..40_000).flat_map(|i| format!("row {} value {} ", i % 977, r.below(50)).into_bytes()).collect();
    let random: Vec<u8> = (0..20_000).map(|_| r.next() as u8).collect();
    let runs: Vec<u8> = (0..30_000).map(|i| (i / 700) as u8).collect();
    let ints: Vec<u8> = (0..10_000i64).flat_map(|i| (i * 3 + 1_000_000).to_le_bytes()).collect();
    vec![text, random, runs, ints, vec![], b"a".to_vec()]
}

/// A mutated copy of `c`: a bit flip, a byte overwrite, a truncation, or an
/// extension; and the promised size, sometimes off by one.
fn mutate(r: &mut Rng, c: &[u8], promised: u64) -> (Vec<u8>, u64) {
    let mut m = c.to_vec();
    match r.below(5) {
        0 | 1 if !m.is_empty() => {
            let at = r.below(m.len() as u64) as usize;
            m[at] ^= 1 << r.below(8);
        }
        2 if !m.is_empty() => {
            let at = r.below(m.len() as u64) as usize;
            m[at] = r.next() as u8;
        }
        3 => m.truncate(r.below(m.len() as u64 + 1) as usize),
        _ => m.push(r.next() as u8),
    }
    let promised = match r.below(8) {
        0 => promised + 1,
        1 => promised.saturating_sub(1),
        _ => promised,
    };
    (m, promised)
}

fn stream(ctx: &Arc<GpuContext>) -> Arc<gpq::cuda::GpuStream> {
    ctx.new_stream().unwrap()
}

/// Valid streams pass; on corrupt ones the check and `snap` agree exactly
/// (a SNAPPY stream the check accepts decodes within bounds to the promised size).
fn snappy_check_agrees_with_the_cpu_decoder(ctx: &Arc<GpuContext>) {
    let mut cases: Vec<(Vec<u8>, u64, bool)> = Vec::new();
    let mut r = Rng::new(1);
    for input in inputs() {
        let c = snap::raw::Encoder::new().compress_vec(&input).unwrap();
        cases.push((c.clone(), input.len() as u64, true));
        for _ in 0..300 {
            let (m, promised) = mutate(&mut r, &c, input.len() as u64);
            let mut out = vec![0u8; promised as usize];
            let ok = snap::raw::Decoder::new().decompress(&m, &mut out).is_ok_and(|n| n as u64 == promised);
            cases.push((m, promised, ok));
        }
    }
    let pages: Vec<(&[u8], u64)> = cases.iter().map(|(b, n, _)| (b.as_slice(), *n)).collect();
    let verdicts = gpq::decode::check_compressed_pages(&stream(ctx), Compression::SNAPPY, &pages).unwrap();
    let mut rejected = 0;
    for (k, ((bytes, promised, decodes), v)) in cases.iter().zip(&verdicts).enumerate() {
        assert_eq!(*v == 0, *decodes, "case {k} ({} bytes, promised {promised}): verdict {v}, snap decodes: {decodes}", bytes.len());
        rejected += (*v != 0) as usize;
    }
    eprintln!("snappy: {} cases, {rejected} rejected by the check and by snap", cases.len());
    assert!(rejected > 100, "the mutations should break many streams");
}

/// The device check's verdict on a SNAPPY stream, walked one tag at a time
/// on the host: the first failing tag in stream order decides (the codes of
/// `CheckReason` in check_compressed.cu).
fn snappy_reference_verdict(b: &[u8], out_len: u64) -> u32 {
    const TRUNCATED: u32 = 1;
    const OUTPUT_OVERRUN: u32 = 2;
    const BAD_OFFSET: u32 = 3;
    const SIZE_MISMATCH: u32 = 4;
    const UNSUPPORTED: u32 = 6;
    if b.len() as u64 >= 1 << 31 || out_len >= 1 << 31 {
        return UNSUPPORTED;
    }
    let (mut declared, mut pos, mut done) = (0u64, 0usize, false);
    for shift in (0..35).step_by(7) {
        let Some(&byte) = b.get(pos) else { break };
        pos += 1;
        declared |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            done = true;
            break;
        }
    }
    if !done {
        return TRUNCATED;
    }
    if declared != out_len {
        return SIZE_MISMATCH;
    }
    let le = |at: usize, n: usize| (0..n).fold(0u64, |v, i| v | u64::from(b[at + i]) << (8 * i));
    let mut out = 0u64;
    while pos < b.len() {
        let tag = b[pos];
        let (kind, t6) = (tag & 3, u64::from(tag >> 2));
        let extra = match kind {
            0 if t6 >= 60 => (t6 - 59) as usize,
            0 => 0,
            3 => 4,
            k => k as usize,
        };
        let left = b.len() - pos;
        if 1 + extra > left {
            return TRUNCATED;
        }
        let (len, advance) = if kind == 0 {
            let len = if t6 >= 60 { le(pos + 1, extra) } else { t6 } + 1;
            if len > (left - 1 - extra) as u64 {
                return TRUNCATED;
            }
            (len, 1 + extra + len as usize)
        } else {
            let offset = if kind == 1 { (u64::from(tag >> 5) << 8) | le(pos + 1, 1) } else { le(pos + 1, extra) };
            if offset == 0 || offset > out {
                return BAD_OFFSET;
            }
            (if kind == 1 { (t6 & 7) + 4 } else { t6 + 1 }, 1 + extra)
        };
        if len > out_len - out {
            return OUTPUT_OVERRUN;
        }
        out += len;
        pos += advance;
    }
    if out == out_len { 0 } else { SIZE_MISMATCH }
}

/// The check's reasons equal a sequential walk's, on streams of every shape
/// (long literals, long runs of copies, pages of many spans) and mutated
/// copies of them: the chunk walks and their warm-ups find the same first
/// failing tag as the walk does.
fn snappy_check_reasons_match_a_sequential_walk(ctx: &Arc<GpuContext>) {
    let cases = snappy_cases(&mut Rng::new(11), 80);
    let pages: Vec<(&[u8], u64)> = cases.iter().map(|(b, n, _)| (b.as_slice(), *n)).collect();
    let verdicts = gpq::decode::check_compressed_pages(&stream(ctx), Compression::SNAPPY, &pages).unwrap();
    let mut by_reason = [0usize; 7];
    for (k, ((bytes, promised, _), v)) in cases.iter().zip(&verdicts).enumerate() {
        let want = snappy_reference_verdict(bytes, *promised);
        assert_eq!(*v, want, "case {k} ({} bytes, promised {promised})", bytes.len());
        by_reason[want.min(6) as usize] += 1;
    }
    eprintln!("snappy reasons: {} cases, by reason (ok, truncated, overrun, offset, size, header, unsupported): {by_reason:?}", cases.len());
    assert!(by_reason[0] > 30 && by_reason[1] > 30 && by_reason[2] > 30 && by_reason[3] > 30 && by_reason[4] > 30, "every reason is exercised");
}

/// SNAPPY streams of every shape (long literals, long runs of copies, pages
/// of many spans and windows) as `snap` writes them, each with `mutations`
/// mutated copies: (bytes, promised size, the input an unmutated stream
/// must give).
fn snappy_cases(r: &mut Rng, mutations: usize) -> Vec<(Vec<u8>, u64, Option<Vec<u8>>)> {
    let mut inputs = inputs();
    for n in 0..24u64 {
        let target = 1 + r.below(if n % 4 == 0 { 300_000 } else { 40_000 }) as usize;
        let mut v = Vec::with_capacity(target);
        while v.len() < target {
            match r.below(4) {
                0 => v.extend((0..r.below(5000)).map(|_| r.next() as u8)),
                1 => v.extend(std::iter::repeat_n(r.next() as u8, r.below(3000) as usize)),
                2 => (0..r.below(2000)).for_each(|i| v.extend(format!("row {} val {} ", i % 97, r.below(30)).bytes())),
                _ => (0..r.below(1000) as i64).for_each(|i| v.extend((i * 7 + 1_000_000).to_le_bytes())),
            }
        }
        v.truncate(target);
        inputs.push(v);
    }
    let mut cases = Vec::new();
    for input in &inputs {
        let c = snap::raw::Encoder::new().compress_vec(input).unwrap();
        let len = input.len() as u64;
        cases.push((c.clone(), len, Some(input.clone())));
        for _ in 0..mutations {
            let (mut m, promised) = mutate(r, &c, len);
            // Also a byte inserted: every later tag shifts, which the chunk
            // walks must find again.
            if r.below(4) == 0 {
                m.insert(r.below(m.len() as u64 + 1) as usize, r.next() as u8);
            }
            cases.push((m, promised, None));
        }
    }
    cases
}

/// gpq's own SNAPPY decoder: every stream `snap` wrote decodes to its
/// input; on mutated copies its verdict is the sequential walk's (the
/// device check's), and what it accepts decodes to the bytes `snap` gives.
fn snappy_decoder_agrees_with_snap(ctx: &Arc<GpuContext>) {
    let emulated = ctx.is_emulated() || std::env::var("GPQ_TEST_SMALL").is_ok_and(|v| v == "1");
    let cases = snappy_cases(&mut Rng::new(13), if emulated { 16 } else { 80 });
    let pages: Vec<(&[u8], u64)> = cases.iter().map(|(b, n, _)| (b.as_slice(), *n)).collect();
    let got = gpq::decode::unsnappy_pages(&stream(ctx), &pages).unwrap();
    let mut by_reason = [0usize; 7];
    for (k, ((bytes, promised, original), (verdict, out))) in cases.iter().zip(&got).enumerate() {
        let want = snappy_reference_verdict(bytes, *promised);
        assert_eq!(*verdict, want, "case {k} ({} bytes, promised {promised})", bytes.len());
        by_reason[want.min(6) as usize] += 1;
        if let Some(original) = original {
            assert!(out == original, "case {k}: a stream snap wrote decodes to other bytes");
        } else if *verdict == 0 {
            let reference = snap::raw::Decoder::new().decompress_vec(bytes).expect("snap decodes what the device accepts");
            assert!(reference == *out, "case {k}: accepted, but snap decodes it to other bytes");
        }
    }
    eprintln!("snappy decoder: {} cases, by reason (ok, truncated, overrun, offset, size, header, unsupported): {by_reason:?}", cases.len());
    assert!(by_reason[0] > 30 && by_reason[1] > 30 && by_reason[2] > 10 && by_reason[3] > 30 && by_reason[4] > 30, "every reason is exercised");
}

/// LZ4 blocks: valid ones pass; whatever the check accepts, `lz4_flex` decodes to the promised size.
fn lz4_check_accepts_only_what_decodes(ctx: &Arc<GpuContext>) {
    let mut cases: Vec<(Vec<u8>, u64, bool, bool)> = Vec::new(); // bytes, promised, valid original, decodes
    let mut r = Rng::new(2);
    for input in inputs() {
        let c = lz4_flex::block::compress(&input);
        cases.push((c.clone(), input.len() as u64, true, true));
        for _ in 0..300 {
            let (m, promised) = mutate(&mut r, &c, input.len() as u64);
            let ok = lz4_flex::block::decompress(&m, promised as usize).is_ok_and(|d| d.len() as u64 == promised);
            cases.push((m, promised, false, ok));
        }
    }
    let pages: Vec<(&[u8], u64)> = cases.iter().map(|(b, n, _, _)| (b.as_slice(), *n)).collect();
    let verdicts = gpq::decode::check_compressed_pages(&stream(ctx), Compression::LZ4_RAW, &pages).unwrap();
    let (mut accepted_bad, mut rejected) = (0, 0);
    for (k, ((_, _, valid, decodes), v)) in cases.iter().zip(&verdicts).enumerate() {
        if *valid {
            assert_eq!(*v, 0, "case {k}: a block lz4_flex wrote fails the check");
        }
        if *v == 0 {
            assert!(*decodes, "case {k}: the check accepts a block lz4_flex cannot decode to the promised size");
        } else {
            rejected += 1;
        }
        accepted_bad += (*v == 0 && !*valid) as usize;
    }
    eprintln!("lz4: {} cases, {rejected} rejected, {accepted_bad} mutated blocks accepted (all decode)", cases.len());
    assert!(rejected > 100);
}

/// ZSTD frames from every level pass; corrupt ones are rejected when their
/// headers are broken (entropy-coded payloads are not decoded by the check).
fn zstd_check_accepts_every_valid_frame(ctx: &Arc<GpuContext>) {
    let mut cases: Vec<(Vec<u8>, u64, bool, bool)> = Vec::new();
    let mut r = Rng::new(3);
    for input in inputs() {
        for level in [1, 3, 9, 19] {
            let c = zstd::bulk::compress(&input, level).unwrap();
            cases.push((c.clone(), input.len() as u64, true, true));
            for _ in 0..60 {
                let (m, promised) = mutate(&mut r, &c, input.len() as u64);
                let ok = zstd::bulk::decompress(&m, promised as usize).is_ok_and(|d| d.len() as u64 == promised);
                cases.push((m, promised, false, ok));
            }
        }
    }
    let pages: Vec<(&[u8], u64)> = cases.iter().map(|(b, n, _, _)| (b.as_slice(), *n)).collect();
    let verdicts = gpq::decode::check_compressed_pages(&stream(ctx), Compression::ZSTD(ZstdLevel::default()), &pages).unwrap();
    let (mut rejected, mut rejected_good, mut undetected) = (0, 0, 0);
    for (k, ((_, _, valid, decodes), v)) in cases.iter().zip(&verdicts).enumerate() {
        if *valid {
            assert_eq!(*v, 0, "case {k}: a frame zstd wrote fails the check");
        }
        rejected += (*v != 0) as usize;
        rejected_good += (*v != 0 && *decodes) as usize;
        undetected += (*v == 0 && !*decodes) as usize;
    }
    eprintln!(
        "zstd: {} cases, {rejected} rejected ({rejected_good} of them decode on the CPU all the same: they go to the CPU), \
         {undetected} corrupt frames pass the check (left to nvCOMP's own status and the deadline)",
        cases.len()
    );
    assert!(rejected > 50);
}

/// What arrow-rs makes of a ZSTD page: the zstd library's streaming
/// decoder (every frame in a row), and the size must be the promised one.
fn zstd_reference(bytes: &[u8], promised: u64) -> Option<Vec<u8>> {
    zstd::stream::decode_all(bytes).ok().filter(|d| d.len() as u64 == promised)
}

/// gpq's own ZSTD decoder: frames of every level (one block or many, raw,
/// RLE and compressed blocks, predefined, RLE, FSE and repeated tables,
/// one or four Huffman streams), frames in a row and skippable frames
/// decode to the bytes the zstd library gives; of mutated frames, what it
/// accepts the library decodes to the same bytes, and what it refuses goes
/// to the CPU decoder (refusing is always safe; accepting wrongly is not).
fn zstd_decoder_agrees_with_the_library(ctx: &Arc<GpuContext>) {
    // Smaller on the emulator and under compute-sanitizer (GPQ_TEST_SMALL=1).
    let emulated = ctx.is_emulated() || std::env::var("GPQ_TEST_SMALL").is_ok_and(|v| v == "1");
    let mut r = Rng::new(11);
    let mut inputs = inputs();
    // Several blocks: repeats far apart, text, and runs, past 128 KiB.
    let mut big: Vec<u8> = Vec::new();
    while big.len() < if emulated { 300_000 } else { 2_000_000 } {
        match r.below(3) {
            0 => big.extend((0..r.below(3000)).map(|_| r.below(16) as u8 + b'a')),
            1 => big.extend(std::iter::repeat_n(r.next() as u8, r.below(2000) as usize)),
            _ => {
                let from = r.below(big.len() as u64 + 1) as usize;
                let len = (r.below(5000) as usize).min(big.len() - from);
                big.extend_from_slice(&big[from..from + len].to_vec());
            }
        }
    }
    inputs.push(big);
    // Prices, one per line: the reference library's higher levels repeat
    // the Huffman table (treeless literals) and the length tables of the
    // block before, which the decoder rebuilds (they share its memory).
    let prices: Vec<u8> = (0..if emulated { 60_000 } else { 300_000 })
        .flat_map(|_| format!("{}.{:02}\n", 900 + r.below(104_100), r.below(100)).into_bytes())
        .collect();
    inputs.push(prices);
    let mutations = if emulated { 6 } else { 60 };
    let mut cases: Vec<(Vec<u8>, u64, Option<Vec<u8>>)> = Vec::new(); // bytes, promised, the input it must give
    for input in &inputs {
        for level in [-5, 1, 3, 9, 19, 22] {
            let c = zstd::bulk::compress(input, level).unwrap();
            cases.push((c.clone(), input.len() as u64, Some(input.clone())));
            for _ in 0..mutations {
                let (m, promised) = mutate(&mut r, &c, input.len() as u64);
                cases.push((m, promised, None));
            }
        }
    }
    // Two frames in a row, and a skippable frame in front of one.
    let (a, b) = (&inputs[0][..5000], &inputs[3][..7000]);
    let mut two = zstd::bulk::compress(a, 3).unwrap();
    two.extend(zstd::bulk::compress(b, 1).unwrap());
    cases.push((two, (a.len() + b.len()) as u64, Some([a, b].concat())));
    let mut skippable = vec![0x5A, 0x2A, 0x4D, 0x18, 3, 0, 0, 0, 1, 2, 3];
    skippable.extend(zstd::bulk::compress(b, 3).unwrap());
    cases.push((skippable, b.len() as u64, Some(b.to_vec())));
    // A frame with a content checksum: refused (the checksum is left to the CPU).
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    std::io::Write::write_all(&mut enc, a).unwrap();
    let checksummed = enc.finish().unwrap();
    let checksummed_case = cases.len();
    cases.push((checksummed, a.len() as u64, None));

    // The frames the library wrote must reach both rebuilds, or this test
    // proves nothing about them.
    let blocks: Vec<(u8, Option<u8>)> = cases.iter().filter(|c| c.2.is_some()).flat_map(|c| zstd_block_modes(&c.0)).collect();
    assert!(blocks.iter().any(|b| b.0 == 3), "no block with treeless literals");
    assert!(blocks.iter().any(|b| b.1.is_some_and(|m| m >> 6 == 3 || (m >> 2) & 3 == 3)), "no block repeats a length table");

    let pages: Vec<(&[u8], u64)> = cases.iter().map(|(b, n, _)| (b.as_slice(), *n)).collect();
    let got = gpq::decode::unzstd_pages(&stream(ctx), &pages).unwrap();
    let (mut accepted_mutants, mut refused) = (0, 0);
    for (k, ((bytes, promised, want), (verdict, out))) in cases.iter().zip(&got).enumerate() {
        if let Some(want) = want {
            assert_eq!(*verdict, 0, "case {k}: a frame zstd wrote ({} bytes for {promised}) is refused", bytes.len());
            assert!(out == want, "case {k}: a frame zstd wrote decodes to other bytes");
            continue;
        }
        if *verdict == 0 {
            let reference = zstd_reference(bytes, *promised);
            assert!(reference.as_deref() == Some(out.as_slice()), "case {k}: accepted, but the zstd library says otherwise");
            accepted_mutants += 1;
        } else {
            refused += 1;
        }
    }
    assert_ne!(got[checksummed_case].0, 0, "a checksummed frame is left to the CPU");
    eprintln!("zstd decoder: {} cases, {refused} refused, {accepted_mutants} mutated frames accepted (each as the library decodes it)", cases.len());
    assert!(refused > 20);
}

/// The compressed blocks of the ZSTD frames in `bytes` (RFC 8878): each
/// one's literals type (3: treeless, the previous Huffman table) and its
/// sequence table modes byte (None without sequences). Raw and RLE blocks
/// are left out, and skippable frames skipped.
fn zstd_block_modes(bytes: &[u8]) -> Vec<(u8, Option<u8>)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i + 6 <= bytes.len() {
        if bytes[i] & 0xF0 == 0x50 && bytes[i + 1..i + 4] == [0x2A, 0x4D, 0x18] {
            i += 8 + u32::from_le_bytes(bytes[i + 4..i + 8].try_into().unwrap()) as usize;
            continue;
        }
        assert_eq!(bytes[i..i + 4], [0x28, 0xB5, 0x2F, 0xFD], "a ZSTD frame");
        let fhd = bytes[i + 4];
        let (fcs_flag, single, dict) = (fhd >> 6, (fhd >> 5) & 1, fhd & 3);
        i += 5 + (single == 0) as usize + [0, 1, 2, 4][dict as usize] + [single as usize, 2, 4, 8][fcs_flag as usize];
        loop {
            let bh = u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], 0]);
            i += 3;
            let (last, kind, size) = (bh & 1 == 1, (bh >> 1) & 3, (bh >> 3) as usize);
            if kind == 2 {
                let b = &bytes[i..i + size];
                let (lit_type, format) = (b[0] & 3, (b[0] >> 2) & 3);
                let mut at = if lit_type < 2 {
                    let (header, count) = match format {
                        0 | 2 => (1, (b[0] >> 3) as usize),
                        1 => (2, (u16::from_le_bytes([b[0], b[1]]) >> 4) as usize),
                        _ => (3, (u32::from_le_bytes([b[0], b[1], b[2], 0]) >> 4) as usize),
                    };
                    header + if lit_type == 0 { count } else { 1 }
                } else {
                    let (header, bits) = match format {
                        0 | 1 => (3, 10),
                        2 => (4, 14),
                        _ => (5, 18),
                    };
                    let h = b[..header].iter().rev().fold(0u64, |h, &x| h << 8 | x as u64);
                    header + ((h >> (4 + bits)) & ((1 << bits) - 1)) as usize
                };
                let mut count = b[at] as usize;
                at += 1;
                if count == 255 {
                    count = u16::from_le_bytes([b[at], b[at + 1]]) as usize + 0x7F00;
                    at += 2;
                } else if count >= 128 {
                    count = ((count - 128) << 8) + b[at] as usize;
                    at += 1;
                }
                found.push((lit_type, (count > 0).then(|| b[at])));
            }
            i += if kind == 1 { 1 } else { size };
            if last {
                break;
            }
        }
    }
    found
}

/// Which pages of the compressed regression inputs the device check stops
/// before nvCOMP (and gpq's SNAPPY decoder refuses): the corrupt SNAPPY page
/// must be among them.
fn regression_pages_and_the_device_check(ctx: &Arc<GpuContext>) {
    let stream = stream(ctx);
    for name in ["snappy-oob-read.parquet", "zstd-hang.parquet", "zstd-hang-tpch.parquet"] {
        let path = testdata().join("regressions").join(name);
        let chunks = gpq::read_column_chunks(&path, &ReadOptions::new()).unwrap();
        let table = gpq::decode::read_page_headers(&chunks).unwrap();
        let pages = gpq::decode::compressed_pages(&chunks, &table).unwrap();
        let mut flagged = Vec::new();
        for (ci, page, codec, bytes, promised) in &pages {
            let v = gpq::decode::check_compressed_pages(&stream, *codec, &[(bytes.as_slice(), *promised)]).unwrap()[0];
            let cpu_ok = match codec {
                Compression::SNAPPY => snap::raw::Decoder::new().decompress_vec(bytes).is_ok_and(|d| d.len() as u64 == *promised),
                _ => zstd::bulk::decompress(bytes, *promised as usize).is_ok_and(|d| d.len() as u64 == *promised),
            };
            if v != 0 || !cpu_ok {
                flagged.push(format!("chunk {ci} page {page}: check {v}, CPU decodes {cpu_ok}"));
            }
            if v != 0 {
                assert!(!cpu_ok, "{name} chunk {ci} page {page}: the check rejects a page the CPU decodes");
            }
            if *codec == Compression::SNAPPY {
                // gpq's own decoder gives the check's verdict, and snap's bytes where it accepts.
                let (d, out) = gpq::decode::unsnappy_pages(&stream, &[(bytes.as_slice(), *promised)]).unwrap().remove(0);
                assert_eq!(d, v, "{name} chunk {ci} page {page}: the decoder's verdict against the check's");
                if d == 0 {
                    assert!(snap::raw::Decoder::new().decompress_vec(bytes).is_ok_and(|r| r == out), "{name} chunk {ci} page {page}");
                }
            }
        }
        eprintln!("{name}: {} compressed pages; {}", pages.len(), flagged.join("; "));
        if name.starts_with("snappy") {
            assert!(flagged.iter().any(|f| !f.contains("check 0")), "{name}: the corrupt page passes the check");
        }
    }
}

/// A good file to read after each hostile one.
fn good_file(dir: &Path) -> PathBuf {
    write_sample(&dir.join("good.parquet"), 3000, 1000, Compression::SNAPPY)
}

fn read_good(path: &Path, expected: &arrow::array::RecordBatch) {
    let got = read_parquet_to_device(path, &ReadOptions::new()).expect("a good file reads after a hostile one");
    assert_batches_equal("good file", expected, &got.to_record_batch().unwrap());
}

/// Every regression input: a typed bad-input error, in well under a second on
/// a GPU (the emulator is slower), and the next read is right.
fn regressions_are_quick_typed_errors(ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    let expected = arrow_rs(&good).unwrap();
    let limit = if ctx.is_emulated() { Duration::from_secs(20) } else { Duration::from_secs(1) };
    let mut files: Vec<PathBuf> = std::fs::read_dir(testdata().join("regressions"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "the regression corpus is missing files: {files:?}");
    // The first read of a process compiles or loads the kernels: not timed.
    read_good(&good, &expected);
    for f in &files {
        let t = Instant::now();
        let result = read_parquet_to_device(f, &ReadOptions::new());
        let took = t.elapsed();
        match &result {
            Ok(t) => panic!("{}: read {} rows instead of failing", f.display(), t.num_rows()),
            Err(e) => {
                eprintln!("{}: {} in {:.0} ms: {e}", f.file_name().unwrap().to_string_lossy(), e.kind(), took.as_secs_f64() * 1e3);
                assert!(e.is_bad_input(), "{}: not a bad-input error: {e}", f.display());
                assert!(!e.is_context_lost(), "{}: the context was lost: {e}", f.display());
            }
        }
        assert!(took < limit, "{}: took {took:?}", f.display());
        read_good(&good, &expected);
    }
}

/// A budget too small for the read is a typed error before allocating; a large one reads.
fn memory_budget_is_enforced(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    match read_parquet_to_device(&good, &ReadOptions::new().with_device_memory_limit(4096)) {
        Err(Error::OverBudget { requested, budget, .. }) => assert!(requested > budget && budget == 4096),
        other => panic!("expected OverBudget, got {other:?}"),
    }
    let t = read_parquet_to_device(&good, &ReadOptions::new().with_device_memory_limit(1 << 30)).unwrap();
    assert_batches_equal("budgeted read", &arrow_rs(&good).unwrap(), &t.to_record_batch().unwrap());
}

/// After a failed read the device's free memory is what it was before it.
fn failed_read_returns_its_memory(ctx: &Arc<GpuContext>) {
    if ctx.is_emulated() {
        eprintln!("SKIPPED on the emulator: its memory figures are fixed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    drop(read_parquet_to_device(&good, &ReadOptions::new()).unwrap());
    // The device's current context (an earlier trial may have had it reset).
    let ctx = GpuContext::get(ctx.ordinal()).unwrap();
    ctx.trim_pool();
    let (before, _) = ctx.memory_info().unwrap();
    // A corrupt SNAPPY page (stopped by the device check), a corrupt ZSTD
    // page (the CPU decoder's verdict) and a malformed page header.
    for f in ["snappy-oob-read.parquet", "zstd-hang.parquet", "header-list-of-bools-hang.parquet"] {
        let e = read_parquet_to_device(testdata().join("regressions").join(f), &ReadOptions::new()).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
    }
    let ctx = GpuContext::get(ctx.ordinal()).unwrap();
    let (after, _) = ctx.memory_info().unwrap();
    eprintln!("free device memory before {before}, after {after}");
    assert!(after + (8 << 20) >= before, "failed reads kept {} bytes", before - after);
}

/// A fault inside nvCOMP (the SNAPPY reproducer with the device check turned
/// off) loses the context: gpq says so with `GpuContextLost`, and either the
/// next read works (`recovered`) or it fails at once with a lost-context
/// error (never a hang or a crash). On the H200 with driver 580 the sticky
/// error outlives the reset (2026-12-01), so the second is what happens there.
fn lost_context_is_reset(_ctx: &Arc<GpuContext>) {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    let expected = arrow_rs(&good).unwrap();
    // nvCOMP with the device check off: by default the check rejects this page before nvCOMP sees it.
    let mut unchecked = ReadOptions::new().with_snappy_decoder(gpq::DeviceDecoder::Nvcomp);
    unchecked.skip_compressed_page_checks = true;
    let e = read_parquet_to_device(testdata().join("regressions/snappy-oob-read.parquet"), &unchecked).unwrap_err();
    eprintln!("unchecked read: {e}");
    let recovered = match &e {
        Error::GpuContextLost { recovered, .. } => *recovered,
        other if other.is_bad_input() => {
            eprintln!("NOTE: nvCOMP did not fault on this input this time");
            true
        }
        other => panic!("expected GpuContextLost, got {other}"),
    };
    if recovered {
        read_good(&good, &expected);
        read_good(&good, &expected);
    } else {
        let t = Instant::now();
        let next = read_parquet_to_device(&good, &ReadOptions::new());
        eprintln!("next read after an unrecovered loss: {:?} in {:?}", next.as_ref().err().map(|e| e.to_string()), t.elapsed());
        assert!(next.is_err_and(|e| e.is_context_lost()), "a read after an unrecoverable loss must fail as such");
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}

/// ZSTD pages go to nvCOMP in the worker process. A corrupt one that makes
/// nvCOMP spin for ever (`zstd-hang.parquet`) costs the worker, not this
/// process: the read is a typed error (the CPU decoder's verdict) within the
/// second, and the next ZSTD file is decompressed by a new worker, right.
fn zstd_hang_costs_only_the_worker(ctx: &Arc<GpuContext>) {
    if ctx.is_emulated() || gpq::decode::nvcomp_version().is_err() {
        eprintln!("SKIPPED: no nvCOMP here, so no worker");
        return;
    }
    if let Err(e) = gpq::decode::nvcomp_worker_path() {
        assert!(std::env::var("GPQ_REQUIRE_NVCOMP").map_or(true, |v| v != "1"), "GPQ_REQUIRE_NVCOMP=1 but {e}");
        eprintln!("SKIPPED: {e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = write_sample(&dir.path().join("good-zstd.parquet"), 3000, 1000, Compression::ZSTD(ZstdLevel::default()));
    let expected = arrow_rs(&good).unwrap();
    // (ZSTD pages go to gpq's own decoder by default; nvCOMP is asked for.)
    let nvcomp = ReadOptions::new().with_decompress(gpq::DecompressMode::Nvcomp).with_zstd_decoder(gpq::DeviceDecoder::Nvcomp);
    let read = |what: &str| {
        // (nvCOMP asked for, so that the worker runs whatever the default's estimate would choose.)
        let t = read_parquet_to_device(&good, &nvcomp).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_batches_equal(what, &expected, &t.to_record_batch().unwrap());
        let d = t.stats().decompression.clone();
        assert!(d.isolated_pages > 0 && d.cpu_pages == 0, "{what}: not decompressed by the worker: {d:?}");
    };
    read("before the hang");
    for _ in 0..2 {
        let t = Instant::now();
        let e = read_parquet_to_device(testdata().join("regressions").join("zstd-hang.parquet"), &nvcomp).unwrap_err();
        let took = t.elapsed();
        eprintln!("zstd-hang.parquet: {} in {:.0} ms: {e}", e.kind(), took.as_secs_f64() * 1e3);
        assert!(e.is_bad_input() && !e.is_context_lost(), "{e}");
        assert!(took < Duration::from_secs(1), "took {took:?}");
        read("after the hang");
    }
    // The worker runs batches side by side: reads on four threads at once
    // all go through it, right.
    std::thread::scope(|s| {
        for k in 0..4 {
            let read = &read;
            s.spawn(move || {
                for round in 0..3 {
                    read(&format!("thread {k}, round {round}, side by side"));
                }
            });
        }
    });
    // A hang beside good batches: the hanging read is an error, and the good
    // reads are right whoever decompressed them (a batch that ran beside the
    // hung one is redone on the CPU).
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..3)
            .map(|k| {
                let (good, expected, nvcomp) = (&good, &expected, &nvcomp);
                s.spawn(move || {
                    for round in 0..4 {
                        let what = format!("thread {k}, round {round}, beside a hang");
                        let t = read_parquet_to_device(good, nvcomp).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_batches_equal(&what, expected, &t.to_record_batch().unwrap());
                    }
                })
            })
            .collect();
        let e = read_parquet_to_device(testdata().join("regressions").join("zstd-hang.parquet"), &nvcomp).unwrap_err();
        assert!(e.is_bad_input() && !e.is_context_lost(), "{e}");
        for r in readers {
            r.join().unwrap();
        }
    });
    read("after the hang beside other reads");
}

/// A GZIP page stored (deflate level 0) with one byte of its payload
/// changed: every inflater decodes it without complaint, only the gzip
/// trailer's CRC-32 tells (arrow-rs: "corrupt gzip stream does not have a
/// matching checksum"). nvCOMP does not check the trailer, so gpq does, on
/// the device, after the worker decompresses: the read is a typed error, not
/// a wrong value. (The fuzzer found 179 such files on the H200 before the
/// check, 2026-12-01; `testdata/regressions/gzip-crc-mismatch.parquet` is
/// this file, kept with GPQ_REGRESSION_OUT=testdata/regressions.)
fn gzip_trailer_mismatch_is_an_error(_ctx: &Arc<GpuContext>) {
    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use parquet::basic::GzipLevel;
    use parquet::file::properties::WriterProperties;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gzip-stored.parquet");
    let values: Int64Array = (0..1000i64).map(|i| i * 1_000_003 + 7).collect();
    let batch = RecordBatch::try_from_iter(vec![("v", Arc::new(values) as ArrayRef)]).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::GZIP(GzipLevel::try_new(0).unwrap()))
        .set_dictionary_enabled(false)
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    assert!(arrow_rs(&path).is_ok());
    let mut bytes = std::fs::read(&path).unwrap();
    let needle = (500i64 * 1_000_003 + 7).to_le_bytes();
    let at = bytes.windows(8).position(|w| w == needle).expect("a stored deflate block holds the value verbatim");
    bytes[at] ^= 0x5a;
    let bad = dir.path().join("gzip-crc-mismatch.parquet");
    std::fs::write(&bad, &bytes).unwrap();
    if let Some(out) = std::env::var_os("GPQ_REGRESSION_OUT") {
        std::fs::copy(&bad, Path::new(&out).join("gzip-crc-mismatch.parquet")).unwrap();
    }
    let arrow_error = arrow_rs(&bad).expect_err("arrow-rs reads the changed page");
    assert!(arrow_error.to_string().contains("checksum"), "{arrow_error}");
    match read_parquet_to_device(&bad, &ReadOptions::new()) {
        Err(e @ Error::CorruptPage { .. }) => eprintln!("gzip-crc-mismatch.parquet: {e}"),
        Err(e) => panic!("expected a corrupt page, got {e}"),
        Ok(t) => panic!("gpq read the changed page as good values: {:?}", t.stats().decompression),
    }
}
