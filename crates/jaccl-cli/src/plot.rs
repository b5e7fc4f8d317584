//! SVG plots of quantities against message size, log-log, a line per series: `jaccl bench`'s
//! (out of place and in place) and `jaccl plan`'s (one per algorithm).

use std::fmt::Write as _;

/// Points of one series: (size in bytes, value).
pub(crate) type Points = Vec<(f64, f64)>;

/// One line: its name in the legend and its points.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Points,
}

/// One log-log panel: a quantity against message size.
pub(crate) struct Panel {
    pub(crate) label: &'static str,
    pub(crate) series: Vec<Series>,
}

/// Where a panel is drawn: its plot area in pixels.
struct Area {
    x: f64,
    y: f64,
    width: f64,
    height: f64,
}

/// Line colours and dashes, series by series (the first two: bench's out of place and in
/// place).
const STYLES: [(&str, &str); 6] = [
    ("#1f77b4", ""),
    ("#ff7f0e", "5,3"),
    ("#2ca02c", "2,2"),
    ("#d62728", "8,3,2,3"),
    ("#9467bd", ""),
    ("#8c564b", "5,3"),
];

fn style(i: usize) -> (&'static str, &'static str) {
    STYLES[i % STYLES.len()]
}

/// Panels side by side under `title`, with one legend for their series (named alike in every
/// panel).
pub(crate) fn svg(title: &str, panels: &[Panel]) -> String {
    let (w, h) = (1000.0, 460.0);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" text-anchor="middle" font-size="16">{}</text>
"#,
        w / 2.0,
        escape(title)
    );
    let width = w / panels.len().max(1) as f64;
    for (i, p) in panels.iter().enumerate() {
        let area = Area {
            x: 70.0 + i as f64 * width,
            y: 50.0,
            width: width - 100.0,
            height: h - 110.0,
        };
        panel(&mut svg, &area, p);
    }
    let names: Vec<&str> = panels
        .first()
        .map(|p| p.series.iter().map(|s| s.name.as_str()).collect())
        .unwrap_or_default();
    let step = 150.0;
    let _ = write!(
        svg,
        r#"<g transform="translate({},{})">"#,
        w / 2.0 - step * names.len() as f64 / 2.0,
        h - 16.0
    );
    for (i, name) in names.iter().enumerate() {
        let (color, dash) = style(i);
        let x = i as f64 * step;
        let _ = write!(
            svg,
            r#"<line x1="{x}" y1="0" x2="{}" y2="0" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="4">{}</text>"#,
            x + 24.0,
            x + 30.0,
            escape(name)
        );
    }
    svg.push_str("</g>\n</svg>\n");
    svg
}

/// Draws `p` with log axes (decades) into `area`.
fn panel(svg: &mut String, area: &Area, p: &Panel) {
    let Area {
        x: x0,
        y: y0,
        width: pw,
        height: ph,
    } = *area;
    let drawn = |q: &&(f64, f64)| q.0 > 0.0 && q.1 > 0.0 && q.1.is_finite();
    let all: Vec<&(f64, f64)> = p
        .series
        .iter()
        .flat_map(|s| &s.points)
        .filter(drawn)
        .collect();
    let decades = |f: &dyn Fn(&(f64, f64)) -> f64| {
        let lo = all.iter().map(|q| f(q)).fold(f64::INFINITY, f64::min);
        let hi = all.iter().map(|q| f(q)).fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() && hi.is_finite() {
            let lo = lo.log10().floor();
            (lo, hi.log10().ceil().max(lo + 1.0))
        } else {
            (0.0, 1.0)
        }
    };
    let (xl, xh) = decades(&|q| q.0);
    let (yl, yh) = decades(&|q| q.1);
    let px = |x: f64| x0 + (x.log10() - xl) / (xh - xl) * pw;
    let py = |y: f64| y0 + ph - (y.log10() - yl) / (yh - yl) * ph;
    let _ = writeln!(
        svg,
        r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    for e in xl as i32..=xh as i32 {
        let x = px(10f64.powi(e));
        let _ = writeln!(
            svg,
            r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            y0 + ph,
            y0 + ph + 16.0,
            human_decimal(10f64.powi(e), "B")
        );
    }
    for e in yl as i32..=yh as i32 {
        let y = py(10f64.powi(e));
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            x0 + pw,
            x0 - 6.0,
            y + 4.0,
            human_decimal(10f64.powi(e), "")
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">message size</text><text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        x0 + pw / 2.0,
        y0 + ph + 34.0,
        x0 - 52.0,
        y0 + ph / 2.0,
        escape(p.label)
    );
    for (i, series) in p.series.iter().enumerate() {
        let points: Vec<&(f64, f64)> = series.points.iter().filter(drawn).collect();
        if points.is_empty() {
            continue;
        }
        let (color, dash) = style(i);
        let path: Vec<String> = points
            .iter()
            .map(|&&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
            path.join(" ")
        );
        for &&(x, y) in &points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                px(x),
                py(y)
            );
        }
    }
}

/// `1`, `10`, `1k`, `1M`, `0.01` with an optional unit.
fn human_decimal(v: f64, unit: &str) -> String {
    let (v, prefix) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let sep = if unit.is_empty() && prefix.is_empty() {
        ""
    } else {
        " "
    };
    format!(
        "{}{sep}{prefix}{unit}",
        format!("{v}").trim_end_matches(".0")
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_labels() {
        assert_eq!(human_decimal(1e6, "B"), "1 MB");
        assert_eq!(human_decimal(0.01, ""), "0.01");
    }

    #[test]
    fn every_series_is_drawn_and_named() {
        let series = |name: &str, k: f64| Series {
            name: name.into(),
            points: vec![(8.0, k), (1024.0, 10.0 * k), (0.0, 1.0)],
        };
        let svg = svg(
            "a <title>",
            &[Panel {
                label: "time",
                series: vec![series("ring", 1.0), series("Bruck", 2.0)],
            }],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">ring<") && svg.contains(">Bruck<"));
        assert!(svg.contains("a &lt;title&gt;"));
    }
}
