//! Guest strings as the host keeps or prints them.
//!
//! A guest's text (a log line, an error message, a counter or state name) can hold line
//! breaks and terminal escapes, and be of any length. Before the host stores, logs or
//! prints one, it goes through [`printable`] (control characters escaped, so a guest
//! cannot forge host log lines or drive a terminal) and, where it is kept, [`guest_text`]
//! (cut to the tenant's limit).

/// `text` with its control characters (line breaks, escapes) written as escapes, so a
/// guest's string can be printed or logged without forging lines or driving a terminal.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
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
    fn guest_strings_are_cut_and_cannot_forge_lines() {
        assert_eq!(printable("plain"), "plain");
        assert_eq!(
            printable("a\nINFO forged\x1b[2J"),
            "a\\nINFO forged\\u{1b}[2J"
        );
        assert_eq!(guest_text("héllo", 2), "h… (5 more bytes cut)");
        assert_eq!(guest_text("ok\n", 10), "ok\\n");
    }
}
