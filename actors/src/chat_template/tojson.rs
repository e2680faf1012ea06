//! A `tojson` filter that prints exactly what Python's `json.dumps` prints.
//!
//! transformers replaces Jinja's `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`.
//! minijinja's built-in filter HTML-escapes `<`, `>`, `&`, `'` and uses compact separators, so a
//! tool schema rendered with it would tokenize differently from what the model saw in training.
//! Every byte here follows CPython's `json` encoder: `", "` / `": "` separators by default, `","`
//! when an indent is given, lowercase `\u00xx` escapes, Python's float `repr`, and `NaN` /
//! `Infinity` for non-finite floats.

use std::fmt::Write as _;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind};

/// How `json.dumps` was asked to format its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonStyle {
    /// `ensure_ascii`: escape every non-ASCII character as `\uXXXX` (surrogate pairs above the BMP).
    pub(crate) ensure_ascii: bool,
    /// `indent` already turned into the string put once per nesting level; `None` is one line.
    pub(crate) indent: Option<String>,
    /// Between items.
    pub(crate) item_sep: String,
    /// Between a key and its value.
    pub(crate) key_sep: String,
    /// `sort_keys`.
    pub(crate) sort_keys: bool,
}

impl Default for JsonStyle {
    fn default() -> Self {
        // transformers passes ensure_ascii=False; the separators are json.dumps' defaults.
        Self {
            ensure_ascii: false,
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

/// The filter registered as `tojson`: `tojson(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, positionally or by keyword, as in transformers.
pub(crate) fn tojson_filter(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.into_values();
    let (positional, kwargs) = from_args::<(&[Value], Kwargs)>(&args)?;
    if positional.len() > 4 {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson() takes at most 4 arguments besides the value",
        ));
    }
    let pick = |index: usize, name: &str| -> Result<Option<Value>, Error> {
        let keyword: Option<Value> = kwargs.get(name)?;
        match (positional.get(index).cloned(), keyword) {
            (Some(_), Some(_)) => Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("tojson() got multiple values for argument '{name}'"),
            )),
            (p, k) => Ok(p.or(k)),
        }
    };
    let ensure_ascii = pick(0, "ensure_ascii")?;
    let indent = pick(1, "indent")?;
    let separators = pick(2, "separators")?;
    let sort_keys = pick(3, "sort_keys")?;
    kwargs.assert_all_used()?;

    let style = JsonStyle::from_python_args(
        ensure_ascii.as_ref(),
        indent.as_ref(),
        separators.as_ref(),
        sort_keys.as_ref(),
    )?;
    let mut out = String::new();
    dump(value, &style, 0, &mut out)?;
    // Not marked safe: transformers' environment does not autoescape, and neither does ours.
    Ok(Value::from(out))
}

impl JsonStyle {
    /// Interprets `json.dumps` keyword arguments as Python would (`None` meaning the default).
    pub(crate) fn from_python_args(
        ensure_ascii: Option<&Value>,
        indent: Option<&Value>,
        separators: Option<&Value>,
        sort_keys: Option<&Value>,
    ) -> Result<Self, Error> {
        let present = |v: Option<&Value>| v.filter(|v| !v.is_none() && !v.is_undefined()).cloned();
        let mut style = JsonStyle::default();
        if let Some(v) = present(ensure_ascii) {
            style.ensure_ascii = v.is_true();
        }
        if let Some(v) = present(sort_keys) {
            style.sort_keys = v.is_true();
        }
        if let Some(v) = present(indent) {
            style.indent = Some(if let Some(s) = v.as_str() {
                s.to_string()
            } else if v.is_integer() {
                // Python: ' ' * indent, so a negative indent means no spaces (but still newlines).
                let n = v.as_i64().unwrap_or(0).max(0);
                " ".repeat(usize::try_from(n).unwrap_or(0))
            } else {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: indent must be an integer or a string, not {}",
                        v.kind()
                    ),
                ));
            });
            // json.dumps: with an indent, the default item separator loses its trailing space.
            style.item_sep = ",".into();
        }
        if let Some(v) = present(separators) {
            let parts: Vec<Value> = match v.kind() {
                ValueKind::Seq => v.try_iter()?.collect(),
                _ => Vec::new(),
            };
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                    style.item_sep = item.as_str().unwrap_or_default().to_string();
                    style.key_sep = key.as_str().unwrap_or_default().to_string();
                }
                _ => return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings (item_separator, key_separator)",
                )),
            }
        }
        Ok(style)
    }
}

/// Serializes `value` into `out` the way `json.dumps` does.
pub(crate) fn dump(
    value: &Value,
    style: &JsonStyle,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => push_number(value, out)?,
        ValueKind::String => push_string(value.as_str().unwrap_or_default(), style, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline_indent(style, level + 1, out);
                dump(item, style, level + 1, out)?;
            }
            newline_indent(style, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                // Python sorts the original keys; for the string keys chat templates use,
                // that is the same as sorting by code point, which Rust's str order is.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline_indent(style, level + 1, out);
                push_string(key, style, out);
                out.push_str(&style.key_sep);
                dump(item, style, level + 1, out)?;
            }
            newline_indent(style, level, out);
            out.push('}');
        }
        kind => {
            // Python raises TypeError for Undefined, bytes and arbitrary objects alike.
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of type {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

fn newline_indent(style: &JsonStyle, level: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

/// JSON object keys as Python coerces them: str as is, bool/None/numbers to their JSON text.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Number => {
            let mut s = String::new();
            push_number(key, &mut s)?;
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn push_number(value: &Value, out: &mut String) -> Result<(), Error> {
    if value.is_integer() {
        // Integers of any width print as plain decimal, like Python's int.
        let _ = write!(out, "{value}");
        return Ok(());
    }
    let x = f64::try_from(value.clone())?;
    out.push_str(&python_float_repr(x));
    Ok(())
}

/// Python's `float.__repr__` (which `json.dumps` uses): the shortest digits that round-trip,
/// positional for decimal exponents in [-4, 16), scientific with a signed two-digit-minimum
/// exponent otherwise, and always a `.0` on integral positional values.
pub(crate) fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "-1.2345e-7".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            out.push_str("0.");
            for _ in 0..(-point) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let point = point as usize;
            if digits.len() <= point {
                out.push_str(&digits);
                for _ in digits.len()..point {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// A JSON string literal as CPython's encoder writes it.
fn push_string(s: &str, style: &JsonStyle, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::Environment;

    fn render(template: &str, value: serde_json::Value) -> Result<String, Error> {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson_filter);
        env.render_str(
            template,
            minijinja::context! { x => Value::from(minijinja::value::Serde(&value)) },
        )
    }

    #[test]
    fn default_separators_match_json_dumps() {
        let v = serde_json::json!({"b": 1, "a": [1, 2.5, true, null], "c": {}});
        assert_eq!(
            render("{{ x | tojson }}", v).unwrap(),
            r#"{"b": 1, "a": [1, 2.5, true, null], "c": {}}"#
        );
    }

    #[test]
    fn keeps_insertion_order_and_sorts_on_request() {
        let v = serde_json::json!({"zeta": 1, "alpha": {"y": 2, "x": 3}});
        assert_eq!(
            render("{{ x | tojson }}", v.clone()).unwrap(),
            r#"{"zeta": 1, "alpha": {"y": 2, "x": 3}}"#
        );
        assert_eq!(
            render("{{ x | tojson(sort_keys=true) }}", v).unwrap(),
            r#"{"alpha": {"x": 3, "y": 2}, "zeta": 1}"#
        );
    }

    #[test]
    fn unicode_is_kept_and_html_is_not_escaped() {
        let v = serde_json::json!({"q": "Zürich <b>&'\"\\ 東京 🦀\n\t\u{1}\u{7f}"});
        assert_eq!(
            render("{{ x | tojson }}", v.clone()).unwrap(),
            "{\"q\": \"Zürich <b>&'\\\"\\\\ 東京 🦀\\n\\t\\u0001\u{7f}\"}"
        );
        assert_eq!(
            render("{{ x | tojson(ensure_ascii=true) }}", v).unwrap(),
            "{\"q\": \"Z\\u00fcrich <b>&'\\\"\\\\ \\u6771\\u4eac \\ud83e\\udd80\\n\\t\\u0001\u{7f}\"}"
        );
    }

    #[test]
    fn indent_and_separators() {
        let v = serde_json::json!({"a": [1, {"b": []}], "c": "d"});
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", v.clone()).unwrap(),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ],\n  \"c\": \"d\"\n}"
        );
        assert_eq!(
            render("{{ x | tojson(indent='\\t') }}", serde_json::json!([1])).unwrap(),
            "[\n\t1\n]"
        );
        assert_eq!(
            render("{{ x | tojson(separators=(',', ':')) }}", v.clone()).unwrap(),
            r#"{"a":[1,{"b":[]}],"c":"d"}"#
        );
        // Positional, as json.dumps' signature order: ensure_ascii, indent, separators, sort_keys.
        assert_eq!(
            render("{{ x | tojson(false, none, (',', ':'), true) }}", v).unwrap(),
            r#"{"a":[1,{"b":[]}],"c":"d"}"#
        );
    }

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (1e300, "1e+300"),
            (-0.0, "-0.0"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "{x:e}");
        }
    }

    #[test]
    fn undefined_is_not_serializable() {
        let err = render("{{ nothing | tojson }}", serde_json::json!(null)).unwrap_err();
        assert!(err.to_string().contains("not JSON serializable"), "{err}");
    }

    #[test]
    fn bad_arguments_are_errors() {
        let v = serde_json::json!([1]);
        assert!(render("{{ x | tojson(indent=[1]) }}", v.clone()).is_err());
        assert!(render("{{ x | tojson(separators='ab') }}", v.clone()).is_err());
        assert!(render("{{ x | tojson(bogus=1) }}", v.clone()).is_err());
        assert!(render("{{ x | tojson(true, ensure_ascii=true) }}", v).is_err());
    }
}
