//! `gpq inspect`: what is in a file, and the IO plan gpq would make for it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use gpq::{ReadOptions, ReadPlan, read_footer_with_page_index};

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

pub fn run(args: InspectArgs) -> gpq::Result<ExitCode> {
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
    for leaf in 0..schema.num_columns() {
        let d = schema.column(leaf);
        let (mut comp, mut uncomp, mut pages) = (0i64, 0i64, 0usize);
        let mut encodings = std::collections::BTreeSet::new();
        let mut codec = String::new();
        for rg in 0..md.num_row_groups() {
            let cc = md.row_group(rg).column(leaf);
            comp += cc.compressed_size();
            uncomp += cc.uncompressed_size();
            codec = format!("{:?}", cc.compression());
            for e in cc.encodings() {
                encodings.insert(format!("{e:?}"));
            }
            if let Some(oi) = md.offset_index() {
                pages += oi[rg].get(leaf).map(|o| o.page_locations().len()).unwrap_or(0);
                if cc.dictionary_page_offset().is_some() {
                    pages += 1;
                }
            }
        }
        let ty = match d.logical_type_ref() {
            Some(l) => format!("{:?}/{l:?}", d.physical_type()),
            None => format!("{:?}", d.physical_type()),
        };
        let ty: String = ty.chars().take(22).collect();
        println!(
            "  {:<24} {:<22} {:<10} {:>4}/{:<4} {:>12} {:>12} {:>7}  {}",
            d.path().string(),
            ty,
            codec.chars().take(10).collect::<String>(),
            d.max_def_level(),
            d.max_rep_level(),
            human_bytes(comp as u64),
            human_bytes(uncomp as u64),
            if md.offset_index().is_some() { pages.to_string() } else { "?".into() },
            encodings.into_iter().collect::<Vec<_>>().join(",")
        );
    }

    if args.chunks {
        println!("\nchunks:");
        for rg in 0..md.num_row_groups() {
            let r = md.row_group(rg);
            println!("  row group {rg}: {} rows, {}", r.num_rows(), human_bytes(r.compressed_size() as u64));
            for (leaf, cc) in r.columns().iter().enumerate() {
                let (start, len) = cc.byte_range();
                println!(
                    "    {:<24} offset {:>12} len {:>10} values {:>9} dict {}",
                    schema.column(leaf).path().string(),
                    start,
                    len,
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
