//! Horizontal bar charts as inline SVG: drawn when the page is made, so
//! they need no script and no network, and print as they show.

use std::fmt::Write as _;

/// One bar: a label, its value, and where a click on it leads.
pub struct Bar {
    pub label: String,
    pub value: u64,
    pub link: Option<String>,
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

const ROW: usize = 22;
const LABEL: usize = 220;
const WIDTH: usize = 720;

/// A bar chart of `bars` (largest first, as given), each bar's share of
/// `total` written beside it.
pub fn bar_chart(title: &str, bars: &[Bar], total: u64) -> String {
    let max = bars.iter().map(|b| b.value).max().unwrap_or(0).max(1);
    let height = ROW * bars.len() + 8;
    let room = (WIDTH - LABEL - 150) as f64;
    let mut svg = format!(
        "<svg class=\"chart\" role=\"img\" aria-label=\"{}\" viewBox=\"0 0 {WIDTH} {height}\" \
         width=\"{WIDTH}\" height=\"{height}\" xmlns=\"http://www.w3.org/2000/svg\">",
        esc(title)
    );
    for (i, b) in bars.iter().enumerate() {
        let y = 4 + i * ROW;
        let w = (b.value as f64 / max as f64 * room).max(1.0);
        let share = 100.0 * b.value as f64 / total.max(1) as f64;
        let label = if b.label.chars().count() > 30 {
            format!("{}…", b.label.chars().take(29).collect::<String>())
        } else {
            b.label.clone()
        };
        let bar = format!(
            "<title>{} — {} steps ({share:.1}%)</title>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{LABEL}\" y=\"{y}\" width=\"{w:.1}\" height=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{}\" class=\"value\">{} ({share:.1}%)</text>",
            esc(&b.label),
            thousands(b.value),
            LABEL - 6,
            y + 15,
            esc(&label),
            ROW - 6,
            LABEL as f64 + w + 6.0,
            y + 15,
            thousands(b.value)
        );
        match &b.link {
            Some(href) => {
                let _ = write!(svg, "<a href=\"{}\"><g>{bar}</g></a>", esc(href));
            }
            None => {
                let _ = write!(svg, "<g>{bar}</g>");
            }
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_127_674), "1,127,674");
    }

    #[test]
    fn bars_are_scaled_to_the_largest() {
        let svg = bar_chart(
            "t",
            &[
                Bar {
                    label: "a<b".into(),
                    value: 100,
                    link: Some("#r-a".into()),
                },
                Bar {
                    label: "c".into(),
                    value: 50,
                    link: None,
                },
            ],
            200,
        );
        assert!(svg.contains("a&lt;b"));
        assert!(svg.contains("width=\"350.0\""), "{svg}");
        assert!(svg.contains("width=\"175.0\""), "{svg}");
        assert!(svg.contains("(50.0%)") && svg.contains("(25.0%)"));
        assert!(svg.contains("<a href=\"#r-a\">"));
    }
}
