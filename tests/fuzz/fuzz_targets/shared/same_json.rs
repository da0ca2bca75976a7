//! Shared by the fuzz targets that round-trip JSON (included with `#[path]`).

use serde_json::Value;

/// Equality, except that floats may differ in the last bits: serde_json's default float parser
/// is not correctly rounded (its `float_roundtrip` feature is off), so `1.01e120` or `7.777e54`
/// can come back one ulp away. Integers and everything else must match exactly.
pub fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() && y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x == y || (x - y).abs() <= x.abs().max(y.abs()) * 1e-15
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}
