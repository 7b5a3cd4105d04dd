//! The instant-runoff result of a closed `ranked` poll (issue 51), as the results
//! carry it once they show: counted by [`super::runoff`] from the ballots of the
//! voters hash (each voter's ballot as it counts), once per process and poll while
//! the poll's [`Stamp`] stays the same. The stamp is read from Redis with the
//! tallies and moves whenever a ballot is written (a new voter, a changed ranking,
//! a rebuild), so every server counts the ballots Redis holds.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use super::runoff::{Runoff, instant_runoff, parse_stored};
use super::store::{PollRecord, Stamp};
use crate::domain::PollId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::redis_conn::Redis;

/// Results counted, by poll: the stamp of the ballots they were counted from, and
/// the result. At most [`KEPT`] polls; past that the oldest counts are forgotten
/// and made again when asked.
type Counted = HashMap<PollId, (Stamp, Arc<Runoff>)>;
static COUNTED: LazyLock<Mutex<Counted>> = LazyLock::new(Default::default);
const KEPT: usize = 256;

/// The runoff of `record`'s ballots, as Redis holds them under `stamp` (read with
/// the results).
pub async fn runoff(
    redis: &Redis,
    keys: &Keys,
    record: &PollRecord,
    id: PollId,
    stamp: &Stamp,
) -> Result<Arc<Runoff>, AppError> {
    if let Some((counted, result)) = COUNTED.lock().expect("not poisoned").get(&id)
        && counted == stamp
    {
        return Ok(result.clone());
    }
    let k = keys.poll(id);
    let held: Vec<(i64, String)> =
        crate::restore::scan_all(&mut redis.clone(), "HSCAN", &k.voters).await?;
    let ballots: Vec<Vec<i64>> = held.iter().filter_map(|(_, v)| parse_stored(v)).collect();
    let options: Vec<i64> = record.options.iter().map(|o| o.id).collect();
    let result = Arc::new(instant_runoff(&options, ballots.iter().map(Vec::as_slice)));
    let mut counted = COUNTED.lock().expect("not poisoned");
    if counted.len() >= KEPT {
        counted.clear();
    }
    counted.insert(id, (stamp.clone(), result.clone()));
    Ok(result)
}
