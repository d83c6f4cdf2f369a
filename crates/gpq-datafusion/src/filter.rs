//! Pushed-down filters evaluated by the scan itself: which of DataFusion's
//! filter expressions the device can evaluate exactly
//! ([`device_predicate`]: comparisons of a column with a literal, `BETWEEN`,
//! `IN` lists, `IS [NOT] NULL`, `LIKE` with `%` only, boolean columns,
//! comparisons of two columns of one type, `AND`/`OR`/`NOT` of those), and
//! the [`ScanFilter`] a scan applies with them.
//!
//! The table reports those filters `Exact`, so DataFusion plans no
//! `FilterExec` for them: the scan must apply them on every path. The GPU
//! backend evaluates them on the device after decoding and copies only the
//! rows they keep ([`gpq::DeviceTable::filter_columns`]); where a batch
//! cannot be filtered on the device, or a run is decoded on the CPU (the CPU
//! backend, a fallback, a lost context), the same filters run on the host as
//! a DataFusion physical expression. Either way the scan reads the filter
//! columns even when the query does not project them, and drops them after.
//!
//! A column may be wrapped in casts that keep its values and their order
//! (wider integers, `Float32` to `Float64`, decimals to a larger scale,
//! between the string types); a decimal literal that falls between two
//! values of the column's scale is turned into the bound that compares the
//! same way. Anything else stays `Inexact`, for DataFusion to evaluate.

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, SchemaRef, TimeUnit};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use datafusion::physical_expr::{PhysicalExpr, conjunction};
use gpq::arrow::filter::{CmpOp, Literal, Predicate};

/// The filters a scan applies itself.
#[derive(Debug)]
pub(crate) struct ScanFilter {
    /// For the device: over the scan's read columns (by position).
    pub device: Predicate,
    /// For the host: the same filters over the read schema.
    pub host: Arc<dyn PhysicalExpr>,
    /// The filters, as DataFusion displays them.
    pub display: Vec<String>,
}

impl ScanFilter {
    /// The scan filter of `filters` (each one [`device_predicate`] accepts)
    /// over `read_schema`, the scan's read columns. `None` without filters.
    pub fn new(
        state: &dyn datafusion::catalog::Session,
        filters: &[&Expr],
        read_schema: &SchemaRef,
    ) -> Result<Option<ScanFilter>> {
        if filters.is_empty() {
            return Ok(None);
        }
        let parts = filters
            .iter()
            .map(|f| {
                device_predicate(f, read_schema).ok_or_else(|| {
                    datafusion::error::DataFusionError::Internal(format!("gpq scan: filter {f} is not a device filter"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let df_schema = DFSchema::try_from(Arc::clone(read_schema))?;
        let host = filters
            .iter()
            .map(|f| state.create_physical_expr((*f).clone(), &df_schema))
            .collect::<Result<Vec<_>>>()?;
        let device = if parts.len() == 1 { parts.into_iter().next().unwrap_or(Predicate::Const(Some(true))) } else { Predicate::And(parts) };
        Ok(Some(ScanFilter { device, host: conjunction(host), display: filters.iter().map(|f| f.to_string()).collect() }))
    }
}

/// The device predicate of `expr` over `schema`'s columns, if the device
/// evaluates it exactly as DataFusion would.
pub(crate) fn device_predicate(expr: &Expr, schema: &Schema) -> Option<Predicate> {
    // A filter without a column is not the scan's to apply (nothing would be read for it).
    if expr.column_refs().is_empty() {
        return None;
    }
    let p = translate(expr, schema)?;
    // Checked under one more AND, as the scan joins its filters: each then
    // fits the kernel's stack together with the others.
    Predicate::And(vec![Predicate::Const(Some(true)), p.clone()]).check(schema).ok()?;
    Some(p)
}

/// The table columns `filters` read (sorted, without repeats).
pub(crate) fn filter_columns(filters: &[&Expr], schema: &Schema) -> Vec<usize> {
    let mut out: Vec<usize> = filters
        .iter()
        .flat_map(|f| f.column_refs())
        .filter_map(|c| schema.index_of(c.name()).ok())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn translate(expr: &Expr, schema: &Schema) -> Option<Predicate> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::And, right }) => {
            Some(Predicate::And(vec![translate(left, schema)?, translate(right, schema)?]))
        }
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Or, right }) => {
            Some(Predicate::Or(vec![translate(left, schema)?, translate(right, schema)?]))
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let op = cmp_op(*op)?;
            match (operand(left, schema), operand(right, schema)) {
                (Some(col), None) => compare(&col, op, literal(right)?),
                (None, Some(col)) => compare(&col, flip(op), literal(left)?),
                // Two columns of one type, compared as they are stored.
                (Some(a), Some(b)) if a.target == b.target && a.scale_up == b.scale_up => {
                    Some(Predicate::CompareColumns { left: a.column, op, right: b.column })
                }
                _ => None,
            }
        }
        Expr::Not(e) => Some(Predicate::Not(Box::new(translate(e, schema)?))),
        Expr::IsNull(e) => Some(Predicate::IsNull(operand(e, schema)?.column)),
        Expr::IsNotNull(e) => Some(Predicate::IsNotNull(operand(e, schema)?.column)),
        Expr::Between(b) => {
            let col = operand(&b.expr, schema)?;
            let range = Predicate::And(vec![
                compare(&col, CmpOp::GtEq, literal(&b.low)?)?,
                compare(&col, CmpOp::LtEq, literal(&b.high)?)?,
            ]);
            Some(if b.negated { Predicate::Not(Box::new(range)) } else { range })
        }
        Expr::InList(list) => {
            let col = operand(&list.expr, schema)?;
            // DataFusion matches floats in lists by their bits (-0.0 is not
            // 0.0 there, unlike in comparisons): left to DataFusion.
            if matches!(col.target, DataType::Float32 | DataType::Float64) {
                return None;
            }
            let mut values = Vec::with_capacity(list.list.len());
            for item in &list.list {
                match literal_value(&col, literal(item)?)? {
                    Value::Exact(v) => values.push(v),
                    // NULL in the list makes a non-match NULL: left to DataFusion.
                    _ => return None,
                }
            }
            let p = Predicate::InList { column: col.column, values };
            Some(if list.negated { Predicate::Not(Box::new(p)) } else { p })
        }
        Expr::Like(like) => {
            if like.case_insensitive {
                return None;
            }
            let col = operand(&like.expr, schema)?;
            if !matches!(col.target, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
                return None;
            }
            let pattern = match literal(&like.pattern)? {
                ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => s.clone(),
                _ => return None,
            };
            if like.escape_char.is_some_and(|c| pattern.contains(c)) {
                return None;
            }
            let p = Predicate::Like { column: col.column, pattern: pattern.into_bytes() };
            Some(if like.negated { Predicate::Not(Box::new(p)) } else { p })
        }
        Expr::Column(_) | Expr::Cast(_) | Expr::TryCast(_) => {
            let col = operand(expr, schema)?;
            (col.target == DataType::Boolean && col.scale_up == 0).then_some(Predicate::Column(col.column))
        }
        Expr::Literal(ScalarValue::Boolean(b), _) => Some(Predicate::Const(*b)),
        _ => None,
    }
}

fn cmp_op(op: Operator) -> Option<CmpOp> {
    Some(match op {
        Operator::Eq => CmpOp::Eq,
        Operator::NotEq => CmpOp::NotEq,
        Operator::Lt => CmpOp::Lt,
        Operator::LtEq => CmpOp::LtEq,
        Operator::Gt => CmpOp::Gt,
        Operator::GtEq => CmpOp::GtEq,
        _ => return None,
    })
}

/// `a op b` as `b flip(op) a`.
fn flip(op: CmpOp) -> CmpOp {
    match op {
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::LtEq => CmpOp::GtEq,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::GtEq => CmpOp::LtEq,
        other => other,
    }
}

fn literal(e: &Expr) -> Option<&ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

/// A column as a comparison sees it: through casts that keep its values.
#[derive(Debug)]
struct Operand {
    column: usize,
    /// The type after the casts (what the literal is in).
    target: DataType,
    /// Decimal digits the casts appended (the column's values times 10^scale_up).
    scale_up: u32,
}

fn operand(e: &Expr, schema: &Schema) -> Option<Operand> {
    match e {
        Expr::Column(c) => {
            let column = schema.index_of(c.name()).ok()?;
            Some(Operand { column, target: schema.field(column).data_type().clone(), scale_up: 0 })
        }
        Expr::Cast(c) => cast_operand(operand(&c.expr, schema)?, c.field.data_type()),
        Expr::TryCast(c) => cast_operand(operand(&c.expr, schema)?, c.field.data_type()),
        _ => None,
    }
}

/// `inner` cast to `to`, where the cast keeps every value and the order.
fn cast_operand(inner: Operand, to: &DataType) -> Option<Operand> {
    use DataType as D;
    let from = &inner.target;
    let int_range = |t: &DataType| -> Option<(i128, i128)> {
        Some(match t {
            D::Int8 => (i8::MIN.into(), i8::MAX.into()),
            D::Int16 => (i16::MIN.into(), i16::MAX.into()),
            D::Int32 => (i32::MIN.into(), i32::MAX.into()),
            D::Int64 => (i64::MIN.into(), i64::MAX.into()),
            D::UInt8 => (0, u8::MAX.into()),
            D::UInt16 => (0, u16::MAX.into()),
            D::UInt32 => (0, u32::MAX.into()),
            D::UInt64 => (0, u64::MAX.into()),
            _ => return None,
        })
    };
    let keeps = match (from, to) {
        (a, b) if a == b => true,
        (a, b) if int_range(a).is_some() && int_range(b).is_some() => {
            let ((lo_a, hi_a), (lo_b, hi_b)) = (int_range(a)?, int_range(b)?);
            lo_b <= lo_a && hi_a <= hi_b
        }
        (D::Float32, D::Float64) => true,
        (D::Utf8 | D::LargeUtf8 | D::Utf8View, D::Utf8 | D::LargeUtf8 | D::Utf8View) => true,
        (D::Binary | D::LargeBinary | D::BinaryView, D::Binary | D::LargeBinary | D::BinaryView) => true,
        (D::Decimal128(p1, s1), D::Decimal128(p2, s2)) => {
            let (p1, s1, p2, s2) = (i32::from(*p1), i32::from(*s1), i32::from(*p2), i32::from(*s2));
            if s2 < s1 || p2 - s2 < p1 - s1 {
                return None;
            }
            return Some(Operand { column: inner.column, target: to.clone(), scale_up: inner.scale_up + (s2 - s1) as u32 });
        }
        _ => false,
    };
    keeps.then(|| Operand { column: inner.column, target: to.clone(), scale_up: inner.scale_up })
}

/// A literal in the column's own units.
enum Value {
    /// Exactly representable.
    Exact(Literal),
    /// NULL.
    Null,
    /// A decimal strictly between the column's values `floor` and `floor + 1`.
    Between(i128),
}

/// `scalar` (of the operand's target type) in the column's units.
fn literal_value(col: &Operand, scalar: &ScalarValue) -> Option<Value> {
    use ScalarValue as S;
    if scalar.is_null() {
        return Some(Value::Null);
    }
    let int = |v: i128| Some(Value::Exact(Literal::Int(v)));
    let unit = |u: TimeUnit| matches!(&col.target, DataType::Timestamp(t, _) if *t == u);
    match (&col.target, scalar) {
        (DataType::Decimal128(_, scale), S::Decimal128(Some(v), _, s)) if s == scale => {
            let div = 10i128.checked_pow(col.scale_up)?;
            let (q, r) = (v.div_euclid(div), v.rem_euclid(div));
            Some(if r == 0 { Value::Exact(Literal::Int(q)) } else { Value::Between(q) })
        }
        (_, S::Decimal128(..)) => None,
        _ if col.scale_up > 0 => None,
        (DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64, s) | (DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64, s) => match s {
            S::Int8(Some(v)) => int((*v).into()),
            S::Int16(Some(v)) => int((*v).into()),
            S::Int32(Some(v)) => int((*v).into()),
            S::Int64(Some(v)) => int((*v).into()),
            S::UInt8(Some(v)) => int((*v).into()),
            S::UInt16(Some(v)) => int((*v).into()),
            S::UInt32(Some(v)) => int((*v).into()),
            S::UInt64(Some(v)) => int((*v).into()),
            _ => None,
        },
        (DataType::Date32, S::Date32(Some(v))) => int((*v).into()),
        (DataType::Date64, S::Date64(Some(v))) => int((*v).into()),
        (DataType::Timestamp(..), S::TimestampSecond(Some(v), _)) if unit(TimeUnit::Second) => int((*v).into()),
        (DataType::Timestamp(..), S::TimestampMillisecond(Some(v), _)) if unit(TimeUnit::Millisecond) => int((*v).into()),
        (DataType::Timestamp(..), S::TimestampMicrosecond(Some(v), _)) if unit(TimeUnit::Microsecond) => int((*v).into()),
        (DataType::Timestamp(..), S::TimestampNanosecond(Some(v), _)) if unit(TimeUnit::Nanosecond) => int((*v).into()),
        (DataType::Float64, S::Float64(Some(v))) => Some(Value::Exact(Literal::Float(*v))),
        (DataType::Float32, S::Float32(Some(v))) => Some(Value::Exact(Literal::Float((*v).into()))),
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, S::Utf8(Some(s)) | S::LargeUtf8(Some(s)) | S::Utf8View(Some(s))) => {
            Some(Value::Exact(Literal::Bytes(s.as_bytes().to_vec())))
        }
        (DataType::Binary | DataType::LargeBinary | DataType::BinaryView, S::Binary(Some(b)) | S::LargeBinary(Some(b)) | S::BinaryView(Some(b))) => {
            Some(Value::Exact(Literal::Bytes(b.clone())))
        }
        (DataType::Boolean, S::Boolean(Some(b))) => Some(Value::Exact(Literal::Bool(*b))),
        _ => None,
    }
}

/// `col op scalar` on the device.
fn compare(col: &Operand, op: CmpOp, scalar: &ScalarValue) -> Option<Predicate> {
    let c = col.column;
    Some(match literal_value(col, scalar)? {
        Value::Exact(value) => Predicate::Compare { column: c, op, value },
        // Comparing with NULL is NULL.
        Value::Null => Predicate::Const(None),
        // The literal lies strictly between the column's `q` and `q + 1`.
        Value::Between(q) => match op {
            CmpOp::Lt | CmpOp::LtEq => Predicate::Compare { column: c, op: CmpOp::LtEq, value: Literal::Int(q) },
            CmpOp::Gt | CmpOp::GtEq => Predicate::Compare { column: c, op: CmpOp::Gt, value: Literal::Int(q) },
            // Never equal: FALSE, or NULL where the column is.
            CmpOp::Eq => Predicate::And(vec![Predicate::IsNull(c), Predicate::Const(None)]),
            CmpOp::NotEq => Predicate::Or(vec![Predicate::IsNotNull(c), Predicate::Const(None)]),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use datafusion::logical_expr::{cast, col, lit};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("i", DataType::Int32, true),
            Field::new("d", DataType::Decimal128(15, 2), true),
            Field::new("s", DataType::Utf8View, true),
            Field::new("f", DataType::Float32, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ])
    }

    #[test]
    fn shapes_the_device_takes() {
        let s = schema();
        let dec = |v: i128, p: u8, sc: i8| lit(ScalarValue::Decimal128(Some(v), p, sc));
        let ok = [
            col("i").lt(lit(5i32)),
            lit(5i32).lt(col("i")),
            cast(col("i"), DataType::Int64).gt_eq(lit(7i64)),
            col("d").between(dec(5, 15, 2), dec(7, 15, 2)),
            cast(col("d"), DataType::Decimal128(20, 4)).lt(dec(12_345, 20, 4)),
            col("s").like(lit("PROMO%")),
            col("s").not_like(lit("%special%requests%")),
            col("s").in_list(vec![lit("a"), lit("b")], false),
            col("f").gt(lit(1.5f32)),
            cast(col("f"), DataType::Float64).gt(lit(1.5f64)),
            col("b"),
            !col("b"),
            col("i").is_null().or(col("s").is_not_null()),
            col("t").gt(lit(ScalarValue::TimestampMicrosecond(Some(5), None))),
            col("i").eq(lit(ScalarValue::Int32(None))),
        ];
        for e in &ok {
            assert!(device_predicate(e, &s).is_some(), "{e} should run on the device");
        }
        assert!(device_predicate(&col("i").lt(col("i")), &s).is_some());
        let refused = [
            col("i").lt(col("d")),
            cast(col("i"), DataType::Int64).lt(col("t")),
            (col("i") + lit(1i32)).lt(lit(5i32)),
            cast(col("i"), DataType::Int8).lt(lit(5i8)),
            cast(col("i"), DataType::Float64).lt(lit(5.0f64)),
            cast(col("d"), DataType::Float64).lt(lit(0.05f64)),
            col("s").ilike(lit("a%")),
            col("s").like(lit("a_c")),
            col("s").in_list(vec![lit("a"), lit(ScalarValue::Utf8(None))], false),
            col("t").gt(lit(ScalarValue::TimestampNanosecond(Some(5), None))),
            col("i").lt(lit(5i32)).and(col("s").like(lit("x\\%"))),
        ];
        for e in &refused {
            assert!(device_predicate(e, &s).is_none(), "{e} should stay with DataFusion");
        }
    }

    #[test]
    fn decimal_literals_between_column_values_become_bounds() {
        let s = schema();
        // d (scale 2) cast to scale 4, compared with 1.2345: between 1.23 and 1.24.
        let cast_d = || cast(col("d"), DataType::Decimal128(20, 4));
        let lit45 = || lit(ScalarValue::Decimal128(Some(12_345), 20, 4));
        let p = device_predicate(&cast_d().lt(lit45()), &s).unwrap();
        assert_eq!(p, Predicate::Compare { column: 1, op: CmpOp::LtEq, value: Literal::Int(123) });
        let p = device_predicate(&cast_d().gt_eq(lit45()), &s).unwrap();
        assert_eq!(p, Predicate::Compare { column: 1, op: CmpOp::Gt, value: Literal::Int(123) });
        // Negative: -1.2345 lies between -1.24 and -1.23.
        let neg = lit(ScalarValue::Decimal128(Some(-12_345), 20, 4));
        let p = device_predicate(&cast_d().gt(neg), &s).unwrap();
        assert_eq!(p, Predicate::Compare { column: 1, op: CmpOp::Gt, value: Literal::Int(-124) });
        // An exact one keeps its comparison.
        let exact = lit(ScalarValue::Decimal128(Some(1_200), 20, 4));
        let p = device_predicate(&cast_d().eq(exact), &s).unwrap();
        assert_eq!(p, Predicate::Compare { column: 1, op: CmpOp::Eq, value: Literal::Int(12) });
    }
}
