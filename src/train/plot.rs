//! Training curves as PNG and SVG: mean reward and EM of the training batches per update,
//! and held-out EM per evaluation, each value of an evaluation written beside its point.
//!
//! Text in the PNG is rasterised with ab_glyph from a font compiled into the binary
//! (`epaint_default_fonts`' Ubuntu Light), so the picture is the same on a machine without
//! system fonts; the SVG writes text elements.

use std::path::{Path, PathBuf};

use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// The family every text in the curves uses, registered once per process.
const FAMILY: &str = "sans-serif";

fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(
                FAMILY,
                FontStyle::Normal,
                epaint_default_fonts::UBUNTU_LIGHT,
            )
            .map_err(|_| "the embedded font does not parse".to_string())
        })
        .clone()
}

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
/// One line of a panel.
struct Series<'a> {
    /// Its name in the legend.
    name: &'a str,
    points: &'a [(f64, f64)],
    color: RGBColor,
    /// Write each point's value beside it (the evaluations: few points, each one read).
    values_named: bool,
}

/// One panel: its title, the y axis's description, and its lines.
struct Panel<'a> {
    title: &'a str,
    y_desc: &'a str,
    series: &'a [Series<'a>],
}

fn panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Panel<'_>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let slices: Vec<&[(f64, f64)]> = p.series.iter().map(|s| s.points).collect();
    let (x0, x1, y0, y1) = range(&slices, 0.08);
    // Updates are whole numbers: ticks on them, and room beside the first and last point.
    let ticks = ((x1 - x0).round() as usize + 1).min(13);
    let (x0, x1) = (x0 - 0.05 * (x1 - x0), x1 + 0.08 * (x1 - x0));
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .caption(p.title, (FAMILY, 20))
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_labels(ticks)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{:.2}", if y.abs() < 5e-3 { 0.0 } else { *y }))
        .x_desc("update (optimizer steps of the policy)")
        .y_desc(p.y_desc)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .draw()?;
    for s in p.series {
        let color = s.color;
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        if s.values_named {
            let style = (FAMILY, 14).into_font().color(&color);
            chart.draw_series(s.points.iter().map(|&(x, y)| {
                EmptyElement::at((x, y)) + Text::new(format!("{y:.2}"), (-12, -20), style.clone())
            }))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FAMILY, 14))
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()?;
    Ok(())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Curves) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
    panel(
        &top,
        &Panel {
            title: "Reward of the training episodes",
            y_desc: "mean reward per episode",
            series: &[Series {
                name: "train reward (mean of the batch)",
                points: &c.reward,
                color: BLUE,
                values_named: false,
            }],
        },
    )?;
    panel(
        &bottom,
        &Panel {
            title: "Exact match",
            y_desc: "fraction of questions right",
            series: &[
                Series {
                    name: "train EM (sampled episodes)",
                    points: &c.train_em,
                    color: GREEN,
                    values_named: false,
                },
                Series {
                    name: "held-out EM (greedy evaluation)",
                    points: &c.eval_em,
                    color: RED,
                    values_named: true,
                },
            ],
        },
    )?;
    root.present()?;
    Ok(())
}

/// Writes `curves.png` and `curves.svg` into `dir`; returns their paths.
pub fn write_curves(dir: &Path, curves: &Curves) -> anyhow::Result<Vec<PathBuf>> {
    let png = dir.join("curves.png");
    let svg = dir.join("curves.svg");
    let size = (900, 700);
    register_font().map_err(|e| anyhow::anyhow!("{}: cannot draw: {e}", png.display()))?;
    draw(BitMapBackend::new(&png, size).into_drawing_area(), curves)
        .map_err(|e| anyhow::anyhow!("{}: cannot draw: {e}", png.display()))?;
    draw(SVGBackend::new(&svg, size).into_drawing_area(), curves)
        .map_err(|e| anyhow::anyhow!("{}: cannot draw: {e}", svg.display()))?;
    Ok(vec![png, svg])
}

#[cfg(test)]
#[path = "../../tests/support/png_text.rs"]
mod png_text;

#[cfg(test)]
mod tests {
    use super::png_text::assert_png_has_text;
    use super::*;

    #[test]
    fn writes_png_and_svg_with_text_even_for_one_point() {
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
            assert_png_has_text(&paths[0]);
            let svg = std::fs::read_to_string(&paths[1]).unwrap();
            assert!(svg.contains("<svg") && svg.contains("held-out EM"), "{svg}");
        }
    }

    #[test]
    fn a_picture_without_text_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("blank.png");
        let root = BitMapBackend::new(&png, (900, 700)).into_drawing_area();
        root.fill(&WHITE).unwrap();
        ChartBuilder::on(&root)
            .margin(12)
            .build_cartesian_2d(0.0..1.0, 0.0..1.0)
            .unwrap()
            .configure_mesh()
            .x_labels(0)
            .y_labels(0)
            .draw()
            .unwrap();
        root.present().unwrap();
        drop(root);
        let caught = std::panic::catch_unwind(|| assert_png_has_text(&png));
        assert!(
            caught.is_err(),
            "a picture of lines only passed the text check"
        );
    }
}
