//! Avro object container files: a file source reads one (`type = "file"`, `format =
//! "avro"`), each datum a record whose value is its JSON, as a Kafka source's Avro values
//! are; a file sink writes one ([`AvroBlocks`]) from the JSON values operators emit.
//!
//! The file carries its writer's schema; the job's `schema`, if given, reads the datums
//! (Avro's resolution: defaults filled, fields dropped, promotions). Blocks are read one
//! at a time (codecs `null`, `deflate` and `snappy`) and transcoded without building
//! values. The position is the byte offset of the block being read and how many of its
//! datums were read, so a restore continues at the next datum without reading the file
//! from its start. A damaged block fails the job, naming the file and the block's offset:
//! a container cannot be read past it.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use sluice_codec::BatchWriter;

use super::formats::avro::{MAX_JSON_BYTES, put_long};
use super::formats::{AvroReading, Compiled};
use super::{Source, SourceStatus};
use crate::metrics::OperatorMetrics;
use crate::spec::values::AvroCodecName;

const MAGIC: &[u8; 4] = b"Obj\x01";

/// A file read from its start or a block's, counting where it stands.
struct Input {
    reader: BufReader<File>,
    offset: u64,
}

impl Input {
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.reader
            .read_exact(buf)
            .map_err(|e| anyhow!("at byte {}: {e}", self.offset))?;
        self.offset += buf.len() as u64;
        Ok(())
    }

    /// A zigzag varint long; `None` at the end of the file before its first byte.
    fn long_or_end(&mut self) -> Result<Option<i64>> {
        let mut value: u64 = 0;
        for (i, shift) in (0..70).step_by(7).enumerate() {
            let mut byte = [0];
            match self.reader.read(&mut byte) {
                Ok(0) if i == 0 => return Ok(None),
                Ok(0) => bail!("the file ends inside a number at byte {}", self.offset),
                Ok(_) => {}
                Err(e) => bail!("at byte {}: {e}", self.offset),
            }
            self.offset += 1;
            value |= u64::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                return Ok(Some(((value >> 1) as i64) ^ -((value & 1) as i64)));
            }
        }
        bail!("a number longer than 10 bytes at byte {}", self.offset)
    }

    fn long(&mut self) -> Result<i64> {
        self.long_or_end()?
            .ok_or_else(|| anyhow!("the file ends at byte {}", self.offset))
    }

    /// Avro `bytes`: a length, then as many bytes (at most [`MAX_JSON_BYTES`]).
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let at = self.offset;
        let len = self.long()?;
        let len = usize::try_from(len)
            .ok()
            .filter(|len| *len <= MAX_JSON_BYTES)
            .ok_or_else(|| anyhow!("a length of {len} at byte {at}"))?;
        let mut out = vec![0; len];
        self.read_exact(&mut out)?;
        Ok(out)
    }
}

/// What a container file's header says.
struct Header {
    /// The writer's schema.
    schema: String,
    codec: String,
    sync: [u8; 16],
}

fn read_header(input: &mut Input) -> Result<Header> {
    let mut magic = [0; 4];
    input.read_exact(&mut magic)?;
    if &magic != MAGIC {
        bail!("it does not start with Avro's magic bytes \"Obj\\x01\"");
    }
    let mut schema = None;
    let mut codec = "null".to_string();
    loop {
        let mut count = input.long()?;
        if count == 0 {
            break;
        }
        if count < 0 {
            count = count
                .checked_neg()
                .ok_or_else(|| anyhow!("a metadata count of {count}"))?;
            input.long()?; // (the block's size in bytes)
        }
        for _ in 0..count {
            let key = input.bytes()?;
            let value = input.bytes()?;
            match key.as_slice() {
                b"avro.schema" => schema = Some(String::from_utf8(value)?),
                b"avro.codec" => codec = String::from_utf8(value)?,
                _ => {}
            }
        }
    }
    let mut sync = [0; 16];
    input.read_exact(&mut sync)?;
    Ok(Header {
        schema: schema.ok_or_else(|| anyhow!("its header has no avro.schema"))?,
        codec,
        sync,
    })
}

/// The datums in a block a file sink writes before it starts another: large enough for
/// the per-block bytes (a count, a size, the sync marker) not to matter, small enough
/// that a reader holds one easily.
const BLOCK_BYTES: usize = 1 << 20;

/// What a file sink writes with `format = "avro"`: the container's header once, at the
/// start of the file, then blocks of the values it is given, each JSON encoded with the
/// sink's schema, compressed by the sink's codec.
///
/// The sync marker is derived from the output's name and the schema, so every process
/// that ever writes to the file, before or after a restore, ends its blocks with the same
/// marker. Blocks end only where [`AvroBlocks::finish_block`] is called, which the sink
/// does before it seals a checkpoint's part: a committed file is always whole blocks.
pub struct AvroBlocks {
    schema: Arc<Compiled>,
    schema_text: String,
    sync: [u8; 16],
    codec: apache_avro::Codec,
    block: Vec<u8>,
    count: u64,
}

impl AvroBlocks {
    /// A writer of `schema` (the .avsc text) for the file at `output`, its blocks
    /// compressed with `codec`.
    pub fn new(schema_text: &str, codec: AvroCodecName, output: &Path) -> Result<AvroBlocks> {
        use sha2::{Digest, Sha256};
        let schema = Arc::new(Compiled::parse(schema_text)?);
        let mut hash = Sha256::new();
        hash.update(b"sluice avro sync marker\0");
        hash.update(output.file_name().unwrap_or_default().as_encoded_bytes());
        hash.update(b"\0");
        hash.update(schema_text.as_bytes());
        let sync = hash.finalize()[..16].try_into().expect("16 bytes");
        Ok(AvroBlocks {
            schema,
            schema_text: schema_text.to_string(),
            sync,
            codec: match codec {
                AvroCodecName::Null => apache_avro::Codec::Null,
                AvroCodecName::Deflate => apache_avro::Codec::Deflate(Default::default()),
                AvroCodecName::Snappy => apache_avro::Codec::Snappy,
            },
            block: Vec::new(),
            count: 0,
        })
    }

    /// Appends the container's header to `out`.
    pub fn header(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        put_long(2, out); // (metadata entries)
        for (key, value) in [
            (&b"avro.schema"[..], self.schema_text.as_bytes()),
            (b"avro.codec", <&str>::from(self.codec).as_bytes()),
        ] {
            put_long(key.len() as i64, out);
            out.extend_from_slice(key);
            put_long(value.len() as i64, out);
            out.extend_from_slice(value);
        }
        put_long(0, out);
        out.extend_from_slice(&self.sync);
    }

    /// Adds `value` (JSON text) to the block; `Err`: why it does not fit the schema.
    /// True when the block is full and should be finished.
    pub fn push(&mut self, value: &[u8]) -> Result<bool> {
        let before = self.block.len();
        if let Err(e) = self.schema.json_to_datum(value, &mut self.block) {
            self.block.truncate(before);
            return Err(e);
        }
        self.count += 1;
        Ok(self.block.len() >= BLOCK_BYTES)
    }

    /// Appends the block of the values pushed since the last one to `out`, compressed
    /// (nothing when there are none).
    pub fn finish_block(&mut self, out: &mut Vec<u8>) -> Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        self.codec.compress(&mut self.block).map_err(|e| {
            anyhow!(
                "compressing an Avro block ({}): {e}",
                <&str>::from(self.codec)
            )
        })?;
        put_long(self.count as i64, out);
        put_long(self.block.len() as i64, out);
        out.extend_from_slice(&self.block);
        out.extend_from_slice(&self.sync);
        self.block.clear();
        self.count = 0;
        Ok(())
    }
}

/// Reads an Avro object container file's datums as JSON records.
pub struct AvroFileSource {
    path: PathBuf,
    input: Input,
    sync: [u8; 16],
    codec: apache_avro::Codec,
    reading: AvroReading,
    /// The block being read (decompressed), where it starts in the file, how many of
    /// its datums were read and how many are left, and where the next one starts.
    block: Vec<u8>,
    block_start: u64,
    block_read: u64,
    block_left: u64,
    cursor: usize,
    json: Vec<u8>,
    metrics: Option<Arc<OperatorMetrics>>,
}

impl AvroFileSource {
    /// Opens `path`, reading its header; `schema`: the job's reader schema (its text).
    pub fn open(path: &Path, schema: Option<&str>) -> Result<AvroFileSource> {
        let file = File::open(path)
            .with_context(|| format!("cannot open source file {}", path.display()))?;
        let mut input = Input {
            reader: BufReader::with_capacity(256 << 10, file),
            offset: 0,
        };
        let header = read_header(&mut input)
            .with_context(|| format!("{}: not an Avro object container file", path.display()))?;
        let writer = Arc::new(
            Compiled::parse(&header.schema)
                .with_context(|| format!("{}: the schema in its header", path.display()))?,
        );
        let reader = schema
            .map(|text| Compiled::parse(text).map(Arc::new))
            .transpose()?;
        let reading = AvroReading::new(writer, reader).map_err(|e| {
            anyhow!(
                "{}: the job's `schema` cannot read the file's datums: {e}",
                path.display()
            )
        })?;
        let codec = apache_avro::Codec::from_str(&header.codec).map_err(|_| {
            anyhow!(
                "{}: its blocks are compressed with {:?}, which Sluice does not read (null, \
                 deflate, snappy)",
                path.display(),
                header.codec
            )
        })?;
        Ok(AvroFileSource {
            path: path.to_path_buf(),
            block_start: input.offset,
            input,
            sync: header.sync,
            codec,
            reading,
            block: Vec::new(),
            block_read: 0,
            block_left: 0,
            cursor: 0,
            json: Vec::new(),
            metrics: None,
        })
    }

    /// Reads the next block; false at the end of the file.
    fn next_block(&mut self) -> Result<bool> {
        self.block_start = self.input.offset;
        self.block_read = 0;
        let Some(count) = self.input.long_or_end()? else {
            return Ok(false);
        };
        let block = self.block_start;
        let count =
            u64::try_from(count).map_err(|_| anyhow!("block at byte {block}: count {count}"))?;
        let data = self.input.bytes()?;
        let mut sync = [0; 16];
        self.input.read_exact(&mut sync)?;
        if sync != self.sync {
            bail!("the block at byte {block} does not end with the file's sync marker");
        }
        let mut data = data;
        self.codec
            .decompress(&mut data)
            .map_err(|e| anyhow!("the block at byte {block}: {e}"))?;
        self.block = data;
        self.block_read = 0;
        self.block_left = count;
        self.cursor = 0;
        Ok(true)
    }

    /// Transcodes the block's next datum into `self.json`.
    fn next_datum(&mut self) -> Result<()> {
        let mut datum = &self.block[self.cursor..];
        let before = datum.len();
        self.json.clear();
        self.reading
            .read(&mut datum, &mut self.json)
            .with_context(|| {
                format!(
                    "datum {} of the block at byte {}",
                    self.block_read, self.block_start
                )
            })?;
        self.cursor += before - datum.len();
        self.block_read += 1;
        self.block_left -= 1;
        if self.block_left == 0 && self.cursor != self.block.len() {
            bail!(
                "the block at byte {} has {} bytes after its last datum",
                self.block_start,
                self.block.len() - self.cursor
            );
        }
        Ok(())
    }

    fn read_records(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus> {
        for _ in 0..max {
            if self.block_left == 0 && !self.next_block()? {
                return Ok(SourceStatus::End);
            }
            if self.block_left == 0 {
                continue; // (An empty block.)
            }
            self.next_datum()?;
            out.push(None, &self.json, None);
        }
        Ok(SourceStatus::More)
    }
}

impl Source for AvroFileSource {
    fn attach_metrics(&mut self, metrics: Arc<OperatorMetrics>) {
        self.metrics = Some(metrics);
    }

    fn poll(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus> {
        let status = self
            .read_records(out, max)
            .with_context(|| format!("reading Avro file {}", self.path.display()));
        if let Some(metrics) = &self.metrics {
            metrics
                .counters
                .lock()
                .insert("bytes-read".to_string(), self.input.offset);
        }
        status
    }

    fn position(&self) -> Vec<u8> {
        let mut position = self.block_start.to_le_bytes().to_vec();
        position.extend_from_slice(&self.block_read.to_le_bytes());
        position
    }

    fn seek(&mut self, position: &[u8]) -> Result<()> {
        let what = format!("resuming Avro file {}", self.path.display());
        let what = || what.clone();
        let (block, read) = match position {
            [a @ .., _, _, _, _, _, _, _, _] if a.len() == 8 => (
                u64::from_le_bytes(a.try_into().expect("8 bytes")),
                u64::from_le_bytes(position[8..].try_into().expect("8 bytes")),
            ),
            _ => bail!(
                "{}: the checkpointed position has {} bytes, not 16",
                what(),
                position.len()
            ),
        };
        let len = self.input.reader.get_ref().metadata()?.len();
        if block > len {
            bail!(
                "{}: at byte {block}, but the file has only {len} bytes (was it replaced?)",
                what()
            );
        }
        self.input.reader.seek(SeekFrom::Start(block))?;
        self.input.offset = block;
        self.block_left = 0;
        if read > 0 {
            if !self.next_block().with_context(what)? || read > self.block_left {
                bail!(
                    "{}: the block at byte {block} has not {read} datums (was the file replaced?)",
                    what()
                );
            }
            for _ in 0..read {
                self.next_datum().with_context(what)?;
            }
        } else {
            self.block_start = block;
            self.block_read = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Value;
    use sluice_codec::BatchReader;

    const SCHEMA: &str = r#"{"type":"record","name":"E","fields":[{"name":"user","type":"string"},{"name":"n","type":"long"}]}"#;

    /// An Avro file of `n` records written by `apache-avro` (blocks of about 100 bytes).
    fn file(dir: &Path, n: i64, codec: apache_avro::Codec) -> PathBuf {
        let schema = apache_avro::Schema::parse_str(SCHEMA).unwrap();
        let mut writer = apache_avro::Writer::builder()
            .schema(&schema)
            .writer(Vec::new())
            .codec(codec)
            .block_size(100)
            .build()
            .unwrap();
        for i in 0..n {
            writer
                .append_value(Value::Record(vec![
                    ("user".into(), Value::String(format!("u{i}"))),
                    ("n".into(), Value::Long(i)),
                ]))
                .unwrap();
        }
        let path = dir.join(format!("{n}-{codec:?}.avro"));
        std::fs::write(&path, writer.into_inner().unwrap()).unwrap();
        path
    }

    fn values(source: &mut AvroFileSource, max: usize) -> (Vec<String>, SourceStatus) {
        let mut out = BatchWriter::with_capacity(1024);
        let status = source.poll(&mut out, max).unwrap();
        let bytes = out.into_bytes();
        let values = BatchReader::new(&bytes)
            .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap())
            .collect();
        (values, status)
    }

    #[test]
    fn datums_are_read_as_json_and_a_restore_continues_at_the_next() {
        let dir = tempfile::tempdir().unwrap();
        for codec in [
            apache_avro::Codec::Null,
            apache_avro::Codec::Deflate(Default::default()),
            apache_avro::Codec::Snappy,
        ] {
            let path = file(dir.path(), 200, codec);
            let mut all = Vec::new();
            let mut source = AvroFileSource::open(&path, None).unwrap();
            // Read 37 at a time, checkpointing and resuming in a new source each time.
            loop {
                let (values, status) = values(&mut source, 37);
                all.extend(values);
                let position = source.position();
                source = AvroFileSource::open(&path, None).unwrap();
                source.seek(&position).unwrap();
                if matches!(status, SourceStatus::End) {
                    break;
                }
            }
            let want: Vec<String> = (0..200)
                .map(|i| format!(r#"{{"user":"u{i}","n":{i}}}"#))
                .collect();
            assert_eq!(all, want, "{codec:?}");
        }
    }

    #[test]
    fn blocks_written_with_each_codec_are_read_back_by_apache_avro() {
        let dir = tempfile::tempdir().unwrap();
        for codec in [
            AvroCodecName::Null,
            AvroCodecName::Deflate,
            AvroCodecName::Snappy,
        ] {
            let path = dir.path().join(format!("{}.avro", codec.name()));
            let mut blocks = AvroBlocks::new(SCHEMA, codec, &path).unwrap();
            let mut bytes = Vec::new();
            blocks.header(&mut bytes);
            // Three blocks of 100 records, repetitive enough to compress.
            for i in 0..300 {
                let value = format!(r#"{{"user":"user-{}","n":{i}}}"#, i % 3);
                assert!(!blocks.push(value.as_bytes()).unwrap());
                if i % 100 == 99 {
                    blocks.finish_block(&mut bytes).unwrap();
                }
            }
            blocks.finish_block(&mut bytes).unwrap();
            std::fs::write(&path, &bytes).unwrap();
            let reader = apache_avro::Reader::new(&bytes[..]).unwrap();
            let read: Vec<Value> = reader.map(|v| v.unwrap()).collect();
            let want: Vec<Value> = (0..300)
                .map(|i| {
                    Value::Record(vec![
                        ("user".into(), Value::String(format!("user-{}", i % 3))),
                        ("n".into(), Value::Long(i)),
                    ])
                })
                .collect();
            assert_eq!(read, want, "{codec:?}");
            // And by Sluice's own Avro file source.
            let mut source = AvroFileSource::open(&path, None).unwrap();
            assert_eq!(values(&mut source, 1000).0.len(), 300, "{codec:?}");
            if codec != AvroCodecName::Null {
                let plain = std::fs::metadata(dir.path().join("null.avro"))
                    .unwrap()
                    .len();
                assert!(
                    (bytes.len() as u64) < plain * 3 / 4,
                    "{codec:?}: {} bytes against {plain} uncompressed",
                    bytes.len()
                );
            }
        }
    }

    #[test]
    fn the_jobs_schema_reads_the_files_datums() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), 3, apache_avro::Codec::Null);
        let v2 = r#"{"type":"record","name":"E","fields":[{"name":"n","type":"long"},{"name":"c","type":"string","default":"nl"}]}"#;
        let mut source = AvroFileSource::open(&path, Some(v2)).unwrap();
        assert_eq!(
            values(&mut source, 10).0,
            [
                r#"{"n":0,"c":"nl"}"#,
                r#"{"n":1,"c":"nl"}"#,
                r#"{"n":2,"c":"nl"}"#
            ]
        );
        let wrong = r#"{"type":"record","name":"E","fields":[{"name":"x","type":"int"}]}"#;
        let e = format!(
            "{:#}",
            AvroFileSource::open(&path, Some(wrong)).err().unwrap()
        );
        assert!(e.contains("cannot read the file's datums"), "{e}");
    }

    #[test]
    fn damaged_files_are_errors_that_say_where() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), 50, apache_avro::Codec::Null);
        let good = std::fs::read(&path).unwrap();
        let not_avro = dir.path().join("lines.avro");
        std::fs::write(&not_avro, b"a,b\n").unwrap();
        let e = format!("{:#}", AvroFileSource::open(&not_avro, None).err().unwrap());
        assert!(
            e.contains("lines.avro: not an Avro object container file"),
            "{e}"
        );
        // Every cut and every flipped byte: an error or fewer datums, never a panic.
        for cut in (0..good.len()).step_by(7) {
            let damaged = dir.path().join("cut.avro");
            std::fs::write(&damaged, &good[..cut]).unwrap();
            if let Ok(mut source) = AvroFileSource::open(&damaged, None) {
                let mut out = BatchWriter::with_capacity(1024);
                let _ = source.poll(&mut out, 100);
            }
            let mut flipped = good.clone();
            flipped[cut] ^= 0x5a;
            std::fs::write(&damaged, &flipped).unwrap();
            if let Ok(mut source) = AvroFileSource::open(&damaged, None) {
                let mut out = BatchWriter::with_capacity(1024);
                let _ = source.poll(&mut out, 100);
            }
        }
        // The last block cut short names its offset.
        let damaged = dir.path().join("short.avro");
        std::fs::write(&damaged, &good[..good.len() - 5]).unwrap();
        let mut source = AvroFileSource::open(&damaged, None).unwrap();
        let mut out = BatchWriter::with_capacity(1024);
        let e = format!("{:#}", source.poll(&mut out, 100).unwrap_err());
        assert!(e.contains("short.avro") && e.contains("at byte"), "{e}");
    }
}
