//! Whether a PNG chart carries its text (titles, axis descriptions, legend), read back from
//! the file. Used on the `curves.png` a run writes.

use std::path::Path;

/// The picture as rows of RGB pixels.
fn decode(path: &Path) -> (usize, usize, Vec<u8>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb, "{info:?}");
    buf.truncate(info.buffer_size());
    (info.width as usize, info.height as usize, buf)
}

/// How many different shades of grey a rectangle holds. Lines are drawn in a few solid
/// colours; rasterised text is antialiased, so text leaves many shades where it is.
fn grey_shades(
    img: &(usize, usize, Vec<u8>),
    x: std::ops::Range<usize>,
    y: std::ops::Range<usize>,
) -> usize {
    let (w, _, px) = img;
    let mut shades = std::collections::BTreeSet::new();
    for row in y {
        for col in x.clone() {
            let i = (row * w + col) * 3;
            let (r, g, b) = (px[i], px[i + 1], px[i + 2]);
            if r == g && g == b && r > 0 && r < 255 {
                shades.insert(r);
            }
        }
    }
    shades.len()
}

/// The PNG carries its text: each panel's title, the axes' descriptions and tick labels,
/// and the legend. Fails on a picture drawn without text.
pub fn assert_png_has_text(path: &Path) {
    let img = decode(path);
    let (w, h, _) = img;
    for panel in 0..2 {
        let top = panel * h / 2;
        let bottom = top + h / 2;
        let regions = [
            ("the title", w / 3..2 * w / 3, top..top + 40),
            ("the y axis's description", 0..30, top + 60..bottom - 60),
            (
                "the x axis's description",
                w / 3..2 * w / 3,
                bottom - 28..bottom,
            ),
            ("the legend", w / 2..w - 20, bottom - 140..bottom - 50),
        ];
        for (what, x, y) in regions {
            let shades = grey_shades(&img, x.clone(), y.clone());
            assert!(
                shades >= 8,
                "{}: panel {panel} has no text where {what} goes (x {x:?}, y {y:?}: {shades} shades of grey)",
                path.display()
            );
        }
    }
}
