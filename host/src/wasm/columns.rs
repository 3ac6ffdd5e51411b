//! Records in columns (`sluice:operator@0.3.0`'s `columns` layout) and back: the host
//! keeps every batch in the flat encoding; an operator that takes columns gets each batch
//! turned into them, and what it returns in columns is turned back and checked as flat
//! records are.

use sluice_codec::{BatchReader, BatchWriter, DecodeError, Headers, RecordRef, encode_headers};

use super::bindings::v3::sluice::operator::types::{Columns, Packed, Records};

/// `partitions`' mark of a record without one.
const NO_PARTITION: u32 = u32::MAX;

/// Byte strings packed as `packed` holds them.
pub(crate) struct PackedWriter {
    packed: Packed,
    count: usize,
}

impl PackedWriter {
    pub(crate) fn new() -> Self {
        Self::with_capacity(0, 0)
    }

    pub(crate) fn with_capacity(strings: usize, bytes: usize) -> Self {
        PackedWriter {
            packed: Packed {
                data: Vec::with_capacity(bytes),
                ends: Vec::with_capacity(4 * strings),
                absent: Vec::new(),
            },
            count: 0,
        }
    }

    pub(crate) fn push(&mut self, string: Option<&[u8]>) {
        let p = &mut self.packed;
        match string {
            Some(s) => {
                p.data.extend_from_slice(s);
                if !p.absent.is_empty() {
                    p.absent.push(0);
                }
            }
            None => {
                if p.absent.is_empty() {
                    p.absent.resize(self.count, 0);
                }
                p.absent.push(1);
            }
        }
        p.ends
            .extend_from_slice(&(p.data.len() as u32).to_le_bytes());
        self.count += 1;
    }

    pub(crate) fn finish(self) -> Packed {
        self.packed
    }
}

/// The `count` strings of `packed` (`data`, `ends`, `absent` as it holds them), checked;
/// `name` says which in an error.
pub(crate) fn unpack<'a>(
    name: &str,
    data: &'a [u8],
    ends: &[u8],
    absent: &[u8],
    count: usize,
) -> Result<Vec<Option<&'a [u8]>>, String> {
    if ends.len() != 4 * count || !(absent.is_empty() || absent.len() == count) {
        return Err(format!(
            "{name}: {count} strings packed with {} bytes of ends (4 per string) and {} of \
             absent (none or 1 per string)",
            ends.len(),
            absent.len()
        ));
    }
    let mut start = 0;
    let mut strings = Vec::with_capacity(count);
    for (i, end) in ends.chunks_exact(4).enumerate() {
        let end = u32::from_le_bytes(end.try_into().expect("4 bytes")) as usize;
        if end < start || end > data.len() {
            return Err(format!(
                "{name}: string {i} ends at byte {end}, before it starts ({start}) or beyond \
                 the {} bytes of data",
                data.len()
            ));
        }
        strings.push(match absent.get(i) {
            Some(&flag) if flag != 0 => None,
            _ => Some(&data[start..end]),
        });
        start = end;
    }
    Ok(strings)
}

/// A flat batch as columns.
pub(crate) fn to_columns(batch: &[u8]) -> Result<Columns, DecodeError> {
    // One pass: the count is known at the end.
    let mut count = 0;
    let mut values = PackedWriter::with_capacity(0, batch.len());
    let mut keys = PackedWriter::new();
    let mut timestamps = Vec::new();
    let mut untimed = Vec::new();
    let mut partitions = Vec::new();
    let mut headers = Vec::new();
    let mut outputs = Vec::new();
    for (i, record) in BatchReader::new(batch).enumerate() {
        let record = record?;
        count = i + 1;
        values.push(Some(record.value));
        keys.push(record.key);
        match record.timestamp {
            Some(ts) => {
                if timestamps.is_empty() && i > 0 {
                    // The records before had none.
                    timestamps.resize(8 * i, 0);
                    untimed.resize(i, 1);
                }
                timestamps.extend_from_slice(&ts.to_le_bytes());
                if !untimed.is_empty() {
                    untimed.push(0);
                }
            }
            None if !timestamps.is_empty() => {
                timestamps.extend_from_slice(&0i64.to_le_bytes());
                if untimed.is_empty() {
                    untimed.resize(i, 0);
                }
                untimed.push(1);
            }
            None => {}
        }
        match record.partition {
            Some(p) => {
                if partitions.is_empty() {
                    partitions = NO_PARTITION.to_le_bytes().repeat(i);
                }
                partitions.extend_from_slice(&p.to_le_bytes());
            }
            None if !partitions.is_empty() => {
                partitions.extend_from_slice(&NO_PARTITION.to_le_bytes());
            }
            None => {}
        }
        if let Some(h) = record.headers {
            let pairs = h.iter().map(|(n, v)| (n.to_vec(), v.to_vec()));
            headers.push((i as u32, pairs.collect()));
        }
        if record.output != 0 {
            outputs.push((i as u32, record.output));
        }
    }
    Ok(Columns {
        count: count as u32,
        values: values.finish(),
        keys: keys.finish(),
        timestamps,
        untimed,
        partitions,
        headers,
        outputs,
    })
}

/// Records an operator returned, in the flat encoding; what breaks the rules of
/// `columns` is an error naming the field.
pub(crate) fn to_flat(records: Records) -> Result<Vec<u8>, String> {
    let c = match records {
        Records::Flat(flat) => return Ok(flat),
        Records::Columns(columns) => columns,
    };
    let count = c.count as usize;
    let context = |e: String| format!("returned records in columns whose {e}");
    let values = unpack(
        "values",
        &c.values.data,
        &c.values.ends,
        &c.values.absent,
        count,
    )
    .map_err(context)?;
    if let Some(i) = values.iter().position(Option::is_none) {
        return Err(format!(
            "returned records in columns whose value {i} is absent (a record always has one)"
        ));
    }
    let keys =
        unpack("keys", &c.keys.data, &c.keys.ends, &c.keys.absent, count).map_err(context)?;
    let sized = |name: &str, len: usize, per: usize| {
        if len == per * count || len == 0 {
            Ok(())
        } else {
            Err(format!(
                "returned records in columns with {count} records but {len} bytes of {name} \
                 (none or {per} per record)"
            ))
        }
    };
    sized("timestamps", c.timestamps.len(), 8)?;
    sized("untimed", c.untimed.len(), 1)?;
    if c.timestamps.is_empty() && !c.untimed.is_empty() {
        return Err("returned records in columns with `untimed` but no `timestamps`".into());
    }
    sized("partitions", c.partitions.len(), 4)?;
    let ascending = |name: &str, numbers: &mut dyn Iterator<Item = u32>| {
        let mut last = None;
        for n in numbers {
            if n as usize >= count || last.is_some_and(|l| n <= l) {
                return Err(format!(
                    "returned records in columns whose {name} name record {n} out of order or \
                     beyond the {count} records"
                ));
            }
            last = Some(n);
        }
        Ok(())
    };
    ascending("headers", &mut c.headers.iter().map(|(i, _)| *i))?;
    ascending("outputs", &mut c.outputs.iter().map(|(i, _)| *i))?;
    if let Some((i, _)) = c.outputs.iter().find(|(_, output)| *output == 0) {
        return Err(format!(
            "returned records in columns sending record {i} to output 0 among the side \
             outputs (the main output is no side output: leave the record out of `outputs`)"
        ));
    }
    let mut headers = c.headers.iter().peekable();
    let mut outputs = c.outputs.iter().peekable();
    let mut writer =
        BatchWriter::with_capacity(c.values.data.len() + c.keys.data.len() + 21 * count);
    let mut encoded = Vec::new();
    for (i, (value, key)) in values.into_iter().zip(keys).enumerate() {
        let timestamp = (!c.timestamps.is_empty() && c.untimed.get(i).is_none_or(|&f| f == 0))
            .then(|| {
                i64::from_le_bytes(c.timestamps[8 * i..8 * i + 8].try_into().expect("8 bytes"))
            });
        let mut record = RecordRef::new(key, value.expect("checked above"), timestamp);
        if !c.partitions.is_empty() {
            let p = u32::from_le_bytes(c.partitions[4 * i..4 * i + 4].try_into().expect("4"));
            record.partition = (p != NO_PARTITION).then_some(p);
        }
        if headers.peek().is_some_and(|(n, _)| *n as usize == i) {
            let (_, pairs) = headers.next().expect("peeked");
            encoded = encode_headers(pairs.iter().map(|(n, v)| (&n[..], &v[..])));
            record.headers =
                Some(Headers::decode(&encoded).map_err(|e| format!("returned headers: {e}"))?);
        }
        if outputs.peek().is_some_and(|(n, _)| *n as usize == i) {
            record.output = outputs.next().expect("peeked").1;
        }
        writer.push_record(record);
    }
    drop(encoded);
    Ok(writer.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Vec<u8> {
        let headers = encode_headers([(&b"h"[..], &b"1"[..]), (b"h", b"2")]);
        let mut w = BatchWriter::new();
        w.push(None, b"", None);
        w.push(Some(b"k"), b"plain", Some(7));
        w.push_record(RecordRef {
            key: Some(b"kk"),
            value: b"extended",
            timestamp: None,
            headers: Some(Headers::decode(&headers).unwrap()),
            partition: Some(3),
            output: 2,
        });
        w.into_bytes()
    }

    fn u32s(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_batch_goes_to_columns_and_back_unchanged() {
        let flat = batch();
        let c = to_columns(&flat).unwrap();
        assert_eq!(c.count, 3);
        assert_eq!(c.values.data, b"plainextended");
        assert_eq!(u32s(&c.values.ends), [0, 5, 13]);
        assert!(c.values.absent.is_empty());
        assert_eq!(c.keys.data, b"kkk");
        assert_eq!(u32s(&c.keys.ends), [0, 1, 3]);
        assert_eq!(c.keys.absent, [1, 0, 0]);
        assert_eq!(c.timestamps.len(), 24);
        assert_eq!(&c.timestamps[8..16], &7i64.to_le_bytes());
        assert_eq!(c.untimed, [1, 0, 1]);
        assert_eq!(u32s(&c.partitions), [u32::MAX, u32::MAX, 3]);
        assert_eq!(
            c.headers,
            [(
                2,
                vec![
                    (b"h".to_vec(), b"1".to_vec()),
                    (b"h".to_vec(), b"2".to_vec())
                ]
            )]
        );
        assert_eq!(c.outputs, [(2, 2)]);
        assert_eq!(to_flat(Records::Columns(c)).unwrap(), flat);
    }

    #[test]
    fn plain_batches_leave_the_optional_columns_empty() {
        let mut w = BatchWriter::new();
        w.push(Some(b"a"), b"1", None);
        w.push(Some(b"b"), b"2", None);
        let flat = w.into_bytes();
        let c = to_columns(&flat).unwrap();
        assert!(c.keys.absent.is_empty() && c.timestamps.is_empty() && c.partitions.is_empty());
        assert_eq!(to_flat(Records::Columns(c)).unwrap(), flat);
    }

    #[test]
    fn columns_that_break_the_rules_are_named() {
        let good = to_columns(&batch()).unwrap();
        let broken = |f: fn(&mut Columns)| {
            let mut c = good.clone();
            f(&mut c);
            to_flat(Records::Columns(c)).unwrap_err()
        };
        assert!(broken(|c| c.count = 4).contains("values: 4 strings packed with 12 bytes of ends"));
        assert!(broken(|c| c.values.ends[8] = 99).contains("values: string 2 ends at byte 99"));
        assert!(broken(|c| c.values.ends[8] = 4).contains("string 2 ends at byte 4, before"));
        assert!(broken(|c| c.keys.absent.push(0)).contains("keys: 3 strings packed"));
        assert!(broken(|c| c.values.absent = vec![0, 1, 0]).contains("value 1 is absent"));
        assert!(broken(|c| c.timestamps.pop().map(drop).unwrap_or(())).contains("timestamps"));
        assert!(broken(|c| c.timestamps.clear()).contains("`untimed` but no `timestamps`"));
        assert!(broken(|c| c.partitions.truncate(4)).contains("4 bytes of partitions"));
        assert!(broken(|c| c.headers[0].0 = 3).contains("headers name record 3"));
        assert!(broken(|c| c.outputs.push((1, 1))).contains("outputs name record 1"));
        assert!(broken(|c| c.outputs[0].1 = 0).contains("output 0"));
    }
}
