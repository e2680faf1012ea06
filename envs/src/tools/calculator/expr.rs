//! An exact arithmetic evaluator: a recursive-descent parser over `+ - * / ^` (also `**`),
//! parentheses, unary minus and decimals (`1.5`, `.5`, `2e3`), evaluated on big rationals.
//! Nothing is ever executed as code; limits on length, nesting, exponents and result size
//! keep every input bounded in time and memory.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

/// Longest expression accepted, in bytes.
pub const MAX_LEN: usize = 10_000;
/// Deepest nesting of parentheses and unary signs.
pub const MAX_DEPTH: usize = 200;
/// Largest result (numerator or denominator) in bits.
pub const MAX_BITS: u64 = 100_000;
/// Largest decimal exponent in a literal (`1e400` is fine, `1e100000` is not).
const MAX_LITERAL_EXP: i64 = 10_000;

/// Why an expression has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    /// The text is not an expression of the grammar.
    #[error("syntax error at character {pos}: {message}")]
    Syntax {
        /// 1-based character position.
        pos: usize,
        /// What was expected.
        message: String,
    },
    /// Division (or a negative power) of zero.
    #[error("division by zero")]
    DivisionByZero,
    /// Input or result past the evaluator's limits.
    #[error("too large: {0}")]
    TooLarge(String),
    /// A power with a non-integer exponent (the result would not be rational).
    #[error("exponent must be an integer, got {0}")]
    NonIntegerExponent(String),
}

/// Evaluates `text` exactly.
pub fn evaluate(text: &str) -> Result<BigRational, CalcError> {
    if text.len() > MAX_LEN {
        return Err(CalcError::TooLarge(format!(
            "expression longer than {MAX_LEN} bytes"
        )));
    }
    let mut p = Parser {
        chars: text.chars().collect(),
        pos: 0,
        depth: 0,
    };
    let value = p.expr()?;
    p.skip_ws();
    if p.pos < p.chars.len() {
        return Err(p.error(format!("unexpected `{}`", p.chars[p.pos])));
    }
    Ok(value)
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn error(&self, message: impl Into<String>) -> CalcError {
        CalcError::Syntax {
            pos: self.pos + 1,
            message: message.into(),
        }
    }

    fn skip_ws(&mut self) {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.chars.get(self.pos).copied()
    }

    fn enter(&mut self) -> Result<(), CalcError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(CalcError::TooLarge(format!(
                "nesting deeper than {MAX_DEPTH}"
            )));
        }
        Ok(())
    }

    /// expr := term (('+' | '-') term)*
    fn expr(&mut self) -> Result<BigRational, CalcError> {
        let mut acc = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.pos += 1;
            let rhs = self.term()?;
            acc = if op == '+' { acc + rhs } else { acc - rhs };
            check_size(&acc)?;
        }
        Ok(acc)
    }

    /// term := unary (('*' | '/') unary)*
    fn term(&mut self) -> Result<BigRational, CalcError> {
        let mut acc = self.unary()?;
        loop {
            match self.peek() {
                Some('*') if self.chars.get(self.pos + 1) != Some(&'*') => {
                    self.pos += 1;
                    acc *= self.unary()?;
                }
                Some('/') => {
                    self.pos += 1;
                    let rhs = self.unary()?;
                    if rhs.is_zero() {
                        return Err(CalcError::DivisionByZero);
                    }
                    acc /= rhs;
                }
                _ => return Ok(acc),
            }
            check_size(&acc)?;
        }
    }

    /// unary := ('-' | '+') unary | power   (so `-2^2` is `-(2^2)`)
    fn unary(&mut self) -> Result<BigRational, CalcError> {
        match self.peek() {
            Some(sign @ ('-' | '+')) => {
                self.pos += 1;
                self.enter()?;
                let v = self.unary()?;
                self.depth -= 1;
                Ok(if sign == '-' { -v } else { v })
            }
            _ => self.power(),
        }
    }

    /// power := atom (('^' | '**') unary)?   (right-associative: `2^3^2` is `2^9`)
    fn power(&mut self) -> Result<BigRational, CalcError> {
        let base = self.atom()?;
        let is_pow = match self.peek() {
            Some('^') => {
                self.pos += 1;
                true
            }
            Some('*') if self.chars.get(self.pos + 1) == Some(&'*') => {
                self.pos += 2;
                true
            }
            _ => false,
        };
        if !is_pow {
            return Ok(base);
        }
        self.enter()?;
        let exp = self.unary()?;
        self.depth -= 1;
        pow(base, &exp)
    }

    /// atom := number | '(' expr ')'
    fn atom(&mut self) -> Result<BigRational, CalcError> {
        match self.peek() {
            Some('(') => {
                self.pos += 1;
                self.enter()?;
                let v = self.expr()?;
                self.depth -= 1;
                if self.peek() != Some(')') {
                    return Err(self.error("expected `)`"));
                }
                self.pos += 1;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() || c == '.' => self.number(),
            Some(c) => Err(self.error(format!("expected a number or `(`, found `{c}`"))),
            None => Err(self.error("expected a number or `(`, found the end")),
        }
    }

    fn digits(&mut self) -> String {
        let start = self.pos;
        while self
            .chars
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_digit() || *c == '_')
        {
            self.pos += 1;
        }
        self.chars[start..self.pos]
            .iter()
            .filter(|c| **c != '_')
            .collect()
    }

    fn number(&mut self) -> Result<BigRational, CalcError> {
        let int = self.digits();
        let mut frac = String::new();
        if self.chars.get(self.pos) == Some(&'.') {
            self.pos += 1;
            frac = self.digits();
        }
        if int.is_empty() && frac.is_empty() {
            return Err(self.error("a number needs digits"));
        }
        let mut exp10: i64 = 0;
        if matches!(self.chars.get(self.pos), Some('e' | 'E')) {
            self.pos += 1;
            let negative = match self.chars.get(self.pos) {
                Some('-') => {
                    self.pos += 1;
                    true
                }
                Some('+') => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let e = self.digits();
            if e.is_empty() {
                return Err(self.error("exponent needs digits"));
            }
            let e: i64 = e
                .parse()
                .ok()
                .filter(|e| *e <= MAX_LITERAL_EXP)
                .ok_or_else(|| {
                    CalcError::TooLarge(format!("literal exponent above {MAX_LITERAL_EXP}"))
                })?;
            exp10 = if negative { -e } else { e };
        }
        let mantissa: BigInt = format!("{int}{frac}")
            .parse()
            .map_err(|_| self.error("bad number"))?;
        let scale = exp10 - frac.len() as i64;
        let ten = BigInt::from(10);
        let value = if scale >= 0 {
            BigRational::from_integer(mantissa * num_traits::pow(ten, scale as usize))
        } else {
            BigRational::new(mantissa, num_traits::pow(ten, (-scale) as usize))
        };
        check_size(&value)?;
        Ok(value)
    }
}

fn check_size(v: &BigRational) -> Result<(), CalcError> {
    if v.numer().bits() > MAX_BITS || v.denom().bits() > MAX_BITS {
        return Err(CalcError::TooLarge(format!(
            "result exceeds {MAX_BITS} bits"
        )));
    }
    Ok(())
}

fn pow(base: BigRational, exp: &BigRational) -> Result<BigRational, CalcError> {
    if !exp.is_integer() {
        return Err(CalcError::NonIntegerExponent(exp.to_string()));
    }
    if base.is_zero() {
        return match exp.numer().sign() {
            num_bigint::Sign::Minus => Err(CalcError::DivisionByZero),
            num_bigint::Sign::NoSign => Ok(BigRational::one()),
            num_bigint::Sign::Plus => Ok(BigRational::zero()),
        };
    }
    let magnitude = exp.numer().abs();
    // Exact for |base| = 1; otherwise the result's size bounds the exponent.
    if base.numer().abs().is_one() && base.denom().is_one() {
        let odd = magnitude.bit(0);
        return Ok(if base.is_negative() && odd {
            -BigRational::one()
        } else {
            BigRational::one()
        });
    }
    let e = magnitude
        .to_u64()
        .filter(|e| {
            let bits = base.numer().bits().max(base.denom().bits()).max(2) - 1;
            bits.saturating_mul(*e) <= MAX_BITS
        })
        .ok_or_else(|| CalcError::TooLarge(format!("exponent {exp} is too large")))?;
    let e = usize::try_from(e).map_err(|_| CalcError::TooLarge("exponent".into()))?;
    let raised = num_traits::pow(base, e);
    let value = if exp.is_negative() {
        raised.recip()
    } else {
        raised
    };
    check_size(&value)?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(s: &str) -> String {
        evaluate(s)
            .map(|v| v.to_string())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn precedence_associativity_and_signs() {
        assert_eq!(eval("1 + 2 * 3"), "7");
        assert_eq!(eval("(1 + 2) * 3"), "9");
        assert_eq!(eval("2^3^2"), "512");
        assert_eq!(eval("2**10"), "1024");
        assert_eq!(eval("-2^2"), "-4");
        assert_eq!(eval("(-2)^3"), "-8");
        assert_eq!(eval("2^-2"), "1/4");
        assert_eq!(eval("--3 - -2"), "5");
        assert_eq!(eval("10 - 4 - 3"), "3");
        assert_eq!(eval("12 / 4 / 3"), "1");
    }

    #[test]
    fn decimals_are_exact() {
        assert_eq!(eval("0.1 + 0.2"), "3/10");
        assert_eq!(eval(".5 * 4"), "2");
        assert_eq!(eval("1.5e3"), "1500");
        assert_eq!(eval("2.5E-1"), "1/4");
        assert_eq!(eval("1_000 + 1"), "1001");
    }

    #[test]
    fn errors_are_reported_not_panicked() {
        assert_eq!(eval("1/0"), "division by zero");
        assert_eq!(eval("1/(2-2)"), "division by zero");
        assert_eq!(eval("0^-1"), "division by zero");
        assert!(eval("2^100000000").starts_with("too large"));
        assert!(eval("10^10^10").starts_with("too large"));
        assert!(eval("1e99999999").starts_with("too large"));
        assert!(eval("2^(1/2)").starts_with("exponent must be an integer"));
        assert_eq!(eval("(-1)^1000000000001"), "-1");
        assert!(eval("1 +").starts_with("syntax error at character 4"));
        assert!(eval("(1").contains("expected `)`"));
        assert!(eval("1 2").contains("unexpected `2`"));
        assert!(eval("import os").starts_with("syntax error at character 1"));
        assert!(eval(".").contains("needs digits"));
        assert!(eval(&"(".repeat(5000)).starts_with("too large"));
        assert!(eval(&"-".repeat(5000)).starts_with("too large"));
        assert!(eval(&"1+".repeat(6000)).starts_with("too large"));
    }
}
