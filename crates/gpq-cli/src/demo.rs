//! `gpq demo`: the main job end to end. Generates a small TPC-H set (kept if
//! already there) and reads every table onto the GPU, printing the IO path,
//! the decompression path and per-stage times. Without a CUDA device it says
//! so, still generates and plans on the CPU, and succeeds unless the GPU was
//! asked for explicitly.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use gpq::{IoPath, ReadPlan};

use crate::generate::{GenArgs, generate};
use crate::human_bytes;

/// Arguments of `gpq demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// TPC-H scale factor.
    #[arg(short = 's', long, default_value_t = 0.1)]
    pub scale_factor: f64,
    /// Output directory.
    #[arg(short, long, default_value = "data/demo")]
    pub out: PathBuf,
    /// IO path (default: GPQ_IO, else auto; anything but auto counts as asking for the GPU).
    #[arg(long)]
    pub io: Option<String>,
    /// Fail when there is no GPU.
    #[arg(long)]
    pub require_gpu: bool,
}

pub fn run(args: DemoArgs) -> gpq::Result<ExitCode> {
    let options = crate::read_options(args.io.as_deref(), None, None)?;
    let io = options.io.path;
    let files = generate(&GenArgs {
        scale_factor: args.scale_factor,
        out: args.out.clone(),
        tables: None,
        compression: "snappy".into(),
        row_group_bytes: 7 << 20,
        page_bytes: 1 << 20,
        encoding: "default".into(),
        page_version: 1,
        threads: 0,
        force: false,
        files: 1,
    })?;
    // The first read makes the device ready (context, kernels): its
    // statistics say what that cost.
    let mut setup: Option<gpq::SetupStats> = None;
    for f in &files {
        let t = match gpq::read_parquet_to_device(f, &options) {
            Err(e @ gpq::Error::NoCudaDevice { .. }) if setup.is_none() => return without_gpu(&e, &files, &options, &args, io),
            read => read?,
        };
        let s = t.stats();
        if setup.is_none() {
            let ctx = gpq::cuda::GpuContext::get(options.device)?;
            println!("\nReading onto {} ({} SMs):\n", ctx.name, ctx.sm_count);
            println!("| table | rows | file | IO path | decompression | setup ms | plan ms | io ms | headers ms | decompress ms | decode ms | total ms | GB/s |");
            println!("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
            setup = Some(s.setup.clone());
        }
        let Some(io) = s.io.as_ref() else { continue };
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            f.file_stem().unwrap_or_default().to_string_lossy(),
            t.num_rows(),
            human_bytes(io.bytes_read),
            io.path,
            s.decompression.path(),
            ms(s.setup.context + s.setup.kernels),
            ms(s.plan),
            ms(io.wall),
            ms(s.page_headers),
            ms(s.decompress),
            ms(s.decode),
            ms(s.total),
            io.bytes_read as f64 / s.total.as_secs_f64() / 1e9
        );
    }
    if let Some(setup) = setup {
        println!(
            "\nThe first read made the device ready: context {:.1} ms, kernels {:.1} ms ({}). `gpq read --repeat 5 {}` shows warm numbers.",
            setup.context.as_secs_f64() * 1e3,
            setup.kernels.as_secs_f64() * 1e3,
            setup.kernel_source,
            args.out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Without a device: says so and plans every read on the CPU; fails only
/// when the GPU was asked for.
fn without_gpu(e: &gpq::Error, files: &[PathBuf], options: &gpq::ReadOptions, args: &DemoArgs, io: IoPath) -> gpq::Result<ExitCode> {
    println!("\n{e}.");
    println!("The data was generated and the reads planned on the CPU; reading onto the GPU needs a CUDA device.\n");
    for f in files {
        let plan = ReadPlan::new(f, options)?;
        println!(
            "{:<40} {:>10} rows, {:>3} row groups, {:>4} chunks -> {:>3} IO ranges, {} to read",
            f.display(),
            plan.num_rows(),
            plan.row_groups().len(),
            plan.chunks().len(),
            plan.io().ranges.len(),
            human_bytes(plan.io().bytes_read)
        );
    }
    let asked = args.require_gpu || io != IoPath::Auto;
    Ok(if asked { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
