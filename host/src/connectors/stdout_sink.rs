//! Writes records as lines to standard output (at-least-once: stdout cannot be rolled
//! back).

use std::io::Write;

use sluice_codec::BatchReader;

use super::LineFormat;
use crate::chain::{CallError, CallOutput, OpenInfo, Operator, OperatorIdentity, OperatorState};

/// The stdout sink. A closed pipe (`sluice run job.toml | head`) is not an error: the
/// rest of the output is discarded.
pub struct StdoutSink {
    identity: OperatorIdentity,
    state: OperatorState,
    format: LineFormat,
    line: Vec<u8>,
    closed: bool,
}

impl StdoutSink {
    /// A stdout sink writing in `format`.
    pub fn new(identity: OperatorIdentity, format: LineFormat) -> Self {
        StdoutSink {
            identity,
            state: OperatorState::new(None),
            format,
            line: Vec::new(),
            closed: false,
        }
    }

    fn write(&mut self) -> Result<(), CallError> {
        if self.closed || self.line.is_empty() {
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        match out.write_all(&self.line).and_then(|()| out.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(CallError::Failed(format!("writing to stdout: {e}"))),
        }
    }
}

impl Operator for StdoutSink {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }

    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }

    fn open(&mut self, _info: &OpenInfo) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        self.line.clear();
        for record in BatchReader::new(records) {
            let record = record.map_err(|e| CallError::Contract(e.to_string()))?;
            self.format
                .write(&record, &mut self.line)
                .map_err(|why| CallError::Failed(format!("standard output: {why}")))?;
        }
        self.write()?;
        Ok(CallOutput::default())
    }

    fn process_watermark(&mut self, _watermark: i64) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn on_timers(&mut self, _timers: &[u8]) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn snapshot(&mut self, _checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        Ok(Vec::new())
    }

    fn notify_complete(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        Ok(())
    }

    fn notify_aborted(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        Ok(())
    }

    fn finish(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn close(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn dispose(&mut self) -> Result<(), CallError> {
        Ok(())
    }
}
