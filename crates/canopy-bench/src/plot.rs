//! SVG charts (plotters, SVG backend only): grouped bars, one group per
//! configuration (an X, a workload) and one bar per variant, in one or more
//! panels side by side.  A dashed line marks the reference ratio 1.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One group of bars.
#[derive(Debug, Clone)]
pub struct Group {
    /// Label under the group.
    pub label: String,
    /// One value per series; `None` draws no bar (a failed or skipped run).
    pub values: Vec<Option<f64>>,
}

/// One panel (sub-chart).
#[derive(Debug, Clone)]
pub struct Panel {
    /// Panel caption.
    pub title: String,
    /// Groups from left to right.
    pub groups: Vec<Group>,
}

/// A chart of grouped bars.
#[derive(Debug, Clone)]
pub struct BarChart {
    /// Overall caption.
    pub title: String,
    /// Y axis description.
    pub y_label: String,
    /// Series (bar) names, in the order of `Group::values`.
    pub series: Vec<String>,
    /// Panels from left to right.
    pub panels: Vec<Panel>,
    /// Draw a dashed horizontal line at this value.
    pub reference: Option<f64>,
}

const COLORS: &[RGBColor] = &[
    RGBColor(0x55, 0x55, 0x55), // glibc: grey
    RGBColor(0x1b, 0x9e, 0x77), // canopy: green
    RGBColor(0x1f, 0x78, 0xb4), // jemalloc
    RGBColor(0xd9, 0x5f, 0x02), // mimalloc
    RGBColor(0x75, 0x70, 0xb3), // tcmalloc
    RGBColor(0x66, 0xc2, 0xa5), // canopy-rich: light green
    RGBColor(0xbb, 0xbb, 0xbb), // bound: light grey
    RGBColor(0xe6, 0xab, 0x02), // rs-system
    RGBColor(0x01, 0x66, 0x5e), // rs-canopy-global: dark green
    RGBColor(0x8c, 0xd9, 0xb0), // rs-canopy-rich
    RGBColor(0xdd, 0xdd, 0xdd), // rs-bound
    RGBColor(0xa1, 0xd9, 0x9b), // canopy-unchecked: pale green
    RGBColor(0xc7, 0xe9, 0xc0), // rs-canopy-unchecked
    RGBColor(0x00, 0x44, 0x1b), // rs-canopy-global-unchecked: darkest green
    RGBColor(0xe7, 0x29, 0x8a),
    RGBColor(0xa6, 0x76, 0x1d),
];

/// The colour of series `i` called `name`: the contenders and Canopy's
/// variants keep the same colour in every chart; others take the palette.
pub fn color(name: &str, i: usize) -> RGBColor {
    let fixed = [
        "glibc",
        "canopy",
        "jemalloc",
        "mimalloc",
        "tcmalloc",
        "canopy-rich",
        "bound",
        "rs-system",
        "rs-canopy-global",
        "rs-canopy-rich",
        "rs-bound",
        "canopy-unchecked",
        "rs-canopy-unchecked",
        "rs-canopy-global-unchecked",
    ];
    match fixed.iter().position(|f| *f == name) {
        Some(k) => COLORS[k % COLORS.len()],
        None => COLORS[(fixed.len() + i) % COLORS.len()],
    }
}

/// Width of one group on the x axis.
const UNIT: i32 = 1000;

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart failed: {e:?}")
}

/// Render the chart as an SVG document.
pub fn render(chart: &BarChart) -> Result<String> {
    let panels = chart.panels.len().max(1);
    let widest = chart
        .panels
        .iter()
        .map(|p| p.groups.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let panel_width = (110 * widest as u32 * chart.series.len().max(1) as u32 / 4).clamp(360, 900);
    let width =
        (panel_width * panels as u32 + 40).max(40 + 10 * chart.title.chars().count() as u32);
    // The legend goes in rows above the panels, never over the bars.
    let item_width = |name: &str| 30 + 7 * name.chars().count() as i32;
    let mut legend_rows = 1u32;
    let mut x = 0i32;
    for name in &chart.series {
        if x > 0 && x + item_width(name) > width as i32 - 80 {
            legend_rows += 1;
            x = 0;
        }
        x += item_width(name);
    }
    let legend_height = 12 + 20 * legend_rows;
    let height = 470 + legend_height;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(&chart.title, ("sans-serif", 20)).map_err(err)?;
        let (legend, body) = root.split_vertically(legend_height);
        let (mut x, mut y) = (60i32, 6i32);
        for (si, name) in chart.series.iter().enumerate() {
            if x > 60 && x + item_width(name) > width as i32 - 20 {
                x = 60;
                y += 20;
            }
            let c = color(name, si);
            legend
                .draw(&Rectangle::new([(x, y + 2), (x + 12, y + 14)], c.filled()))
                .map_err(err)?;
            legend
                .draw(&Text::new(
                    name.as_str(),
                    (x + 17, y + 1),
                    ("sans-serif", 13).into_font(),
                ))
                .map_err(err)?;
            x += item_width(name);
        }
        let areas = body.split_evenly((1, panels));
        let y_max = chart
            .panels
            .iter()
            .flat_map(|p| &p.groups)
            .flat_map(|g| g.values.iter().flatten())
            .copied()
            .filter(|v| v.is_finite())
            .fold(chart.reference.unwrap_or(0.0), f64::max);
        let y_max = if y_max > 0.0 { y_max * 1.12 } else { 1.0 };
        for (panel, area) in chart.panels.iter().zip(areas.iter()) {
            // x is in thousandths of a group: group i spans [1000 i, 1000 (i + 1)).
            let n = panel.groups.len().max(1) as i32;
            let centers: Vec<i32> = (0..n).map(|i| i * UNIT + UNIT / 2).collect();
            let labels: Vec<String> = panel.groups.iter().map(|g| g.label.clone()).collect();
            let mut cc = ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(55)
                .build_cartesian_2d((0..n * UNIT).with_key_points(centers), 0.0..y_max)
                .map_err(err)?;
            let fmt_x = |x: &i32| {
                if x.rem_euclid(UNIT) == UNIT / 2 {
                    labels.get((x / UNIT) as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            };
            cc.configure_mesh()
                .disable_x_mesh()
                .light_line_style(WHITE)
                .x_label_formatter(&fmt_x)
                .y_desc(chart.y_label.as_str())
                .y_label_formatter(&|y| format!("{y:.2}"))
                .draw()
                .map_err(err)?;
            let k = chart.series.len().max(1) as i32;
            let w = (UNIT * 8 / 10) / k;
            for (si, name) in chart.series.iter().enumerate() {
                let c = color(name, si);
                let bars = panel.groups.iter().enumerate().filter_map(move |(gi, g)| {
                    let v = g.values.get(si).copied().flatten()?;
                    let x0 = gi as i32 * UNIT + UNIT / 10 + si as i32 * w;
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + w * 9 / 10, v)],
                        c.filled(),
                    ))
                });
                cc.draw_series(bars).map_err(err)?;
            }
            if let Some(r) = chart.reference {
                let style = ShapeStyle {
                    color: BLACK.mix(0.6),
                    filled: false,
                    stroke_width: 1,
                };
                let dash = UNIT / 20;
                let dashes = (0..n * 20).step_by(2).map(move |i| {
                    PathElement::new(vec![(i * dash, r), ((i + 1) * dash, r)], style)
                });
                cc.draw_series(dashes).map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_bars_labels_and_gaps() {
        let chart = BarChart {
            title: "SAC".into(),
            y_label: "time / glibc".into(),
            series: vec!["glibc".into(), "canopy".into()],
            panels: vec![
                Panel {
                    title: "1 thread".into(),
                    groups: vec![
                        Group {
                            label: "X=1000".into(),
                            values: vec![Some(1.0), Some(0.8)],
                        },
                        Group {
                            label: "X=25".into(),
                            values: vec![Some(1.0), None],
                        },
                    ],
                },
                Panel {
                    title: "2 threads".into(),
                    groups: vec![Group {
                        label: "X=25".into(),
                        values: vec![Some(1.0), Some(0.5)],
                    }],
                },
            ],
            reference: Some(1.0),
        };
        let svg = render(&chart).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("X=1000") && svg.contains("X=25"));
        assert!(svg.contains("canopy") && svg.contains("2 threads"));
        assert!(svg.contains("<rect"));
    }
}
