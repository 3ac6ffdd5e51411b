//! The instance's timers in its database: registering, deleting and firing them, the
//! boundary with the timers kept on the heap, and reading them for a savepoint (their
//! layout, the in-memory heads and the remembered set are in `timers.rs`).

use super::*;

impl LsmBackend {
    /// Registers a timer for `key` (of this instance's key groups); registering one that
    /// exists changes nothing.
    pub fn register_timer(
        &mut self,
        domain: TimeDomain,
        time: i64,
        key: &[u8],
    ) -> Result<(), StateError> {
        let kg = self.group_of(key)?;
        timers::compose(&mut self.key, kg, domain, time, key);
        if self.known_timers.contains(&self.key) {
            return Ok(());
        }
        encode_value(&mut self.value, 0, &[]);
        self.timer_writes.put(&self.key, &self.value);
        self.known_timers.insert(&self.key);
        self.timers.registered(domain, kg, time);
        if self.timer_writes.bytes() >= pending::FLUSH_BYTES {
            self.commit()?;
        }
        Ok(())
    }

    /// Deletes a timer if it exists.
    pub fn delete_timer(
        &mut self,
        domain: TimeDomain,
        time: i64,
        key: &[u8],
    ) -> Result<(), StateError> {
        let kg = self.group_of(key)?;
        timers::compose(&mut self.key, kg, domain, time, key);
        self.timer_writes.delete(&self.key);
        self.known_timers.remove(&self.key);
        self.timers.deleted(domain, kg, time);
        Ok(())
    }

    /// Registers `timers` (restored from the heap's layout) in the database.
    pub fn restore_timers(&mut self, timers: &TimerQueues) -> Result<(), StateError> {
        self.near_until = [i64::MIN; 2];
        for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
            for (time, key) in timers.iter(domain) {
                self.register_timer(domain, time, key)?;
            }
        }
        self.commit()
    }

    /// The time before which `domain`'s timers are kept on the heap (in the operator's
    /// queues) rather than here.
    pub fn near_until(&self, domain: TimeDomain) -> i64 {
        self.near_until[timers::slot(domain)]
    }

    /// The heap gave its timers of `domain` at or after `time` to the database.
    pub fn lower_near_until(&mut self, domain: TimeDomain, time: i64) {
        let s = timers::slot(domain);
        self.near_until[s] = self.near_until[s].min(time);
    }

    /// Moves the time before which timers are kept on the heap up to the database's
    /// earliest timer (every timer before it is on the heap, since none is here), or to
    /// the end of time when it holds none; returns that earliest timer's time.
    pub fn raise_near_until(&mut self, domain: TimeDomain) -> Result<Option<i64>, StateError> {
        let first = self.next_timer(domain)?;
        let s = timers::slot(domain);
        self.near_until[s] = self.near_until[s].max(first.unwrap_or(i64::MAX));
        Ok(first)
    }

    /// How many bytes the heap may hold of the timers before `near_until` (as the host
    /// counts timers: their keys and a fixed size each) before it gives the latest of them
    /// to the database: a sixteenth of the instance's memory, beside the sixteenth that
    /// remembers the timers registered here lately.
    pub fn near_timer_bytes(&self) -> u64 {
        self.config.memory_bytes.max(MIN_MEMORY_BYTES) / 16
    }

    /// The time of the earliest timer of `domain` in the database.
    pub fn next_timer(&mut self, domain: TimeDomain) -> Result<Option<i64>, StateError> {
        if let Some(least) = self.timers.least(domain) {
            return Ok(least);
        }
        let unknown = self.timers.unknown_groups(domain);
        if !unknown.is_empty() {
            self.commit()?;
            for (kg, floor) in unknown {
                let head = self.first_timer(kg, domain, floor)?;
                self.timers.set(domain, kg, head);
            }
        }
        Ok(self.timers.settle(domain))
    }

    /// Group `kg`'s earliest timer of `domain`, none of which is before `floor`, read.
    fn first_timer(&self, kg: u32, domain: TimeDomain, floor: i64) -> Result<Head, StateError> {
        let it = timer_cursor(&self.store.db, kg, domain, floor, true);
        match it.key().and_then(|k| timer_of(&k[GROUP_BYTES..])) {
            Some((_, time, _)) => Ok(Head::At(time)),
            None => it.status().map_err(storage_error).map(|()| Head::Empty),
        }
    }

    /// Removes the first `limit` timers of `domain` due at `time` (at or before it), by
    /// time and then key as the heap's queues give them, and appends them to `out`;
    /// returns how many. The due key groups' timers are merged, each group read from its
    /// head: a round reads what it takes and one more per group.
    pub fn pop_due_timers(
        &mut self,
        out: &mut TimerWriter,
        domain: TimeDomain,
        time: i64,
        limit: usize,
    ) -> Result<usize, StateError> {
        if limit == 0 || self.next_timer(domain)?.is_none_or(|t| t > time) {
            return Ok(0);
        }
        self.commit()?;
        let groups = self.timers.due_groups(domain, time);
        let mut cursors = Vec::with_capacity(groups.len());
        for &(kg, head) in &groups {
            cursors.push(timer_cursor(&self.store.db, kg, domain, head, true));
        }
        // The next due timer of each group, least first: a timer's key after its group
        // sorts as (time, key) within a domain.
        let due = |k: &[u8]| timer_of(&k[GROUP_BYTES..]).is_some_and(|(_, at, _)| at <= time);
        let mut next = std::collections::BinaryHeap::new();
        for (i, it) in cursors.iter().enumerate() {
            if let Some(k) = it.key().filter(|k| due(k)) {
                next.push(std::cmp::Reverse((k[GROUP_BYTES..].to_vec(), i)));
            }
        }
        let mut taken = 0;
        while taken < limit
            && let Some(std::cmp::Reverse((composite, i))) = next.pop()
        {
            let (_, at, key) = timer_of(&composite).expect("a timer's key");
            out.push(domain, at, key);
            self.key.clear();
            self.key.extend_from_slice(&group_start(groups[i].0));
            self.key.extend_from_slice(&composite);
            self.timer_writes.delete(&self.key);
            self.known_timers.remove(&self.key);
            taken += 1;
            let it = &mut cursors[i];
            it.next();
            if let Some(k) = it.key().filter(|k| due(k)) {
                next.push(std::cmp::Reverse((k[GROUP_BYTES..].to_vec(), i)));
            }
        }
        for (it, &(kg, _)) in cursors.iter().zip(&groups) {
            let head = match it.key().and_then(|k| timer_of(&k[GROUP_BYTES..])) {
                Some((_, at, _)) => Head::At(at),
                None => it.status().map_err(storage_error).map(|()| Head::Empty)?,
            };
            self.timers.set(domain, kg, head);
        }
        drop(cursors);
        self.commit()?;
        Ok(taken)
    }
}

/// An iterator over `domain`'s timers of key group `kg` in `db`, at the first at or after
/// `from`; what it reads goes into the block cache when `cache`.
fn timer_cursor(
    db: &DB,
    kg: u32,
    domain: TimeDomain,
    from: i64,
    cache: bool,
) -> rocksdb::DBRawIterator<'_> {
    let (start, end) = timers::range_from(kg, domain, from);
    let mut read = ReadOptions::default();
    if let Some(end) = end {
        read.set_iterate_upper_bound(end);
    }
    read.fill_cache(cache);
    let mut it = db.raw_iterator_opt(read);
    it.seek(&start);
    it
}

/// Calls `f(domain, time, key)` for every timer of key groups `range` in the database in
/// `path` (opened read only), by key group, domain and time. Seeks to each group's
/// timers: state entries are never read.
pub(crate) fn read_timers(
    path: &Path,
    range: Range<u32>,
    mut f: impl FnMut(TimeDomain, i64, &[u8]) -> Result<()>,
) -> Result<()> {
    let db = DB::open_for_read_only(&Options::default(), path, false)
        .with_context(|| format!("opening the state database in {}", path.display()))?;
    for kg in range {
        for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
            let mut it = timer_cursor(&db, kg, domain, i64::MIN, false);
            while let Some((_, time, key)) = it.key().and_then(|k| timer_of(&k[GROUP_BYTES..])) {
                f(domain, time, key)?;
                it.next();
            }
            it.status()
                .with_context(|| format!("reading {}", path.display()))?;
        }
    }
    Ok(())
}
