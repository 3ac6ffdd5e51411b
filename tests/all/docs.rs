//! The documentation stays true. `README.md` and the pages under `docs/` are read as a
//! user reads them:
//!
//! - a ```toml block with a `[source]` or `[[source]]` table is a job file, and passes
//!   `sluice validate`;
//! - a ```toml block with `[defaults]`, `[server]` or `[tenant.NAME]` tables (or a
//!   top-level `strict_tenants` or `jobs`) is a host configuration, and passes
//!   `sluice validate --host-config` beside a trivial job;
//! - any other ```toml block is part of one, and says so with a line `<!-- fragment -->`
//!   just before it;
//! - every `sluice COMMAND` of a ```sh block or of a table of commands exists (`sluice
//!   COMMAND --help` succeeds), and every `--option` written after it is in that help;
//! - every relative link of these pages (and of the other markdown files next to them)
//!   leads to a file that exists, and a `#section` of a page to one of its headings.
//!
//! Before validating, the test fills in what a reader would: a plugin named by its file
//! (`plugins/count.wasm`, `count.wasm`) becomes the component `tests/build.rs` built from
//! `plugins/count`; the host folder of a `dirs` grant is created in a scratch folder (an
//! absolute path made relative to it); a `token_sha256` that is no SHA-256 (`"…"`)
//! becomes one; a secret a job reads from a relative `"${file:NAME}"` is written beside it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};

use sluice_tests::{test_dir, write_job};

use crate::cli::{outcome, sluice};

/// The line that marks the next code block as a part of a file, not checked alone.
const FRAGMENT: &str = "<!-- fragment -->";

/// A SHA-256 (of `docs`) for the host configurations that show `token_sha256 = "…"`.
const SOME_SHA256: &str = "46b42b4229cd7a39c564e780bb665a8bde4fdf722007e8473f167fe53ed4b995";

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `path` as from the root, for messages.
fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A markdown file: its path from the root (what messages name) and its text.
struct Page {
    name: String,
    text: String,
}

impl Page {
    fn read(name: &str) -> Page {
        let path = root().join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        Page {
            name: name.to_string(),
            text,
        }
    }

    /// The folder its relative links start from.
    fn dir(&self) -> PathBuf {
        root()
            .join(&self.name)
            .parent()
            .expect("a page is in a folder")
            .to_path_buf()
    }

    /// `PAGE:LINE`, for messages.
    fn at(&self, line: usize) -> String {
        format!("{}:{line}", self.name)
    }
}

/// `README.md` and `docs/*.md`: the pages whose examples are checked.
fn pages() -> Vec<Page> {
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("reading docs/")
        .map(|entry| entry.expect("reading docs/").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .map(|path| format!("docs/{}", path.file_name().unwrap().to_string_lossy()))
        .collect();
    docs.sort();
    std::iter::once("README.md".to_string())
        .chain(docs)
        .map(|name| Page::read(&name))
        .collect()
}

/// The pages, and the other markdown files that link to them or that they link to.
fn linked_pages() -> Vec<Page> {
    let mut pages = pages();
    for name in [
        "BENCHMARKS.md",
        "sdk/README.md",
        "sdk-python/README.md",
        "sdk-js/README.md",
        "scripts/kafka/README.md",
    ] {
        if root().join(name).is_file() {
            pages.push(Page::read(name));
        }
    }
    pages
}

/// Writes the secrets `text` reads from files beside it (`"${file:NAME}"`, relative)
/// into `dir`: a reader has them.
fn write_file_secrets(dir: &Path, text: &str) {
    for reference in text.split("${file:").skip(1) {
        if let Some(name) = reference.split('}').next()
            && Path::new(name).is_relative()
        {
            std::fs::write(dir.join(name), "secret\n").unwrap();
        }
    }
}

/// Fails with every problem found, one per line.
fn report(problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{} problem(s) in the docs:\n\n{}\n",
        problems.len(),
        problems.join("\n\n")
    );
}

/// `text` indented by four spaces, for quoting a command's output in a message.
fn indent(text: &str) -> String {
    text.trim_end()
        .lines()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------- markdown

/// A code fence: its character, its length and its info string.
fn fence(line: &str) -> Option<(char, usize, &str)> {
    let trimmed = line.trim_start();
    let c = trimmed.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = trimmed.chars().take_while(|&x| x == c).count();
    (n >= 3).then(|| (c, n, trimmed[n..].trim()))
}

/// Whether `line` closes a block opened by a fence of `n` characters `c`.
fn closes(line: &str, c: char, n: usize) -> bool {
    fence(line).is_some_and(|(c2, n2, rest)| c2 == c && n2 >= n && rest.is_empty())
}

/// A fenced code block.
struct Block {
    /// The first word of its info string (`toml`, `sh`, ...).
    lang: String,
    /// The number (from 1) of the line of its opening fence.
    line: usize,
    /// Its lines, without the fences.
    body: String,
    /// Whether the line before it (blank lines aside) is `<!-- fragment -->`.
    fragment: bool,
}

fn blocks(page: &Page) -> Vec<Block> {
    let lines: Vec<&str> = page.text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((c, n, info)) = fence(lines[i]) else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = String::new();
        i += 1;
        while i < lines.len() && !closes(lines[i], c, n) {
            body.push_str(lines[i]);
            body.push('\n');
            i += 1;
        }
        i += 1;
        let fragment = lines[..start]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.trim() == FRAGMENT);
        out.push(Block {
            lang: info.split_whitespace().next().unwrap_or("").to_string(),
            line: start + 1,
            body,
            fragment,
        });
    }
    out
}

/// `text` with the lines of fenced code blocks emptied (so line numbers stay).
fn outside_fences(text: &str) -> String {
    let mut out = String::new();
    let mut open: Option<(char, usize)> = None;
    for line in text.lines() {
        match open {
            Some((c, n)) => {
                if closes(line, c, n) {
                    open = None;
                }
            }
            None => match fence(line) {
                Some((c, n, _)) => open = Some((c, n)),
                None => out.push_str(line),
            },
        }
        out.push('\n');
    }
    out
}

/// The length of the run of backticks at `i`.
fn backtick_run(chars: &[char], i: usize) -> usize {
    chars[i..].iter().take_while(|&&c| c == '`').count()
}

/// `text` with its code spans blanked (newlines kept). A span ends at the next run of
/// as many backticks, within its paragraph.
fn blank_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = backtick_run(&chars, i);
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '\n' && chars.get(j + 1) == Some(&'\n') {
                break;
            }
            if chars[j] == '`' {
                let m = backtick_run(&chars, j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &mut out[i..j + n] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + n;
            }
            None => i += n,
        }
    }
    out.into_iter().collect()
}

/// The code spans of one line (a table row).
fn code_spans(line: &str) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = backtick_run(&chars, i);
        let mut j = i + n;
        let mut found = false;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = backtick_run(&chars, j);
                if m == n {
                    spans.push(
                        chars[i + n..j]
                            .iter()
                            .collect::<String>()
                            .trim()
                            .to_string(),
                    );
                    i = j + n;
                    found = true;
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        if !found {
            i += n;
        }
    }
    spans
}

/// The cells of a table row, split at every `|` that is not escaped (`\|`).
fn cells(row: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut chars = row.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push_str("\\|");
                chars.next();
            }
            '|' => cells.push(String::new()),
            _ => cells.last_mut().unwrap().push(c),
        }
    }
    if cells.first().is_some_and(|c| c.trim().is_empty()) {
        cells.remove(0);
    }
    if cells.last().is_some_and(|c| c.trim().is_empty()) {
        cells.pop();
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

fn is_row(line: &str) -> bool {
    line.trim_start().starts_with('|')
}

fn is_separator(line: &str) -> bool {
    is_row(line)
        && line.contains('-')
        && line
            .trim()
            .chars()
            .all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

/// GitHub's anchors for the headings of a markdown text.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for line in outside_fences(text).lines() {
        let trimmed = line.trim_start();
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) || line.len() - trimmed.len() > 3 {
            continue;
        }
        let rest = &trimmed[level..];
        if !rest.is_empty() && !rest.starts_with(' ') {
            continue;
        }
        let heading = rest.trim().trim_end_matches('#').trim();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(match *n {
            0 => slug,
            n => format!("{slug}-{n}"),
        });
        *n += 1;
    }
    out
}

/// The targets of a page's links and images outside code, with their line numbers.
fn links(page: &Page) -> Vec<(usize, String)> {
    let prose = blank_code_spans(&outside_fences(&page.text));
    let mut out = Vec::new();
    for (start, _) in prose.match_indices("](") {
        let line = prose[..start].matches('\n').count() + 1;
        let rest = &prose[start + 2..];
        let target = match rest.strip_prefix('<') {
            Some(inner) => inner.split('>').next().unwrap_or(""),
            None => rest
                .split(|c: char| c == ')' || c.is_whitespace())
                .next()
                .unwrap_or(""),
        };
        out.push((line, target.to_string()));
    }
    // Reference definitions: `[name]: target`.
    for (n, line) in prose.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix('[')
            && let Some((_, target)) = rest.split_once("]: ")
        {
            let target = target.split_whitespace().next().unwrap_or("");
            out.push((n + 1, target.to_string()));
        }
    }
    out
}

// ---------------------------------------------------------------- toml blocks

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Job,
    Host,
    Neither,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Job => "job file",
            Kind::Host => "host configuration",
            Kind::Neither => "fragment",
        }
    }
}

/// The name of the table a line opens (`[name]` or `[[name]]`), if it opens one.
fn table_header(line: &str) -> Option<&str> {
    let inner = line.trim().strip_prefix('[')?;
    let inner = inner.strip_prefix('[').unwrap_or(inner);
    let name = inner[..inner.find(']')?].trim();
    let is_name = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '"'));
    is_name.then_some(name)
}

/// What a toml block is, by its tables.
fn kind(toml: &str) -> Result<Kind, String> {
    let (mut job, mut host, mut top) = (false, false, true);
    for line in toml.lines() {
        if let Some(table) = table_header(line) {
            top = false;
            match table {
                "source" => job = true,
                "defaults" | "server" => host = true,
                t if t.starts_with("tenant.") => host = true,
                _ => {}
            }
        } else if top
            && let Some((key, _)) = line.split_once('=')
            && matches!(key.trim(), "strict_tenants" | "jobs")
        {
            host = true;
        }
    }
    match (job, host) {
        (true, true) => Err(
            "this toml block has tables of a job file ([source]) and of a host configuration \
             ([defaults], [server], [tenant.NAME]): a file is one or the other"
                .into(),
        ),
        (true, false) => Ok(Kind::Job),
        (false, true) => Ok(Kind::Host),
        (false, false) => Ok(Kind::Neither),
    }
}

/// The ```toml blocks of a page that are whole files of `kind` (not marked fragments).
fn toml_files(page: &Page, want: Kind) -> Vec<Block> {
    blocks(page)
        .into_iter()
        .filter(|b| b.lang == "toml" && !b.fragment && kind(&b.body) == Ok(want))
        .collect()
}

/// Where the comment of a toml line begins (a `#` outside a string), or its end.
fn toml_code_end(line: &str) -> usize {
    let (mut quote, mut escaped) = (None, false);
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '#' => return i,
                _ => {}
            },
        }
    }
    line.len()
}

/// The byte ranges of the (basic) string values of `key` in `line`, `key = "value"`,
/// outside its comment; also inside inline tables.
fn string_values(line: &str, key: &str) -> Vec<Range<usize>> {
    let code = &line[..toml_code_end(line)];
    let mut out = Vec::new();
    for (at, _) in code.match_indices(key) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '"')) {
            continue;
        }
        let rest = code[at + key.len()..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else {
            continue;
        };
        let Some(value) = rest.trim_start().strip_prefix('"') else {
            continue;
        };
        let Some(len) = value.find('"') else {
            continue;
        };
        let start = code.len() - value.len();
        out.push(start..start + len);
    }
    out
}

/// `toml` with every string value of `key` replaced by what `f` makes of it.
fn replace_values(
    toml: &str,
    key: &str,
    mut f: impl FnMut(&str) -> Result<String, String>,
) -> Result<String, String> {
    let mut out = String::new();
    for line in toml.lines() {
        let mut line = line.to_string();
        for range in string_values(&line, key).into_iter().rev() {
            let new = f(&line[range.clone()])?;
            line.replace_range(range, &new.replace('\\', "\\\\").replace('"', "\\\""));
        }
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// The components `tests/build.rs` built, by plugin name (`test_hog` for `test-hog`).
fn built_plugins() -> BTreeMap<String, &'static str> {
    let mut map = BTreeMap::new();
    macro_rules! add {
        ($name:ident, $constant:ident) => {
            map.insert(
                stringify!($name).to_string(),
                sluice_tests::plugins::$constant,
            );
        };
    }
    sluice_tests::foreach_plugin!(add);
    map
}

/// The built component a job file's `plugin = "…/NAME.wasm"` stands for.
fn built_plugin(plugins: &BTreeMap<String, &'static str>, named: &str) -> Result<String, String> {
    let path = Path::new(named);
    let stem = path
        .file_stem()
        .filter(|_| path.extension().is_some_and(|e| e == "wasm"))
        .map(|s| s.to_string_lossy().replace('-', "_"));
    match stem.and_then(|s| plugins.get(&s)) {
        Some(built) => Ok(built.to_string()),
        None => Err(format!(
            "the job file names plugin {named:?}, which is no plugins/NAME built by \
             tests/build.rs ({})",
            plugins.keys().cloned().collect::<Vec<_>>().join(", ")
        )),
    }
}

#[test]
fn every_toml_block_is_a_job_file_a_host_configuration_or_a_marked_fragment() {
    let mut problems = Vec::new();
    for page in pages() {
        for block in blocks(&page).iter().filter(|b| b.lang == "toml") {
            let at = page.at(block.line);
            match (kind(&block.body), block.fragment) {
                (Err(e), _) => problems.push(format!("{at}: {e}")),
                (Ok(Kind::Neither), false) => problems.push(format!(
                    "{at}: this toml block is neither a job file (a [source] or [[source]] \
                     table) nor a host configuration ([defaults], [server], [tenant.NAME]), \
                     so it is not checked: make it a whole file, or put a line `{FRAGMENT}` \
                     before it"
                )),
                (Ok(whole @ (Kind::Job | Kind::Host)), true) => problems.push(format!(
                    "{at}: this toml block is marked `{FRAGMENT}` but is a whole {}: remove \
                     the mark, so that it is checked",
                    whole.name()
                )),
                _ => {}
            }
        }
    }
    report(&problems);
}

#[test]
fn job_files_in_the_docs_validate() {
    let plugins = built_plugins();
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for block in toml_files(&page, Kind::Job) {
            checked += 1;
            let at = page.at(block.line);
            let job = match replace_values(&block.body, "plugin", |p| built_plugin(&plugins, p)) {
                Ok(job) => job,
                Err(e) => {
                    problems.push(format!("{at}: {e}"));
                    continue;
                }
            };
            let dir = test_dir("docs-job");
            write_file_secrets(&dir, &job);
            let path = write_job(&dir, &job);
            let (code, _, stderr) = outcome(&sluice(&["validate", path.to_str().unwrap()]));
            if code != Some(0) {
                problems.push(format!(
                    "{at}: `sluice validate` refuses this job file (exit status {code:?}; \
                     written to {} with the plugins' paths filled in):\n{}",
                    path.display(),
                    indent(&stderr)
                ));
            }
        }
    }
    assert!(checked > 0, "found no job file in README.md or docs/*.md");
    report(&problems);
}

#[test]
fn host_configurations_in_the_docs_validate() {
    let uppercase = built_plugins()["uppercase"];
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for block in toml_files(&page, Kind::Host) {
            checked += 1;
            let at = page.at(block.line);
            let dir = test_dir("docs-host");
            let host = replace_values(&block.body, "host", |folder| {
                // A `dirs` grant names a folder that must exist: make it, in `dir`.
                let relative = folder.trim_start_matches('/');
                std::fs::create_dir_all(dir.join(relative))
                    .map_err(|e| format!("cannot create the granted folder {folder:?}: {e}"))?;
                Ok(relative.to_string())
            })
            .and_then(|host| {
                replace_values(&host, "token_sha256", |token| {
                    let hex = token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit());
                    Ok(if hex { token } else { SOME_SHA256 }.to_string())
                })
            });
            let host = match host {
                Ok(host) => host,
                Err(e) => {
                    problems.push(format!("{at}: {e}"));
                    continue;
                }
            };
            let host_path = dir.join("host.toml");
            write_file_secrets(&dir, &host);
            std::fs::write(&host_path, host).expect("writing the host configuration");
            let job = write_job(
                &dir,
                &format!(
                    r#"
name = "docs-host"
[source]
type = "generator"
records = 1
[[operator]]
name = "uppercase"
plugin = "{uppercase}"
[sink]
type = "stdout"
"#
                ),
            );
            let (code, _, stderr) = outcome(&sluice(&[
                "validate",
                job.to_str().unwrap(),
                "--host-config",
                host_path.to_str().unwrap(),
            ]));
            if code != Some(0) {
                problems.push(format!(
                    "{at}: `sluice validate --host-config` refuses this host configuration \
                     (exit status {code:?}; written to {}):\n{}",
                    host_path.display(),
                    indent(&stderr)
                ));
            }
        }
    }
    assert!(
        checked > 0,
        "found no host configuration in README.md or docs/*.md"
    );
    report(&problems);
}

// ---------------------------------------------------------------- commands

/// A `sluice` command written in the docs.
struct Invocation {
    /// `PAGE:LINE`.
    at: String,
    /// What follows `sluice`: a subcommand, or none when options come first.
    subcommand: Option<String>,
    /// The `--options` written after it.
    options: Vec<String>,
}

/// The `--option`s among `words` (`[--drain]`, `--cluster=HOST` count too).
fn options(words: &[&str]) -> Vec<String> {
    words
        .iter()
        .filter_map(|word| {
            let word = word.trim_start_matches(['[', '(']);
            let name = word.strip_prefix("--")?;
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            name.starts_with(|c: char| c.is_ascii_alphabetic())
                .then(|| format!("--{name}"))
        })
        .collect()
}

/// The `sluice` command among the words of one shell command, if there is one:
/// `sluice ...`, `target/release/sluice ...` or `cargo run -p sluice -- ...`.
fn invocation(words: &[&str], at: String) -> Option<Invocation> {
    let i = words
        .iter()
        .position(|w| *w == "sluice" || w.ends_with("/sluice"))?;
    let mut rest = &words[i + 1..];
    if i > 0 && matches!(words[i - 1], "-p" | "--package") {
        if rest.first() != Some(&"--") {
            return None;
        }
        rest = &rest[1..];
    }
    let first = rest.first()?;
    if first.starts_with('-') {
        return Some(Invocation {
            at,
            subcommand: None,
            options: options(rest),
        });
    }
    // A group of commands (`sluice cluster gc`) names its command in the next word.
    let words = match rest.get(1) {
        Some(second) if GROUPS.contains(first) && !second.starts_with('-') => 2,
        _ => 1,
    };
    Some(Invocation {
        at,
        subcommand: Some(rest[..words].join(" ")),
        options: options(&rest[words..]),
    })
}

/// The commands that hold commands of their own.
const GROUPS: &[&str] = &["cluster"];

/// A shell line without its comment (a `#` that begins a word, outside quotes).
fn shell_code(line: &str) -> &str {
    let mut quote = None;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '"' | '\'' => quote = Some(c),
                '#' if previous.is_whitespace() => return &line[..i],
                _ => {}
            },
        }
        previous = c;
    }
    line
}

/// The `sluice` commands of a page's ```sh blocks.
fn shell_commands(page: &Page, out: &mut Vec<Invocation>) {
    for block in blocks(page)
        .iter()
        .filter(|b| matches!(b.lang.as_str(), "sh" | "bash" | "shell" | "console"))
    {
        for (n, line) in block.body.lines().enumerate() {
            for command in shell_code(line).split([';', '|', '&', '(', ')']) {
                let words: Vec<&str> = command.split_whitespace().collect();
                out.extend(invocation(&words, page.at(block.line + 1 + n)));
            }
        }
    }
}

/// The commands in the first column of a page's tables whose first header is
/// `command`: each code span is one, `sluice` implied (`list`, `status ID`).
fn table_commands(page: &Page, out: &mut Vec<Invocation>) {
    let text = outside_fences(&page.text);
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i + 1 < lines.len() {
        let header = is_row(lines[i]) && is_separator(lines[i + 1]);
        if !header
            || cells(lines[i]).first().map(|c| c.to_lowercase()) != Some("command".to_string())
        {
            i += 1;
            continue;
        }
        i += 2;
        while i < lines.len() && is_row(lines[i]) {
            let first = cells(lines[i]).into_iter().next().unwrap_or_default();
            for span in code_spans(&first) {
                let span = span.replace("\\|", "|");
                let mut words: Vec<&str> = span.split_whitespace().collect();
                if words.first() != Some(&"sluice") {
                    words.insert(0, "sluice");
                }
                out.extend(invocation(&words, page.at(i + 1)));
            }
            i += 1;
        }
    }
}

/// `sluice [SUBCOMMAND] --help`, or why it failed.
fn help_of(subcommand: Option<&str>) -> Result<String, String> {
    let mut args: Vec<&str> = subcommand
        .into_iter()
        .flat_map(str::split_whitespace)
        .collect();
    args.push("--help");
    let (code, stdout, stderr) = outcome(&sluice(&args));
    match code {
        Some(0) => Ok(stdout),
        _ => Err(format!(
            "`sluice {}` exits with {code:?}, so there is no such command:\n{}",
            args.join(" "),
            indent(&stderr)
        )),
    }
}

/// Whether `help` lists `option` (followed by no further letters of a name).
fn lists_option(help: &str, option: &str) -> bool {
    help.match_indices(option).any(|(at, _)| {
        !help[at + option.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
    })
}

#[test]
fn commands_in_the_docs_exist_with_the_options_they_are_shown_with() {
    let mut invocations = Vec::new();
    for page in pages() {
        shell_commands(&page, &mut invocations);
        table_commands(&page, &mut invocations);
    }
    assert!(
        !invocations.is_empty(),
        "found no `sluice` command in README.md or docs/*.md"
    );
    let mut helps: HashMap<Option<String>, Result<String, String>> = HashMap::new();
    let mut problems = Vec::new();
    for invocation in &invocations {
        let command = match &invocation.subcommand {
            Some(s) => format!("sluice {s}"),
            None => "sluice".to_string(),
        };
        let help = helps
            .entry(invocation.subcommand.clone())
            .or_insert_with(|| help_of(invocation.subcommand.as_deref()));
        match help {
            Err(e) => problems.push(format!("{}: `{command}`: {e}", invocation.at)),
            Ok(text) => {
                for option in &invocation.options {
                    if !lists_option(text, option) {
                        problems.push(format!(
                            "{}: `{command}` is shown with `{option}`, which `{command} \
                             --help` does not list",
                            invocation.at
                        ));
                    }
                }
            }
        }
    }
    report(&problems);
}

// ---------------------------------------------------------------- links

#[test]
fn relative_links_between_the_pages_lead_somewhere() {
    let pages = linked_pages();
    let mut headings: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in &pages {
        for (line, target) in links(page) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let at = page.at(line);
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = match path {
                "" => root().join(&page.name),
                path => page.dir().join(path.replace("%20", " ")),
            };
            if !file.exists() {
                problems.push(format!(
                    "{at}: the link `{target}` leads to {}, which does not exist",
                    relative(&file)
                ));
                continue;
            }
            let Some(anchor) = anchor else {
                continue;
            };
            if file.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let known = headings
                .entry(file.clone())
                .or_insert_with(|| anchors(&std::fs::read_to_string(&file).unwrap_or_default()));
            if !known.contains(anchor) {
                problems.push(format!(
                    "{at}: the link `{target}`: {} has no heading whose anchor is `#{anchor}` \
                     (its anchors: {})",
                    relative(&file),
                    known.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    assert!(checked > 0, "found no relative link in the docs");
    report(&problems);
}

// ---------------------------------------------------------------- the test's own parts

#[test]
fn the_readers_of_the_docs_read_what_they_should() {
    assert_eq!(table_header("[[source]]   # one"), Some("source"));
    assert_eq!(
        table_header("[tenant.acme.kafka]"),
        Some("tenant.acme.kafka")
    );
    assert_eq!(table_header("  [\"a\", \"b\"],"), None);
    assert_eq!(kind("strict_tenants = true\n"), Ok(Kind::Host));
    assert_eq!(
        kind("name = \"x\"\n[source]\n[[operator]]\n"),
        Ok(Kind::Job)
    );
    assert_eq!(kind("[[operator]]\nname = \"join\"\n"), Ok(Kind::Neither));

    let line = r#"dirs = [{ host = "/srv/a", guest = "/a" }]  # host = "no""#;
    let values: Vec<&str> = string_values(line, "host")
        .into_iter()
        .map(|r| &line[r])
        .collect();
    assert_eq!(values, ["/srv/a"]);
    assert_eq!(
        replace_values("plugin = \"plugins/count.wasm\" # x\n", "plugin", |_| Ok(
            "/b/c.wasm".into()
        )),
        Ok("plugin = \"/b/c.wasm\" # x\n".to_string())
    );

    let words = [
        "cargo",
        "run",
        "-p",
        "sluice",
        "--",
        "serve",
        "--host-config",
        "h",
    ];
    let serve = invocation(&words, String::new()).unwrap();
    assert_eq!(serve.subcommand.as_deref(), Some("serve"));
    assert_eq!(serve.options, ["--host-config"]);
    assert!(
        invocation(
            &["cargo", "build", "-p", "sluice", "--release"],
            String::new()
        )
        .is_none()
    );
    assert_eq!(
        options(&[
            "[--from-checkpoint",
            "latest|PATH",
            "[--allow-rewind]",
            "|",
            "--fresh]"
        ]),
        ["--from-checkpoint", "--allow-rewind", "--fresh"]
    );
    assert_eq!(
        shell_code("sluice run x --fresh  # or --cluster"),
        "sluice run x --fresh  "
    );
    assert_eq!(
        cells(r"| `new [--template a\|b]` | what |"),
        [r"`new [--template a\|b]`", "what"]
    );

    let page = "# A\n## Run, resume, start over\n```sh\n# not a heading\n```\n## Operators in `plugins/`\n## A\n";
    let found = anchors(page);
    for anchor in ["a", "run-resume-start-over", "operators-in-plugins", "a-1"] {
        assert!(found.contains(anchor), "{anchor} not in {found:?}");
    }
    assert!(!found.contains("not-a-heading"));
    let prose = blank_code_spans("see `[x](no)` and\n[y](yes.md) `a\nb`");
    assert!(
        !prose.contains("no)") && prose.contains("[y](yes.md)"),
        "{prose}"
    );
}
