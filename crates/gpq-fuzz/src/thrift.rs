//! A walker over Thrift compact-protocol structs (Parquet's page headers and
//! footer) that records where every integer field lies.
//!
//! The parquet crate keeps its Thrift code private, and a fuzzer needs
//! positions rather than values anyway: to overwrite one varint in place, or
//! to splice in a longer one and fix up the offsets that follow. The walker
//! checks every length against the buffer and limits nesting, so it can run
//! over mutated bytes too.

/// Compact-protocol type codes.
mod ty {
    pub const STOP: u8 = 0;
    pub const TRUE: u8 = 1;
    pub const FALSE: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const I16: u8 = 4;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const DOUBLE: u8 = 7;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const SET: u8 = 10;
    pub const MAP: u8 = 11;
    pub const STRUCT: u8 = 12;
    pub const UUID: u8 = 13;
}

/// Deepest nesting the walker follows (Parquet's own structs nest about 6 deep).
const MAX_DEPTH: usize = 32;

/// One integer field (`i16`, `i32` or `i64`) found by [`walk_struct`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntField {
    /// Field ids from the outermost struct down to this field; list and map
    /// elements add no id (so a column chunk's `total_compressed_size` in a
    /// footer is `[4, 1, 3, 7]` whatever its row group and column).
    pub ids: Vec<i16>,
    /// The instance numbers of the enclosing structs, outermost first (the
    /// walk numbers every struct it enters, the outermost 0): fields with the
    /// same last owner belong to the same struct value.
    pub owners: Vec<usize>,
    /// Byte offset of the varint's first byte.
    pub start: usize,
    /// Byte offset just past the varint.
    pub end: usize,
    /// The decoded value.
    pub value: i64,
    /// Width of the Thrift type in bits: 16, 32 or 64.
    pub bits: u32,
}

impl IntField {
    /// Whether the field's id path is `ids`.
    pub fn is(&self, ids: &[i16]) -> bool {
        self.ids == ids
    }
}

/// What [`walk_struct`] found: the integer fields, in file order, and where
/// the struct ends.
#[derive(Clone, Debug, Default)]
pub struct Walk {
    /// Every integer field, in order of position.
    pub ints: Vec<IntField>,
    /// Offset just past the struct's stop byte.
    pub end: usize,
}

/// Walks the compact-protocol struct that starts at `at` in `buf`.
///
/// Fails (with a short reason) on anything malformed: a truncated varint or
/// string, a length past the end, an unknown type, nesting over 32 levels.
pub fn walk_struct(buf: &[u8], at: usize) -> Result<Walk, String> {
    let mut w = Walker { buf, pos: at, ids: Vec::new(), owners: Vec::new(), next_owner: 0, ints: Vec::new() };
    w.structure(0)?;
    Ok(Walk { ints: w.ints, end: w.pos })
}

struct Walker<'a> {
    buf: &'a [u8],
    pos: usize,
    ids: Vec<i16>,
    owners: Vec<usize>,
    next_owner: usize,
    ints: Vec<IntField>,
}

impl Walker<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.buf.get(self.pos).ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        self.pos += 1;
        Ok(b)
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        let end = (self.pos as u64).checked_add(n).filter(|&e| e <= self.buf.len() as u64);
        match end {
            Some(e) => {
                self.pos = e as usize;
                Ok(())
            }
            None => Err(format!("{n} bytes at {} run past the end", self.pos)),
        }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift < 64 {
                v |= ((b & 0x7f) as u64) << shift;
            }
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("varint longer than 10 bytes at {}", self.pos))
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn structure(&mut self, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("nesting deeper than {MAX_DEPTH} at {}", self.pos));
        }
        self.owners.push(self.next_owner);
        self.next_owner += 1;
        let mut last: i16 = 0;
        loop {
            let header = self.byte()?;
            let t = header & 0x0f;
            if t == ty::STOP {
                break;
            }
            let delta = header >> 4;
            let id = if delta == 0 { self.zigzag()? as i16 } else { last.wrapping_add(delta as i16) };
            last = id;
            self.ids.push(id);
            self.value(t, false, depth)?;
            self.ids.pop();
        }
        self.owners.pop();
        Ok(())
    }

    /// A value of type `t`; `in_collection`: booleans take a byte.
    fn value(&mut self, t: u8, in_collection: bool, depth: usize) -> Result<(), String> {
        match t {
            ty::TRUE | ty::FALSE => {
                if in_collection {
                    self.byte()?;
                }
            }
            ty::BYTE => {
                self.byte()?;
            }
            ty::I16 | ty::I32 | ty::I64 => {
                let start = self.pos;
                let value = self.zigzag()?;
                let bits = match t {
                    ty::I16 => 16,
                    ty::I32 => 32,
                    _ => 64,
                };
                self.ints.push(IntField { ids: self.ids.clone(), owners: self.owners.clone(), start, end: self.pos, value, bits });
            }
            ty::DOUBLE => self.skip(8)?,
            ty::UUID => self.skip(16)?,
            ty::BINARY => {
                let n = self.varint()?;
                self.skip(n)?;
            }
            ty::LIST | ty::SET => {
                let h = self.byte()?;
                let et = h & 0x0f;
                let n = if h >> 4 == 15 { self.varint()? } else { (h >> 4) as u64 };
                // Every element takes at least one byte (booleans in a collection too).
                if n > self.remaining() {
                    return Err(format!("list of {n} elements at {} is longer than the buffer", self.pos));
                }
                for _ in 0..n {
                    self.value(et, true, depth + 1)?;
                }
            }
            ty::MAP => {
                let n = self.varint()?;
                if n > 0 {
                    if n > self.remaining() {
                        return Err(format!("map of {n} entries at {} is longer than the buffer", self.pos));
                    }
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.value(kv >> 4, true, depth + 1)?;
                        self.value(kv & 0x0f, true, depth + 1)?;
                    }
                }
            }
            ty::STRUCT => self.structure(depth + 1)?,
            other => return Err(format!("unknown compact type {other} at {}", self.pos - 1)),
        }
        Ok(())
    }
}

/// Zigzag-encodes `v` as a varint of at least `min_len` bytes (a shorter
/// encoding is padded with continuation bytes, which decoders accept).
pub fn encode_int(v: i64, bits: u32, min_len: usize) -> Vec<u8> {
    let mut z = match bits {
        16 => ((v as i16 as i32) << 1 ^ ((v as i16 as i32) >> 31)) as u32 as u64,
        32 => ((v as i32) << 1 ^ ((v as i32) >> 31)) as u32 as u64,
        _ => ((v << 1) ^ (v >> 63)) as u64,
    };
    let mut out = Vec::new();
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
    while out.len() < min_len {
        *out.last_mut().unwrap() |= 0x80;
        out.push(0);
    }
    out
}

/// The largest non-negative value whose zigzag varint fits in `len` bytes,
/// capped at the type's maximum.
pub fn max_in_bytes(len: usize, bits: u32) -> i64 {
    let payload_bits = (7 * len as u32).min(63);
    let zig_max = if payload_bits >= 63 { i64::MAX as u64 } else { (1u64 << payload_bits) - 1 };
    let v = (zig_max / 2) as i64;
    let cap = match bits {
        16 => i16::MAX as i64,
        32 => i32::MAX as i64,
        _ => i64::MAX,
    };
    v.min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_walks_back() {
        for (v, bits) in [(0i64, 32u32), (1, 32), (-1, 32), (i32::MAX as i64, 32), (i32::MIN as i64, 32), (i64::MAX, 64), (i64::MIN, 64), (300, 16)] {
            for min_len in [1, 3, 6] {
                let enc = encode_int(v, bits, min_len);
                assert!(enc.len() >= min_len);
                // A struct with the value as field 1 of the right type.
                let t = match bits {
                    16 => 4,
                    32 => 5,
                    _ => 6,
                };
                let mut buf = vec![0x10 | t];
                buf.extend(&enc);
                buf.push(0);
                let w = walk_struct(&buf, 0).unwrap();
                assert_eq!(w.end, buf.len());
                assert_eq!(w.ints.len(), 1);
                assert_eq!(w.ints[0].value, v, "{v} {bits} {min_len}");
                assert_eq!((w.ints[0].start, w.ints[0].end), (1, 1 + enc.len()));
            }
        }
        assert_eq!(max_in_bytes(1, 32), 63);
        assert_eq!(max_in_bytes(2, 32), 8191);
        assert_eq!(max_in_bytes(5, 32), i32::MAX as i64);
        assert_eq!(encode_int(max_in_bytes(2, 32), 32, 1).len(), 2);
    }

    #[test]
    fn nested_ids_and_bad_input() {
        // struct { 1: i32 5, 3: struct { 1: i64 -2 }, 4: list<i32> [7, 8], 5: binary "ab" }
        let buf = [0x15, 10, 0x2c, 0x16, 3, 0x00, 0x19, 0x25, 14, 16, 0x18, 2, b'a', b'b', 0x00];
        let w = walk_struct(&buf, 0).unwrap();
        assert_eq!(w.end, buf.len());
        let got: Vec<(Vec<i16>, i64)> = w.ints.iter().map(|f| (f.ids.clone(), f.value)).collect();
        assert_eq!(got, vec![(vec![1], 5), (vec![3, 1], -2), (vec![4], 7), (vec![4], 8)]);
        assert_ne!(w.ints[0].owners.last(), w.ints[1].owners.last());
        for cut in 0..buf.len() {
            assert!(walk_struct(&buf[..cut], 0).is_err(), "cut at {cut}");
        }
        assert!(walk_struct(&[0x1e, 0x00], 0).is_err());
        assert!(walk_struct(&[0x19, 0xf5, 0xff, 0xff, 0x0f], 0).is_err());
    }
}
