//! A small, deterministic SVG chart builder, and PNG rendering of its output with an
//! embedded font (DejaVu Sans), so plots need no system font packages.
//!
//! Coordinates are pixels from the top left. Numbers are written with a fixed number of
//! decimals, so identical data gives identical bytes.

use std::fmt::Write as _;
#[cfg(feature = "png")]
use std::sync::OnceLock;

/// The font embedded for PNG rendering (DejaVu Sans; license in `assets/fonts/`).
pub const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// The font family written into SVG text.
pub const FONT_FAMILY: &str = "DejaVu Sans, Verdana, sans-serif";

/// Colours for series, in order (colour-blind friendly, Okabe-Ito based).
pub const PALETTE: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];

/// The colour of series `i`.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// A marker's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// A circle.
    Circle,
    /// A square.
    Square,
    /// A triangle, point up.
    Triangle,
    /// A diamond.
    Diamond,
}

/// How one series is drawn: colour, dash pattern (empty: solid) and marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Stroke and fill colour.
    pub color: &'static str,
    /// SVG `stroke-dasharray`, or empty for a solid line.
    pub dash: &'static str,
    /// Marker shape.
    pub marker: Marker,
}

/// The fixed style of each scheduler, the same in every plot and report; two series with
/// identical values stay distinguishable by dash and marker.
const SCHEDULER_STYLES: [(&str, Style); 11] = [
    (
        crate::produce::OPTIMAL,
        Style {
            color: "#000000",
            dash: "",
            marker: Marker::Circle,
        },
    ),
    (
        "vllm",
        Style {
            color: "#D55E00",
            dash: "",
            marker: Marker::Square,
        },
    ),
    (
        "vllm-v1",
        Style {
            color: "#0072B2",
            dash: "7 3",
            marker: Marker::Triangle,
        },
    ),
    (
        "sarathi",
        Style {
            color: "#009E73",
            dash: "2 2",
            marker: Marker::Diamond,
        },
    ),
    (
        "orca",
        Style {
            color: "#E69F00",
            dash: "9 3 2 3",
            marker: Marker::Circle,
        },
    ),
    (
        "orca-max",
        Style {
            color: "#56B4E9",
            dash: "4 4",
            marker: Marker::Square,
        },
    ),
    (
        "static",
        Style {
            color: "#CC79A7",
            dash: "1 3",
            marker: Marker::Triangle,
        },
    ),
    (
        "mcsf",
        Style {
            color: "#882255",
            dash: "12 4",
            marker: Marker::Diamond,
        },
    ),
    (
        "fastgen",
        Style {
            color: "#44AA99",
            dash: "6 2 1 2",
            marker: Marker::Circle,
        },
    ),
    (
        "lightllm",
        Style {
            color: "#999933",
            dash: "3 1",
            marker: Marker::Square,
        },
    ),
    (
        "fastertransformer",
        Style {
            color: "#AA4499",
            dash: "8 2 2 2",
            marker: Marker::Triangle,
        },
    ),
];

/// Dash patterns for series without a fixed style, by index.
const DASHES: [&str; 4] = ["", "7 3", "2 2", "9 3 2 3"];

/// The style of series `name` (its scheduler's when the name starts with one, e.g.
/// `vllm (makespan)`; a policy-constrained optimum such as `optimal+no-evict` keeps the
/// optimum's colour with a dash of its own), else a palette style by `index`.
pub fn series_style(name: &str, index: usize) -> Style {
    // The solver's unproven answer keeps the solver's style.
    let name = match name.strip_prefix("best-found") {
        Some(rest) => &format!("{}{rest}", crate::produce::OPTIMAL),
        None => name,
    };
    let base = name.split([' ', '+']).next().unwrap_or(name);
    match SCHEDULER_STYLES.iter().find(|(n, _)| *n == base) {
        Some((_, style)) if base.len() == name.len() || name.as_bytes()[base.len()] == b' ' => {
            *style
        }
        Some((_, style)) => Style {
            dash: DASHES[1 + index % (DASHES.len() - 1)],
            marker: [Marker::Square, Marker::Triangle, Marker::Diamond][index % 3],
            ..*style
        },
        None => Style {
            color: color(index),
            dash: DASHES[index % DASHES.len()],
            marker: [
                Marker::Circle,
                Marker::Square,
                Marker::Triangle,
                Marker::Diamond,
            ][index % 4],
        },
    }
}

/// Escapes text for XML.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// An SVG document under construction.
#[derive(Debug, Clone)]
pub struct Svg {
    width: u32,
    height: u32,
    body: String,
}

/// Text alignment relative to the anchor point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// Text starts at the point.
    Start,
    /// Text is centred on the point.
    Middle,
    /// Text ends at the point.
    End,
}

impl Anchor {
    fn as_str(self) -> &'static str {
        match self {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        }
    }
}

impl Svg {
    /// An empty white canvas.
    pub fn new(width: u32, height: u32) -> Self {
        let mut s = Self {
            width,
            height,
            body: String::new(),
        };
        s.rect(
            0.0,
            0.0,
            f64::from(width),
            f64::from(height),
            "#ffffff",
            1.0,
        );
        s
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// A filled rectangle.
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, opacity: f64) {
        let _ = write!(
            self.body,
            "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"{fill}\"",
            w.max(0.0),
            h.max(0.0)
        );
        if opacity < 1.0 {
            let _ = write!(self.body, " fill-opacity=\"{opacity:.2}\"");
        }
        self.body.push_str("/>\n");
    }

    /// A straight line; `dash` like `"4 3"` or empty.
    #[allow(clippy::too_many_arguments)]
    pub fn line(
        &mut self,
        x1: f64,
        y1: f64,
        x2: f64,
        y2: f64,
        stroke: &str,
        width: f64,
        dash: &str,
    ) {
        let _ = write!(
            self.body,
            "<line x1=\"{x1:.2}\" y1=\"{y1:.2}\" x2=\"{x2:.2}\" y2=\"{y2:.2}\""
        );
        self.end_stroked(stroke, width, dash);
    }

    /// Closes an element with its stroke: colour, width and dash pattern (none if empty).
    fn end_stroked(&mut self, stroke: &str, width: f64, dash: &str) {
        let _ = write!(
            self.body,
            " stroke=\"{stroke}\" stroke-width=\"{width:.2}\""
        );
        if !dash.is_empty() {
            let _ = write!(self.body, " stroke-dasharray=\"{dash}\"");
        }
        self.body.push_str("/>\n");
    }

    /// A polyline through `points`.
    pub fn polyline(&mut self, points: &[(f64, f64)], stroke: &str, width: f64) {
        self.polyline_dashed(points, stroke, width, "");
    }

    /// A marker of `shape` at a point: filled with `color`, or white inside when `hollow`.
    pub fn marker(&mut self, x: f64, y: f64, shape: Marker, color: &str, hollow: bool) {
        let r = if hollow { 3.5 } else { 3.0 };
        let (fill, stroke) = if hollow {
            ("#ffffff", color)
        } else {
            (color, color)
        };
        let points: Vec<(f64, f64)> = match shape {
            Marker::Circle => {
                let _ = writeln!(
                    self.body,
                    "<circle cx=\"{x:.2}\" cy=\"{y:.2}\" r=\"{r:.2}\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"1.50\"/>"
                );
                return;
            }
            Marker::Square => vec![
                (x - r, y - r),
                (x + r, y - r),
                (x + r, y + r),
                (x - r, y + r),
            ],
            Marker::Triangle => vec![
                (x, y - r * 1.2),
                (x + r * 1.1, y + r * 0.8),
                (x - r * 1.1, y + r * 0.8),
            ],
            Marker::Diamond => vec![(x, y - r * 1.3), (x + r, y), (x, y + r * 1.3), (x - r, y)],
        };
        let pts: Vec<String> = points
            .iter()
            .map(|(px, py)| format!("{px:.2},{py:.2}"))
            .collect();
        let _ = writeln!(
            self.body,
            "<polygon points=\"{}\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"1.50\"/>",
            pts.join(" ")
        );
    }

    /// A polyline with a dash pattern (empty: solid).
    pub fn polyline_dashed(&mut self, points: &[(f64, f64)], stroke: &str, width: f64, dash: &str) {
        if points.is_empty() {
            return;
        }
        self.body
            .push_str("<polyline fill=\"none\" stroke-linejoin=\"round\" points=\"");
        self.push_points(points);
        self.body.push('"');
        self.end_stroked(stroke, width, dash);
    }

    /// Writes `x,y` pairs separated by spaces (an SVG `points` attribute's value).
    fn push_points(&mut self, points: &[(f64, f64)]) {
        for (i, (x, y)) in points.iter().enumerate() {
            if i > 0 {
                self.body.push(' ');
            }
            let _ = write!(self.body, "{x:.2},{y:.2}");
        }
    }

    /// A filled polygon (no stroke), e.g. a band between two lines.
    pub fn polygon(&mut self, points: &[(f64, f64)], fill: &str, opacity: f64) {
        if points.len() < 3 {
            return;
        }
        self.body.push_str("<polygon points=\"");
        self.push_points(points);
        let _ = writeln!(
            self.body,
            "\" fill=\"{fill}\" fill-opacity=\"{opacity:.2}\"/>"
        );
    }

    /// A filled circle.
    pub fn circle(&mut self, x: f64, y: f64, r: f64, fill: &str) {
        let _ = writeln!(
            self.body,
            "<circle cx=\"{x:.2}\" cy=\"{y:.2}\" r=\"{r:.2}\" fill=\"{fill}\"/>"
        );
    }

    /// Text at a point; `rotate` in degrees (e.g. -90 for a vertical axis label).
    #[allow(clippy::too_many_arguments)]
    pub fn text(
        &mut self,
        x: f64,
        y: f64,
        s: &str,
        size: f64,
        anchor: Anchor,
        rotate: f64,
        bold: bool,
    ) {
        let _ = write!(
            self.body,
            "<text x=\"{x:.2}\" y=\"{y:.2}\" font-size=\"{size:.1}\" text-anchor=\"{}\" fill=\"#222222\"",
            anchor.as_str()
        );
        if bold {
            self.body.push_str(" font-weight=\"bold\"");
        }
        if rotate != 0.0 {
            let _ = write!(
                self.body,
                " transform=\"rotate({rotate:.1} {x:.2} {y:.2})\""
            );
        }
        let _ = writeln!(self.body, ">{}</text>", escape(s));
    }

    /// The SVG document.
    pub fn finish(&self) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"{FONT_FAMILY}\">\n{}</svg>\n",
            self.body,
            w = self.width,
            h = self.height
        )
    }

    /// The document without the XML declaration, for inlining into HTML.
    pub fn inline(&self) -> String {
        let doc = self.finish();
        doc.split_once('\n')
            .map_or(doc.clone(), |(_, rest)| rest.to_string())
    }
}

/// Renders an SVG document to PNG bytes at its own size, with the embedded font.
#[cfg(feature = "png")]
pub fn render_png(svg: &str) -> Result<Vec<u8>, String> {
    static OPTIONS: OnceLock<resvg::usvg::Options<'static>> = OnceLock::new();
    let opt = OPTIONS.get_or_init(|| {
        let mut o = resvg::usvg::Options {
            font_family: "DejaVu Sans".to_string(),
            ..Default::default()
        };
        let db = o.fontdb_mut();
        db.load_font_data(FONT.to_vec());
        db.set_sans_serif_family("DejaVu Sans");
        o
    });
    let tree = resvg::usvg::Tree::from_str(svg, opt).map_err(|e| format!("SVG: {e}"))?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| "empty image".to_string())?;
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().map_err(|e| format!("PNG: {e}"))
}

/// An axis over `[lo, hi]`: linear, or logarithmic for doubling grids; ticks at round
/// values (integers only, for integer data), or at the data's own values on a log axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Lower end.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
    /// Logarithmic (the data are positive and grow by a constant factor of 2 or more).
    pub log: bool,
    /// Ticks only at integers (the data are integers: requests, tokens, evictions).
    pub integer: bool,
    /// Ticks at these values instead of round ones (a log axis's data values).
    pub marks: Vec<f64>,
}

impl Axis {
    /// A linear axis covering `values`, starting at 0 when `from_zero`, padded to nice
    /// ticks; integer ticks when every value is an integer.
    pub fn covering(values: impl IntoIterator<Item = f64>, from_zero: bool) -> Self {
        let values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        let integer = !values.is_empty() && values.iter().all(|v| v.fract() == 0.0);
        let (mut lo, mut hi) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        if !lo.is_finite() {
            return Self::linear(0.0, 1.0, false);
        }
        if from_zero {
            lo = lo.min(0.0);
        }
        if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
            let pad = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
            hi += pad;
            if !from_zero {
                lo -= pad;
            }
        }
        let step = Self::step(hi - lo, integer);
        Self::linear(
            if from_zero && lo >= 0.0 {
                lo
            } else {
                (lo / step).floor() * step
            },
            (hi / step).ceil() * step,
            integer,
        )
    }

    /// An axis for a chart's x values (grid parameters): logarithmic with ticks at the
    /// values when they grow by a constant factor of 2 or more (a doubling grid), else
    /// linear over the data's own range (a small margin, not padded out to round ticks),
    /// with integer ticks for integer data.
    pub fn for_grid(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        let geometric = v.len() >= 3 && v[0] > 0.0 && {
            let r = v[1] / v[0];
            r >= 2.0 - 1e-9 && v.windows(2).all(|p| ((p[1] / p[0]) / r - 1.0).abs() < 1e-6)
        };
        if geometric {
            let (lo, hi) = (v[0], v[v.len() - 1]);
            // A twentieth of the span on each side, in log space.
            let pad = (hi / lo).powf(0.05);
            return Self {
                lo: lo / pad,
                hi: hi * pad,
                log: true,
                integer: v.iter().all(|x| x.fract() == 0.0),
                marks: v,
            };
        }
        let Some((&lo, &hi)) = v.first().zip(v.last()) else {
            return Self::linear(0.0, 1.0, false);
        };
        if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
            return Self::covering([lo], false);
        }
        let pad = (hi - lo) * 0.04;
        Self::linear(lo - pad, hi + pad, v.iter().all(|x| x.fract() == 0.0))
    }

    /// A linear axis over exactly `[lo, hi]` (rows, bars: positions, not data).
    pub fn span(lo: f64, hi: f64) -> Self {
        Self::linear(lo, hi, false)
    }

    fn linear(lo: f64, hi: f64, integer: bool) -> Self {
        Self {
            lo,
            hi,
            log: false,
            integer,
            marks: Vec::new(),
        }
    }

    /// The tick step for a span: about five ticks, at least 1 for integer data.
    fn step(span: f64, integer: bool) -> f64 {
        let step = nice_step(span / 5.0);
        if integer { step.max(1.0).round() } else { step }
    }

    /// Where `v` falls on the axis, from 0 (`lo`) to 1 (`hi`).
    pub fn fraction(&self, v: f64) -> f64 {
        if self.log {
            (v.max(f64::MIN_POSITIVE).ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    /// The tick values inside the axis: the marks where given, else about five round ones.
    pub fn ticks(&self) -> Vec<f64> {
        if !self.marks.is_empty() {
            // At most 12 labels: every k-th mark.
            let k = self.marks.len().div_ceil(12);
            return self.marks.iter().step_by(k).copied().collect();
        }
        let step = Self::step(self.hi - self.lo, self.integer);
        let first = (self.lo / step - 1e-9).ceil();
        let last = (self.hi / step + 1e-9).floor();
        (first as i64..=last as i64)
            .map(|k| k as f64 * step)
            .collect()
    }
}

fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// A tick label: up to 4 significant digits, no trailing zeros.
pub fn tick_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:.1e}");
    }
    let decimals = (3 - a.log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A plot area: a pixel box and the two axes mapped onto it.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Left edge (px).
    pub x0: f64,
    /// Top edge (px).
    pub y0: f64,
    /// Right edge (px).
    pub x1: f64,
    /// Bottom edge (px).
    pub y1: f64,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
}

impl Frame {
    /// Pixel x of a data value.
    pub fn px(&self, v: f64) -> f64 {
        self.x0 + self.x.fraction(v) * (self.x1 - self.x0)
    }

    /// Pixel y of a data value.
    pub fn py(&self, v: f64) -> f64 {
        self.y1 - self.y.fraction(v) * (self.y1 - self.y0)
    }

    /// The plot area's background.
    pub fn draw_background(&self, svg: &mut Svg) {
        svg.rect(
            self.x0,
            self.y0,
            self.x1 - self.x0,
            self.y1 - self.y0,
            "#fafafa",
            1.0,
        );
    }

    /// Horizontal grid lines with their labels at the y ticks.
    pub fn draw_y_grid(&self, svg: &mut Svg) {
        for t in self.y.ticks() {
            let y = self.py(t);
            svg.line(self.x0, y, self.x1, y, "#dddddd", 1.0, "");
            svg.text(
                self.x0 - 6.0,
                y + 4.0,
                &tick_label(t),
                11.0,
                Anchor::End,
                0.0,
                false,
            );
        }
    }

    /// Vertical grid lines, tick marks and labels at the x ticks.
    pub fn draw_x_grid(&self, svg: &mut Svg) {
        for t in self.x.ticks() {
            let x = self.px(t);
            svg.line(x, self.y0, x, self.y1, "#eeeeee", 1.0, "");
            svg.line(x, self.y1, x, self.y1 + 4.0, "#444444", 1.0, "");
            svg.text(
                x,
                self.y1 + 17.0,
                &tick_label(t),
                11.0,
                Anchor::Middle,
                0.0,
                false,
            );
        }
    }

    /// Draws the title, grid, ticks and axis labels.
    pub fn draw_axes(&self, svg: &mut Svg, title: &str, x_label: &str, y_label: &str) {
        self.draw_background(svg);
        self.draw_y_grid(svg);
        self.draw_x_grid(svg);
        svg.line(self.x0, self.y1, self.x1, self.y1, "#444444", 1.0, "");
        svg.line(self.x0, self.y0, self.x0, self.y1, "#444444", 1.0, "");
        svg.text(
            (self.x0 + self.x1) / 2.0,
            self.y0 - 12.0,
            title,
            14.0,
            Anchor::Middle,
            0.0,
            true,
        );
        svg.text(
            (self.x0 + self.x1) / 2.0,
            self.y1 + 36.0,
            x_label,
            12.0,
            Anchor::Middle,
            0.0,
            false,
        );
        let yl = (self.y0 + self.y1) / 2.0;
        svg.text(
            self.x0 - 48.0,
            yl,
            y_label,
            12.0,
            Anchor::Middle,
            -90.0,
            false,
        );
    }

    /// Clips a point to the frame (for lines that run off the axes).
    pub fn clamp(&self, (x, y): (f64, f64)) -> (f64, f64) {
        (x.clamp(self.x0, self.x1), y.clamp(self.y0, self.y1))
    }
}

/// The width a legend of these names takes (px).
pub fn legend_width<'a>(names: impl IntoIterator<Item = &'a str>) -> f64 {
    let longest = names
        .into_iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0) as f64;
    if longest == 0.0 {
        0.0
    } else {
        46.0 + longest * 6.6
    }
}

/// Draws the legend of `(name, style)` to the right of the frame, top aligned: each entry's
/// line in its dash with its marker (the chart leaves [`legend_width`] for it).
pub fn legend(svg: &mut Svg, frame: &Frame, items: &[(String, Style)]) {
    if items.is_empty() {
        return;
    }
    let x = frame.x1 + 10.0;
    let y = frame.y0;
    for (i, (name, st)) in items.iter().enumerate() {
        let yy = y + 14.0 + i as f64 * 16.0;
        svg.line(
            x + 2.0,
            yy - 4.0,
            x + 30.0,
            yy - 4.0,
            st.color,
            2.0,
            st.dash,
        );
        svg.marker(x + 16.0, yy - 4.0, st.marker, st.color, false);
        svg.text(x + 36.0, yy, name, 11.0, Anchor::Start, 0.0, false);
    }
}

/// One named line of a line chart.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Legend name.
    pub name: String,
    /// Data points in order.
    pub points: Vec<(f64, f64)>,
    /// Draw as a step function (value holds until the next point).
    pub step: bool,
    /// Draw markers at the points.
    pub markers: bool,
    /// Per point (empty: none): whether the value is not proven (a hollow marker).
    pub unproven: Vec<bool>,
    /// Per point (empty: none): a vertical bar between two values (e.g. from a schedule's
    /// value to the proven bound).
    pub bars: Vec<Option<(f64, f64)>>,
    /// x values where a run of this series failed: a cross on the x axis.
    pub failed: Vec<f64>,
    /// Per point (empty: none): the least and greatest of the values averaged into it
    /// (seed replicates, other parameters), drawn as a translucent band.
    pub spread: Vec<Option<(f64, f64)>>,
}

/// A labelled horizontal reference line.
#[derive(Debug, Clone)]
pub struct RefLine {
    /// Data value.
    pub y: f64,
    /// Label.
    pub label: String,
}

/// Draws a line chart into the box `(x0, y0, x1, y1)` of `svg`, its legend beside it.
#[allow(clippy::too_many_arguments)]
pub fn line_chart(
    svg: &mut Svg,
    bounds: (f64, f64, f64, f64),
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    refs: &[RefLine],
    y_from_zero: bool,
) {
    line_chart_panel(
        svg,
        bounds,
        title,
        x_label,
        y_label,
        series,
        refs,
        y_from_zero,
        true,
    );
}

/// [`line_chart`], with or without the legend (panels side by side share the last one's).
#[allow(clippy::too_many_arguments)]
pub fn line_chart_panel(
    svg: &mut Svg,
    bounds: (f64, f64, f64, f64),
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    refs: &[RefLine],
    y_from_zero: bool,
    with_legend: bool,
) {
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0).chain(s.failed.iter().copied()));
    let ys = series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|p| p.1)
                .chain(s.bars.iter().flatten().flat_map(|&(lo, hi)| [lo, hi]))
        })
        .chain(
            series
                .iter()
                .flat_map(|s| s.spread.iter().flatten().flat_map(|&(lo, hi)| [lo, hi])),
        )
        .chain(refs.iter().map(|r| r.y));
    // The legend goes to the right of the plot, never over the data.
    let legend_w = if with_legend {
        legend_width(series.iter().map(|s| s.name.as_str()))
    } else {
        0.0
    };
    let frame = Frame {
        x0: bounds.0 + 64.0,
        y0: bounds.1 + 30.0,
        x1: bounds.2 - 16.0 - legend_w,
        y1: bounds.3 - 46.0,
        x: Axis::for_grid(xs),
        y: Axis::covering(ys, y_from_zero),
    };
    frame.draw_axes(svg, title, x_label, y_label);
    for r in refs {
        let y = frame.py(r.y);
        svg.line(frame.x0, y, frame.x1, y, "#aa0000", 1.5, "6 4");
        svg.text(
            frame.x0 + 4.0,
            y - 4.0,
            &r.label,
            11.0,
            Anchor::Start,
            0.0,
            false,
        );
    }
    let mut items = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let style = series_style(&s.name, i);
        draw_spread(svg, &frame, s, style.color);
        draw_series(svg, &frame, s, &style);
        items.push((s.name.clone(), style));
    }
    // Side by side panels share one legend and one line of notes (on the last panel),
    // which narrow panels would otherwise overlap.
    if with_legend {
        legend(svg, &frame, &items);
        chart_notes(svg, &frame, series);
    }
}

/// The band between the least and greatest values behind each point (boxes up to the next
/// point for a step series).
fn draw_spread(svg: &mut Svg, frame: &Frame, s: &Series, c: &str) {
    let band: Vec<(f64, f64, f64)> = s
        .points
        .iter()
        .zip(&s.spread)
        .filter_map(|(&(x, _), sp)| sp.map(|(lo, hi)| (x, lo, hi)))
        .collect();
    if s.step {
        // Steps hold until the next point: one box per point, up to the next.
        for (k, &(x, _)) in s.points.iter().enumerate() {
            let Some(Some((lo, hi))) = s.spread.get(k) else {
                continue;
            };
            let next = match (s.points.get(k + 1), k.checked_sub(1)) {
                (Some(n), _) => n.0,
                (None, Some(p)) => x + (x - s.points[p].0),
                (None, None) => x,
            };
            let (x0, x1) = (frame.px(x), frame.px(next));
            let (top, bottom) = (frame.py(*hi), frame.py(*lo));
            svg.rect(x0, top, x1 - x0, bottom - top, c, 0.12);
        }
    } else if band.len() >= 2 && band.iter().any(|&(_, lo, hi)| hi > lo) {
        let mut outline: Vec<(f64, f64)> = band
            .iter()
            .map(|&(x, _, hi)| (frame.px(x), frame.py(hi)))
            .collect();
        outline.extend(
            band.iter()
                .rev()
                .map(|&(x, lo, _)| (frame.px(x), frame.py(lo))),
        );
        svg.polygon(&outline, c, 0.12);
    }
}

/// A series' line, bars to its bounds, markers (hollow where unproven) and failed runs.
fn draw_series(svg: &mut Svg, frame: &Frame, s: &Series, style: &Style) {
    let c = style.color;
    let mut pts = Vec::with_capacity(s.points.len() * 2);
    for (k, &(x, y)) in s.points.iter().enumerate() {
        if s.step && k > 0 {
            pts.push((frame.px(x), frame.py(s.points[k - 1].1)));
        }
        pts.push((frame.px(x), frame.py(y)));
    }
    svg.polyline_dashed(&pts, c, 1.8, style.dash);
    for (k, &(x, _)) in s.points.iter().enumerate() {
        if let Some(Some((lo, hi))) = s.bars.get(k) {
            let px = frame.px(x);
            svg.line(px, frame.py(*lo), px, frame.py(*hi), c, 1.2, "");
            svg.line(px - 3.0, frame.py(*lo), px + 3.0, frame.py(*lo), c, 1.2, "");
        }
    }
    if s.markers {
        for (k, &(x, y)) in s.points.iter().enumerate() {
            let hollow = s.unproven.get(k).copied().unwrap_or(false);
            svg.marker(frame.px(x), frame.py(y), style.marker, c, hollow);
        }
    }
    for &x in &s.failed {
        let (px, py) = (frame.px(x), frame.y1 - 6.0);
        svg.line(px - 4.0, py - 4.0, px + 4.0, py + 4.0, c, 2.0, "");
        svg.line(px - 4.0, py + 4.0, px + 4.0, py - 4.0, c, 2.0, "");
    }
}

/// What bands, hollow markers and crosses mean, above the plot, where any is drawn.
fn chart_notes(svg: &mut Svg, frame: &Frame, series: &[Series]) {
    let mut notes = Vec::new();
    if series
        .iter()
        .any(|s| s.spread.iter().flatten().any(|&(lo, hi)| hi > lo))
    {
        notes.push("band: least to greatest of the values averaged into each point");
    }
    if series.iter().any(|s| s.unproven.iter().any(|&u| u)) {
        notes.push("hollow: not proven optimal (bar: to the proven bound)");
    }
    if series.iter().any(|s| !s.failed.is_empty()) {
        notes.push("x on the axis: a run failed");
    }
    if !notes.is_empty() {
        svg.text(
            frame.x0,
            frame.y0 - 1.0,
            &notes.join("; "),
            10.0,
            Anchor::Start,
            0.0,
            false,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_cover_the_data_with_round_ticks() {
        let a = Axis::covering([0.3, 7.2], true);
        assert_eq!(a.lo, 0.0);
        assert!(a.hi >= 7.2 && a.hi <= 10.0);
        let t = a.ticks();
        assert_eq!(t.first(), Some(&0.0));
        assert!(t.len() >= 4 && t.len() <= 11, "{t:?}");
        assert!(t.iter().all(|v| (v * 2.0).fract() == 0.0), "{t:?}");
        let flat = Axis::covering([5.0, 5.0], false);
        assert!(flat.lo < 5.0 && flat.hi > 5.0);
    }

    #[test]
    fn doubling_grids_get_a_log_axis_with_ticks_at_the_data() {
        let a = Axis::for_grid([16.0, 4.0, 8.0, 64.0, 32.0, 8.0]);
        assert!(a.log && a.integer);
        assert_eq!(a.ticks(), vec![4.0, 8.0, 16.0, 32.0, 64.0]);
        // Each doubling takes the same width, and the data sit inside the axis.
        let step = a.fraction(8.0) - a.fraction(4.0);
        assert!((a.fraction(64.0) - a.fraction(32.0) - step).abs() < 1e-12);
        assert!(a.fraction(4.0) > 0.0 && a.fraction(64.0) < 1.0);
    }

    #[test]
    fn integer_data_get_integer_ticks_and_axes_stop_near_the_data() {
        let a = Axis::for_grid([1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!(!a.log && a.integer);
        assert!(a.lo > 0.5 && a.hi < 5.5, "{a:?}");
        let t = a.ticks();
        assert!(!t.is_empty() && t.iter().all(|v| v.fract() == 0.0), "{t:?}");
        // Evictions 0..2 on a y axis: no 0.5.
        let y = Axis::covering([0.0, 1.0, 2.0], true);
        assert!(
            y.ticks().iter().all(|v| v.fract() == 0.0),
            "{:?}",
            y.ticks()
        );
        // Fractional data keep fractional ticks.
        let f = Axis::covering([0.0, 0.3], true);
        assert!(f.ticks().iter().any(|v| v.fract() != 0.0));
    }

    #[test]
    fn spread_bands_and_the_legend_stay_off_the_data() {
        let series = vec![Series {
            name: "vllm".into(),
            points: vec![(1.0, 2.0), (2.0, 3.0), (3.0, 4.0)],
            markers: true,
            spread: vec![Some((1.5, 2.5)), Some((2.0, 4.0)), Some((4.0, 4.0))],
            ..Default::default()
        }];
        let mut svg = Svg::new(960, 420);
        line_chart(
            &mut svg,
            (0.0, 0.0, 960.0, 420.0),
            "t",
            "x",
            "y",
            &series,
            &[],
            true,
        );
        let doc = svg.finish();
        assert!(doc.contains("<polygon"), "the band is drawn");
        assert!(doc.contains("band: least to greatest"));
        // The legend's label sits right of the plot area (x1 = 960 - 16 - legend width).
        let x1 = 960.0 - 16.0 - legend_width(["vllm"]);
        let label = doc
            .split("<text")
            .find(|t| t.contains(">vllm<"))
            .expect("legend label");
        let x: f64 = label
            .split("x=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| v.parse().ok())
            .expect("label x");
        assert!(x > x1, "legend at {x}, plot ends at {x1}");
    }

    #[test]
    fn a_scheduler_has_one_style_everywhere_and_no_two_look_alike() {
        // The same whatever its place among the series or the objective in its name.
        assert_eq!(series_style("vllm", 0), series_style("vllm", 5));
        assert_eq!(series_style("vllm", 0), series_style("vllm (makespan)", 2));
        assert_eq!(series_style("vllm", 1).color, "#D55E00");
        let styles: Vec<Style> = SCHEDULER_STYLES.iter().map(|(_, s)| *s).collect();
        for (i, a) in styles.iter().enumerate() {
            for b in &styles[i + 1..] {
                assert_ne!(a.color, b.color);
                assert!(a.dash != b.dash || a.marker != b.marker, "{a:?} {b:?}");
            }
        }
        // A constrained optimum: the optimum's colour, a line of its own.
        let constrained = series_style("optimal+no-evict", 1);
        assert_eq!(constrained.color, series_style("optimal", 0).color);
        assert_ne!(constrained.dash, series_style("optimal", 0).dash);
        // "vllm-v1" is not "vllm" with a suffix.
        assert_eq!(series_style("vllm-v1", 0).color, "#0072B2");
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(2000.0), "2000");
        assert_eq!(tick_label(1.5e7), "1.5e7");
        assert_eq!(tick_label(0.0), "0");
    }

    #[test]
    #[cfg(feature = "png")]
    fn text_is_escaped_and_png_renders_at_size() {
        let mut s = Svg::new(120, 80);
        s.text(10.0, 20.0, "a<b & \"c\"", 12.0, Anchor::Start, 0.0, false);
        let doc = s.finish();
        assert!(doc.contains("a&lt;b &amp; &quot;c&quot;"));
        let png = render_png(&doc).unwrap();
        let img = resvg::tiny_skia::Pixmap::decode_png(&png).unwrap();
        assert_eq!((img.width(), img.height()), (120, 80));
        // The text was drawn with the embedded font: some pixels are not white.
        assert!(img.pixels().iter().any(|p| p.red() < 200));
    }
}
