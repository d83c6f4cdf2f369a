//! How each column is decoded: from its Parquet physical type and the Arrow
//! type the result should have, the kernel and conversion to use and the
//! type the device buffers hold. Where the kernels cannot produce the
//! requested type directly (view types, dictionaries, unusual coercions from
//! an embedded Arrow schema), the device holds the type Parquet implies and
//! the host casts when it converts to a `RecordBatch`.

use arrow::datatypes::{DataType, IntervalUnit, TimeUnit};
use parquet::basic::Type as PhysicalType;

use crate::plan::LeafColumn;

/// Which kernel family decodes a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// Fixed-width values (gpq_decode_fixed).
    Fixed,
    /// BOOLEAN bits (gpq_decode_fixed).
    Bool,
    /// Offsets and characters (gpq_string_sizes, gpq_string_chars).
    Strings,
    /// Byte-array decimals (gpq_string_sizes, gpq_bytes_decimal).
    BytesDecimal,
}

/// Kernel conversion kinds (`GpqKind` in page_decode.cuh; a test checks they agree).
pub(crate) mod kind {
    /// Copy the low bytes.
    pub const COPY: u32 = 0;
    /// Sign-extend.
    pub const SEXT: u32 = 1;
    /// Multiply an i32 into an i64.
    pub const MUL: u32 = 2;
    /// Big-endian decimal bytes.
    pub const BE_DECIMAL: u32 = 3;
    /// INT96 timestamps.
    pub const INT96: u32 = 4;
    /// Booleans.
    pub const BOOL: u32 = 5;
    /// Strings.
    pub const STRING: u32 = 6;
    /// Byte-array decimals.
    pub const BYTES_DECIMAL: u32 = 7;
    /// INTERVAL as day-time (the days and milliseconds of the three words).
    pub const INTERVAL_DAY_TIME: u32 = 8;
}

/// The decode recipe of one column.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ColumnRecipe {
    /// Kernel family.
    pub family: Family,
    /// Conversion kind.
    pub kind: u32,
    /// Stored bytes per value (0 for BOOLEAN and BYTE_ARRAY).
    pub in_width: u32,
    /// Output bytes per value (0 for BOOLEAN and strings).
    pub out_width: u32,
    /// Conversion multiplier.
    pub mul: i64,
    /// Conversion divisor.
    pub div: i64,
    /// Arrow type of the device buffers.
    pub device_type: DataType,
}

fn fixed(kind: u32, in_width: u32, out_width: u32, device_type: DataType) -> ColumnRecipe {
    ColumnRecipe { family: Family::Fixed, kind, in_width, out_width, mul: 1, div: 1, device_type }
}

fn decimal_width(t: &DataType) -> Option<u32> {
    match t {
        DataType::Decimal32(..) => Some(4),
        DataType::Decimal64(..) => Some(8),
        DataType::Decimal128(..) => Some(16),
        DataType::Decimal256(..) => Some(32),
        _ => None,
    }
}

/// The recipe producing `target` directly from `leaf`, if the kernels can.
pub(crate) fn direct(leaf: &LeafColumn, target: &DataType) -> Option<ColumnRecipe> {
    use DataType as D;
    use PhysicalType as P;
    let t = target.clone();
    Some(match (leaf.physical_type, target) {
        // The device decodes the values; the host builds the dictionary array.
        (_, D::Dictionary(_, value)) => return direct(leaf, value),
        // Every value is null (the NULL logical type): levels only, no values kept.
        (P::INT32 | P::FLOAT, D::Null) => fixed(kind::COPY, 4, 0, t),
        (P::INT64 | P::DOUBLE, D::Null) => fixed(kind::COPY, 8, 0, t),
        (P::INT32, D::Int32 | D::UInt32 | D::Date32 | D::Time32(_) | D::Decimal32(..)) => fixed(kind::COPY, 4, 4, t),
        (P::INT32, D::Int8 | D::UInt8) => fixed(kind::COPY, 4, 1, t),
        (P::INT32, D::Int16 | D::UInt16) => fixed(kind::COPY, 4, 2, t),
        (P::INT32, D::Int64 | D::Decimal64(..)) => fixed(kind::SEXT, 4, 8, t),
        (P::INT32, D::Decimal128(..)) => fixed(kind::SEXT, 4, 16, t),
        (P::INT32, D::Decimal256(..)) => fixed(kind::SEXT, 4, 32, t),
        (P::INT32, D::Date64) => ColumnRecipe { mul: 86_400_000, ..fixed(kind::MUL, 4, 8, t) },
        (P::INT64, D::Int64 | D::UInt64 | D::Timestamp(..) | D::Time64(_) | D::Date64 | D::Duration(_) | D::Decimal64(..)) => {
            fixed(kind::COPY, 8, 8, t)
        }
        (P::INT64, D::Decimal128(..)) => fixed(kind::SEXT, 8, 16, t),
        (P::INT64, D::Decimal256(..)) => fixed(kind::SEXT, 8, 32, t),
        (P::INT96, D::Timestamp(unit, _)) => {
            let (mul, div) = match unit {
                TimeUnit::Second => (1, 1_000_000_000),
                TimeUnit::Millisecond => (1_000, 1_000_000),
                TimeUnit::Microsecond => (1_000_000, 1_000),
                TimeUnit::Nanosecond => (1_000_000_000, 1),
            };
            ColumnRecipe { mul, div, ..fixed(kind::INT96, 12, 8, t) }
        }
        (P::FLOAT, D::Float32) => fixed(kind::COPY, 4, 4, t),
        (P::DOUBLE, D::Float64) => fixed(kind::COPY, 8, 8, t),
        (P::BOOLEAN, D::Boolean) => ColumnRecipe { family: Family::Bool, kind: kind::BOOL, in_width: 0, out_width: 0, mul: 1, div: 1, device_type: t },
        (P::FIXED_LEN_BYTE_ARRAY, D::FixedSizeBinary(n)) if *n == leaf.type_length && *n > 0 => {
            fixed(kind::COPY, *n as u32, *n as u32, t)
        }
        (P::FIXED_LEN_BYTE_ARRAY, D::Float16) if leaf.type_length == 2 => fixed(kind::COPY, 2, 2, t),
        // INTERVAL: months, days, milliseconds as three u32 (arrow-rs has no
        // reader for month-day-nano, and neither does gpq).
        (P::FIXED_LEN_BYTE_ARRAY, D::Interval(IntervalUnit::YearMonth)) if leaf.type_length == 12 => fixed(kind::COPY, 12, 4, t),
        (P::FIXED_LEN_BYTE_ARRAY, D::Interval(IntervalUnit::DayTime)) if leaf.type_length == 12 => {
            fixed(kind::INTERVAL_DAY_TIME, 12, 8, t)
        }
        (P::FIXED_LEN_BYTE_ARRAY, d) if decimal_width(d).is_some() => {
            let out = decimal_width(d)?;
            let n = u32::try_from(leaf.type_length).ok().filter(|&n| n > 0 && n <= out)?;
            fixed(kind::BE_DECIMAL, n, out, t)
        }
        (P::BYTE_ARRAY, D::Utf8 | D::Binary | D::LargeUtf8 | D::LargeBinary) => strings(t),
        (P::BYTE_ARRAY, D::Utf8View) => strings(D::Utf8),
        (P::BYTE_ARRAY, D::BinaryView) => strings(D::Binary),
        (P::BYTE_ARRAY, d) if decimal_width(d).is_some() => ColumnRecipe {
            family: Family::BytesDecimal,
            kind: kind::BYTES_DECIMAL,
            in_width: 0,
            out_width: decimal_width(d)?,
            mul: 1,
            div: 1,
            device_type: t,
        },
        _ => return None,
    })
}

fn strings(device_type: DataType) -> ColumnRecipe {
    ColumnRecipe { family: Family::Strings, kind: kind::STRING, in_width: 0, out_width: 0, mul: 1, div: 1, device_type }
}

/// The recipe for `target`, going through `natural` (the type Parquet implies
/// without an embedded schema) and a host cast if need be.
pub(crate) fn recipe(leaf: &LeafColumn, target: &DataType, natural: &DataType) -> Option<ColumnRecipe> {
    if let Some(r) = direct(leaf, target) {
        return Some(r);
    }
    let r = direct(leaf, natural)?;
    arrow::compute::can_cast_types(&r.device_type, target).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::kind;

    #[test]
    fn conversion_kinds_match_the_cuda_source() {
        let entries = crate::gpu::status::cuh_enum(include_str!("../gpu/kernels/page_decode.cuh"), "GpqKind");
        let rust = [
            ("GPQ_KIND_COPY", kind::COPY),
            ("GPQ_KIND_SEXT", kind::SEXT),
            ("GPQ_KIND_MUL", kind::MUL),
            ("GPQ_KIND_BE_DECIMAL", kind::BE_DECIMAL),
            ("GPQ_KIND_INT96", kind::INT96),
            ("GPQ_KIND_BOOL", kind::BOOL),
            ("GPQ_KIND_STRING", kind::STRING),
            ("GPQ_KIND_BYTES_DECIMAL", kind::BYTES_DECIMAL),
            ("GPQ_KIND_INTERVAL_DAY_TIME", kind::INTERVAL_DAY_TIME),
        ];
        let rust: Vec<(String, u32)> = rust.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        assert_eq!(entries, rust);
    }
}
