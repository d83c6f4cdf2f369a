//! The mutation loop on the CPU: tiny seed files, ~150 mutants read by gpq
//! (on its CPU emulator, or on a GPU where there is one and the emulator is
//! not compiled in) must never panic, lose the context or take over 10 s,
//! and afterwards the unmutated seeds must still read equal to arrow-rs.
//! Also checks the layout walk against the parquet crate's metadata.
//!
//! Run with `cargo test -p gpq-fuzz --features gpq/emulator` (`GPQ_FUZZ_MUTANTS=N`
//! for another number of mutants than 150).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Float64Array, Int32Array, RecordBatch, StringArray};
use gpq_fuzz::check::{Checked, Outcome, check_file};
use gpq_fuzz::layout::Layout;
use gpq_fuzz::mutate::{Class, Seed, make_mutant, mutant_file_name, mutate_as, mutate_dir};
use gpq_fuzz::rng::Rng;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

const ROWS: usize = 50;
/// Mutants in the loop (`GPQ_FUZZ_MUTANTS` overrides).
fn mutants() -> usize {
    std::env::var("GPQ_FUZZ_MUTANTS").ok().and_then(|v| v.parse().ok()).unwrap_or(150)
}

/// A nullable INT32, a dictionary-encoded string and a DOUBLE, in pages of 10 rows.
fn write_seed(dir: &Path, codec: Compression, v2: bool) -> PathBuf {
    let a: Int32Array = (0..ROWS as i32).map(|i| if i % 7 == 3 { None } else { Some(i * 37 - 500) }).collect();
    let s: StringArray = (0..ROWS).map(|i| Some(["red", "green", "blue", "a much longer string value"][i % 4])).collect();
    let d: Float64Array = (0..ROWS).map(|i| i as f64 * 1.5 - 3.0).collect();
    let batch = RecordBatch::try_from_iter_with_nullable(vec![
        ("a", Arc::new(a) as ArrayRef, true),
        ("s", Arc::new(s) as ArrayRef, false),
        ("d", Arc::new(d) as ArrayRef, false),
    ])
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(codec)
        .set_writer_version(if v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 })
        // gpq decodes PLAIN and dictionary pages (v2 would default to DELTA_BINARY_PACKED).
        .set_encoding(Encoding::PLAIN)
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(ColumnPath::from("s"), true)
        .set_data_page_row_count_limit(10)
        .set_write_batch_size(10)
        .build();
    let name = format!("{}_{}.parquet", codec.to_string().to_lowercase().split('(').next().unwrap(), if v2 { "v2" } else { "v1" });
    let path = dir.join(name);
    let mut w = ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

fn write_seeds(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for codec in [Compression::UNCOMPRESSED, Compression::SNAPPY, Compression::ZSTD(ZstdLevel::try_new(1).unwrap())] {
        for v2 in [false, true] {
            out.push(write_seed(dir, codec, v2));
        }
    }
    out
}

/// Routes gpq to the emulator; `false` (with a notice) where there is
/// neither the emulator nor a GPU.
fn device() -> bool {
    match gpq::cuda::use_emulator() {
        Ok(()) => true,
        Err(_) if gpq::cuda::device_available() => {
            eprintln!("NOTE: gpq built without the `emulator` feature; mutants are read on the GPU");
            true
        }
        Err(e) => {
            eprintln!("SKIPPED: {e}, and there is no GPU (run with --features gpq/emulator)");
            false
        }
    }
}

/// [`check_file`] in a thread; fails the test if it takes over 10 s.
fn check_in_time(path: &Path) -> (Checked, Duration) {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(check_file(&p, true, |_| {}));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(c) => (c, started.elapsed()),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{}: the read took over 10 s", path.display()),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{}: the checking thread died", path.display()),
    }
}

#[test]
fn layout_matches_parquet_metadata() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let dir = tempfile::tempdir().unwrap();
    for seed in write_seeds(dir.path()) {
        let bytes = std::fs::read(&seed).unwrap();
        let layout = Layout::parse(&bytes).unwrap();
        let reader = SerializedFileReader::new(std::fs::File::open(&seed).unwrap()).unwrap();
        let meta = reader.metadata();
        let chunks: Vec<_> = meta.row_groups().iter().flat_map(|rg| rg.columns().iter()).collect();
        assert_eq!(layout.chunks.len(), chunks.len(), "{}", seed.display());
        for (i, (ours, theirs)) in layout.chunks.iter().zip(&chunks).enumerate() {
            let (start, len) = theirs.byte_range();
            assert_eq!(ours.range, start as usize..(start + len) as usize, "{} chunk {i}", seed.display());
            // The walk covers the chunk exactly, page by page.
            assert_eq!(ours.pages.first().unwrap().header.start, ours.range.start);
            assert_eq!(ours.pages.last().unwrap().body.end, ours.range.end);
            let dict = theirs.dictionary_page_offset().is_some() as usize;
            // 50 rows in pages of 10: 5 data pages (plus the dictionary page).
            assert_eq!(ours.pages.len(), 5 + dict, "{} chunk {i}", seed.display());
            let values: i64 = ours.pages.iter().flat_map(|p| &p.ints).filter(|f| f.is(&[5, 1]) || f.is(&[8, 1])).map(|f| f.value).sum();
            assert_eq!(values, theirs.num_values(), "{} chunk {i}", seed.display());
        }
        let rows = layout.footer_ints.iter().find(|f| f.is(&[3])).unwrap().value;
        assert_eq!(rows, meta.file_metadata().num_rows());
    }
}

#[test]
fn mutants_are_deterministic_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = dir.path().join("seeds");
    std::fs::create_dir(&seeds).unwrap();
    write_seeds(&seeds);
    let a = mutate_dir(&seeds, &dir.path().join("a"), 60, 9).unwrap();
    let b = mutate_dir(&seeds, &dir.path().join("b"), 60, 9).unwrap();
    let mut classes = BTreeMap::new();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.path.file_name(), y.path.file_name());
        assert_eq!(std::fs::read(&x.path).unwrap(), std::fs::read(&y.path).unwrap());
        let name = x.path.file_name().unwrap().to_str().unwrap();
        let parts: Vec<&str> = name.trim_end_matches(".parquet").split('-').collect();
        assert_eq!(parts.len(), 4, "{name}");
        assert_eq!(parts[2], x.class.name());
        *classes.entry(x.class.name()).or_insert(0) += 1;
    }
    assert_eq!(classes.len(), Class::ALL.len(), "{classes:?}");
    assert!(dir.path().join("a/mutations.tsv").is_file());

    // Field mutations change exactly the one value: the rest of the file
    // still lays out, with the same pages.
    let seed = Seed::load(&seeds.join("snappy_v2.parquet")).unwrap();
    let layout = seed.layout.as_ref().unwrap();
    let mut grown = 0;
    for i in 0..200 {
        let m = mutate_as(&seed.bytes, Some(layout), Class::PageField, &mut Rng::new(i)).unwrap();
        if m.detail.contains("grew") {
            grown += 1;
            let after = Layout::parse(&m.bytes).unwrap_or_else(|e| panic!("{}: {e}", m.detail));
            assert_eq!(after.chunks.len(), layout.chunks.len());
            // A size field that grew leaves its own chunk's walk different;
            // every other chunk walks as before.
            let same = after.chunks.iter().zip(&layout.chunks).filter(|(x, y)| x.pages.len() == y.pages.len()).count();
            assert!(same + 1 >= layout.chunks.len(), "{}", m.detail);
        }
    }
    assert!(grown > 10, "{grown} of 200 page-field mutants needed a longer varint");
    for i in 0..100 {
        let m = mutate_as(&seed.bytes, Some(layout), Class::FooterField, &mut Rng::new(i)).unwrap();
        Layout::parse(&m.bytes).unwrap_or_else(|e| panic!("{}: {e}", m.detail));
    }
}

#[test]
fn mutants_never_panic_or_hang_and_the_seeds_stay_right() {
    if !device() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let seed_paths = write_seeds(dir.path());
    let seeds: Vec<Seed> = seed_paths.iter().map(|p| Seed::load(p).unwrap()).collect();
    let started = Instant::now();
    for (path, seed) in seed_paths.iter().zip(&seeds) {
        assert!(seed.layout.is_some(), "{}", path.display());
        let (c, _) = check_in_time(path);
        assert_eq!(c.outcome, Outcome::Equal, "unmutated seed {}: {}", path.display(), c.detail);
    }
    let mutants_dir = dir.path().join("mutants");
    std::fs::create_dir(&mutants_dir).unwrap();
    let mut outcomes: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut slowest = (Duration::ZERO, String::new());
    for i in 0..mutants() {
        let (seed, m) = make_mutant(&seeds, i, 0x5eed);
        let path = mutants_dir.join(mutant_file_name(i, &seed.stem, m.class, &m.op));
        std::fs::write(&path, &m.bytes).unwrap();
        let (c, took) = check_in_time(&path);
        *outcomes.entry((m.class.name(), c.outcome.name())).or_default() += 1;
        if took > slowest.0 {
            slowest = (took, path.file_name().unwrap().to_string_lossy().into_owned());
        }
        let line = format!("{} [{}] {}: {} ({})", c.outcome.name(), c.gpq_kind.unwrap_or("-"), path.file_name().unwrap().to_string_lossy(), c.detail, m.detail);
        if c.outcome.is_failure() {
            failures.push(line);
        } else if matches!(c.outcome, Outcome::Differs | Outcome::GpqOkArrowError | Outcome::GpqErrorArrowOk) {
            eprintln!("note: {line}");
        }
    }
    let mutants_took = started.elapsed();
    for (path, _) in seed_paths.iter().zip(&seeds) {
        let (c, _) = check_in_time(path);
        assert_eq!(c.outcome, Outcome::Equal, "unmutated seed {} after the mutants: {}", path.display(), c.detail);
    }
    eprintln!("{} mutants in {:.1} s (slowest {:.2} s: {}); class/outcome counts:", mutants(), mutants_took.as_secs_f64(), slowest.0.as_secs_f64(), slowest.1);
    for ((class, outcome), n) in &outcomes {
        eprintln!("  {class:12} {outcome:20} {n}");
    }
    assert!(failures.is_empty(), "{} mutants panicked or lost the context:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn read_subcommand_speaks_the_driver_protocol() {
    if !gpq::cuda::emulator_compiled() {
        eprintln!("SKIPPED: the binary's protocol is checked on the emulator (run with --features gpq/emulator)");
        return;
    }
    use std::io::Write;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let seeds = write_seeds(dir.path());
    let truncated = dir.path().join("truncated.parquet");
    std::fs::write(&truncated, &std::fs::read(&seeds[1]).unwrap()[..300]).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpq-fuzz"))
        .args(["read", "--good"])
        .arg(&seeds[0])
        .env("GPQ_EMULATE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}\n\n{}", seeds[2].display(), truncated.display()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("STEP ")).collect();
    assert_eq!(lines[0], "READY", "{text}");
    assert_eq!(lines[1], format!("BEGIN {}", seeds[2].display()));
    assert!(lines[2].starts_with(&format!("END {} equal ", seeds[2].display())), "{text}");
    assert_eq!(lines[3], format!("BEGIN {}", truncated.display()));
    assert!(lines[4].starts_with(&format!("END {} gpq-error ", truncated.display())), "{text}");
    assert!(lines[4].contains("kind=") && !lines[4].contains("kind=-"), "{text}");
    assert!(lines[5].starts_with("SUMMARY files=2 equal=1 differs=0 gpq-error=1 "), "{text}");
    assert_eq!(lines.len(), 6, "{text}");
    // gpq's outcome goes out before arrow-rs reads, for the driver's report of a file arrow-rs hangs on.
    let said: Vec<(&str, &str)> =
        text.lines().filter_map(|l| l.strip_prefix("STEP gpq-done ")?.split_once(' ')).collect();
    assert_eq!(said.len(), 2, "{text}");
    assert!(said.iter().all(|(ms, _)| ms.parse::<u64>().is_ok()), "{text}");
    assert!(said[0].1.starts_with("ok "), "{text}");
    assert!(said[1].1.starts_with("error kind=") && !said[1].1.starts_with("error kind=-"), "{text}");
}
