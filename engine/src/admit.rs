//! Which payloads a function accepts: the envelope checked against the
//! function's own context before any of its data is decoded. A payload from
//! another query, another edge, or with counts no sender of this plan would
//! announce is refused with the reason, never collected.

use crate::context::CloudContext;
use crate::error::{EngineError, Result};
use crate::payload::{MAX_FRAGMENTS, Payload};

/// Check `p` against what `ctx` says this function receives; `stage` names
/// the function in the error.
pub fn admit(p: &Payload, ctx: &CloudContext, stage: &str) -> Result<()> {
    let bad = |reason: String| EngineError::BadPayload {
        uuid: p.uuid_string(),
        stage: stage.to_string(),
        reason,
    };
    if p.uuid.qid != ctx.query_code {
        return Err(bad(format!(
            "qid {:?} is not this function's query {}",
            p.uuid.qid, ctx.query_code
        )));
    }
    let edge = ctx
        .inputs
        .iter()
        .find(|e| e.shuffle_id == p.shuffle_id)
        .ok_or_else(|| {
            let inputs: Vec<u32> = ctx.inputs.iter().map(|e| e.shuffle_id).collect();
            bad(format!(
                "shuffle id {} is not an input of this stage (inputs {inputs:?})",
                p.shuffle_id
            ))
        })?;
    if p.uuid.seq_len != edge.senders {
        return Err(bad(format!(
            "seq_len {} is not the {} senders of edge {}",
            p.uuid.seq_len, edge.senders, edge.shuffle_id
        )));
    }
    if p.uuid.seq_num >= p.uuid.seq_len {
        return Err(bad(format!(
            "seq_num {} is not below seq_len {}",
            p.uuid.seq_num, p.uuid.seq_len
        )));
    }
    if p.fragment.count == 0 || p.fragment.count > MAX_FRAGMENTS {
        return Err(bad(format!(
            "fragment count {} is not in 1..={MAX_FRAGMENTS}",
            p.fragment.count
        )));
    }
    if p.fragment.index >= p.fragment.count {
        return Err(bad(format!(
            "fragment {} is not below fragment count {}",
            p.fragment.index, p.fragment.count
        )));
    }
    if let Some(epochs) = ctx.epochs
        && p.epoch >= epochs
    {
        return Err(bad(format!(
            "epoch {} is past the run's {epochs} epochs",
            p.epoch
        )));
    }
    // A watermark of i64::MIN is legitimate (a source partition has read
    // nothing yet: hold every window), so the watermark is not checked.
    Ok(())
}
