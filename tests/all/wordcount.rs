//! The word-count job, checked word by word against a count computed in the test.

use sluice::job::JobOutcome;
use sluice_tests::plugins::{COUNT, FILTER, TOKENIZE, UPPERCASE};
use sluice_tests::{
    expected_word_counts, final_counts, final_counts_any_order, read_sink_output, run_job,
    sample_text, test_dir, write_job,
};

fn wordcount_job(input: &str, count_parallelism: u32, sink_parallelism: u32) -> String {
    format!(
        r#"
name = "wordcount"
[source]
type = "file"
path = "{input}"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
config = {{ min-length = 2 }}
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = {count_parallelism}
key_by = "key"
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
parallelism = {sink_parallelism}
"#
    )
}

#[test]
fn word_count_matches_an_independent_count() {
    let dir = test_dir("wordcount");
    let text = sample_text(7, 3000);
    std::fs::write(dir.join("input.txt"), &text).unwrap();
    let job = write_job(&dir, &wordcount_job("input.txt", 1, 1));
    let report = run_job(&job).unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    let expected = expected_word_counts(&text, 2);
    assert!(expected.len() > 20, "the sample text has too few words");
    assert_eq!(final_counts(&output).unwrap(), expected);
    let total: u64 = expected.values().sum();
    assert_eq!(output.lines().count() as u64, total);
}

#[test]
fn word_count_is_the_same_at_parallelism_1_2_and_4() {
    let text = sample_text(11, 2000);
    let expected = expected_word_counts(&text, 2);
    for (count_p, sink_p) in [(1, 1), (2, 1), (4, 1), (4, 2)] {
        let dir = test_dir("wordcount-parallel");
        std::fs::write(dir.join("input.txt"), &text).unwrap();
        let job = write_job(&dir, &wordcount_job("input.txt", count_p, sink_p));
        run_job(&job).unwrap();
        let output = read_sink_output(&dir.join("out/counts.tsv"), sink_p);
        let counts = if sink_p == 1 {
            final_counts(&output)
        } else {
            final_counts_any_order(&output)
        };
        assert_eq!(
            counts.unwrap(),
            expected,
            "count parallelism {count_p}, sink parallelism {sink_p}"
        );
    }
}

#[test]
fn filter_and_uppercase_in_one_chain() {
    let dir = test_dir("chain");
    std::fs::write(dir.join("input.txt"), "alpha beta\ngamma alpha\ndelta\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "chain"
[source]
type = "file"
path = "input.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "filter"
plugin = "{FILTER}"
config = {{ none-of = "alpha", min-length = 5 }}
[[operator]]
name = "uppercase"
plugin = "{UPPERCASE}"
[sink]
type = "file"
path = "out.txt"
"#
        ),
    );
    let report = run_job(&job).unwrap();
    // One task: the whole pipeline is chained.
    assert_eq!(report.tasks.len(), 1);
    assert_eq!(
        std::fs::read_to_string(dir.join("out.txt")).unwrap(),
        "GAMMA\nDELTA\n"
    );
}
