//! Guest standard output and error: written to the host's log, tagged with the operator,
//! rate-limited, and the tail of stderr kept for error messages (a Rust guest's panic
//! message exists only there).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::chain::OperatorIdentity;

/// How much of stderr is kept for error messages.
const TAIL_BYTES: usize = 8 << 10;
/// A line longer than this is logged in pieces.
const MAX_LINE: usize = 4 << 10;

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `stdout`
    Stdout,
    /// `stderr`
    Stderr,
}

/// Allows `rate` log lines per second per operator instance, a line counting once per
/// KiB begun (so long lines cannot flood the host log at the same rate as short ones);
/// counts the lines it drops.
#[derive(Debug)]
pub struct LogRate {
    rate: u32,
    window_start: Instant,
    in_window: u32,
    /// Lines dropped since the instance started.
    pub dropped: u64,
}

impl LogRate {
    /// A limiter for `rate` lines per second.
    pub fn new(rate: u32) -> Self {
        LogRate {
            rate,
            window_start: Instant::now(),
            in_window: 0,
            dropped: 0,
        }
    }

    /// Whether one more line may be logged now. When a window ends with drops, the first
    /// line of the next window is preceded by a note of how many were dropped.
    pub fn admit(&mut self, identity: &OperatorIdentity, bytes: usize) -> bool {
        if self.window_start.elapsed().as_secs() >= 1 {
            if self.in_window > self.rate {
                tracing::warn!(
                    tenant = %identity.tenant, job = %identity.job, operator = %identity.operator,
                    subtask = identity.subtask,
                    "dropped log lines of this operator over the rate of {} lines (KiB) per second",
                    self.rate
                );
            }
            self.window_start = Instant::now();
            self.in_window = 0;
        }
        let units = u32::try_from(1 + bytes / 1024).unwrap_or(u32::MAX);
        self.in_window = self.in_window.saturating_add(units);
        if self.in_window > self.rate {
            self.dropped += 1;
            false
        } else {
            true
        }
    }
}

/// State shared by an instance's stdout and stderr streams.
#[derive(Debug)]
pub struct GuestOutput {
    identity: OperatorIdentity,
    partial: [Vec<u8>; 2],
    stderr_tail: VecDeque<u8>,
    rate: LogRate,
}

impl GuestOutput {
    /// Output of the instance `identity`, logging at most `lines_per_second`.
    pub fn new(identity: OperatorIdentity, lines_per_second: u32) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(GuestOutput {
            identity,
            partial: [Vec::new(), Vec::new()],
            stderr_tail: VecDeque::new(),
            rate: LogRate::new(lines_per_second),
        }))
    }

    fn write(&mut self, stream: Stream, bytes: &[u8]) {
        if stream == Stream::Stderr {
            self.stderr_tail.extend(bytes);
            let excess = self.stderr_tail.len().saturating_sub(TAIL_BYTES);
            self.stderr_tail.drain(..excess);
        }
        let idx = stream as usize;
        for &b in bytes {
            if b == b'\n' || self.partial[idx].len() >= MAX_LINE {
                let line = std::mem::take(&mut self.partial[idx]);
                self.log_line(stream, &line);
                if b != b'\n' {
                    self.partial[idx].push(b);
                }
            } else {
                self.partial[idx].push(b);
            }
        }
    }

    fn log_line(&mut self, stream: Stream, line: &[u8]) {
        if !self.rate.admit(&self.identity, line.len()) {
            return;
        }
        let line = String::from_utf8_lossy(line);
        let line = crate::guest_text::printable(&line);
        let id = &self.identity;
        let stream = match stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        };
        tracing::info!(
            target: "sluice::guest",
            tenant = %id.tenant, job = %id.job, operator = %id.operator, subtask = id.subtask,
            stream, "{line}"
        );
    }

    /// The last few KiB written to stderr.
    pub fn stderr_tail(&self) -> String {
        let (a, b) = self.stderr_tail.as_slices();
        let mut bytes = a.to_vec();
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Forgets stderr written so far (called when a call starts, so that an error
    /// message only quotes what the failing call wrote).
    pub fn clear_stderr_tail(&mut self) {
        self.stderr_tail.clear();
    }

    /// The rate limiter, shared with the `log` import.
    pub fn rate(&mut self) -> &mut LogRate {
        &mut self.rate
    }

    /// The instance this output belongs to.
    pub fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }
}

/// The panic message in a Rust guest's stderr, if there is one: the text after the last
/// `panicked at <location>:` line, without the backtrace hint.
pub fn panic_message(stderr: &str) -> Option<String> {
    let start = stderr.rfind("panicked at ")?;
    let rest = &stderr[start..];
    let rest = rest.split_once('\n').map_or(rest, |(location, message)| {
        if message.trim().is_empty() {
            location
        } else {
            message
        }
    });
    let message = rest
        .split("\nnote: run with `RUST_BACKTRACE")
        .next()
        .unwrap_or(rest)
        .trim();
    Some(message.to_string())
}

/// One of an instance's output streams, as WASI sees it.
#[derive(Debug, Clone)]
pub struct GuestPipe {
    output: Arc<Mutex<GuestOutput>>,
    stream: Stream,
}

impl GuestPipe {
    /// The `stream` of `output`.
    pub fn new(output: Arc<Mutex<GuestOutput>>, stream: Stream) -> Self {
        GuestPipe { output, stream }
    }

    fn write_bytes(&self, bytes: &[u8]) {
        self.output.lock().write(self.stream, bytes);
    }
}

impl IsTerminal for GuestPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for GuestPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_bytes(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestPipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write_bytes(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_the_panic_message_from_rust_stderr() {
        let stderr = "some log\nthread '<unnamed>' panicked at plugins/x/src/lib.rs:12:9:\n\
                      test-misbehave: deliberate panic in process\n\
                      note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            panic_message(stderr).unwrap(),
            "test-misbehave: deliberate panic in process"
        );
        assert_eq!(panic_message("nothing here"), None);
    }

    #[test]
    fn keeps_only_the_tail_of_stderr() {
        let out = GuestOutput::new(
            OperatorIdentity {
                tenant: "t".into(),
                job: "j".into(),
                operator: "o".into(),
                subtask: 0,
                parallelism: 1,
            },
            0,
        );
        let mut out = out.lock();
        out.write(Stream::Stderr, &vec![b'a'; TAIL_BYTES]);
        out.write(Stream::Stderr, b"end");
        let tail = out.stderr_tail();
        assert_eq!(tail.len(), TAIL_BYTES);
        assert!(tail.ends_with("aaend"));
        // Rate 0: every line is dropped and counted (the 8 KiB stderr run counted as
        // two lines of at most 4 KiB).
        assert_eq!(out.rate().dropped, 2);
        out.write(Stream::Stdout, b"one\ntwo\n");
        assert_eq!(out.rate().dropped, 4);
    }
}
