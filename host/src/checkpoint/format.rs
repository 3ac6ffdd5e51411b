//! The file format of one operator instance's state in a checkpoint.
//!
//! ```text
//! file      := "SLUICEST" version:u32 operator:bytes state:bytes64 watermark:i64
//!              descriptors keyed timers
//! descriptors := count:u32 (name:bytes kind:u8 has_ttl:u8 ttl:u64)*
//! keyed     := 0 | 1 first_key_group:u32 groups:u32 (key_group:u32 count:u64 entry*)*
//!              | 2 first_key_group:u32 end_key_group:u32 taken_at:i64 count:u32 db_file*
//! entry     := composite_key:bytes value:bytes written_at:i64
//! db_file   := name:bytes size:u64 crc32:u32 (0 bytes:bytes64 | 1 shared_name:bytes)
//! timers    := count:u64 (domain:u8 timestamp:i64 key:bytes)*
//! ```
//! Integers are little-endian; `bytes` is a u32 length and the bytes, `bytes64` the same
//! with a u64 length. The file is streamed while it is written (a state of millions of
//! keys is never materialized as one buffer) and its CRC-32 is recorded in the
//! checkpoint's metadata, so a torn or altered file is detected before it is used.
//!
//! Keyed state comes as entries (`1`: the heap backend's, and every savepoint's, so a
//! savepoint is self-contained and either backend reads it) or as the manifest of an LSM
//! instance's database (`2`: a checkpoint's, whose table files are in the checkpoint
//! storage's shared folder).

use std::io::{self, Read, Write};

use anyhow::{Context, Result, bail};
use sluice_codec::TimeDomain;

use super::snapshot::OperatorSnapshot;
use crate::state::lsm::{DbFile, LsmFiles, LsmSnapshot, Place};
use crate::state::{Entry, KeyedSnapshot, KeyedStateSnapshot, StateDescriptor, StateKind};
use crate::timers::TimerQueues;

const MAGIC: &[u8; 8] = b"SLUICEST";
const VERSION: u32 = 1;

/// A writer that counts bytes and computes their CRC-32.
pub struct CrcWriter<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> CrcWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        CrcWriter {
            inner,
            hasher: crc32fast::Hasher::new(),
            len: 0,
        }
    }

    /// `(inner, bytes written, CRC-32)`.
    pub fn finish(self) -> (W, u64, u32) {
        (self.inner, self.len, self.hasher.finalize())
    }
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn put_bytes(w: &mut impl Write, b: &[u8]) -> io::Result<()> {
    w.write_all(&(b.len() as u32).to_le_bytes())?;
    w.write_all(b)
}

/// Writes `snapshot` to `w`.
pub fn write_operator_state<W: Write>(w: &mut W, snapshot: &OperatorSnapshot) -> io::Result<()> {
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    put_bytes(w, snapshot.operator.as_bytes())?;
    w.write_all(&(snapshot.state.len() as u64).to_le_bytes())?;
    w.write_all(&snapshot.state)?;
    w.write_all(&snapshot.watermark.to_le_bytes())?;
    let descriptors = snapshot
        .keyed
        .as_ref()
        .map_or(&[][..], KeyedSnapshot::descriptors);
    w.write_all(&(descriptors.len() as u32).to_le_bytes())?;
    for d in descriptors {
        put_bytes(w, d.name.as_bytes())?;
        w.write_all(&[kind_byte(d.kind), u8::from(d.ttl_ms.is_some())])?;
        w.write_all(&d.ttl_ms.unwrap_or(0).to_le_bytes())?;
    }
    match &snapshot.keyed {
        None => w.write_all(&[0])?,
        Some(KeyedSnapshot::Heap(keyed)) => write_heap(w, keyed)?,
        Some(KeyedSnapshot::Lsm(local)) => write_lsm_entries(w, local)?,
        Some(KeyedSnapshot::Files(files)) => write_lsm_files(w, files)?,
    }
    let timers: Vec<(TimeDomain, i64, &[u8])> = [TimeDomain::EventTime, TimeDomain::ProcessingTime]
        .into_iter()
        .flat_map(|d| snapshot.timers.iter(d).map(move |(ts, k)| (d, ts, k)))
        .collect();
    let write_timer = |w: &mut W, domain: TimeDomain, ts: i64, key: &[u8]| -> io::Result<()> {
        w.write_all(&[domain.to_byte()])?;
        w.write_all(&ts.to_le_bytes())?;
        put_bytes(w, key)
    };
    // An LSM instance keeps its timers in its database: a savepoint counts them first,
    // then writes them, one at a time.
    let local = match &snapshot.keyed {
        Some(KeyedSnapshot::Lsm(local)) => Some(local),
        _ => None,
    };
    let mut lsm_timers = 0u64;
    if let Some(local) = local {
        read_lsm_timers(local, |_, _, _| {
            lsm_timers += 1;
            Ok(())
        })?;
    }
    w.write_all(&(timers.len() as u64 + lsm_timers).to_le_bytes())?;
    for (domain, ts, key) in timers {
        write_timer(w, domain, ts, key)?;
    }
    if let Some(local) = local {
        let mut written = 0u64;
        read_lsm_timers(local, |domain, ts, key| {
            written += 1;
            write_timer(w, domain, ts, key)
        })?;
        if written != lsm_timers {
            return Err(io::Error::other(format!(
                "the state database held {lsm_timers} timers and then {written}"
            )));
        }
    }
    Ok(())
}

/// Calls `f` for each timer an LSM instance's local checkpoint holds.
fn read_lsm_timers(
    local: &LsmSnapshot,
    mut f: impl FnMut(TimeDomain, i64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let path = local
        .local()
        .map_err(|e| io::Error::other(format!("{e:#}")))?;
    crate::state::lsm::read_timers(path, local.key_groups.clone(), |d, ts, key| {
        f(d, ts, key).map_err(anyhow::Error::from)
    })
    .map_err(io_error)
}

/// An error of reading an LSM instance's database as the I/O error it was (a full disk,
/// say), or as one.
fn io_error(e: anyhow::Error) -> io::Error {
    e.downcast::<io::Error>()
        .unwrap_or_else(|e| io::Error::other(format!("{e:#}")))
}

/// The heap backend's entries, by key group.
fn write_heap(w: &mut impl Write, keyed: &KeyedStateSnapshot) -> io::Result<()> {
    w.write_all(&[1])?;
    w.write_all(&keyed.first_key_group.to_le_bytes())?;
    let groups: Vec<_> = keyed.key_groups().collect();
    w.write_all(&(groups.len() as u32).to_le_bytes())?;
    for (kg, entries) in groups {
        let entries: Vec<_> = entries.collect();
        w.write_all(&kg.to_le_bytes())?;
        w.write_all(&(entries.len() as u64).to_le_bytes())?;
        for (k, e) in entries {
            w.write_all(&(k.len() as u32).to_le_bytes())?;
            w.write_all(k.prefix)?;
            w.write_all(k.user_key)?;
            put_bytes(w, &e.value)?;
            w.write_all(&e.written_at.to_le_bytes())?;
        }
    }
    Ok(())
}

/// An LSM instance's entries in the heap backend's layout (a savepoint), read from its
/// local checkpoint one key group at a time.
fn write_lsm_entries(w: &mut impl Write, local: &LsmSnapshot) -> io::Result<()> {
    let groups = local.key_groups.clone();
    w.write_all(&[1])?;
    w.write_all(&groups.start.to_le_bytes())?;
    w.write_all(&(groups.len() as u32).to_le_bytes())?;
    // A group's entries are counted before they are written: one group in memory.
    let mut group: Vec<u8> = Vec::new();
    let (mut current, mut count) = (groups.start, 0u64);
    fn flush(w: &mut impl Write, kg: u32, count: u64, group: &mut Vec<u8>) -> io::Result<()> {
        w.write_all(&kg.to_le_bytes())?;
        w.write_all(&count.to_le_bytes())?;
        w.write_all(group)?;
        group.clear();
        Ok(())
    }
    let path = local
        .local()
        .map_err(|e| io::Error::other(format!("{e:#}")))?;
    crate::state::lsm::read_entries(path, groups.clone(), |kg, key, written_at, value| {
        // Timers are written with the heap's, after the entries.
        if crate::state::lsm::timer_of(key).is_some() {
            return Ok(());
        }
        while current < kg {
            flush(w, current, count, &mut group)?;
            (current, count) = (current + 1, 0);
        }
        put_bytes(&mut group, key)?;
        put_bytes(&mut group, value)?;
        group.extend_from_slice(&written_at.to_le_bytes());
        count += 1;
        Ok(())
    })
    // A failed write stays the I/O error it was (a full disk, say).
    .map_err(io_error)?;
    while current < groups.end {
        flush(w, current, count, &mut group)?;
        (current, count) = (current + 1, 0);
    }
    Ok(())
}

/// An LSM instance's manifest (a checkpoint): its files, tables by their shared names.
fn write_lsm_files(w: &mut impl Write, files: &LsmFiles) -> io::Result<()> {
    w.write_all(&[2])?;
    w.write_all(&files.key_groups.start.to_le_bytes())?;
    w.write_all(&files.key_groups.end.to_le_bytes())?;
    w.write_all(&files.taken_at.to_le_bytes())?;
    w.write_all(&(files.files.len() as u32).to_le_bytes())?;
    for f in &files.files {
        put_bytes(w, f.name.as_bytes())?;
        w.write_all(&f.size.to_le_bytes())?;
        w.write_all(&f.crc32.to_le_bytes())?;
        match &f.place {
            Place::Inline(bytes) => {
                w.write_all(&[0])?;
                w.write_all(&(bytes.len() as u64).to_le_bytes())?;
                w.write_all(bytes)?;
            }
            Place::Shared(name) => {
                w.write_all(&[1])?;
                put_bytes(w, name.as_bytes())?;
            }
        }
    }
    Ok(())
}

fn kind_byte(kind: StateKind) -> u8 {
    match kind {
        StateKind::Value => 0,
        StateKind::List => 1,
        StateKind::Map => 2,
    }
}

struct Reader<R> {
    inner: R,
}

impl<R: Read> Reader<R> {
    fn exact<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .context("the state file ends early")?;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.exact::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.exact()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.exact()?))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.exact()?))
    }
    fn vec(&mut self, len: u64) -> Result<Vec<u8>> {
        // Small fields (keys, values) are read in place; a large length is trusted only as
        // far as the file really has bytes, so a corrupt one cannot allocate gigabytes.
        const SMALL: u64 = 64 << 10;
        let mut v = Vec::new();
        if len <= SMALL {
            v.resize(len as usize, 0);
            self.inner
                .read_exact(&mut v)
                .map_err(|_| anyhow::anyhow!("the state file ends early"))?;
            return Ok(v);
        }
        (&mut self.inner).take(len).read_to_end(&mut v)?;
        if v.len() as u64 != len {
            bail!("the state file ends early");
        }
        Ok(v)
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let len = self.u32()?;
        self.vec(u64::from(len))
    }
}

/// An LSM manifest (after its marker). Its shared folder is left for the caller, who
/// knows where the checkpoint is.
fn read_lsm_files(
    r: &mut Reader<impl Read>,
    descriptors: Vec<StateDescriptor>,
) -> Result<LsmFiles> {
    let (start, end) = (r.u32()?, r.u32()?);
    if start > end {
        bail!("state file: key groups {start}..{end}");
    }
    let taken_at = r.i64()?;
    let files = (0..r.u32()?)
        .map(|_| {
            let name = String::from_utf8(r.bytes()?).context("state file name")?;
            // Names become paths: one plain name each.
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                bail!("state file: bad file name {name:?}");
            }
            let size = r.u64()?;
            let crc32 = r.u32()?;
            let place = match r.u8()? {
                0 => {
                    let len = r.u64()?;
                    let bytes = r.vec(len)?;
                    if bytes.len() as u64 != size || crc32fast::hash(&bytes) != crc32 {
                        bail!("state file: {name} is corrupt");
                    }
                    Place::Inline(bytes)
                }
                1 => {
                    let shared = String::from_utf8(r.bytes()?).context("shared file name")?;
                    if shared.is_empty() || shared.contains('/') || shared.starts_with('.') {
                        bail!("state file: bad shared file name {shared:?}");
                    }
                    Place::Shared(shared)
                }
                p => bail!("state file: unknown file place {p}"),
            };
            Ok(DbFile {
                name,
                size,
                crc32,
                place,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(LsmFiles {
        descriptors,
        key_groups: start..end,
        taken_at,
        files,
        shared: None,
        copied: 0,
        copied_files: 0,
    })
}

/// Reads a file written by [`write_operator_state`].
pub fn read_operator_state(r: impl Read) -> Result<OperatorSnapshot> {
    let mut r = Reader { inner: r };
    if &r.exact::<8>()? != MAGIC {
        bail!("not a Sluice state file");
    }
    let version = r.u32()?;
    if version != VERSION {
        bail!("state file format version {version} is not supported (this host reads {VERSION})");
    }
    let operator = String::from_utf8(r.bytes()?).context("operator name")?;
    let state_len = r.u64()?;
    let state = r.vec(state_len)?;
    let watermark = r.i64()?;
    let descriptors = (0..r.u32()?)
        .map(|_| {
            let name = String::from_utf8(r.bytes()?).context("state name")?;
            let kind = match r.u8()? {
                0 => StateKind::Value,
                1 => StateKind::List,
                2 => StateKind::Map,
                k => bail!("unknown state kind {k}"),
            };
            let has_ttl = r.u8()? != 0;
            let ttl = r.u64()?;
            Ok(StateDescriptor {
                name,
                kind,
                ttl_ms: has_ttl.then_some(ttl),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let keyed = match r.u8()? {
        0 => None,
        1 => {
            let first = r.u32()?;
            let groups = r.u32()?;
            let mut parts = Vec::with_capacity(groups as usize);
            for g in 0..groups {
                let kg = r.u32()?;
                if kg != first + g {
                    bail!("key groups out of order in state file");
                }
                let n = r.u64()?;
                let mut entries = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    let key = r.bytes()?;
                    let value = crate::state::Value::from(&r.bytes()?[..]);
                    let written_at = r.i64()?;
                    entries.push((key, Entry { value, written_at }));
                }
                parts.push(entries);
            }
            Some(KeyedSnapshot::Heap(
                KeyedStateSnapshot::from_parts(descriptors, first, parts)
                    .map_err(|e| anyhow::anyhow!("state file: {e}"))?,
            ))
        }
        2 => Some(KeyedSnapshot::Files(read_lsm_files(&mut r, descriptors)?)),
        b => bail!("bad keyed-state marker {b}"),
    };
    let mut timers = TimerQueues::new();
    for _ in 0..r.u64()? {
        let domain = TimeDomain::from_byte(r.u8()?).context("unknown timer domain")?;
        let ts = r.i64()?;
        let key = r.bytes()?;
        timers.register(domain, ts, &key);
    }
    Ok(OperatorSnapshot {
        operator,
        state,
        keyed,
        timers,
        watermark,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KeyedStateBackend;

    #[test]
    fn round_trips_operator_state_keyed_state_and_timers() {
        let mut backend = KeyedStateBackend::new(128, 32..64);
        let v = backend
            .declare(StateDescriptor {
                name: "count".into(),
                kind: StateKind::Value,
                ttl_ms: Some(5),
            })
            .unwrap();
        let mut written = 0;
        for i in 0..2000u32 {
            if backend
                .put(v, &i.to_le_bytes(), b"", &i.to_be_bytes(), 7)
                .is_ok()
            {
                written += 1;
            }
        }
        let mut timers = TimerQueues::new();
        timers.register(TimeDomain::EventTime, 10, b"k");
        timers.register(TimeDomain::ProcessingTime, -4, b"");
        let snapshot = OperatorSnapshot {
            operator: "count".into(),
            state: b"opaque".to_vec(),
            keyed: Some(KeyedSnapshot::Heap(backend.snapshot(8))),
            timers: timers.clone(),
            watermark: 77,
        };
        let mut w = CrcWriter::new(Vec::new());
        write_operator_state(&mut w, &snapshot).unwrap();
        let (bytes, len, crc) = w.finish();
        assert_eq!(len as usize, bytes.len());
        assert_eq!(crc, crc32fast::hash(&bytes));

        let back = read_operator_state(&bytes[..]).unwrap();
        assert_eq!(back.operator, "count");
        assert_eq!(back.state, b"opaque");
        assert_eq!(back.timers, timers);
        assert_eq!(back.watermark, 77);
        let Some(KeyedSnapshot::Heap(keyed)) = back.keyed else {
            panic!("heap state reads back as entries")
        };
        assert_eq!(keyed.len(), written);
        assert_eq!(keyed.descriptors[0].ttl_ms, Some(5));
        let mut restored = KeyedStateBackend::new(128, 32..64);
        restored.restore(&keyed).unwrap();
        for i in 0..2000u32 {
            if let Ok(Some(value)) = restored.get(0, &i.to_le_bytes(), b"", 8) {
                assert_eq!(&*value, &i.to_be_bytes());
            }
        }
        assert_eq!(restored.len(), written);

        for cut in [0, 9, 20, bytes.len() - 1] {
            assert!(read_operator_state(&bytes[..cut]).is_err());
        }
    }
}
