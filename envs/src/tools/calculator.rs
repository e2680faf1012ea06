//! `calculator`: exact arithmetic for the model, without evaluating any code.
//!
//! Results are exact rationals: `0.1 + 0.2` answers `0.3`; `1/3` answers
//! `1/3 (≈ 0.3333333333)`. Division by zero, huge powers and syntax errors come back as
//! tool errors the model can read.

pub mod expr;

use std::time::Duration;

use async_trait::async_trait;
use num_bigint::BigInt;
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::{Signed, Zero};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::tool::{Tool, ToolOutput};

pub use expr::{evaluate, CalcError};

/// Digits after the point in the approximate decimal of a non-terminating result.
const APPROX_DIGITS: usize = 10;

/// The calculator tool.
#[derive(Debug, Clone, Default)]
pub struct CalculatorTool;

/// Formats an exact value: an integer or terminating decimal as is; anything else as
/// `p/q (≈ decimal)`.
pub fn format_value(v: &BigRational) -> String {
    if v.is_integer() {
        return v.numer().to_string();
    }
    // A fraction in lowest terms terminates in base 10 iff its denominator is 2^a 5^b.
    let mut d = v.denom().clone();
    let (two, five) = (BigInt::from(2), BigInt::from(5));
    let mut places = 0usize;
    let mut twos = 0usize;
    let mut fives = 0usize;
    while d.is_even() {
        d /= &two;
        twos += 1;
    }
    while (&d % &five).is_zero() {
        d /= &five;
        fives += 1;
    }
    if d == BigInt::from(1) {
        places = twos.max(fives);
    }
    if places > 0 && places <= 60 {
        return decimal(v, places);
    }
    format!("{} (≈ {})", v, decimal(v, APPROX_DIGITS))
}

/// `v` rounded toward zero to `places` digits after the point, trailing zeros dropped.
fn decimal(v: &BigRational, places: usize) -> String {
    let scale = num_traits::pow(BigInt::from(10), places);
    let scaled = (v.numer().abs() * &scale) / v.denom();
    let digits = scaled.to_string();
    let digits = format!("{digits:0>width$}", width = places + 1);
    let (int, frac) = digits.split_at(digits.len() - places);
    let frac = frac.trim_end_matches('0');
    let sign = if v.is_negative() { "-" } else { "" };
    if frac.is_empty() {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

#[async_trait]
impl Tool for CalculatorTool {
    fn name(&self) -> &str {
        "calculator"
    }
    fn description(&self) -> &str {
        "Evaluate an arithmetic expression exactly. Supports + - * / ^ (power), parentheses, \
         unary minus and decimals, e.g. \"(3.5 + 2) * 4 / 3\"."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "The arithmetic expression."}
            },
            "required": ["expression"]
        })
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }
    async fn call(&self, arguments: Value) -> Result<ToolOutput> {
        let expression = arguments
            .get("expression")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let value = evaluate(expression).map_err(|e| Error::Tool {
            tool: "calculator".into(),
            message: e.to_string(),
        })?;
        let mut out = ToolOutput::text(format_value(&value));
        out.metadata
            .insert("exact".into(), Value::from(value.to_string()));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(s: &str) -> String {
        format_value(&evaluate(s).unwrap())
    }

    #[test]
    fn formats_exact_values() {
        assert_eq!(show("0.1 + 0.2"), "0.3");
        assert_eq!(show("1/3"), "1/3 (≈ 0.3333333333)");
        assert_eq!(show("-2/3"), "-2/3 (≈ -0.6666666666)");
        assert_eq!(show("-1/8"), "-0.125");
        assert_eq!(show("7/4"), "1.75");
        assert_eq!(show("2^64"), "18446744073709551616");
        assert_eq!(show("1/1024"), "0.0009765625");
    }

    #[tokio::test]
    async fn tool_answers_and_errors() {
        let out = CalculatorTool
            .call(json!({"expression": "(3.5 + 2) * 4 / 3"}))
            .await
            .unwrap();
        assert_eq!(out.text, "22/3 (≈ 7.3333333333)");
        let e = CalculatorTool
            .call(json!({"expression": "1/0"}))
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "tool `calculator` failed: division by zero");
    }
}
