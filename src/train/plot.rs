//! Training curves as PNG and SVG: mean reward and EM of the training batches per update,
//! and held-out EM per evaluation.
//!
//! plotters is built without font support (no system font libraries to link or find), so
//! the PNG has axes, ticks and lines but no text; the SVG backend writes text as SVG text
//! elements, so it carries the title, axis labels and legend.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

/// The points to draw; x is the update step.
#[derive(Debug, Clone, Default)]
pub struct Curves {
    /// Mean training reward per update.
    pub reward: Vec<(f64, f64)>,
    /// Mean training EM per update.
    pub train_em: Vec<(f64, f64)>,
    /// Held-out EM per evaluation (greedy).
    pub eval_em: Vec<(f64, f64)>,
}

fn range(points: &[&[(f64, f64)]], pad: f64) -> (f64, f64, f64, f64) {
    let all = points.iter().flat_map(|p| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if x0 > x1 {
        return (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1.0 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-6 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    (x0, x1, y0 - pad, y1 + pad)
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;
/// One line of a panel: legend name, points, colour.
type Series<'a> = (&'a str, &'a [(f64, f64)], RGBColor);

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    series: &[Series<'_>],
    text: bool,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let slices: Vec<&[(f64, f64)]> = series.iter().map(|s| s.1).collect();
    let (x0, x1, y0, y1) = range(&slices, 0.05);
    let mut builder = ChartBuilder::on(area);
    builder.margin(12);
    if text {
        builder
            .caption(title, ("sans-serif", 18))
            .x_label_area_size(30)
            .y_label_area_size(45);
    } else {
        builder.x_label_area_size(8).y_label_area_size(8);
    }
    let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("update").y_desc(title);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    for (name, points, color) in series {
        let color = *color;
        let drawn = chart.draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(2),
        ))?;
        if text {
            drawn
                .label(*name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    if text {
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Curves, text: bool) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
    panel(
        &top,
        "reward",
        &[("train reward (mean)", &c.reward, BLUE)],
        text,
    )?;
    panel(
        &bottom,
        "exact match",
        &[
            ("train EM (sampled)", &c.train_em, GREEN),
            ("held-out EM (greedy)", &c.eval_em, RED),
        ],
        text,
    )?;
    root.present()?;
    Ok(())
}

/// Writes `curves.png` and `curves.svg` into `dir`; returns their paths.
pub fn write_curves(dir: &Path, curves: &Curves) -> anyhow::Result<Vec<PathBuf>> {
    let png = dir.join("curves.png");
    let svg = dir.join("curves.svg");
    let size = (800, 600);
    draw(
        BitMapBackend::new(&png, size).into_drawing_area(),
        curves,
        false,
    )
    .map_err(|e| anyhow::anyhow!("{}: cannot draw: {e}", png.display()))?;
    draw(
        SVGBackend::new(&svg, size).into_drawing_area(),
        curves,
        true,
    )
    .map_err(|e| anyhow::anyhow!("{}: cannot draw: {e}", svg.display()))?;
    Ok(vec![png, svg])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_png_and_svg_even_for_one_point() {
        let dir = tempfile::tempdir().unwrap();
        for curves in [
            Curves::default(),
            Curves {
                reward: vec![(1.0, -0.5)],
                train_em: vec![(1.0, 0.1)],
                eval_em: vec![(0.0, 0.0)],
            },
            Curves {
                reward: vec![(1.0, -0.5), (2.0, 0.2), (3.0, 0.4)],
                train_em: vec![(1.0, 0.1), (2.0, 0.3), (3.0, 0.5)],
                eval_em: vec![(0.0, 0.0), (3.0, 0.4)],
            },
        ] {
            let paths = write_curves(dir.path(), &curves).unwrap();
            let png = std::fs::read(&paths[0]).unwrap();
            assert_eq!(&png[1..4], b"PNG");
            let svg = std::fs::read_to_string(&paths[1]).unwrap();
            assert!(svg.contains("<svg") && svg.contains("held-out EM"), "{svg}");
        }
    }
}
