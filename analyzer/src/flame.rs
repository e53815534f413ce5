//! Flame graphs of steps by call stack, drawn by inferno.

use std::io::Write;

use crate::error::{AnalyzeError, Result};

/// Folded stacks (`a;b;c count`), the format flame graph tools read.
pub fn folded_lines(folded: &[(Vec<String>, u64)]) -> Vec<String> {
    folded
        .iter()
        .filter(|(path, _)| !path.is_empty())
        .map(|(path, count)| {
            let names: Vec<String> = path.iter().map(|n| n.replace([';', ' '], "_")).collect();
            format!("{} {count}", names.join(";"))
        })
        .collect()
}

/// Writes an SVG flame graph, widths in steps.
pub fn write_svg(folded: &[(Vec<String>, u64)], title: &str, out: &mut impl Write) -> Result<()> {
    write_svg_of(folded, title, "steps", out)
}

/// Writes an SVG flame graph, widths in `unit` (steps, samples).
pub fn write_svg_of(
    folded: &[(Vec<String>, u64)],
    title: &str,
    unit: &str,
    out: &mut impl Write,
) -> Result<()> {
    write_svg_with(folded, title, unit, None, out)
}

/// [`write_svg_of`], `width` pixels wide where given (else as wide as
/// its viewer: an SVG file opened on its own).
pub fn write_svg_with(
    folded: &[(Vec<String>, u64)],
    title: &str,
    unit: &str,
    width: Option<usize>,
    out: &mut impl Write,
) -> Result<()> {
    let lines = folded_lines(folded);
    let mut options = inferno::flamegraph::Options::default();
    options.image_width = width;
    options.title = title.to_string();
    options.count_name = unit.to_string();
    options.hash = true;
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(|s| s.as_str()), out)
        .map_err(AnalyzeError::Flame)
}
