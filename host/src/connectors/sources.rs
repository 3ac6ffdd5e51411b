use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crossbeam_channel::{Receiver, TryRecvError, bounded};
use sluice_codec::BatchWriter;

use super::formats::{Decoded, Decoder, Format, FormatConfig, OnBadRecord};
use super::{Source, SourceStatus};
use crate::metrics::OperatorMetrics;

fn position_u64(position: &[u8], what: &str) -> Result<u64> {
    let bytes: [u8; 8] = position.try_into().map_err(|_| {
        anyhow::anyhow!(
            "{what}: checkpointed position has {} bytes, expected 8",
            position.len()
        )
    })?;
    Ok(u64::from_le_bytes(bytes))
}

/// Reads a text file, one record per line (without the line break), or with `format =
/// "protobuf"` a file of length-delimited messages (each a varint of its length, then the
/// message: what Java's `writeDelimitedTo` and C++'s `SerializeDelimitedToOstream`
/// write). Its position is the byte offset of the next line or message, so a restore
/// continues exactly after the last one read before the checkpoint.
pub struct FileSource {
    path: PathBuf,
    reader: BufReader<File>,
    offset: u64,
    line: Vec<u8>,
    /// Whether records are length-delimited messages, not lines.
    delimited: bool,
    /// `format = "json"`: each line is checked to be a JSON value; `"protobuf"`: each
    /// message is decoded into JSON.
    json: Option<JsonLines>,
    /// Where it reports how far it read (counter `bytes-read`: its offset).
    metrics: Option<Arc<OperatorMetrics>>,
}

/// A file source's JSON lines: blank lines are left out, a line that is not JSON is a
/// bad record.
struct JsonLines {
    decoder: Decoder,
    on_bad_record: OnBadRecord,
    /// Lines left out by `on_bad_record = "skip"`.
    bad: u64,
}

impl FileSource {
    /// Opens `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path)
            .with_context(|| format!("cannot open source file {}", path.display()))?;
        Ok(FileSource {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(256 << 10, file),
            offset: 0,
            line: Vec::new(),
            delimited: false,
            json: None,
            metrics: None,
        })
    }

    /// Reads the file as `format` says: lines as they are (`bytes`), JSON lines, or
    /// length-delimited Protobuf messages of its `schema`.
    pub fn with_format(mut self, format: &FormatConfig) -> Result<Self> {
        match format.format {
            Format::Bytes => {}
            Format::Json | Format::Protobuf => {
                self.delimited = format.format == Format::Protobuf;
                self.json = Some(JsonLines {
                    decoder: Decoder::new(format)?,
                    on_bad_record: format.on_bad_record.clone(),
                    bad: 0,
                });
            }
            other => bail!("a file source of lines reads no {other:?}"),
        }
        Ok(self)
    }
}

/// The largest length-delimited message a file source reads: a length past it is a
/// damaged file, not a message to allocate for.
const MAX_MESSAGE_BYTES: u64 = 64 << 20;

impl FileSource {
    /// The next line (without its line break) into `self.line`; how many bytes it took
    /// of the file, 0 at its end.
    fn next_line(&mut self) -> Result<usize> {
        self.line.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .with_context(|| format!("reading {}", self.path.display()))?;
        if self.line.ends_with(b"\n") {
            self.line.pop();
            if self.line.ends_with(b"\r") {
                self.line.pop();
            }
        }
        Ok(n)
    }

    /// The next length-delimited message into `self.line`; how many bytes it took of
    /// the file (its length's varint and itself), 0 at the file's end.
    fn next_message(&mut self) -> Result<usize> {
        self.line.clear();
        let at = self.offset;
        let damaged = |why: String| {
            anyhow::anyhow!(
                "{}: the message at byte {at}: {why} (`format = \"protobuf\"` reads \
                 length-delimited messages: each a varint of its length, then the message)",
                self.path.display()
            )
        };
        let mut len = 0u64;
        let mut took = 0;
        loop {
            let buf = self
                .reader
                .fill_buf()
                .with_context(|| format!("reading {}", self.path.display()))?;
            let Some(&byte) = buf.first() else {
                if took == 0 {
                    return Ok(0);
                }
                return Err(damaged("the file ends inside its length".into()));
            };
            self.reader.consume(1);
            if took == 9 && byte > 1 {
                return Err(damaged("its length is past 64 bits".into()));
            }
            len |= u64::from(byte & 0x7f) << (7 * took);
            took += 1;
            if byte & 0x80 == 0 {
                break;
            }
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(damaged(format!(
                "its length, {len} bytes, is past the {MAX_MESSAGE_BYTES} a message may have"
            )));
        }
        self.line.resize(len as usize, 0);
        std::io::Read::read_exact(&mut self.reader, &mut self.line).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                damaged(format!("the file ends inside it ({len} bytes long)"))
            } else {
                anyhow::Error::new(e).context(format!("reading {}", self.path.display()))
            }
        })?;
        Ok(took + len as usize)
    }

    fn read_lines(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus> {
        let what = if self.delimited { "message" } else { "line" };
        for _ in 0..max {
            let n = if self.delimited {
                self.next_message()?
            } else {
                self.next_line()?
            };
            if n == 0 {
                return Ok(SourceStatus::End);
            }
            let at = self.offset;
            self.offset += n as u64;
            let line = &self.line[..];
            let Some(json) = &mut self.json else {
                out.push(None, line, None);
                continue;
            };
            if !self.delimited && line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let why = match json.decoder.decode("", line)? {
                Decoded::Value(value) => {
                    out.push(None, value, None);
                    continue;
                }
                Decoded::Bad(why) => why,
            };
            if json.on_bad_record == OnBadRecord::Fail {
                let format = if self.delimited { "protobuf" } else { "json" };
                bail!(
                    "{}: the {what} at byte {at}: {why} (`format = \"{format}\"`; \
                     `on_bad_record = \"skip\"` leaves such {what}s out, counted)",
                    self.path.display()
                );
            }
            // The first bad ones, then every thousandth.
            if json.bad < 10 || json.bad.is_multiple_of(1000) {
                tracing::warn!(
                    "file source {}: skipping the {what} at byte {at} ({} skipped so far): {why}",
                    self.path.display(),
                    json.bad + 1
                );
            }
            json.bad += 1;
        }
        Ok(SourceStatus::More)
    }
}

impl Source for FileSource {
    fn attach_metrics(&mut self, metrics: Arc<OperatorMetrics>) {
        self.metrics = Some(metrics);
    }

    fn poll(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus> {
        let status = self.read_lines(out, max);
        if let Some(metrics) = &self.metrics {
            let mut counters = metrics.counters.lock();
            match counters.get_mut("bytes-read") {
                Some(offset) => *offset = self.offset,
                None => {
                    counters.insert("bytes-read".to_string(), self.offset);
                }
            }
            if let Some(json) = &self.json {
                counters.insert("bad-records".to_string(), json.bad);
            }
        }
        status
    }

    fn position(&self) -> Vec<u8> {
        self.offset.to_le_bytes().to_vec()
    }

    fn seek(&mut self, position: &[u8]) -> Result<()> {
        let offset = position_u64(position, "file source")?;
        let len = self.reader.get_ref().metadata()?.len();
        if offset > len {
            bail!(
                "cannot resume {} at byte {offset}: the file has only {len} bytes (was it replaced?)",
                self.path.display()
            );
        }
        self.reader.seek(SeekFrom::Start(offset))?;
        self.offset = offset;
        Ok(())
    }
}

/// What a [`GeneratorSource`] generates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Generated {
    /// Lines of `words` pseudo-words out of `vocabulary`, as text.
    Words {
        /// Words per line.
        words: usize,
        /// Distinct words.
        vocabulary: u64,
    },
    /// Lines `timestamp,key,value`: event time `index × step_ms`, made up to `jitter_ms`
    /// earlier (out of order), one of `keys` keys, a value 0–99.
    Events {
        /// Distinct keys.
        keys: u64,
        /// Event time between consecutive records.
        step_ms: i64,
        /// Most a timestamp is moved back.
        jitter_ms: i64,
    },
}

/// Generates `records` deterministic lines, spread over the subtasks (subtask *s* of *p*
/// generates records *s*, *s + p*, ...), optionally throttled to `rate` records per second
/// per subtask. A throttled generator emits fixed chunks of about a tenth of a second of
/// records, so where batches start and end — and with them the watermarks — does not
/// depend on timing.
pub struct GeneratorSource {
    total: u64,
    subtask: u64,
    parallelism: u64,
    /// Records this subtask has generated.
    done: u64,
    seed: u64,
    generated: Generated,
    rate: Option<f64>,
    started: Instant,
    line: String,
}

impl GeneratorSource {
    /// A generator for `subtask` of `parallelism`.
    pub fn new(
        total: u64,
        subtask: u32,
        parallelism: u32,
        seed: u64,
        generated: Generated,
        rate: Option<f64>,
    ) -> Self {
        GeneratorSource {
            total,
            subtask: u64::from(subtask),
            parallelism: u64::from(parallelism),
            done: 0,
            seed,
            generated,
            rate,
            started: Instant::now(),
            line: String::new(),
        }
    }

    fn index(&self) -> u64 {
        self.subtask + self.done * self.parallelism
    }

    fn generate(&mut self, index: u64) {
        match self.generated {
            Generated::Words { words, vocabulary } => {
                generated_line(self.seed, index, words, vocabulary, &mut self.line)
            }
            Generated::Events {
                keys,
                step_ms,
                jitter_ms,
            } => {
                use std::fmt::Write;
                let (ts, key, value) = generated_event(self.seed, index, keys, step_ms, jitter_ms);
                self.line.clear();
                let _ = write!(self.line, "{ts},k{key},{value}");
            }
        }
    }
}

/// Line `index` of a `words` generator: a pure function, so tests can compute the
/// expected input independently of the source.
pub fn generated_line(seed: u64, index: u64, words: usize, vocabulary: u64, out: &mut String) {
    out.clear();
    for w in 0..words as u64 {
        if w > 0 {
            out.push(' ');
        }
        let r = splitmix64(seed ^ splitmix64(index.wrapping_mul(1_000_003).wrapping_add(w)));
        // Zipf-like: small word numbers are much more frequent, as in text.
        let word = (r % vocabulary) * (r.rotate_left(17) % vocabulary) / vocabulary;
        push_word(word, out);
    }
}

/// Record `index` of an `events` generator as `(timestamp, key number, value)`.
pub fn generated_event(
    seed: u64,
    index: u64,
    keys: u64,
    step_ms: i64,
    jitter_ms: i64,
) -> (i64, u64, u64) {
    let r = splitmix64(seed ^ splitmix64(index));
    let jitter = if jitter_ms > 0 {
        (r.rotate_left(29) % (jitter_ms as u64 + 1)) as i64
    } else {
        0
    };
    let ts = index as i64 * step_ms - jitter;
    (ts, r % keys.max(1), r.rotate_left(41) % 100)
}

fn push_word(mut n: u64, out: &mut String) {
    const CONSONANTS: &[u8] = b"bdfgklmnprstvz";
    const VOWELS: &[u8] = b"aeiou";
    loop {
        out.push(CONSONANTS[(n % CONSONANTS.len() as u64) as usize] as char);
        n /= CONSONANTS.len() as u64;
        out.push(VOWELS[(n % VOWELS.len() as u64) as usize] as char);
        n /= VOWELS.len() as u64;
        if n == 0 {
            break;
        }
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Source for GeneratorSource {
    fn poll(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus> {
        let mut count = max as u64;
        if let Some(rate) = self.rate {
            // The next record is due `done / rate` seconds after the start.
            let due = self.started + Duration::from_secs_f64(self.done as f64 / rate);
            if Instant::now() < due {
                return Ok(SourceStatus::Idle {
                    retry_at: Some(due),
                });
            }
            count = count.min(((rate / 10.0).round() as u64).max(1));
        }
        for _ in 0..count {
            let index = self.index();
            if index >= self.total {
                return Ok(SourceStatus::End);
            }
            self.generate(index);
            out.push(None, self.line.as_bytes(), None);
            self.done += 1;
        }
        if self.index() >= self.total {
            return Ok(SourceStatus::End);
        }
        Ok(SourceStatus::More)
    }

    fn position(&self) -> Vec<u8> {
        self.done.to_le_bytes().to_vec()
    }

    fn seek(&mut self, position: &[u8]) -> Result<()> {
        self.done = position_u64(position, "generator source")?;
        // Keep the configured rate relative to the restored position.
        if let Some(rate) = self.rate {
            self.started = Instant::now() - Duration::from_secs_f64(self.done as f64 / rate);
        }
        Ok(())
    }
}

/// Reads lines from standard input on a helper thread. Not replayable: a job reading
/// stdin cannot resume from a checkpoint.
pub struct StdinSource {
    lines: Receiver<Vec<u8>>,
    wake: Receiver<()>,
    consumed: u64,
}

impl StdinSource {
    /// Starts reading standard input.
    pub fn start() -> Self {
        let (tx, lines) = bounded::<Vec<u8>>(1024);
        let (wake_tx, wake) = bounded(1);
        thread::Builder::new()
            .name("stdin source".into())
            .spawn(move || {
                let stdin = std::io::stdin();
                let mut lock = stdin.lock();
                loop {
                    let mut line = Vec::new();
                    match lock.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if line.ends_with(b"\n") {
                                line.pop();
                            }
                            if tx.send(line).is_err() {
                                break;
                            }
                            let _ = wake_tx.try_send(());
                        }
                    }
                }
                drop(tx);
                let _ = wake_tx.try_send(());
            })
            .expect("spawning the stdin reader");
        StdinSource {
            lines,
            wake,
            consumed: 0,
        }
    }
}

impl Source for StdinSource {
    fn poll(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus> {
        for _ in 0..max {
            match self.lines.try_recv() {
                Ok(line) => {
                    out.push(None, &line, None);
                    self.consumed += 1;
                }
                Err(TryRecvError::Empty) => {
                    return Ok(if out.is_empty() {
                        SourceStatus::Idle { retry_at: None }
                    } else {
                        SourceStatus::More
                    });
                }
                Err(TryRecvError::Disconnected) => return Ok(SourceStatus::End),
            }
        }
        Ok(SourceStatus::More)
    }

    fn position(&self) -> Vec<u8> {
        self.consumed.to_le_bytes().to_vec()
    }

    fn seek(&mut self, _position: &[u8]) -> Result<()> {
        bail!("the stdin source cannot resume from a checkpoint: standard input cannot be replayed")
    }

    fn waker(&self) -> Option<&Receiver<()>> {
        Some(&self.wake)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_codec::BatchReader;
    use std::io::Write;

    const WORDS: Generated = Generated::Words {
        words: 2,
        vocabulary: 50,
    };

    fn values(w: &BatchWriter) -> Vec<String> {
        BatchReader::new(w.as_bytes())
            .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn file_source_resumes_after_the_last_line_read() {
        let dir = std::env::temp_dir().join(format!("sluice-src-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("in.txt");
        File::create(&path)
            .unwrap()
            .write_all(b"one\r\ntwo\nthree\nlast-without-newline")
            .unwrap();
        let mut src = FileSource::open(&path).unwrap();
        let mut out = BatchWriter::new();
        assert_eq!(src.poll(&mut out, 2).unwrap(), SourceStatus::More);
        assert_eq!(values(&out), ["one", "two"]);
        let pos = src.position();
        let mut rest = BatchWriter::new();
        assert_eq!(src.poll(&mut rest, 10).unwrap(), SourceStatus::End);
        assert_eq!(values(&rest), ["three", "last-without-newline"]);

        let mut resumed = FileSource::open(&path).unwrap();
        resumed.seek(&pos).unwrap();
        let mut again = BatchWriter::new();
        resumed.poll(&mut again, 10).unwrap();
        assert_eq!(values(&again), ["three", "last-without-newline"]);
        assert!(resumed.seek(&10_000u64.to_le_bytes()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_of_messages_with_a_damaged_length_is_named_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        let format = FormatConfig {
            format: Format::Protobuf,
            schema: Some(crate::connectors::formats::SchemaText::plain(
                "syntax = \"proto3\"; message M { string s = 1; }",
            )),
            ..FormatConfig::bytes()
        };
        let read = |bytes: &[u8]| {
            let path = dir.path().join("in.pb");
            std::fs::write(&path, bytes).unwrap();
            let mut src = FileSource::open(&path)
                .unwrap()
                .with_format(&format)
                .unwrap();
            let mut out = BatchWriter::new();
            src.poll(&mut out, 10).map(|_| values(&out))
        };
        // "a" as a message: field 1, length 1, "a"; its length 3 as one varint byte, then
        // as a padded varint of two.
        assert_eq!(read(&[3, 0x0a, 1, b'a']).unwrap(), [r#"{"s":"a"}"#]);
        assert_eq!(read(&[0x83, 0, 0x0a, 1, b'a']).unwrap(), [r#"{"s":"a"}"#]);
        // Ten bytes whose last carries bits past 64: an error, not a length of 0.
        let mut past = vec![0x80; 9];
        past.push(0x02);
        let e = format!("{:#}", read(&past).unwrap_err());
        assert!(
            e.contains("the message at byte 0: its length is past 64 bits"),
            "{e}"
        );
        let e = format!("{:#}", read(&[0x80; 11]).unwrap_err());
        assert!(e.contains("its length is past 64 bits"), "{e}");
        let e = format!("{:#}", read(&[3, 0x0a]).unwrap_err());
        assert!(e.contains("the file ends inside it (3 bytes long)"), "{e}");
    }

    #[test]
    fn generator_subtasks_partition_the_records_and_resume() {
        let mut all = vec![];
        for s in 0..3 {
            let mut g = GeneratorSource::new(10, s, 3, 7, WORDS, None);
            let mut out = BatchWriter::new();
            while g.poll(&mut out, 4).unwrap() == SourceStatus::More {}
            all.extend(values(&out));
        }
        assert_eq!(all.len(), 10);
        let mut expected = vec![];
        let mut line = String::new();
        for i in 0..10 {
            generated_line(7, i, 2, 50, &mut line);
            expected.push(line.clone());
        }
        all.sort();
        expected.sort();
        assert_eq!(all, expected);

        let mut g = GeneratorSource::new(10, 0, 1, 7, WORDS, None);
        let mut first = BatchWriter::new();
        g.poll(&mut first, 4).unwrap();
        let mut h = GeneratorSource::new(10, 0, 1, 7, WORDS, None);
        h.seek(&g.position()).unwrap();
        let (mut a, mut b) = (BatchWriter::new(), BatchWriter::new());
        g.poll(&mut a, 100).unwrap();
        h.poll(&mut b, 100).unwrap();
        assert_eq!(values(&a), values(&b));
        assert_eq!(values(&a).len(), 6);
    }

    #[test]
    fn throttled_generator_goes_idle_until_its_next_chunk_is_due() {
        // 10 records per second: chunks of one record, one every 100 ms.
        let mut g = GeneratorSource::new(100, 0, 1, 1, WORDS, Some(10.0));
        let mut out = BatchWriter::new();
        assert_eq!(g.poll(&mut out, 100).unwrap(), SourceStatus::More);
        assert_eq!(out.len(), 1);
        match g.poll(&mut out, 100).unwrap() {
            SourceStatus::Idle { retry_at: Some(t) } => {
                assert!(t > Instant::now() + Duration::from_millis(50));
            }
            other => panic!("expected idle, got {other:?}"),
        }
        // 1000 records per second: chunks of 100, whatever the batch size above that.
        let mut g = GeneratorSource::new(1000, 0, 1, 1, WORDS, Some(1000.0));
        let mut out = BatchWriter::new();
        g.poll(&mut out, 1024).unwrap();
        assert_eq!(out.len(), 100);
    }

    #[test]
    fn events_are_csv_with_bounded_jitter() {
        let generated = Generated::Events {
            keys: 7,
            step_ms: 10,
            jitter_ms: 25,
        };
        let mut g = GeneratorSource::new(200, 0, 1, 3, generated, None);
        let mut out = BatchWriter::new();
        g.poll(&mut out, 1000).unwrap();
        for (i, line) in values(&out).iter().enumerate() {
            let fields: Vec<&str> = line.split(',').collect();
            let ts: i64 = fields[0].parse().unwrap();
            let in_order = i as i64 * 10;
            assert!((in_order - 25..=in_order).contains(&ts), "{line}");
            assert!(fields[1].starts_with('k') && fields[1][1..].parse::<u64>().unwrap() < 7);
            assert!(fields[2].parse::<u64>().unwrap() < 100);
        }
    }
}
