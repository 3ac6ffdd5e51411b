//! A file sink with exactly-once output through two-phase commit.
//!
//! Records go to an in-progress staging file. At a checkpoint (`snapshot`, the
//! pre-commit) the staging file is sealed under the checkpoint's id; when that checkpoint
//! is complete (`notify-complete`, the commit) the sealed files are appended to the output
//! file in order. The sink's checkpointed state is the output length before the pending
//! commits and the sizes of the pending files, which is enough to recover after a crash at
//! any point:
//!
//! * the output is as long as the checkpoint accounts for: go on;
//! * the output is shorter (the crash hit before or during the pending commits): cut back
//!   a partial append and append the rest. A staging file is deleted only after its append
//!   was made durable, so the ones needed still exist;
//! * the output is longer: it holds commits of later checkpoints, so restoring this one
//!   would take back committed output. That is refused ([`CallError::Unrecoverable`])
//!   unless the job was started with `allow_rewind`: then the output as it was is kept
//!   as a new file generation (`out.tsv.1`, ...) and the job goes on in a copy cut back to
//!   the checkpoint.
//!
//! Committed output is never truncated or deleted: a fresh start refuses an existing
//! output file (the job runner moves earlier output aside first when asked to).
//! Without checkpointing, the whole output stays in the staging file and becomes the
//! output file only when the input ended: a failed job never leaves a partial output.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sluice_codec::BatchReader;

use super::LineFormat;
use super::avro_file::AvroBlocks;
use super::formats::{self, Proto, protobuf};
use crate::chain::{CallError, CallOutput, OpenInfo, Operator, OperatorIdentity, OperatorState};
use crate::job::FileOutput;

/// The file sink's checkpointed state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkState {
    /// Length of the output file with all commits before the pending ones.
    pub base_len: u64,
    /// Sealed staging files not yet appended: `(checkpoint id, length)`.
    pub pending: Vec<(u64, u64)>,
}

/// Writes records as lines to a file, exactly once (see the module docs).
pub struct FileSink {
    identity: OperatorIdentity,
    state: OperatorState,
    format: LineFormat,
    output: PathBuf,
    staging: PathBuf,
    transactional: bool,
    allow_rewind: bool,
    in_progress: Option<BufWriter<File>>,
    in_progress_len: u64,
    sink: SinkState,
    line: Vec<u8>,
    /// `format = "avro"`: the values go into an Avro object container file, not lines.
    avro: Option<AvroBlocks>,
    /// `format = "protobuf"`: each value is written as a length-delimited message.
    protobuf: Option<prost_reflect::MessageDescriptor>,
    /// A message being encoded.
    message: Vec<u8>,
}

impl FileSink {
    /// A sink writing to `output` (subtask files get `-<index>` before the extension when
    /// the sink has more than one subtask). `transactional` when the job checkpoints;
    /// `allow_rewind` lets a restore take back committed output (kept as a generation).
    pub fn new(
        identity: OperatorIdentity,
        output: &Path,
        format: LineFormat,
        transactional: bool,
        allow_rewind: bool,
    ) -> Self {
        let output = output_path(output, identity.subtask, identity.parallelism);
        let staging = staging_path(&output);
        FileSink {
            identity,
            state: OperatorState::new(None),
            format,
            output,
            staging,
            transactional,
            allow_rewind,
            in_progress: None,
            in_progress_len: 0,
            sink: SinkState::default(),
            line: Vec::new(),
            avro: None,
            protobuf: None,
            message: Vec::new(),
        }
    }

    /// Writes what `output` says instead of lines, each record's value (JSON) encoded
    /// with its schema (keys are not written): an Avro object container file, or
    /// length-delimited Protobuf messages (each a varint of its length, then the message,
    /// as Java's `writeDelimitedTo` writes them).
    pub fn with_output(mut self, output: &FileOutput) -> Result<Self> {
        match output {
            FileOutput::Avro { schema, codec } => {
                self.avro = Some(
                    AvroBlocks::new(schema, *codec, &self.output)
                        .with_context(|| format!("the Avro schema of {}", self.output.display()))?,
                );
            }
            FileOutput::Protobuf { schema, message } => {
                let proto = Proto::parse_with(schema)
                    .and_then(|proto| proto.message(message.as_deref()))
                    .with_context(|| format!("the .proto schema of {}", self.output.display()))?;
                self.protobuf = Some(proto);
            }
        }
        Ok(self)
    }

    /// The file this subtask writes.
    pub fn output_path(&self) -> &Path {
        &self.output
    }

    fn in_progress_path(&self) -> PathBuf {
        self.staging.join("in-progress")
    }

    fn sealed_path(&self, id: u64) -> PathBuf {
        self.staging.join(format!("{id:020}.part"))
    }

    fn start_in_progress(&mut self) -> Result<()> {
        let path = self.in_progress_path();
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        self.in_progress = Some(BufWriter::with_capacity(256 << 10, file));
        self.in_progress_len = 0;
        if let Some(avro) = &self.avro
            && self.sink.base_len == 0
            && self.sink.pending.is_empty()
        {
            // Nothing is before this file in the output: it starts the container.
            self.line.clear();
            avro.header(&mut self.line);
            self.write_line()?;
        }
        Ok(())
    }

    /// Appends `self.line` to the in-progress file.
    fn write_line(&mut self) -> std::io::Result<()> {
        let w = self
            .in_progress
            .as_mut()
            .ok_or_else(|| std::io::Error::other("sink used before open"))?;
        w.write_all(&self.line)?;
        self.in_progress_len += self.line.len() as u64;
        self.line.clear();
        Ok(())
    }

    /// Ends the Avro block being written, so that what is sealed or committed next is
    /// whole blocks.
    fn finish_avro_block(&mut self) -> std::io::Result<()> {
        if let Some(avro) = &mut self.avro {
            self.line.clear();
            avro.finish_block(&mut self.line)
                .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
            self.write_line()?;
        }
        Ok(())
    }

    /// Flushes and fsyncs the in-progress file.
    fn sync_in_progress(&mut self) -> Result<()> {
        if let Some(w) = self.in_progress.as_mut() {
            w.flush()?;
            w.get_ref().sync_data()?;
        }
        Ok(())
    }

    fn recover(&mut self, restored: Option<&[u8]>, attempt: u32) -> Result<(), CallError> {
        let io = |context: &str, e: anyhow::Error| {
            CallError::Failed(format!("{context} ({}): {e:#}", self.output.display()))
        };
        if let Some(parent) = self.output.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))
                .map_err(|e| io("cannot open the output", e))?;
        }
        fs::create_dir_all(&self.staging)
            .with_context(|| format!("creating {}", self.staging.display()))
            .map_err(|e| io("cannot open the output", e))?;
        let Some(bytes) = restored else {
            return self.start_fresh(attempt);
        };
        let restored: SinkState = postcard::from_bytes(bytes).map_err(|e| {
            CallError::Failed(format!("decoding the file sink's checkpointed state: {e}"))
        })?;
        let current = fs::metadata(&self.output).map(|m| m.len()).unwrap_or(0);
        let appended = match plan_recovery(current, &restored) {
            Recovery::Appended(n) => n,
            Recovery::Rewind { target } if self.allow_rewind => {
                let kept =
                    rewind(&self.output, target).map_err(|e| io("cannot rewind the output", e))?;
                tracing::warn!(
                    "{}: output rewound to the restored checkpoint; the output as it was is kept in {}",
                    self.identity,
                    kept.display()
                );
                restored.pending.len()
            }
            Recovery::Rewind { target } => {
                return Err(CallError::Unrecoverable(format!(
                    "{}: {}",
                    self.output.display(),
                    rewind_refusal(current, target)
                )));
            }
            Recovery::Missing => {
                return Err(CallError::Unrecoverable(format!(
                    "{}: it has {current} bytes, but the checkpoint says {} were committed (was the \
                     output moved or changed by someone else?)",
                    self.output.display(),
                    restored.base_len
                )));
            }
        };
        let len = restored.base_len
            + restored.pending[..appended]
                .iter()
                .map(|p| p.1)
                .sum::<u64>();
        self.finish_recovery(&restored, appended, len)
            .map_err(|e| self.err("cannot recover the output", e))
    }

    /// A start without restored state: no output may exist yet, except what this run's
    /// own earlier attempt wrote without checkpoints. Staged files are not committed
    /// output (a job that has a complete checkpoint is restored, or its staging folder
    /// was moved aside before a fresh start): they are cleared.
    fn start_fresh(&mut self, attempt: u32) -> Result<(), CallError> {
        let exists = fs::metadata(&self.output).is_ok();
        if exists && (self.transactional || attempt == 0) {
            return Err(CallError::Unrecoverable(format!(
                "{} already exists and the job starts from scratch; it is left as it is \
                 (resume the job from its latest checkpoint, or start it with --fresh to move \
                 the earlier output aside)",
                self.output.display()
            )));
        }
        (|| -> Result<()> {
            clear_dir(&self.staging, &[])?;
            if exists {
                // An earlier attempt of this run finished without checkpoints.
                remove_if_exists(&self.output)?;
            }
            Ok(())
        })()
        .map_err(|e| self.err("cannot open the output", e))
    }

    /// Cuts the output back to `len` (a partial append) and appends the pending files
    /// from `appended` on: their checkpoint is complete, since it is being restored.
    fn finish_recovery(&mut self, restored: &SinkState, appended: usize, len: u64) -> Result<()> {
        let current = fs::metadata(&self.output).map(|m| m.len()).unwrap_or(0);
        if current > len {
            truncate(&self.output, len)?;
        }
        self.sink = SinkState {
            base_len: len,
            pending: restored.pending[appended..].to_vec(),
        };
        let keep: Vec<PathBuf> = self
            .sink
            .pending
            .iter()
            .map(|p| self.sealed_path(p.0))
            .collect();
        for path in &keep {
            if !path.exists() {
                bail!(
                    "staging file {} of a checkpointed commit is missing",
                    path.display()
                );
            }
        }
        clear_dir(&self.staging, &keep)?;
        self.commit_up_to(u64::MAX)
    }

    /// Appends the sealed files with id ≤ `id` to the output, oldest first.
    fn commit_up_to(&mut self, id: u64) -> Result<()> {
        while let Some(&(pid, size)) = self.sink.pending.first() {
            if pid > id {
                break;
            }
            let sealed = self.sealed_path(pid);
            self.append_file(&sealed, size)?;
            self.sink.pending.remove(0);
            crate::failpoint!("sink::commit");
        }
        Ok(())
    }

    /// Appends `file` (of `size` bytes) to the output durably, then deletes it.
    fn append_file(&mut self, file: &Path, size: u64) -> Result<()> {
        crate::failpoint!("sink::append");
        let output_len = fs::metadata(&self.output).map(|m| m.len()).ok();
        if output_len.is_none_or(|l| l == 0) && self.sink.base_len == 0 {
            // First commit: the staging file becomes the output.
            fs::rename(file, &self.output).with_context(|| {
                format!("moving {} to {}", file.display(), self.output.display())
            })?;
        } else {
            let mut out = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.output)
                .with_context(|| format!("opening {}", self.output.display()))?;
            let mut src =
                File::open(file).with_context(|| format!("opening {}", file.display()))?;
            std::io::copy(&mut src, &mut out)?;
            out.sync_data()?;
            fs::remove_file(file)?;
        }
        sync_dir(self.output.parent())?;
        self.sink.base_len += size;
        Ok(())
    }

    /// Pre-commit: seals the in-progress file under `checkpoint_id`.
    fn seal(&mut self, checkpoint_id: u64) -> Result<()> {
        self.finish_avro_block()?;
        self.sync_in_progress()?;
        self.in_progress = None;
        fs::rename(self.in_progress_path(), self.sealed_path(checkpoint_id))?;
        sync_dir(Some(&self.staging))?;
        self.sink
            .pending
            .push((checkpoint_id, self.in_progress_len));
        self.start_in_progress()
    }

    /// End of input: commits everything, including the in-progress file.
    fn commit_all(&mut self) -> Result<()> {
        self.commit_up_to(u64::MAX)?;
        self.finish_avro_block()?;
        self.sync_in_progress()?;
        self.in_progress = None;
        let len = self.in_progress_len;
        self.append_file(&self.in_progress_path(), len)?;
        self.in_progress_len = 0;
        Ok(())
    }

    /// `process` of an Avro sink: each value into the block, a full block written out.
    fn process_avro(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        for record in BatchReader::new(records) {
            let record = record.map_err(|e| CallError::Contract(e.to_string()))?;
            let avro = self.avro.as_mut().expect("an Avro sink");
            let full = avro.push(record.value).map_err(|e| {
                CallError::Failed(format!(
                    "{}: the value {} does not fit the sink's Avro schema: {e:#}",
                    self.output.display(),
                    formats::quoted(record.value)
                ))
            })?;
            if full {
                self.finish_avro_block().map_err(|e| self.write_failed(e))?;
            }
        }
        crate::failpoint!("sink::write");
        Ok(CallOutput::default())
    }

    fn write_failed(&self, e: std::io::Error) -> CallError {
        CallError::Failed(format!("writing {}: {e}", self.output.display()))
    }

    fn err(&self, context: &str, e: anyhow::Error) -> CallError {
        CallError::Failed(format!("{context} ({}): {e:#}", self.output.display()))
    }
}

/// What restoring a sink's checkpointed state does to an output of `current` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The output holds everything committed before the checkpoint and the first `n`
    /// of its pending files (a crash came before or during their append): the rest is
    /// appended, a partly appended one again.
    Appended(usize),
    /// The output holds commits of later checkpoints: `target` bytes are the
    /// checkpoint's.
    Rewind {
        /// The length the checkpoint accounts for.
        target: u64,
    },
    /// The output is shorter than what was committed before the checkpoint.
    Missing,
}

/// Decides how an output of `current` bytes recovers to `state`.
pub fn plan_recovery(current: u64, state: &SinkState) -> Recovery {
    let target = state.base_len + state.pending.iter().map(|p| p.1).sum::<u64>();
    if current > target {
        return Recovery::Rewind { target };
    }
    if current < state.base_len {
        return Recovery::Missing;
    }
    let mut len = state.base_len;
    let mut appended = 0;
    for &(_, size) in &state.pending {
        if len + size > current {
            break;
        }
        len += size;
        appended += 1;
    }
    Recovery::Appended(appended)
}

/// Why a restore that would take back committed output is refused.
pub fn rewind_refusal(current: u64, target: u64) -> String {
    format!(
        "it holds {current} bytes of committed output, but the checkpoint being restored \
         accounts for only {target}: restoring it would take back output that later \
         checkpoints committed. Resume from the latest checkpoint instead, or allow the \
         rewind (--allow-rewind; on the server, allow_rewind=true), which keeps the current output as a new file generation \
         and continues from the checkpoint's"
    )
}

/// Keeps `output` as it is under the next free generation name and makes `output` a
/// copy of its first `len` bytes. Returns the generation's path.
fn rewind(output: &Path, len: u64) -> Result<PathBuf> {
    let kept = next_generation(&[output.to_path_buf()])
        .into_iter()
        .next()
        .expect("one path in, one out");
    fs::rename(output, &kept)
        .with_context(|| format!("moving {} to {}", output.display(), kept.display()))?;
    let mut src = File::open(&kept)?;
    let mut dst = File::create(output)?;
    std::io::copy(&mut std::io::Read::take(&mut src, len), &mut dst)?;
    dst.sync_all()?;
    sync_dir(output.parent())?;
    Ok(kept)
}

/// The names `paths` get when moved aside together: each with `.N` appended, for the
/// smallest `N` free for all of them.
pub fn next_generation(paths: &[PathBuf]) -> Vec<PathBuf> {
    let with = |p: &Path, n: u32| {
        let mut name = p.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{n}"));
        p.with_file_name(name)
    };
    let n = (1..)
        .find(|&n| {
            paths
                .iter()
                .all(|p| fs::symlink_metadata(with(p, n)).is_err())
        })
        .expect("some generation is free");
    paths.iter().map(|p| with(p, n)).collect()
}

/// The file subtask `subtask` of `parallelism` writes for a sink with output `path`.
pub fn output_path(path: &Path, subtask: u32, parallelism: u32) -> PathBuf {
    if parallelism > 1 {
        subtask_path(path, subtask)
    } else {
        path.to_path_buf()
    }
}

/// The staging folder of an output file.
pub fn staging_path(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    output.with_file_name(format!(".{name}.pending"))
}

fn subtask_path(path: &Path, subtask: u32) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{subtask}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{subtask}"),
    };
    path.with_file_name(name)
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

fn truncate(path: &Path, len: u64) -> Result<()> {
    if len == 0 {
        return remove_if_exists(path);
    }
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.set_len(len)?;
    f.sync_data()?;
    Ok(())
}

fn clear_dir(dir: &Path, keep: &[PathBuf]) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if !keep.contains(&path) {
            remove_if_exists(&path)?;
        }
    }
    Ok(())
}

fn sync_dir(dir: Option<&Path>) -> Result<()> {
    let dir = dir
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()?;
    Ok(())
}

impl Operator for FileSink {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }

    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }

    fn open(&mut self, info: &OpenInfo) -> Result<CallOutput, CallError> {
        self.recover(info.restored_state.as_deref(), info.attempt)?;
        if info.restored_state.is_some() {
            crate::failpoint!("restore::after-sink-recovery");
        }
        self.start_in_progress()
            .map_err(|e| self.err("cannot open the output", e))?;
        Ok(CallOutput::default())
    }

    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        if self.avro.is_some() {
            return self.process_avro(records);
        }
        self.line.clear();
        for record in BatchReader::new(records) {
            let record = record.map_err(|e| CallError::Contract(e.to_string()))?;
            match &self.protobuf {
                Some(descriptor) => {
                    self.message.clear();
                    protobuf::json_to_message(descriptor, record.value, &mut self.message)
                        .map_err(|e| {
                            CallError::Failed(format!(
                                "{}: the value {}: {e}",
                                self.output.display(),
                                formats::quoted(record.value),
                            ))
                        })?;
                    prost::encoding::encode_varint(self.message.len() as u64, &mut self.line);
                    self.line.extend_from_slice(&self.message);
                }
                None => self.format.write(&record, &mut self.line).map_err(|why| {
                    CallError::Failed(format!("{}: {why}", self.output.display()))
                })?,
            }
        }
        crate::failpoint!("sink::write");
        self.write_line().map_err(|e| self.write_failed(e))?;
        Ok(CallOutput::default())
    }

    fn process_watermark(&mut self, _watermark: i64) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn on_timers(&mut self, _timers: &[u8]) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        if !self.transactional {
            return Ok(Vec::new());
        }
        self.seal(checkpoint_id)
            .map_err(|e| self.err("cannot pre-commit output", e))?;
        crate::failpoint!("sink::after-pre-commit");
        postcard::to_allocvec(&self.sink).map_err(|e| CallError::Failed(e.to_string()))
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        self.commit_up_to(checkpoint_id)
            .map_err(|e| self.err("cannot commit output", e))
    }

    fn notify_aborted(&mut self, _checkpoint_id: u64) -> Result<(), CallError> {
        // The aborted checkpoint's data stays pending; the next completed checkpoint
        // commits it.
        Ok(())
    }

    fn finish(&mut self) -> Result<CallOutput, CallError> {
        // With checkpoints the tail is committed by the final checkpoint.
        if !self.transactional {
            self.commit_all()
                .map_err(|e| self.err("cannot commit the final output", e))?;
        }
        Ok(CallOutput::default())
    }

    fn close(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn dispose(&mut self) -> Result<(), CallError> {
        // Uncommitted data of a failed run is thrown away; sealed files stay for recovery.
        if self.in_progress.take().is_some() {
            let _ = fs::remove_file(self.in_progress_path());
        }
        if !self.transactional || self.sink.pending.is_empty() {
            let _ = fs::remove_dir(&self.staging);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_codec::BatchWriter;

    fn identity() -> OperatorIdentity {
        OperatorIdentity {
            tenant: "t".into(),
            job: "j".into(),
            operator: "sink".into(),
            subtask: 0,
            parallelism: 1,
        }
    }

    fn batch(values: &[&str]) -> Vec<u8> {
        let mut w = BatchWriter::new();
        for v in values {
            w.push(None, v.as_bytes(), None);
        }
        w.into_bytes()
    }

    fn open(path: &Path, restored: Option<Vec<u8>>) -> FileSink {
        let mut sink = FileSink::new(identity(), path, LineFormat::Value, true, false);
        sink.open(&OpenInfo {
            restored_state: restored,
            ..OpenInfo::default()
        })
        .unwrap();
        sink
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_default()
    }

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-sink-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn output_appears_only_when_committed() {
        let dir = tempdir("commit");
        let out = dir.join("out.txt");
        let mut sink = open(&out, None);
        sink.process(&batch(&["a", "b"])).unwrap();
        sink.snapshot(1).unwrap();
        sink.process(&batch(&["c"])).unwrap();
        assert_eq!(read(&out), "");
        sink.notify_complete(1).unwrap();
        assert_eq!(read(&out), "a\nb\n");
        sink.snapshot(2).unwrap();
        sink.notify_aborted(2).unwrap();
        sink.process(&batch(&["d"])).unwrap();
        sink.snapshot(3).unwrap();
        assert_eq!(read(&out), "a\nb\n");
        // Completing 3 commits the data of the aborted checkpoint 2 too.
        sink.notify_complete(3).unwrap();
        assert_eq!(read(&out), "a\nb\nc\nd\n");
        sink.process(&batch(&["e"])).unwrap();
        sink.finish().unwrap();
        // The tail is committed by the final checkpoint, not by the end of input.
        assert_eq!(read(&out), "a\nb\nc\nd\n");
        sink.snapshot(4).unwrap();
        sink.notify_complete(4).unwrap();
        sink.dispose().unwrap();
        assert_eq!(read(&out), "a\nb\nc\nd\ne\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn restoring_an_older_checkpoint_never_takes_back_committed_output() {
        let dir = tempdir("rewind");
        let out = dir.join("out.txt");
        let mut sink = open(&out, None);
        sink.process(&batch(&["a"])).unwrap();
        let state = sink.snapshot(1).unwrap();
        sink.notify_complete(1).unwrap();
        sink.process(&batch(&["b"])).unwrap();
        sink.snapshot(2).unwrap();
        sink.notify_complete(2).unwrap();
        assert_eq!(read(&out), "a\nb\n");
        // Restoring checkpoint 1 would take "b" back, which checkpoint 2 committed.
        drop(sink);
        let mut refused = FileSink::new(identity(), &out, LineFormat::Value, true, false);
        let err = refused
            .open(&OpenInfo {
                restored_state: Some(state.clone()),
                ..OpenInfo::default()
            })
            .unwrap_err();
        assert!(matches!(err, CallError::Unrecoverable(_)), "{err}");
        assert!(err.to_string().contains("--allow-rewind"), "{err}");
        assert_eq!(read(&out), "a\nb\n");
        // Allowed: the output as it was stays as a generation, the job goes on from "a".
        let mut rewound = FileSink::new(identity(), &out, LineFormat::Value, true, true);
        rewound
            .open(&OpenInfo {
                restored_state: Some(state),
                ..OpenInfo::default()
            })
            .unwrap();
        assert_eq!(read(&out), "a\n");
        assert_eq!(read(&dir.join("out.txt.1")), "a\nb\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fresh_start_leaves_an_existing_output_alone() {
        let dir = tempdir("fresh");
        let out = dir.join("out.txt");
        fs::write(&out, "precious\n").unwrap();
        for transactional in [true, false] {
            let mut sink = FileSink::new(identity(), &out, LineFormat::Value, transactional, false);
            let err = sink.open(&OpenInfo::default()).unwrap_err();
            assert!(err.to_string().contains("already exists"), "{err}");
            sink.dispose().unwrap();
            assert_eq!(read(&out), "precious\n");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn recovery_completes_commits_the_crash_interrupted() {
        let dir = tempdir("complete");
        let out = dir.join("out.txt");
        let mut sink = open(&out, None);
        sink.process(&batch(&["a"])).unwrap();
        sink.snapshot(1).unwrap();
        sink.notify_complete(1).unwrap();
        sink.process(&batch(&["b", "c"])).unwrap();
        // Checkpoint 2 completed, but the process died before notify-complete(2).
        let state = sink.snapshot(2).unwrap();
        drop(sink);
        // A partial append of checkpoint 2's file is also cut back and redone.
        OpenOptions::new()
            .append(true)
            .open(&out)
            .unwrap()
            .write_all(b"b\n")
            .unwrap();
        let _sink = open(&out, Some(state));
        assert_eq!(read(&out), "a\nb\nc\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_checkpoints_a_failed_run_leaves_no_output() {
        let dir = tempdir("plain");
        let out = dir.join("out.txt");
        let mut sink = FileSink::new(identity(), &out, LineFormat::KeyValue, false, false);
        sink.open(&OpenInfo::default()).unwrap();
        let mut w = BatchWriter::new();
        w.push(Some(b"word"), b"3", None);
        sink.process(&w.into_bytes()).unwrap();
        sink.dispose().unwrap();
        assert!(!out.exists());
        let mut sink = FileSink::new(identity(), &out, LineFormat::KeyValue, false, false);
        sink.open(&OpenInfo::default()).unwrap();
        let mut w = BatchWriter::new();
        w.push(Some(b"word"), b"3", None);
        sink.process(&w.into_bytes()).unwrap();
        sink.finish().unwrap();
        sink.dispose().unwrap();
        assert_eq!(read(&out), "word\t3\n");
        fs::remove_dir_all(&dir).unwrap();
    }
}
