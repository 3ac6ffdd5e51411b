//! Every plugin loads as a component (or is refused with the error it exists to cause),
//! and every plugin has a test here: `foreach_plugin!` fails to compile when one is missing.

use sluice_tests::engine;
use sluice_tests::plugins::*;

fn load(path: &str) -> anyhow::Result<sluice::wasm::Plugin> {
    sluice::wasm::Plugin::load(&engine(), std::path::Path::new(path), false)
}

macro_rules! assert_test_exists {
    ($name:ident, $constant:ident) => {
        #[expect(unused_imports, reason = "only checks that the test exists")]
        use self::$name as _;
    };
}
sluice_tests::foreach_plugin!(assert_test_exists);

fn assert_operator(path: &str) {
    let plugin = load(path).unwrap();
    assert_eq!(
        plugin.info.interface,
        "sluice:operator/stream-operator@0.3.0"
    );
    for call in ["open", "process", "snapshot", "notify-complete", "dispose"] {
        assert!(
            plugin.info.calls.iter().any(|c| c == call),
            "{path} lacks {call}"
        );
    }
}

#[test]
fn join() {
    assert_operator(JOIN);
}

#[test]
fn enrich() {
    assert_operator(ENRICH);
}

#[test]
fn tokenize() {
    assert_operator(TOKENIZE);
}

#[test]
fn filter() {
    assert_operator(FILTER);
}

#[test]
fn uppercase() {
    assert_operator(UPPERCASE);
}

#[test]
fn count() {
    assert_operator(COUNT);
}

#[test]
fn window() {
    assert_operator(WINDOW);
}

#[test]
fn test_misbehave() {
    assert_operator(TEST_MISBEHAVE);
}

#[test]
fn test_hog() {
    assert_operator(TEST_HOG);
}

#[test]
fn test_sleeper() {
    assert_operator(TEST_SLEEPER);
}

#[test]
fn test_recorder() {
    assert_operator(TEST_RECORDER);
}

#[test]
fn test_wrong_version() {
    let err = format!("{:#}", load(TEST_WRONG_VERSION).unwrap_err());
    assert!(err.contains("built for sluice:operator@0.9.0"), "{err}");
    assert!(
        err.contains(
            "supports sluice:operator@0.3.0, sluice:operator@0.2.0 and sluice:operator@0.1.0"
        ),
        "{err}"
    );
}

#[test]
fn test_not_operator() {
    let err = format!("{:#}", load(TEST_NOT_OPERATOR).unwrap_err());
    assert!(err.contains("is not a Sluice operator"), "{err}");
    assert!(err.contains("wasi:cli/run"), "{err}");
}
