//! Guest strings as the host keeps or prints them.
//!
//! A guest's text (a log line, an error message, a counter or state name) can hold line
//! breaks and terminal escapes, and be of any length. Before the host stores, logs or
//! prints one, it goes through [`printable`] (control characters escaped, so a guest
//! cannot forge host log lines or drive a terminal) and, where it is kept, [`guest_text`]
//! (cut to the tenant's limit).

/// Whether `c` changes how the text around it is shown rather than showing itself: a
/// control character (line breaks, terminal escapes), a line or paragraph separator, or a
/// bidirectional formatting character (which can make a line read as another, as in
/// CVE-2021-42574).
pub fn is_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with its [unprintable](is_unprintable) characters written as escapes, so a
/// guest's string can be printed or logged without forging lines, driving a terminal or
/// reordering what is shown.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(is_unprintable) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unprintable(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Output a job wrote, as shown on a terminal: each line [`printable`] but for its tabs
/// (a tab-separated line stays one), invalid UTF-8 replaced, line breaks kept. What a
/// job writes is its tenant's, and a terminal obeys the escapes in it.
pub fn for_terminal(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\n' || c == '\t' || !is_unprintable(c) {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

/// A guest's string as the host keeps or prints it: cut to `max` bytes (on a character
/// boundary, saying how much was cut) and [`printable`].
pub fn guest_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return printable(text).into_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} more bytes cut)",
        printable(&text[..end]),
        text.len() - end
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_for_a_terminal_keeps_lines_and_tabs_and_escapes_the_rest() {
        let shown = for_terminal(b"a\tb\n\x1b[2Jc\r\xff\xe2\x80\xaed\n");
        assert_eq!(shown, "a\tb\n\\u{1b}[2Jc\\r\u{fffd}\\u{202e}d\n");
    }

    #[test]
    fn guest_strings_are_cut_and_cannot_forge_lines() {
        assert_eq!(printable("plain"), "plain");
        assert_eq!(
            printable("a\nINFO forged\x1b[2J"),
            "a\\nINFO forged\\u{1b}[2J"
        );
        assert_eq!(
            printable("ok\u{2028}INFO forged \u{202e}dlrow"),
            "ok\\u{2028}INFO forged \\u{202e}dlrow"
        );
        assert_eq!(printable("naïve café"), "naïve café");
        assert_eq!(guest_text("héllo", 2), "h… (5 more bytes cut)");
        assert_eq!(guest_text("ok\n", 10), "ok\\n");
    }
}
