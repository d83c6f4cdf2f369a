//! The mutation classes, and the mutation of a folder of seed files.
//!
//! Each mutant differs from its seed in one way, named by its class and
//! operation (both recorded in the mutant's file name, e.g.
//! `00042-snappy_v2_dict-pagebody-flip.parquet`):
//!
//! | class | what changes |
//! | --- | --- |
//! | `pagebody` | bits flipped or bytes overwritten inside one page's body |
//! | `pageheader` | the same inside one page header |
//! | `footer` | the same inside the Thrift footer, or its length word |
//! | `truncate` | the file cut short (anywhere, near a page, or in the footer) |
//! | `pagefield` | one integer field of a page header (sizes, counts, encodings, the page type) set to an extreme |
//! | `footerfield` | one integer field of the footer (row counts, sizes, offsets, types, codecs) set to an extreme |
//!
//! The field classes keep the rest of the file consistent: a value that
//! needs a longer varint is spliced in, and the footer's offsets and sizes
//! that the splice moves are fixed up (a shorter one is padded with
//! continuation bytes), so the mutant differs from its seed in that one
//! value only.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::layout::Layout;
use crate::rng::Rng;
use crate::thrift::{IntField, encode_int, max_in_bytes};

/// What a mutation changes (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Bits or bytes inside a page body.
    PageBody,
    /// Bits or bytes inside a page header.
    PageHeader,
    /// Bits or bytes inside the footer, or the footer's length.
    Footer,
    /// The file cut short.
    Truncate,
    /// An integer field of a page header set to an extreme.
    PageField,
    /// An integer field of the footer set to an extreme.
    FooterField,
}

impl Class {
    /// Every class.
    pub const ALL: [Class; 6] = [Class::PageBody, Class::PageHeader, Class::Footer, Class::Truncate, Class::PageField, Class::FooterField];

    /// The name used in file names and reports.
    pub fn name(self) -> &'static str {
        match self {
            Class::PageBody => "pagebody",
            Class::PageHeader => "pageheader",
            Class::Footer => "footer",
            Class::Truncate => "truncate",
            Class::PageField => "pagefield",
            Class::FooterField => "footerfield",
        }
    }

    /// How often the class is drawn, relative to the others.
    fn weight(self) -> u32 {
        match self {
            Class::PageBody => 25,
            Class::PageHeader => 15,
            Class::Footer => 12,
            Class::Truncate => 8,
            Class::PageField => 25,
            Class::FooterField => 15,
        }
    }
}

/// One mutated file, in memory.
#[derive(Clone, Debug)]
pub struct Mutant {
    /// The mutated bytes.
    pub bytes: Vec<u8>,
    /// The class of the mutation.
    pub class: Class,
    /// The operation, safe for a file name (`flip`, `compressed_page_size_max`, ...).
    pub op: String,
    /// Where and what exactly, for the manifest (one line).
    pub detail: String,
}

/// Mutates `seed` once, drawing the class and everything else from `rng`.
/// `layout` is the seed's [`Layout`]; without one (an unparsable seed) only
/// truncation and flips anywhere are possible.
pub fn mutate(seed: &[u8], layout: Option<&Layout>, rng: &mut Rng) -> Mutant {
    let weights: Vec<u32> = Class::ALL.iter().map(|c| c.weight()).collect();
    for _ in 0..8 {
        let class = Class::ALL[rng.weighted(&weights)];
        if let Some(m) = mutate_as(seed, layout, class, rng) {
            return m;
        }
    }
    mutate_as(seed, layout, Class::Truncate, rng).unwrap_or_else(|| Mutant {
        bytes: seed.to_vec(),
        class: Class::Truncate,
        op: "none".into(),
        detail: "seed too short to mutate".into(),
    })
}

/// Mutates `seed` once with a mutation of `class`; `None` where the class
/// does not apply (no layout, no pages, no such fields, a file of one byte).
pub fn mutate_as(seed: &[u8], layout: Option<&Layout>, class: Class, rng: &mut Rng) -> Option<Mutant> {
    let mut bytes = seed.to_vec();
    let (op, detail) = match class {
        Class::Truncate => truncate(&mut bytes, layout, rng)?,
        Class::PageBody => {
            let layout = layout?;
            let pages: Vec<_> = layout.pages().filter(|(_, _, p)| !p.body.is_empty()).collect();
            let &(c, p, page) = rng.pick(nonempty(&pages)?);
            let (op, what) = scramble(&mut bytes, page.body.clone(), rng);
            (op, format!("chunk {c} page {p} body {:?}: {what}", page.body))
        }
        Class::PageHeader => {
            let layout = layout?;
            let pages: Vec<_> = layout.pages().collect();
            let &(c, p, page) = rng.pick(nonempty(&pages)?);
            let (op, what) = scramble(&mut bytes, page.header.clone(), rng);
            (op, format!("chunk {c} page {p} header {:?}: {what}", page.header))
        }
        Class::Footer => {
            let layout = layout?;
            if rng.one_in(12) {
                footer_length(&mut bytes, layout, rng)
            } else {
                let (op, what) = scramble(&mut bytes, layout.footer.clone(), rng);
                (op, format!("footer {:?}: {what}", layout.footer))
            }
        }
        Class::PageField => page_field(&mut bytes, layout?, rng)?,
        Class::FooterField => footer_field(&mut bytes, layout?, rng)?,
    };
    Some(Mutant { bytes, class, op, detail })
}

fn nonempty<T>(items: &[T]) -> Option<&[T]> {
    if items.is_empty() { None } else { Some(items) }
}

/// Flips bits or overwrites bytes inside `region`; returns the operation and what it did.
fn scramble(bytes: &mut [u8], region: std::ops::Range<usize>, rng: &mut Rng) -> (String, String) {
    let region = region.start.min(bytes.len())..region.end.min(bytes.len());
    if region.is_empty() {
        return ("noop".into(), "empty region".into());
    }
    const INTERESTING: [u8; 6] = [0x00, 0xff, 0x7f, 0x80, 0x01, 0x15];
    match rng.weighted(&[35, 20, 30, 15]) {
        0 => {
            let at = rng.in_range(region);
            let bit = rng.below(8);
            bytes[at] ^= 1 << bit;
            ("flip".into(), format!("bit {bit} of byte {at}"))
        }
        1 => {
            let n = 2 + rng.below(7);
            let mut what = String::new();
            for _ in 0..n {
                let at = rng.in_range(region.clone());
                let bit = rng.below(8);
                bytes[at] ^= 1 << bit;
                let _ = write!(what, "{at}.{bit} ");
            }
            ("flips".into(), format!("bits {}", what.trim_end()))
        }
        2 => {
            let at = rng.in_range(region);
            let v = if rng.one_in(3) { rng.next_u64() as u8 } else { *rng.pick(&INTERESTING) };
            let old = std::mem::replace(&mut bytes[at], v);
            ("byte".into(), format!("byte {at} {old:#04x} -> {v:#04x}"))
        }
        _ => {
            let at = rng.in_range(region.clone());
            let end = (at + 2 + rng.below(15)).min(region.end);
            let fill = if rng.one_in(3) { None } else { Some(*rng.pick(&INTERESTING)) };
            for b in &mut bytes[at..end] {
                *b = fill.unwrap_or_else(|| rng.next_u64() as u8);
            }
            let what = fill.map_or("random".to_string(), |v| format!("{v:#04x}"));
            ("run".into(), format!("bytes {at}..{end} := {what}"))
        }
    }
}

fn truncate(bytes: &mut Vec<u8>, layout: Option<&Layout>, rng: &mut Rng) -> Option<(String, String)> {
    let len = bytes.len();
    if len < 2 {
        return None;
    }
    let mut at = 1 + rng.below(len - 1);
    let mut where_ = "anywhere";
    if let Some(layout) = layout {
        match rng.weighted(&[40, 30, 30]) {
            1 => {
                at = rng.in_range(layout.footer.start..len).max(1);
                where_ = "in the footer";
            }
            2 => {
                let pages: Vec<_> = layout.pages().collect();
                if let Some(&(_, _, page)) = nonempty(&pages).map(|p| rng.pick(p)) {
                    // Just inside or just past a page's end, or inside its header.
                    let base = if rng.one_in(2) { page.body.end } else { page.header.start + 1 };
                    at = (base as i64 + rng.below(9) as i64 - 4).clamp(1, len as i64 - 1) as usize;
                    where_ = "near a page";
                }
            }
            _ => {}
        }
    }
    bytes.truncate(at);
    Some(("cut".into(), format!("cut at {at} of {len} ({where_})")))
}

fn footer_length(bytes: &mut [u8], layout: &Layout, rng: &mut Rng) -> (String, String) {
    let len = bytes.len();
    let old = (layout.footer.end - layout.footer.start) as u32;
    let v = *rng.pick(&[0, 1, old.wrapping_sub(1), old + 1, old.wrapping_mul(2), len as u32 - 8, len as u32, u32::MAX, i32::MAX as u32]);
    bytes[len - 8..len - 4].copy_from_slice(&v.to_le_bytes());
    ("len".into(), format!("footer length {old} -> {v}"))
}

/// An extreme value for an integer field: its name and the value, given the
/// field's old value, width and varint length.
fn extremes(f: &IntField) -> Vec<(&'static str, i64)> {
    let (max, min) = match f.bits {
        16 => (i16::MAX as i64, i16::MIN as i64),
        32 => (i32::MAX as i64, i32::MIN as i64),
        _ => (i64::MAX, i64::MIN),
    };
    let clamp = |v: i64| v.clamp(min, max);
    let mut out = vec![
        ("zero", 0),
        ("one", 1),
        ("neg", -1),
        ("max", max),
        ("min", min),
        ("huge", clamp(1 << 30)),
        ("inc", clamp(f.value.saturating_add(1))),
        ("dec", clamp(f.value.saturating_sub(1))),
        ("double", clamp(f.value.saturating_mul(2))),
        ("half", f.value / 2),
        ("fill", max_in_bytes(f.end - f.start, f.bits)),
    ];
    if f.bits == 64 {
        out.push(("over32", 1 << 31));
        out.push(("over32u", 1 << 32));
    }
    out
}

/// The name of a page header's integer field, and how often to pick it.
fn page_field_name(ids: &[i16]) -> Option<(&'static str, u32)> {
    Some(match ids {
        [1] => ("page_type", 1),
        [2] => ("uncompressed_page_size", 4),
        [3] => ("compressed_page_size", 4),
        [4] => ("crc", 1),
        [5, 1] => ("num_values", 4),
        [5, 2] => ("encoding", 2),
        [5, 3] => ("def_level_encoding", 1),
        [5, 4] => ("rep_level_encoding", 1),
        [7, 1] => ("dict_num_values", 4),
        [7, 2] => ("dict_encoding", 1),
        [8, 1] => ("v2_num_values", 4),
        [8, 2] => ("v2_num_nulls", 3),
        [8, 3] => ("v2_num_rows", 3),
        [8, 4] => ("v2_encoding", 2),
        [8, 5] => ("v2_def_levels_byte_length", 3),
        [8, 6] => ("v2_rep_levels_byte_length", 2),
        _ => return None,
    })
}

/// The name of a footer integer field worth setting to extremes.
fn footer_field_name(ids: &[i16]) -> Option<&'static str> {
    Some(match ids {
        [1] => "version",
        [2, 1] => "schema_type",
        [2, 2] => "type_length",
        [2, 3] => "repetition_type",
        [2, 5] => "num_children",
        [2, 6] => "converted_type",
        [2, 7] => "scale",
        [2, 8] => "precision",
        [2, 10, 5, 1] => "logical_decimal_scale",
        [2, 10, 5, 2] => "logical_decimal_precision",
        [3] => "num_rows",
        [4, 2] => "rg_total_byte_size",
        [4, 3] => "rg_num_rows",
        [4, 5] => "rg_file_offset",
        [4, 6] => "rg_total_compressed_size",
        [4, 1, 2] => "chunk_file_offset",
        [4, 1, 3, 1] => "column_type",
        [4, 1, 3, 2] => "column_encoding",
        [4, 1, 3, 4] => "codec",
        [4, 1, 3, 5] => "num_values",
        [4, 1, 3, 6] => "total_uncompressed_size",
        [4, 1, 3, 7] => "total_compressed_size",
        [4, 1, 3, 9] => "data_page_offset",
        [4, 1, 3, 11] => "dictionary_page_offset",
        _ => return None,
    })
}

/// Footer fields holding file offsets (moved when bytes before them are spliced in).
fn is_offset_field(ids: &[i16]) -> bool {
    matches!(ids, [4, 5] | [4, 1, 2] | [4, 1, 4] | [4, 1, 6] | [4, 1, 3, 9] | [4, 1, 3, 10] | [4, 1, 3, 11] | [4, 1, 3, 14])
}

/// Overwrites field `f` with `v`, padding to the old length or growing; returns the bytes added.
fn set_int(bytes: &mut Vec<u8>, f: &IntField, shift: usize, v: i64) -> usize {
    let enc = encode_int(v, f.bits, f.end - f.start);
    let added = enc.len() - (f.end - f.start);
    bytes.splice(f.start + shift..f.end + shift, enc);
    added
}

/// Rewrites the footer length word after the footer grew by `grown` bytes.
fn fix_footer_length(bytes: &mut [u8], layout: &Layout, grown: usize) {
    let n = bytes.len();
    let footer_len = (layout.footer.end - layout.footer.start + grown) as u32;
    bytes[n - 8..n - 4].copy_from_slice(&footer_len.to_le_bytes());
}

fn page_field(bytes: &mut Vec<u8>, layout: &Layout, rng: &mut Rng) -> Option<(String, String)> {
    let mut candidates = Vec::new();
    let mut weights = Vec::new();
    for (c, p, page) in layout.pages() {
        for f in &page.ints {
            if let Some((name, w)) = page_field_name(&f.ids) {
                candidates.push((c, p, f, name));
                weights.push(w);
            }
        }
    }
    if candidates.is_empty() {
        return None;
    }
    let (c, p, f, name) = candidates[rng.weighted(&weights)];
    let (ext, v) = *rng.pick(&extremes(f));
    let added = set_int(bytes, f, 0, v);
    let mut detail = format!("chunk {c} page {p} {name} at {}: {} -> {v}", f.start, f.value);
    if added > 0 {
        // Everything after the header moved: fix the footer's offsets past
        // the splice, and the sizes of the chunk and its row group.
        let chunk = &layout.chunks[c];
        let mut edits: Vec<(&IntField, i64)> = Vec::new();
        for g in &layout.footer_ints {
            let grows_chunk = g.ids == [4, 1, 3, 7] && g.owners.last() == Some(&chunk.meta_owner);
            let grows_group = g.ids == [4, 6] && g.owners.last() == Some(&chunk.row_group_owner);
            let moves = is_offset_field(&g.ids) && g.value > f.start as i64;
            if grows_chunk || grows_group || moves {
                edits.push((g, g.value.saturating_add(added as i64)));
            }
        }
        let mut grown = 0;
        for (g, v) in edits.iter().rev() {
            grown += set_int(bytes, g, added, *v);
        }
        fix_footer_length(bytes, layout, grown);
        let _ = write!(detail, " (varint grew {added} bytes; {} footer fields fixed)", edits.len());
    }
    Some((format!("{name}_{ext}"), detail))
}

fn footer_field(bytes: &mut Vec<u8>, layout: &Layout, rng: &mut Rng) -> Option<(String, String)> {
    let mut names: Vec<&'static str> = layout.footer_ints.iter().filter_map(|f| footer_field_name(&f.ids)).collect();
    names.sort_unstable();
    names.dedup();
    let name = *rng.pick(nonempty(&names)?);
    let fields: Vec<&IntField> = layout.footer_ints.iter().filter(|f| footer_field_name(&f.ids) == Some(name)).collect();
    let f = *rng.pick(&fields);
    let (ext, v) = *rng.pick(&extremes(f));
    let added = set_int(bytes, f, 0, v);
    fix_footer_length(bytes, layout, added);
    let detail = format!("footer {name} at {}: {} -> {v}{}", f.start, f.value, if added > 0 { format!(" (varint grew {added} bytes)") } else { String::new() });
    Some((format!("{name}_{ext}"), detail))
}

/// A seed's name as used in mutant file names: its file stem with anything
/// but ASCII letters, digits and `_` replaced by `_` (so `-` separates the
/// parts of a mutant's name).
pub fn seed_stem(path: &Path) -> String {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// The file name of mutant `index`: `{index:05}-{seed}-{class}-{op}.parquet`.
pub fn mutant_file_name(index: usize, seed: &str, class: Class, op: &str) -> String {
    format!("{index:05}-{seed}-{}-{op}.parquet", class.name())
}

/// A seed file, read and laid out.
#[derive(Clone, Debug)]
pub struct Seed {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its name in mutant file names ([`seed_stem`]).
    pub stem: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its layout, if the footer parsed.
    pub layout: Option<Layout>,
}

impl Seed {
    /// Reads and lays out the seed at `path`.
    pub fn load(path: &Path) -> std::io::Result<Seed> {
        let bytes = std::fs::read(path)?;
        let layout = Layout::parse(&bytes).ok();
        Ok(Seed { path: path.to_path_buf(), stem: seed_stem(path), bytes, layout })
    }
}

/// The `*.parquet` files directly in `dir`, sorted by name.
pub fn seed_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    Ok(files)
}

/// Mutant `index` of a run seeded with `rng_seed` over `seeds` (round-robin).
pub fn make_mutant(seeds: &[Seed], index: usize, rng_seed: u64) -> (&Seed, Mutant) {
    let seed = &seeds[index % seeds.len()];
    let mut rng = Rng::for_mutant(rng_seed, index as u64);
    (seed, mutate(&seed.bytes, seed.layout.as_ref(), &mut rng))
}

/// One mutant written by [`mutate_dir`].
#[derive(Clone, Debug)]
pub struct Written {
    /// The mutant's path.
    pub path: PathBuf,
    /// The seed's stem.
    pub seed: String,
    /// The mutation's class.
    pub class: Class,
    /// The operation.
    pub op: String,
    /// What exactly changed.
    pub detail: String,
}

/// Writes `count` mutants of the `*.parquet` files in `seeds` into `out`
/// (created if missing), round-robin over the seeds, and a manifest
/// `out/mutations.tsv` (file, seed, class, op, detail). The same arguments
/// give the same files.
pub fn mutate_dir(seeds: &Path, out: &Path, count: usize, rng_seed: u64) -> std::io::Result<Vec<Written>> {
    let loaded = seed_files(seeds)?.iter().map(|p| Seed::load(p)).collect::<std::io::Result<Vec<_>>>()?;
    if loaded.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no *.parquet seeds in {}", seeds.display())));
    }
    std::fs::create_dir_all(out)?;
    let mut manifest = String::from("file\tseed\tclass\top\tdetail\n");
    let mut written = Vec::with_capacity(count);
    for index in 0..count {
        let (seed, m) = make_mutant(&loaded, index, rng_seed);
        let name = mutant_file_name(index, &seed.stem, m.class, &m.op);
        let path = out.join(&name);
        std::fs::write(&path, &m.bytes)?;
        let _ = writeln!(manifest, "{name}\t{}\t{}\t{}\t{}", seed.stem, m.class.name(), m.op, m.detail.replace(['\t', '\n'], " "));
        written.push(Written { path, seed: seed.stem.clone(), class: m.class, op: m.op, detail: m.detail });
    }
    std::fs::write(out.join("mutations.tsv"), manifest)?;
    Ok(written)
}
