//! Kernels compiled ahead of time: cubins for the architectures gpq ships
//! and PTX for GPUs newer than all of them, built with NVRTC from the
//! sources in `kernels/` by `scripts/build-kernels.sh`, stored zstd-compressed
//! in `prebuilt/` and embedded in the library. A device runs the cubin of its
//! own major architecture with the highest minor version it can run (a cubin
//! runs on later minor versions of the same major), so a first read compiles
//! nothing.
//!
//! `prebuilt/manifest.txt` records the digest of the sources and options the
//! images were built from; a unit test fails when the sources have changed
//! since (so the images can never drift from them), and
//! `tests/kernels_nvrtc.rs` rebuilds every image and compares the bytes.

use sha2::{Digest, Sha256};

use super::kernels::{NVRTC_OPTIONS, translation_unit};
use crate::error::{Error, Result};

/// The form of a prebuilt image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// Machine code for one architecture (`sm_XY`): runs on devices of the
    /// same major version and an equal or later minor one.
    Cubin,
    /// PTX for a virtual architecture (`compute_XY`): the driver compiles it
    /// for any device of that architecture or later.
    Ptx,
}

/// One compiled image of the kernels.
#[derive(Debug, Clone, Copy)]
pub struct Image {
    /// The NVRTC `--gpu-architecture` it was built for (`sm_90`, `compute_80`).
    pub arch: &'static str,
    /// Cubin or PTX.
    pub kind: ImageKind,
    /// The compute capability it targets.
    pub capability: (i32, i32),
    compressed: &'static [u8],
}

macro_rules! image {
    ($arch:literal, $kind:expr, $cc:expr, $file:literal) => {
        Image { arch: $arch, kind: $kind, capability: $cc, compressed: include_bytes!(concat!("prebuilt/", $file)) }
    };
}

/// Every image gpq ships, as `scripts/build-kernels.sh` builds them.
pub const IMAGES: [Image; 5] = [
    image!("sm_80", ImageKind::Cubin, (8, 0), "sm_80.cubin.zst"),
    image!("sm_90", ImageKind::Cubin, (9, 0), "sm_90.cubin.zst"),
    image!("sm_100", ImageKind::Cubin, (10, 0), "sm_100.cubin.zst"),
    image!("sm_120", ImageKind::Cubin, (12, 0), "sm_120.cubin.zst"),
    image!("compute_80", ImageKind::Ptx, (8, 0), "compute_80.ptx.zst"),
];

/// What the images were built from (`prebuilt/manifest.txt`).
pub const MANIFEST: &str = include_str!("prebuilt/manifest.txt");

/// Decompresses a zstd-compressed kernel image (at most 64 MiB), as stored
/// under `src/gpu/prebuilt/` (or given with `GPQ_KERNELS=file:`).
pub(crate) fn decompress_image(compressed: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::bulk::decompress(compressed, 64 << 20)
}

impl Image {
    /// The image's bytes (a cubin, or NUL-terminated PTX text), decompressed.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        decompress_image(self.compressed)
            .map_err(|e| Error::Kernel { stage: "load", log: format!("prebuilt {} image: {e}", self.arch) })
    }

    /// The file name of the image under `src/gpu/prebuilt/`.
    pub fn file_name(&self) -> String {
        match self.kind {
            ImageKind::Cubin => format!("{}.cubin.zst", self.arch),
            ImageKind::Ptx => format!("{}.ptx.zst", self.arch),
        }
    }
}

/// The cubin a device of compute capability `cc` runs: same major version,
/// the highest minor version not above the device's.
pub fn cubin_for(cc: (i32, i32)) -> Option<&'static Image> {
    IMAGES
        .iter()
        .filter(|i| i.kind == ImageKind::Cubin && i.capability.0 == cc.0 && i.capability.1 <= cc.1)
        .max_by_key(|i| i.capability.1)
}

/// The PTX a device of compute capability `cc` can compile, if any (the
/// newest virtual architecture not above the device's).
pub fn ptx_for(cc: (i32, i32)) -> Option<&'static Image> {
    IMAGES.iter().filter(|i| i.kind == ImageKind::Ptx && i.capability <= cc).max_by_key(|i| i.capability)
}

/// The digest of what the images are built from: the translation unit and
/// the NVRTC options (hex SHA-256).
pub fn source_digest() -> String {
    let mut h = Sha256::new();
    h.update(translation_unit().as_bytes());
    for o in NVRTC_OPTIONS {
        h.update(b"\0");
        h.update(o.as_bytes());
    }
    hex(&h.finalize())
}

/// The hex SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of `key` in the manifest (`key value` lines).
pub fn manifest_value(key: &str) -> Option<&'static str> {
    MANIFEST.lines().find_map(|l| l.strip_prefix(key).and_then(|rest| rest.strip_prefix(' ')).map(str::trim))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_built_from_the_current_sources() {
        let recorded = manifest_value("sources").expect("manifest names the sources' digest");
        assert_eq!(
            recorded,
            source_digest(),
            "the kernel sources or NVRTC options changed since the prebuilt kernels were built: run scripts/build-kernels.sh"
        );
    }

    #[test]
    fn every_image_decompresses_to_what_the_manifest_records() {
        for image in &IMAGES {
            let bytes = image.bytes().unwrap();
            let recorded = manifest_value(&image.file_name()).unwrap_or_else(|| panic!("{} is not in the manifest", image.arch));
            assert_eq!(recorded, digest(&bytes), "{}", image.arch);
            match image.kind {
                ImageKind::Cubin => assert_eq!(&bytes[..4], b"\x7fELF", "{}", image.arch),
                ImageKind::Ptx => {
                    assert!(bytes.ends_with(b"\0"), "PTX is handed to the driver NUL-terminated");
                    assert!(String::from_utf8_lossy(&bytes).contains(".entry gpq_decode_fixed"), "{}", image.arch);
                }
            }
        }
    }

    #[test]
    fn devices_get_the_cubin_of_their_major_version() {
        let arch = |cc| cubin_for(cc).map(|i| i.arch);
        assert_eq!(arch((8, 0)), Some("sm_80"));
        assert_eq!(arch((8, 6)), Some("sm_80"));
        assert_eq!(arch((8, 9)), Some("sm_80"));
        assert_eq!(arch((9, 0)), Some("sm_90"));
        assert_eq!(arch((10, 3)), Some("sm_100"));
        assert_eq!(arch((12, 1)), Some("sm_120"));
        assert_eq!(arch((7, 5)), None);
        assert_eq!(arch((11, 0)), None);
        assert_eq!(ptx_for((11, 0)).map(|i| i.arch), Some("compute_80"));
        assert_eq!(ptx_for((7, 5)).map(|i| i.arch), None);
    }
}
