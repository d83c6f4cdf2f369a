//! `gpq inspect`: what is in a file, and the IO plan gpq would make for it.
//! Any input, however damaged, gives output or an error, never a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use gpq::{ReadOptions, ReadPlan, read_footer_with_page_index};
use parquet::basic::{Encoding, EncodingMask};

use crate::human_bytes;

/// Arguments of `gpq inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// The Parquet file.
    pub file: PathBuf,
    /// Show every column chunk, not only the per-column summary.
    #[arg(long)]
    pub chunks: bool,
    /// Show every IO range of the plan.
    #[arg(long)]
    pub ranges: bool,
    /// Merge gap for the IO plan shown (bytes).
    #[arg(long, default_value = "64k", value_parser = |s: &str| gpq::options::parse_size(s).ok_or("bad size"))]
    pub merge_gap: u64,
}

/// Runs `gpq inspect`. The file is untrusted: every footer value is shown
/// as stored (negative offsets included) without being trusted, sums are
/// overflow-checked, and a panic anywhere below becomes an error.
pub fn run(args: InspectArgs) -> gpq::Result<ExitCode> {
    match catch_unwind(AssertUnwindSafe(|| inspect(&args))) {
        Ok(result) => result,
        Err(payload) => {
            let message = gpq::error::panic_message(payload.as_ref());
            Err(gpq::Error::Internal(format!("inspecting {} panicked: {message}", args.file.display())))
        }
    }
}

/// `total + v` for a byte count from the footer; `None` once a value was
/// negative or the sum overflowed.
fn add_size(total: Option<u64>, v: i64) -> Option<u64> {
    total?.checked_add(u64::try_from(v).ok()?)
}

/// A checked byte count for display.
fn show_size(size: Option<u64>) -> String {
    size.map_or_else(|| "invalid".to_string(), human_bytes)
}

/// The encodings set in a column chunk's encoding mask.
#[allow(deprecated)]
fn encoding_names(mask: &EncodingMask) -> impl Iterator<Item = String> + '_ {
    [
        Encoding::PLAIN,
        Encoding::PLAIN_DICTIONARY,
        Encoding::RLE,
        Encoding::BIT_PACKED,
        Encoding::DELTA_BINARY_PACKED,
        Encoding::DELTA_LENGTH_BYTE_ARRAY,
        Encoding::DELTA_BYTE_ARRAY,
        Encoding::RLE_DICTIONARY,
        Encoding::BYTE_STREAM_SPLIT,
    ]
    .into_iter()
    .filter(|&e| mask.is_set(e))
    .map(|e| format!("{e:?}"))
}

fn inspect(args: &InspectArgs) -> gpq::Result<ExitCode> {
    let footer = read_footer_with_page_index(&args.file)?;
    let md = footer.metadata.clone();
    let fm = md.file_metadata();
    println!("file:        {} ({} bytes)", args.file.display(), footer.file_size);
    println!("created by:  {}", fm.created_by().unwrap_or("?"));
    println!("rows:        {}", fm.num_rows());
    println!("row groups:  {}", md.num_row_groups());
    println!(
        "page index:  offset index {}, column index {}",
        if md.offset_index().is_some() { "present" } else { "absent" },
        if md.column_index().is_some() { "present" } else { "absent" }
    );
    let has_arrow = fm.key_value_metadata().is_some_and(|kv| kv.iter().any(|k| k.key == "ARROW:schema"));
    println!("arrow schema embedded: {has_arrow}");

    println!("\ncolumns:");
    println!(
        "  {:<24} {:<22} {:<10} {:>9} {:>12} {:>12} {:>7}  encodings",
        "path", "type", "codec", "max d/r", "compressed", "uncompressed", "pages"
    );
    let schema = fm.schema_descr();
    for (leaf, d) in schema.columns().iter().enumerate() {
        let (mut comp, mut uncomp, mut pages) = (Some(0u64), Some(0u64), Some(0usize));
        let mut encodings = std::collections::BTreeSet::new();
        let mut codec = String::new();
        for (rg, r) in md.row_groups().iter().enumerate() {
            let Some(cc) = r.columns().get(leaf) else { continue };
            comp = add_size(comp, cc.compressed_size());
            uncomp = add_size(uncomp, cc.uncompressed_size());
            codec = format!("{:?}", cc.compression());
            encodings.extend(encoding_names(cc.encodings_mask()));
            if let Some(oi) = md.offset_index() {
                let data_pages = oi.get(rg).and_then(|r| r.get(leaf)).map_or(0, |o| o.page_locations().len());
                let dictionary = usize::from(cc.dictionary_page_offset().is_some());
                pages = pages.and_then(|p| p.checked_add(data_pages)?.checked_add(dictionary));
            }
        }
        let ty = match d.logical_type_ref() {
            Some(l) => format!("{:?}/{l:?}", d.physical_type()),
            None => format!("{:?}", d.physical_type()),
        };
        let ty: String = ty.chars().take(22).collect();
        let pages = match (md.offset_index(), pages) {
            (None, _) => "?".to_string(),
            (Some(_), None) => "invalid".to_string(),
            (Some(_), Some(p)) => p.to_string(),
        };
        println!(
            "  {:<24} {:<22} {:<10} {:>4}/{:<4} {:>12} {:>12} {:>7}  {}",
            d.path().string(),
            ty,
            codec.chars().take(10).collect::<String>(),
            d.max_def_level(),
            d.max_rep_level(),
            show_size(comp),
            show_size(uncomp),
            pages,
            encodings.into_iter().collect::<Vec<_>>().join(",")
        );
    }

    if args.chunks {
        println!("\nchunks:");
        for (rg, r) in md.row_groups().iter().enumerate() {
            // RowGroupMetaData::compressed_size sums without checking.
            let size = r.columns().iter().try_fold(0u64, |t, c| add_size(Some(t), c.compressed_size()));
            println!("  row group {rg}: {} rows, {}", r.num_rows(), show_size(size));
            for (leaf, cc) in r.columns().iter().enumerate() {
                // As stored, not trusted: ColumnChunkMetaData::byte_range asserts on negative values.
                let start = cc.dictionary_page_offset().unwrap_or(cc.data_page_offset());
                println!(
                    "    {:<24} offset {:>12} len {:>10} values {:>9} dict {}",
                    schema.columns().get(leaf).map_or_else(|| format!("#{leaf}"), |d| d.path().string()),
                    start,
                    cc.compressed_size(),
                    cc.num_values(),
                    cc.dictionary_page_offset().is_some()
                );
            }
        }
    }

    let plan = ReadPlan::from_footer(&args.file, footer, &ReadOptions::new().with_merge_gap(args.merge_gap))?;
    let io = plan.io();
    println!("\nIO plan (all columns, all row groups, 4 KiB alignment, merge gap {}):", human_bytes(args.merge_gap));
    println!("  chunks:      {}", plan.chunks().len());
    println!("  ranges:      {}", io.ranges.len());
    println!("  tasks:       {}", io.tasks.len());
    println!("  requested:   {} ({} bytes)", human_bytes(io.bytes_requested), io.bytes_requested);
    println!(
        "  read:        {} ({} bytes, over-read {} = {:.3}%)",
        human_bytes(io.bytes_read),
        io.bytes_read,
        io.over_read(),
        100.0 * io.over_read() as f64 / io.bytes_requested.max(1) as f64
    );
    println!("  device buf:  {}", human_bytes(io.device_bytes));
    if args.ranges {
        for r in &io.ranges {
            println!("    file {:>12} +{:>10} -> device {:>12}", r.file_offset, r.read_len, r.device_offset);
        }
    }
    Ok(ExitCode::SUCCESS)
}
