//! The instant-runoff result of a closed `ranked` poll (issue 51), as the results
//! carry it once they show: counted by [`super::runoff`] from the ballots of the
//! voters hash (each voter's ballot as it counts), once per process and poll while
//! the number of voters stays the same (a closed poll takes no ballot; a rebuild
//! that finds other ballots gives another count, and a new result).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use super::runoff::{Runoff, instant_runoff, parse_stored};
use super::store::PollRecord;
use crate::domain::PollId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::redis_conn::Redis;

/// Results counted, by poll: the voters they were counted from, and the result.
/// At most [`KEPT`] polls; past that the oldest counts are forgotten and made
/// again when asked.
type Counted = HashMap<PollId, (i64, Arc<Runoff>)>;
static COUNTED: LazyLock<Mutex<Counted>> = LazyLock::new(Default::default);
const KEPT: usize = 256;

/// The runoff of `record`'s ballots, `voters` of them as Redis counts them now.
pub async fn runoff(
    redis: &Redis,
    keys: &Keys,
    record: &PollRecord,
    id: PollId,
    voters: i64,
) -> Result<Arc<Runoff>, AppError> {
    if let Some((counted, result)) = COUNTED.lock().expect("not poisoned").get(&id)
        && *counted == voters
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
    counted.insert(id, (voters, result.clone()));
    Ok(result)
}
