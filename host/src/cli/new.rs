//! `sluice new`: a plugin crate from a template, which builds, tests and runs at once.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// What a new plugin starts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Template {
    /// One record in, one changed record out.
    Map,
    /// Records kept or dropped by a predicate, with counters.
    Filter,
    /// A running count per key in the host's keyed state.
    Keyed,
    /// Sums per key in tumbling event-time windows, with timers.
    Window,
}

impl Template {
    fn name(self) -> &'static str {
        match self {
            Template::Map => "map",
            Template::Filter => "filter",
            Template::Keyed => "keyed",
            Template::Window => "window",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Template::Window => include_str!("../../templates/window.rs"),
            Template::Map => include_str!("../../templates/map.rs"),
            Template::Filter => include_str!("../../templates/filter.rs"),
            Template::Keyed => include_str!("../../templates/keyed.rs"),
        }
    }

    /// The job file's source fields and operator fields.
    fn job(self) -> (&'static str, &'static str) {
        match self {
            Template::Map => (
                "records = 1000\nwords_per_record = 4",
                "config = { prefix = \"> \" }",
            ),
            Template::Filter => (
                "records = 1000\nwords_per_record = 4",
                "config = { contains = \"na\" }",
            ),
            Template::Keyed => (
                "records = 1000\nwords_per_record = 1\nvocabulary = 50",
                "key_by = \"value\"",
            ),
            Template::Window => (
                "shape = \"events\"\nrecords = 10000\nkeys = 10\nstep_ms = 10\njitter_ms = 500\n\
                 timestamp = { field = 0 }\nout_of_orderness_ms = 500",
                "key_by = { field = 1 }\nconfig = { size-ms = 10000 }",
            ),
        }
    }
}

/// The language of a new plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Language {
    /// A Rust crate (`cargo test`, `cargo build --target wasm32-wasip2`).
    Rust,
    /// A Python module (pytest; built with componentize-py).
    Python,
    /// A JavaScript module (`node --test`; built with componentize-js).
    Js,
}

impl Template {
    /// The example operator of `language` this template starts from, and its tests.
    fn guest_files(self, language: Language) -> (&'static str, &'static str) {
        match (language, self) {
            (Language::Python, Template::Map) => (
                include_str!("../../../plugins-python/upper.py"),
                include_str!("../../templates/guest/test_map.py"),
            ),
            (Language::Python, Template::Filter) => (
                include_str!("../../../plugins-python/filter.py"),
                include_str!("../../templates/guest/test_filter.py"),
            ),
            (Language::Python, Template::Keyed) => (
                include_str!("../../../plugins-python/count.py"),
                include_str!("../../templates/guest/test_keyed.py"),
            ),
            (Language::Python, Template::Window) => (
                include_str!("../../../plugins-python/tumbling.py"),
                include_str!("../../templates/guest/test_window.py"),
            ),
            (Language::Js, Template::Map) => (
                include_str!("../../../plugins-js/upper.js"),
                include_str!("../../templates/guest/map.test.js"),
            ),
            (Language::Js, Template::Filter) => (
                include_str!("../../../plugins-js/filter.js"),
                include_str!("../../templates/guest/filter.test.js"),
            ),
            (Language::Js, Template::Keyed) => (
                include_str!("../../../plugins-js/count.js"),
                include_str!("../../templates/guest/keyed.test.js"),
            ),
            (Language::Js, Template::Window) => (
                include_str!("../../../plugins-js/tumbling.js"),
                include_str!("../../templates/guest/window.test.js"),
            ),
            (Language::Rust, _) => unreachable!("Rust plugins are crates"),
        }
    }
}

/// Module names a Python operator cannot have: Python's keywords, and the modules the
/// build puts beside it.
const PYTHON_RESERVED: &[&str] = &[
    "False",
    "None",
    "True",
    "and",
    "as",
    "assert",
    "async",
    "await",
    "break",
    "class",
    "continue",
    "def",
    "del",
    "elif",
    "else",
    "except",
    "finally",
    "for",
    "from",
    "global",
    "if",
    "import",
    "in",
    "is",
    "lambda",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "return",
    "try",
    "while",
    "with",
    "yield",
    "app",
    "sluice_sdk",
    "sluice_wit",
];

/// Creates a Python or JavaScript plugin `name` in `dir/name` from `template`: the
/// operator, its tests, a job file and a README, using the SDK and build script of the
/// Sluice checkout at `checkout` (this build's, unless given). Returns the folder.
pub(super) fn create_guest(
    dir: &Path,
    name: &str,
    template: Template,
    language: Language,
    checkout: Option<&Path>,
) -> Result<PathBuf> {
    check_name(name)?;
    let root = dir.join(name);
    if root.exists() {
        bail!(
            "{} exists already: choose another name or folder (nothing was written)",
            root.display()
        );
    }
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checkout = checkout.unwrap_or(&own);
    let (sdk, script) = match language {
        Language::Python => ("sdk-python", "scripts/build-python-plugin.sh"),
        Language::Js => ("sdk-js", "scripts/build-js-plugin.sh"),
        Language::Rust => unreachable!("Rust plugins are crates"),
    };
    if !checkout.join(sdk).is_dir() || !checkout.join(script).is_file() {
        bail!(
            "{} is not a Sluice checkout with {sdk}/ and {script}: {} plugins are built \
             with them (pass --sdk CHECKOUT)",
            checkout.display(),
            match language {
                Language::Python => "Python",
                _ => "JavaScript",
            }
        );
    }
    let checkout = checkout
        .canonicalize()
        .with_context(|| format!("the checkout at {}", checkout.display()))?;
    let lib = name.replace('-', "_");
    if language == Language::Python && (PYTHON_RESERVED.contains(&lib.as_str())) {
        bail!(
            "{name:?} cannot name a Python operator: its module `{lib}` would be a keyword or \
             a module the build uses (app, sluice_sdk, sluice_wit); choose another name"
        );
    }
    let (source, operator) = template.job();
    // The examples take no `prefix` (the Rust map template's config).
    let operator = if template == Template::Map {
        ""
    } else {
        operator
    };
    let (module, tests) = template.guest_files(language);
    let c = checkout.display();
    // Paths in the commands people copy are quoted for the shell where they need it (a
    // checkout under "My Projects").
    let shell = |path: PathBuf| {
        let path = path.to_string_lossy().into_owned();
        shlex::try_quote(&path).map_or_else(|_| path.clone(), |q| q.into_owned())
    };
    let (file, test_file, language_name, test, build) = match language {
        Language::Python => (
            format!("{lib}.py"),
            format!("test_{lib}.py"),
            "Python",
            format!(
                "PYTHONPATH={} python3 -m pytest -q",
                shell(checkout.join("sdk-python"))
            ),
            format!(
                "{} {lib}.py {lib}.wasm",
                shell(checkout.join("scripts/build-python-plugin.sh"))
            ),
        ),
        _ => (
            format!("{lib}.js"),
            format!("{lib}.test.js"),
            "JavaScript",
            "npm install && npm test".to_string(),
            format!(
                "{} {lib}.js {lib}.wasm",
                shell(checkout.join("scripts/build-js-plugin.sh"))
            ),
        ),
    };
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{lib}}", &lib)
            .replace("{{template}}", template.name())
            .replace("{{source}}", source)
            .replace("{{operator}}", operator)
            .replace("{{language}}", language_name)
            .replace("{{checkout}}", &c.to_string())
            .replace("{{test}}", &test)
            .replace("{{build}}", &build)
    };
    let mut files = vec![
        (file, module.to_string()),
        (test_file, fill(tests)),
        (
            "job.toml".to_string(),
            fill(include_str!("../../templates/guest/job.toml.in")),
        ),
        (
            "README.md".to_string(),
            fill(include_str!("../../templates/guest/README.md.in")),
        ),
        (
            ".gitignore".to_string(),
            "*.wasm
/out
/checkpoints
__pycache__/
node_modules/
"
            .to_string(),
        ),
    ];
    if language == Language::Js {
        let package = serde_json::json!({
            "name": name,
            "private": true,
            "type": "module",
            "scripts": { "test": "node --test" },
            "dependencies": { "sluice-sdk": format!("file:{c}/sdk-js") },
        });
        files.push((
            "package.json".to_string(),
            serde_json::to_string_pretty(&package)? + "\n",
        ));
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    for (file, text) in files {
        let path = root.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(root)
}

/// Creates the crate `name` in `dir/name` from `template`, depending on the SDK at
/// `sdk` (a path) or, without one, on the SDK found beside this build of Sluice, or else
/// on the published `sluice-sdk`. Returns the crate's folder.
pub(super) fn create(
    dir: &Path,
    name: &str,
    template: Template,
    sdk: Option<&Path>,
) -> Result<PathBuf> {
    check_name(name)?;
    let root = dir.join(name);
    if root.exists() {
        bail!(
            "{} exists already: choose another name or folder (nothing was written)",
            root.display()
        );
    }
    let checkout_sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
    let sdk = match sdk {
        Some(p) => Some(p.to_path_buf()),
        None => checkout_sdk
            .join("Cargo.toml")
            .is_file()
            .then_some(checkout_sdk),
    };
    let sdk_dependency = match &sdk {
        Some(p) => {
            let p = p
                .canonicalize()
                .with_context(|| format!("the SDK at {}", p.display()))?;
            if !p.join("Cargo.toml").is_file() {
                bail!(
                    "{} is not the sluice-sdk crate (no Cargo.toml)",
                    p.display()
                );
            }
            format!("{{ path = {:?} }}", p.display().to_string())
        }
        None => format!("\"{}\"", env!("CARGO_PKG_VERSION")),
    };
    let lib = name.replace('-', "_");
    let type_name = type_name(name);
    let (source, operator) = template.job();
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{lib}}", &lib)
            .replace("{{Type}}", &type_name)
            .replace("{{template}}", template.name())
            .replace("{{sdk}}", &sdk_dependency)
            .replace("{{source}}", source)
            .replace("{{operator}}", operator)
    };
    let files = [
        (
            "Cargo.toml",
            fill(include_str!("../../templates/Cargo.toml.in")),
        ),
        ("src/lib.rs", fill(template.source())),
        (
            "job.toml",
            fill(include_str!("../../templates/job.toml.in")),
        ),
        (
            "README.md",
            fill(include_str!("../../templates/README.md.in")),
        ),
        (".gitignore", "/target\n/out\n/checkpoints\n".to_string()),
        (
            ".cargo/config.toml",
            include_str!("../../templates/cargo-config.toml").to_string(),
        ),
    ];
    for dir in [root.join("src"), root.join(".cargo")] {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (file, text) in files {
        let path = root.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    // The versions this SDK was built and tested with, so the plugin builds the same.
    if let Some(lock) = sdk
        .as_deref()
        .and_then(|p| p.parent())
        .map(|w| w.join("Cargo.lock"))
        .filter(|l| l.is_file())
    {
        std::fs::copy(&lock, root.join("Cargo.lock"))
            .with_context(|| format!("copying {}", lock.display()))?;
    }
    Ok(root)
}

/// A crate name Cargo takes: ASCII letters, digits, `-` and `_`, starting with a letter.
fn check_name(name: &str) -> Result<()> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        bail!(
            "{name:?} is not a plugin name: use ASCII letters, digits, `-` and `_`, starting \
             with a letter (at most 64)"
        );
    }
    Ok(())
}

/// `my-op` → `MyOp`.
fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut chars = p.chars();
            let first = chars.next().map(|c| c.to_ascii_uppercase());
            first.into_iter().chain(chars).collect::<String>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_in_a_guest_plugins_files_quote_a_checkout_path_with_spaces() {
        let base = std::env::temp_dir().join(format!("sluice-new-{}", std::process::id()));
        let checkout = base.join("My Projects/sluice");
        for dir in ["sdk-python", "sdk-js", "scripts"] {
            std::fs::create_dir_all(checkout.join(dir)).unwrap();
        }
        for script in ["build-python-plugin.sh", "build-js-plugin.sh"] {
            std::fs::write(checkout.join("scripts").join(script), "").unwrap();
        }
        let quoted = format!("'{}", checkout.canonicalize().unwrap().display());
        for (language, name) in [(Language::Python, "py-op"), (Language::Js, "js-op")] {
            let root = create_guest(&base, name, Template::Map, language, Some(&checkout)).unwrap();
            let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
            let build = readme
                .lines()
                .find(|l| l.contains("build-") && l.contains(".wasm"))
                .unwrap();
            assert!(build.trim_start().starts_with(&quoted), "{readme}");
            if language == Language::Python {
                assert!(readme.contains(&format!("PYTHONPATH={quoted}")), "{readme}");
            }
            let job = std::fs::read_to_string(root.join("job.toml")).unwrap();
            assert!(job.contains(&quoted), "{job}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn names_become_types_and_bad_ones_are_refused() {
        assert_eq!(type_name("my-op_2"), "MyOp2");
        assert!(check_name("my-op").is_ok());
        for bad in ["", "1op", "op/../x", "op op", "ö"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
