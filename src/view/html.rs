//! HTML building blocks: escaping, the page frame, tables of numbers and SVG curves.
//! Pages are rendered on the server with no script or style from elsewhere.

use std::fmt::Write;

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number for a table cell: 4 significant decimals, `—` for none.
pub fn num(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(v) if v.is_nan() => "—".into(),
        Some(v) if v == v.trunc() && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) if v.abs() >= 1000.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.4}"),
    }
}

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d2b3a;color:#fff;padding:10px 20px;display:flex;gap:18px;align-items:baseline}
header a{color:#cfe3ff;text-decoration:none} header b{font-size:16px}
main{padding:16px 20px;max-width:1500px}
h1{font-size:20px;margin:4px 0 12px} h2{font-size:16px;margin:22px 0 8px}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{border:1px solid #dde1e6;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef1f4;white-space:nowrap} th a{color:inherit}
td.n{text-align:right} tr.changed td{background:#fff8e1}
.note{color:#5b6570} .err{color:#a3161b;font-weight:600} .warn{background:#fff4d6;border:1px solid #f0c36d;padding:6px 10px;margin:8px 0}
pre{background:#fff;border:1px solid #dde1e6;padding:8px;white-space:pre-wrap;word-break:break-word;max-height:480px;overflow:auto}
.curves{display:flex;flex-wrap:wrap;gap:12px} .curve{background:#fff;border:1px solid #dde1e6}
.curve text{font-size:11px;fill:#445}
.step{background:#fff;border:1px solid #dde1e6;margin:10px 0;padding:8px 12px}
.tokens{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace;font-size:13px;border:1px solid #dde1e6;padding:6px;background:#fff}
.tok{border-radius:2px} .obs{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:13px;color:#354;background:#f3f8f3;border:1px solid #d5e5d5;padding:6px}
form.filter{display:flex;gap:10px;flex-wrap:wrap;align-items:end;margin:6px 0 12px} form.filter label{display:flex;flex-direction:column;font-size:12px;color:#445}
.pager a,.pager span{margin-right:10px}
"#;

/// A whole page: the header's links, a title, and `body`.
pub fn frame(title: &str, run_name: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t} · agent-r1</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head><body>\
         <header><b>agent-r1</b><span>{run}</span><a href=\"/ui\">run</a><a href=\"/ui/episodes\">episodes</a>\
         <a href=\"/ui/live\">live</a></header><main><h1>{t}</h1>{body}</main></body></html>",
        t = esc(title),
        run = esc(run_name),
    )
}

/// One series of a curve: `(x, y)` points.
pub struct Series<'a> {
    /// The log and key it comes from (`updates.reward_mean`), the SVG's `data-series`.
    pub key: &'a str,
    /// A title.
    pub title: &'a str,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// A small line chart as inline SVG. Every point is a `<circle>` carrying its values in
/// `data-x` / `data-y` (and a tooltip), so the numbers behind a curve can be read back.
pub fn curve(series: &Series<'_>) -> String {
    let (w, h, left, right, top, bottom) = (320.0, 170.0, 46.0, 10.0, 22.0, 24.0);
    let mut out = String::new();
    let pts = &series.points;
    let _ = write!(
        out,
        "<svg class=\"curve\" data-series=\"{}\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\
         <title>{}</title><text x=\"{left}\" y=\"14\" style=\"font-weight:600\">{}</text>",
        esc(series.key),
        esc(series.title),
        esc(series.title)
    );
    if pts.is_empty() {
        let _ = write!(out, "<text x=\"{left}\" y=\"80\">no data</text></svg>");
        return out;
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-12 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let sy = |y: f64| top + (y1 - y) / (y1 - y0) * (h - top - bottom);
    let _ = write!(
        out,
        "<line x1=\"{left}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#99a\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{b}\" stroke=\"#99a\"/>\
         <text x=\"2\" y=\"{yt}\">{hi}</text><text x=\"2\" y=\"{b}\">{lo}</text>\
         <text x=\"{left}\" y=\"{xl}\">{xa}</text><text x=\"{xr}\" y=\"{xl}\" text-anchor=\"end\">{xb}</text>",
        b = h - bottom,
        r = w - right,
        yt = top + 4.0,
        hi = num(Some(y1)),
        lo = num(Some(y0)),
        xl = h - 6.0,
        xa = num(Some(x0)),
        xr = w - right,
        xb = num(Some(x1)),
    );
    let line: Vec<String> = pts
        .iter()
        .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
        .collect();
    let _ = write!(
        out,
        "<polyline fill=\"none\" stroke=\"#2f6fb0\" stroke-width=\"1.6\" points=\"{}\"/>",
        line.join(" ")
    );
    for &(x, y) in pts {
        let _ = write!(
            out,
            "<circle class=\"pt\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.6\" fill=\"#2f6fb0\" data-x=\"{x}\" data-y=\"{y}\"><title>update {x}: {}</title></circle>",
            sx(x),
            sy(y),
            num(Some(y))
        );
    }
    out.push_str("</svg>");
    out
}

/// A background colour for a token sampled with log-probability `lp`: white when the policy
/// was sure (p near 1), deepening red as p falls.
pub fn logprob_colour(lp: f64) -> String {
    let p = lp.exp().clamp(0.0, 1.0);
    let light = 97.0 - (1.0 - p) * 45.0;
    format!("hsl(4,85%,{light:.0}%)")
}
