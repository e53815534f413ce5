//! Lines a guest makes vtrace print (LOG hypercalls, rejected calls): made
//! harmless and rate-limited.
//!
//! The guest controls the text and how often it comes. Raw, it could move
//! the cursor, clear the screen or forge a line of vtrace's own ("vtrace:
//! guest exited with status 0"); unlimited, a loop of LOG calls writes
//! hundreds of MB to the terminal. So control characters (newlines
//! included) are shown escaped, every line carries the `vtrace: guest:`
//! prefix, and lines beyond a budget are counted instead of printed. The
//! trace keeps every LOG whole.

use std::time::Instant;

/// Lines printed at once before the limit applies.
const BURST: u32 = 100;
/// Lines per second printed once the burst is spent.
const PER_SECOND: u32 = 20;
/// Characters of a guest's text printed on one line; the rest is counted.
/// With the line budget, this bounds the bytes a second a guest can send
/// to the terminal (some 5 KB, where 20 KB lines made 1.4 MB).
const LINE_CHARS: usize = 240;

/// The text with every control character, and the backslash, escaped:
/// one line of plain characters.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// The control characters of one line of a message escaped, tabs kept: a
/// path or a trace's metadata quoted in it cannot steer the terminal.
pub fn escape_within_line(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        match c {
            '\t' => out.push(c),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A token bucket over host time for the guest's lines.
#[derive(Debug)]
pub struct GuestLines {
    tokens: u32,
    refilled: Instant,
    dropped: u64,
    /// Dropped since the last line printed.
    unreported: u64,
}

impl Default for GuestLines {
    fn default() -> Self {
        GuestLines::new(Instant::now())
    }
}

impl GuestLines {
    /// A full budget at `now`.
    pub fn new(now: Instant) -> GuestLines {
        GuestLines {
            tokens: BURST,
            refilled: now,
            dropped: 0,
            unreported: 0,
        }
    }

    /// The line to print for guest text `text` at `now`, or `None` when
    /// over budget (then counted). A printed line after dropped ones says
    /// how many were not shown.
    pub fn admit(&mut self, text: &str, now: Instant) -> Option<String> {
        let elapsed = now.saturating_duration_since(self.refilled);
        let earned = elapsed.as_millis() * u128::from(PER_SECOND) / 1000;
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(earned).min(BURST);
            self.refilled = now;
        }
        if self.tokens == 0 {
            self.dropped += 1;
            self.unreported += 1;
            return None;
        }
        self.tokens -= 1;
        let line = match text.char_indices().nth(LINE_CHARS) {
            None => format!("vtrace: guest: {}", escape(text)),
            Some((at, _)) => format!(
                "vtrace: guest: {}... ({} more bytes not shown; the trace keeps the text whole)",
                escape(&text[..at]),
                text.len() - at
            ),
        };
        Some(match std::mem::take(&mut self.unreported) {
            0 => line,
            n => format!(
                "vtrace: ({n} guest lines not shown: more than {PER_SECOND} a second)\n{line}"
            ),
        })
    }

    /// Lines not printed over the whole run.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn control_characters_cannot_forge_or_move() {
        assert_eq!(
            escape("ok\nvtrace: guest exited with status 0"),
            "ok\\nvtrace: guest exited with status 0"
        );
        assert_eq!(escape("\x1b[2J\0bell\x07"), "\\u{1b}[2J\\u{0}bell\\u{7}");
        assert_eq!(
            escape("a\\nb"),
            "a\\\\nb",
            "a literal backslash-n stays apart"
        );
        assert_eq!(escape("tab\there é"), "tab\\there é");
    }

    #[test]
    fn a_long_line_is_cut_and_says_how_much_is_not_shown() {
        let mut lines = GuestLines::new(Instant::now());
        let long = "x".repeat(20_000);
        let shown = lines.admit(&long, Instant::now()).unwrap();
        assert!(shown.len() < 400, "{}", shown.len());
        assert!(shown.ends_with("(19760 more bytes not shown; the trace keeps the text whole)"));
        assert_eq!(
            lines.admit("short", Instant::now()).unwrap(),
            "vtrace: guest: short"
        );
    }

    #[test]
    fn a_flood_is_cut_to_the_budget_and_counted() {
        let start = Instant::now();
        let mut lines = GuestLines::new(start);
        let shown = (0..10_000)
            .filter(|_| lines.admit("x", start).is_some())
            .count();
        assert_eq!(shown, BURST as usize);
        assert_eq!(lines.dropped(), 10_000 - u64::from(BURST));
        // A second later, PER_SECOND more; the first says what was lost.
        let later = start + Duration::from_secs(1);
        let first = lines.admit("y", later).unwrap();
        assert!(first.contains("9900 guest lines not shown"), "{first}");
        assert!(first.ends_with("vtrace: guest: y"));
        let more = (1..100)
            .filter(|_| lines.admit("z", later).is_some())
            .count();
        assert_eq!(more, PER_SECOND as usize - 1);
    }
}
