//! `gpq-nvcomp-worker`: runs nvCOMP for gpq in a process of its own, so that
//! corrupt ZSTD or GZIP pages can fault or hang only this process. The
//! library starts it (see the `gpq` crate's decompression stage); it speaks
//! a private protocol on stdin and stdout and is not meant to be run by hand.

fn main() {
    std::process::exit(gpq::nvcomp_worker_main())
}
