//! CPU decompression of single pages, for codecs nvCOMP does not handle
//! (BROTLI, Hadoop-framed LZ4) and for machines without nvCOMP.

use std::io::Read;

use parquet::basic::Compression;

/// Decompresses `input` into exactly `out.len()` bytes.
pub(crate) fn decompress(codec: Compression, input: &[u8], out: &mut [u8]) -> Result<(), String> {
    let n = match codec {
        Compression::UNCOMPRESSED => {
            if input.len() != out.len() {
                return Err(format!("uncompressed page of {} bytes, expected {}", input.len(), out.len()));
            }
            out.copy_from_slice(input);
            input.len()
        }
        Compression::SNAPPY => snap::raw::Decoder::new().decompress(input, out).map_err(|e| format!("snappy: {e}"))?,
        Compression::GZIP(_) => read_all(flate2::read::MultiGzDecoder::new(input), out, "gzip")?,
        // The one-shot API: no intermediate buffer; it verifies frame
        // checksums and fails when the frames hold more than `out` takes.
        Compression::ZSTD(_) => zstd::bulk::decompress_to_buffer(input, out).map_err(|e| format!("zstd: {e}"))?,
        Compression::LZ4_RAW => lz4_flex::block::decompress_into(input, out).map_err(|e| format!("lz4_raw: {e}"))?,
        Compression::LZ4 => lz4_hadoop(input, out)?,
        Compression::BROTLI(_) => read_all(brotli::Decompressor::new(input, 4096), out, "brotli")?,
        other => return Err(format!("codec {other:?} is not supported")),
    };
    if n != out.len() {
        return Err(format!("decompressed to {n} bytes, the page header says {}", out.len()));
    }
    Ok(())
}

fn read_all(mut r: impl Read, out: &mut [u8], what: &str) -> Result<usize, String> {
    let mut done = 0;
    while done < out.len() {
        match r.read(&mut out[done..]) {
            Ok(0) => break,
            Ok(k) => done += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
    // Anything beyond the expected size means the header lied; reading on
    // to the end also checks the stream's trailer (GZIP's CRC-32, a ZSTD
    // frame's checksum), whose failure is an error too.
    if done == out.len() {
        let mut extra = [0u8; 1];
        loop {
            match r.read(&mut extra) {
                Ok(0) => break,
                Ok(_) => return Err(format!("{what}: more data than the page header says")),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{what}: {e}")),
            }
        }
    }
    Ok(done)
}

/// Parquet's LZ4 codec: Hadoop framing (big-endian uncompressed and
/// compressed sizes before each block), falling back to the LZ4 frame format
/// and to a raw block as older writers did.
fn lz4_hadoop(input: &[u8], out: &mut [u8]) -> Result<usize, String> {
    let mut i = 0usize;
    let mut o = 0usize;
    let framed = (|| {
        while i < input.len() {
            if input.len() - i < 8 {
                return None;
            }
            let expect = u32::from_be_bytes(input[i..i + 4].try_into().unwrap()) as usize;
            let size = u32::from_be_bytes(input[i + 4..i + 8].try_into().unwrap()) as usize;
            i += 8;
            if size > input.len() - i || expect > out.len() - o {
                return None;
            }
            let n = lz4_flex::block::decompress_into(&input[i..i + size], &mut out[o..o + expect]).ok()?;
            if n != expect {
                return None;
            }
            i += size;
            o += n;
        }
        Some(o)
    })();
    if let Some(n) = framed {
        return Ok(n);
    }
    if let Ok(n) = read_all(lz4_flex::frame::FrameDecoder::new(input), out, "lz4") {
        if n == out.len() {
            return Ok(n);
        }
    }
    lz4_flex::block::decompress_into(input, out).map_err(|e| format!("lz4: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        let mut out = vec![0u8; data.len()];

        let s = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        decompress(Compression::SNAPPY, &s, &mut out).unwrap();
        assert_eq!(out, data);

        let z = zstd::bulk::compress(&data, 1).unwrap();
        decompress(Compression::ZSTD(Default::default()), &z, &mut out).unwrap();
        assert_eq!(out, data);

        let l = lz4_flex::block::compress(&data);
        decompress(Compression::LZ4_RAW, &l, &mut out).unwrap();
        assert_eq!(out, data);

        let mut framed = (data.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&(l.len() as u32).to_be_bytes());
        framed.extend_from_slice(&l);
        decompress(Compression::LZ4, &framed, &mut out).unwrap();
        assert_eq!(out, data);

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &data).unwrap();
        decompress(Compression::GZIP(Default::default()), &gz.finish().unwrap(), &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn gzip_checksum_is_verified() {
        use std::io::Write;
        let data = vec![3u8; 5000];
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&data).unwrap();
        let mut bytes = gz.finish().unwrap();
        let n = bytes.len();
        bytes[n - 8] ^= 1; // the CRC-32 in the trailer
        let mut out = vec![0u8; data.len()];
        let e = decompress(Compression::GZIP(Default::default()), &bytes, &mut out).unwrap_err();
        assert!(e.contains("gzip"), "{e}");
    }

    #[test]
    fn wrong_sizes_are_errors() {
        let data = vec![7u8; 1000];
        let s = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        let mut short = vec![0u8; 999];
        assert!(decompress(Compression::SNAPPY, &s, &mut short).is_err());
        let mut long = vec![0u8; 1001];
        assert!(decompress(Compression::SNAPPY, &s, &mut long).is_err());
        assert!(decompress(Compression::SNAPPY, &s[..s.len() / 2], &mut vec![0u8; 1000]).is_err());
    }
}
