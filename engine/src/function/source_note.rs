//! A source member's offsets log between checkpoints, kept in its source's
//! own system (`Source::keep_note`; Kafka: a committed offset's metadata)
//! rather than in one object-store write per epoch. Checkpoint epochs still
//! write their entry (and the member's counts) to the store; an epoch in
//! between costs the store nothing.
//!
//! The note holds every entry after the last commit: those are the epochs a
//! restart may read again, and each must be read exactly as it was.

use std::collections::BTreeMap;

use base64::Engine as _;

use super::StageFunction;
use super::source_stage::SourceStage;
use crate::checkpoint::{CheckpointStore, OffsetsEntry};
use crate::error::{EngineError, Result};
use crate::source::EpochSpec;

/// The entries kept in the source, by epoch: this instance's copy of the
/// note it last kept (or read when it started).
#[derive(Debug, Default)]
pub(super) struct KeptEntries {
    entries: BTreeMap<u64, OffsetsEntry>,
    /// The notes an earlier instance left were taken in.
    taken_in: bool,
}

impl KeptEntries {
    pub(super) fn get(&self, epoch: u64) -> Option<&OffsetsEntry> {
        self.entries.get(&epoch)
    }

    pub(super) fn insert(&mut self, epoch: u64, entry: OffsetsEntry) {
        self.entries.insert(epoch, entry);
    }

    pub(super) fn remove(&mut self, epoch: u64) {
        self.entries.remove(&epoch);
    }

    /// Whether the notes earlier instances left are in already.
    pub(super) fn taken_in(&self) -> bool {
        self.taken_in
    }

    /// Take in the entries of the notes earlier instances left (this
    /// instance's own win), keeping those after `committed`.
    fn take_in(&mut self, notes: BTreeMap<u64, OffsetsEntry>, committed: Option<u64>) {
        for (epoch, entry) in notes {
            self.entries.entry(epoch).or_insert(entry);
        }
        self.taken_in = true;
        self.committed(committed);
    }

    /// Drop what no restart reads again: the commit and everything before.
    pub(super) fn committed(&mut self, committed: Option<u64>) {
        if let Some(c) = committed {
            self.entries.retain(|e, _| *e > c);
        }
    }

    /// The note: the entries as JSON, LZ4-compressed, in base64 (Kafka's
    /// metadata is a string). Entries of one member differ in little but
    /// their offsets, so ten epochs' fit in well under a kilobyte.
    pub(super) fn note(&self) -> Result<String> {
        let json = serde_json::to_vec(&self.entries)
            .map_err(|e| EngineError::Context(format!("encoding the offsets note: {e}")))?;
        let packed = lz4_flex::compress_prepend_size(&json);
        Ok(base64::engine::general_purpose::STANDARD_NO_PAD.encode(packed))
    }
}

/// The entries of a note written by [`KeptEntries::note`].
fn read_note(note: &str) -> Result<BTreeMap<u64, OffsetsEntry>> {
    let bad =
        |why: String| EngineError::Context(format!("the offsets note kept in the source: {why}"));
    let packed = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(note.trim())
        .map_err(|e| bad(format!("not base64: {e}")))?;
    let json =
        lz4_flex::decompress_size_prepended(&packed).map_err(|e| bad(format!("not LZ4: {e}")))?;
    serde_json::from_slice(&json).map_err(|e| bad(format!("not a log: {e}")))
}

/// The key a member's note is kept under in one table's source: its run
/// lineage, stage, member and the table, so a new lineage (a fresh store)
/// never reads an old one's.
fn note_key(run: &str, stage: u32, member: u32, table: &str) -> String {
    format!("{run}.{stage}.{member}.{table}")
}

impl SourceStage {
    /// Whether any of this member's sources may keep a note.
    pub(super) fn keeps_notes(&self) -> bool {
        self.readers.iter().any(|r| r.source.keeps_notes())
    }

    /// Keep `note` in the first of this member's sources that can.
    pub(super) async fn keep_note(
        &self,
        f: &StageFunction,
        cs: &CheckpointStore,
        spec: EpochSpec,
        note: &str,
    ) -> Result<bool> {
        for r in self.readers.iter().filter(|r| r.source.keeps_notes()) {
            let key = note_key_of(f, cs, &r.table);
            if r.source
                .keep_note(spec, &key, note)
                .await
                .map_err(|e| e.at_source(&r.table, &f.name))?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Take in the entries this member's sources keep (every table's
    /// note), once per instance: before it keeps a note of its own, which
    /// replaces them, or when it needs an entry the store does not have.
    /// Reading a note fences the instance that wrote it. A run whose every
    /// epoch is a checkpoint never gets here.
    pub(super) async fn take_in_notes(
        &self,
        f: &StageFunction,
        cs: &CheckpointStore,
        kept: &mut KeptEntries,
        spec: EpochSpec,
        committed: Option<u64>,
    ) -> Result<()> {
        if kept.taken_in() {
            return Ok(());
        }
        let mut notes = BTreeMap::new();
        for r in self.readers.iter().filter(|r| r.source.keeps_notes()) {
            let key = note_key_of(f, cs, &r.table);
            let note = r
                .source
                .kept_note(spec, &key)
                .await
                .map_err(|e| e.at_source(&r.table, &f.name))?;
            if let Some(note) = note {
                notes.extend(read_note(&note).map_err(|e| e.at_source(&r.table, &f.name))?);
            }
        }
        kept.take_in(notes, committed);
        Ok(())
    }
}

/// The key of the note this member keeps in `table`'s source: one per
/// table, since one key is one writer (a second would fence the first).
fn note_key_of(f: &StageFunction, cs: &CheckpointStore, table: &str) -> String {
    note_key(&cs.manifest().run, f.ctx.stage, f.ctx.member, table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::TableRead;
    use crate::payload::SourceOffset;

    fn entry(epoch: u64) -> OffsetsEntry {
        let at = |o: i64| {
            vec![SourceOffset {
                source: "ad-events".into(),
                partition: 0,
                offset: o,
                position: None,
            }]
        };
        OffsetsEntry {
            tables: vec![TableRead {
                table: "ad_events".into(),
                from: at(epoch as i64 * 100_000),
                to: at((epoch as i64 + 1) * 100_000),
                clock: None,
            }],
            watermark: Some(1_700_000_000_000 + epoch as i64 * 1000),
            idle: false,
            drained: false,
            finished: false,
            epochs: None,
            poison: vec![],
        }
    }

    #[test]
    fn a_note_reads_back_as_written_and_keeps_only_what_follows_the_commit() {
        let mut kept = KeptEntries::default();
        for e in 1..=20 {
            kept.insert(e, entry(e));
        }
        kept.committed(Some(10));
        let note = kept.note().unwrap();
        let read = read_note(&note).unwrap();
        assert_eq!(
            read.keys().copied().collect::<Vec<_>>(),
            (11..=20).collect::<Vec<_>>()
        );
        assert_eq!(read[&15], entry(15));
        assert!(note.len() < 1500, "ten entries take {} bytes", note.len());
        assert!(read_note("not a note").is_err());
        assert!(read_note(&note[..note.len() / 2]).is_err());
    }
}
