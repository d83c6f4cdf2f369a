//! # gpq-fuzz: a mutation fuzzer for gpq
//!
//! gpq parses page headers, decompresses and decodes on the GPU, so a corrupt
//! file must never hang a kernel, read or write out of bounds, lose the CUDA
//! context or panic: it must give an [`gpq::Error`], or the same values as
//! arrow-rs, and the next read must still be right. This crate checks that by
//! mutating valid Parquet files and reading each mutant in one long-lived
//! process (a driver, `scripts/fuzz/fuzz.py`, watches it for hangs and
//! crashes and restarts it).
//!
//! ## Layout
//!
//! - [`rng`]: the deterministic random numbers every mutation is drawn from.
//! - [`thrift`]: a walker over Thrift compact-protocol structs that records
//!   where every integer field lies.
//! - [`layout`]: where a file's footer, column chunks, page headers and page
//!   bodies are, found with [`thrift`].
//! - [`mutate`]: the mutation classes (bit flips and byte overwrites in page
//!   bodies, page headers and the footer; truncation; size and count fields
//!   set to extremes) and the mutation of a folder of seeds.
//! - [`compare`]: arrow-rs as the reference reader, and a loose comparison of
//!   gpq's columns with it.
//! - [`check`]: one guarded read of a file by gpq, classified into an
//!   [`check::Outcome`].
//!
//! The binary `gpq-fuzz` has two subcommands, `mutate` and `read` (see
//! `src/main.rs`).

#![warn(missing_docs)]

pub mod check;
pub mod compare;
pub mod layout;
pub mod mutate;
pub mod rng;
pub mod thrift;
