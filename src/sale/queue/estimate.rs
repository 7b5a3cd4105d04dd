//! How long a shopper waiting in the line still waits, and their chance of a unit,
//! from what actually moves the line (issue 50).
//!
//! The admitter lets shoppers in at the sale's pace, but never more admitted and
//! unexpired than units left (`lua/queue_admit.lua`). So the line moves at the pace
//! only while there is *room* (units left not held by an open admission). A
//! purchase takes a unit and ends an admission: the room stays as it was. Only a
//! *pass* (an admission that runs out unused, its whole life after it was given)
//! frees room for the next in line. A shopper with more people ahead than room
//! waits for passes: of the admissions open now, and of those given later.
//!
//! The model: the pace admits into the room; each admission passes, one life after
//! it was given, with the pass share `p`; the open admissions end between the
//! soonest and the latest end the script reads. Three answers:
//!
//! - the **soonest** (`min`): if every admission before this shopper passed, the
//!   pace with a full second's credit; and when the turn needs `n` passes of the
//!   admissions open now, no sooner than the `n`-th of them ends (read exactly).
//!   Nobody is let in sooner (save for units an admin adds or orders give back);
//! - the **expected** wait at the recent pass share;
//! - the **latest** (`max`), at the low end of what the share may be (one standard
//!   error below it, so a share read over few admissions gives a late bound), or
//!   none when at that share the line may never reach this place.
//!
//! And the chance: `Likely` when the units left outnumber all that everyone before
//! this shopper (those let in and holding, and those waiting ahead) may buy (one
//! each, or the sale's `max_per_user`), `Possible` when they do not, but would if
//! the recent share of those before passed and the others bought one each, else
//! `Unlikely`.

use serde::Serialize;

/// What the line looks like to one shopper waiting in it (Redis clock, ms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LineNow {
    /// People waiting before this shopper.
    pub ahead: i64,
    pub units_left: i64,
    /// Admissions running now: shoppers let in who may still buy.
    pub open: i64,
    /// Admissions a second.
    pub rate: i64,
    /// An admission's life.
    pub life_ms: i64,
    /// Until the soonest and the latest open admission ends (`None`: none open).
    pub open_ends_in_ms: Option<(i64, i64)>,
    /// When the turn needs `n` passes of the admissions open now: until the `n`-th
    /// of them ends.
    pub needed_end_in_ms: Option<i64>,
    /// The recent share of passes (0 to 1) and how many ended admissions it is
    /// over; `None` before any admission ended.
    pub pass_share: Option<(f64, f64)>,
    /// Units one shopper may buy: everyone before this shopper may take that many.
    pub per_user: i64,
}

/// A shopper's chance of a unit (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Chance {
    /// More units left than people before this shopper may buy, even if all of
    /// them buy all they may.
    Likely,
    /// Fewer units left than people before, but enough if the recent share of
    /// them lets their turn pass.
    Possible,
    /// Fewer units left than the people before who are likely to buy.
    Unlikely,
}

/// The wait, in whole seconds, and the chance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// At the recent pass share; `None` when the line may not reach this place.
    pub expected_s: Option<i64>,
    /// The soonest; `None` when no pass could bring the turn.
    pub min_s: Option<i64>,
    /// The latest, at the low end of the pass share; `None`: maybe never.
    pub max_s: Option<i64>,
    pub chance: Chance,
}

/// How often the admitter steps: a turn comes up to this late.
const STEP_MS: f64 = 100.0;
/// Steps of the model per admission life.
const STEPS_PER_LIFE: usize = 32;
/// How far the model looks: this many admission lives.
const LIVES: usize = 200;

impl LineNow {
    pub fn estimate(&self) -> Estimate {
        let (share, over) = self.pass_share.unwrap_or((0.0, 0.0));
        // One standard error of a share read over `over` admissions, at most 0.5.
        let width = 1.0 / (over + 4.0).sqrt();
        let low = if self.pass_share.is_some() {
            (share - width).max(0.0)
        } else {
            0.0
        };
        let before = self.open + self.ahead;
        let chance = if before.saturating_mul(self.per_user.max(1)) < self.units_left {
            Chance::Likely
        } else if (1.0 - share) * (before as f64) < self.units_left as f64 {
            Chance::Possible
        } else {
            Chance::Unlikely
        };
        let min = self.soonest_ms();
        let max = self.turn_ms(low, 0.0).map(|t| t + STEP_MS);
        let expected = self.turn_ms(share, 0.0).map(|t| t + STEP_MS);
        let secs_up = |ms: f64| (ms / 1000.0).ceil() as i64;
        let min_s = min.map(|ms| (ms / 1000.0).floor() as i64);
        let max_s = max.map(secs_up);
        let expected_s = expected.map(|ms| {
            let s = (ms / 1000.0).round() as i64;
            s.clamp(
                min_s.unwrap_or(s),
                max_s.unwrap_or(s).max(min_s.unwrap_or(s)),
            )
        });
        Estimate {
            expected_s,
            min_s: min_s.filter(|_| self.units_left > 0),
            max_s: max_s.filter(|_| self.units_left > 0),
            chance,
        }
    }

    fn room(&self) -> i64 {
        (self.units_left - self.open).max(0)
    }

    /// Until the pace has admitted `n` from a credit of `credit` admissions.
    fn pace_ms(&self, n: i64, credit: f64) -> f64 {
        ((n as f64 - credit).max(0.0) / self.rate.max(1) as f64) * 1000.0
    }

    /// The soonest the turn may come: a bound, not a guess. The turn needs `n`
    /// passes beyond the room. Within one life from now only the admissions open
    /// now can end, so the `j`-th pass (`j` up to `open`) is no sooner than the
    /// `j`-th of them ends (read exactly). A later one is the pass of a shopper let
    /// in from now on, a life after they were let in. And since at most `h` (open
    /// and room: the units left) hold a turn at once, the holder of pass `j + h`
    /// was let in after pass `j`: every `h` passes more take another life after
    /// the first pass (the soonest open end, or a life when none is open).
    fn soonest_ms(&self) -> Option<f64> {
        let need = self.ahead + 1;
        let pace = self.pace_ms(need, self.rate.max(1) as f64);
        let passes = need - self.room();
        if passes <= 0 {
            return Some(pace);
        }
        if passes <= self.open {
            let end = self.needed_end_in_ms.unwrap_or(0).max(0) as f64;
            return Some(pace.max(end));
        }
        let life = self.life_ms as f64;
        let first = match self.open_ends_in_ms {
            Some((first, _)) if self.open > 0 => first.max(0) as f64,
            _ => life,
        };
        let holders = (self.open + self.room()).max(1);
        let later = ((passes + holders - 1) / holders - 1) as f64;
        Some(pace.max(life).max(first + later * life))
    }

    /// When the pace, the room and the passes at share `p` have admitted this
    /// shopper (ms from now), as a fluid model in steps of a life's 1/32; `None`
    /// when they never do within [`LIVES`] lives.
    fn turn_ms(&self, p: f64, credit: f64) -> Option<f64> {
        let need = (self.ahead + 1) as f64;
        let room = self.room() as f64;
        if need <= room {
            return Some(self.pace_ms(self.ahead + 1, credit));
        }
        let rate = self.rate.max(1) as f64;
        let dt = (self.life_ms.max(1) as f64 / STEPS_PER_LIFE as f64).max(1.0);
        let ring = STEPS_PER_LIFE + 2;
        // Passes due, by step (a ring one life long): the open admissions' spread
        // evenly between their soonest and latest end.
        let mut due = vec![0.0f64; ring];
        let mut pending = 0.0;
        if let (Some((first, last)), true) = (self.open_ends_in_ms, self.open > 0) {
            let step_of = |ms: i64| ((ms.max(0) as f64 / dt).ceil() as usize).min(ring - 2);
            let (a, b) = (step_of(first), step_of(last).max(step_of(first)));
            let each = p * self.open as f64 / (b - a + 1) as f64;
            for slot in &mut due[a..=b] {
                *slot += each;
            }
            pending = p * self.open as f64;
        }
        let (mut room, mut credit, mut admitted) = (room, credit.min(rate), 0.0);
        for step in 0..STEPS_PER_LIFE * LIVES {
            let slot = step % ring;
            room += due[slot];
            pending -= due[slot];
            due[slot] = 0.0;
            credit = (credit + rate * dt / 1000.0).min(rate);
            let take = room.min(credit).min(need - admitted);
            admitted += take;
            room -= take;
            credit -= take;
            due[(step + STEPS_PER_LIFE) % ring] += p * take;
            pending += p * take;
            if admitted >= need - 1e-6 {
                return Some((step + 1) as f64 * dt);
            }
            if room < 1e-6 && pending < 1e-6 {
                return None;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(ahead: i64, units_left: i64, open: i64) -> LineNow {
        LineNow {
            ahead,
            units_left,
            open,
            rate: 10,
            life_ms: 30_000,
            open_ends_in_ms: (open > 0).then_some((5_000, 30_000)),
            needed_end_in_ms: None,
            pass_share: None,
            per_user: 1,
        }
    }

    #[test]
    fn with_room_for_everyone_ahead_the_pace_decides() {
        let e = line(49, 1000, 0).estimate();
        assert_eq!(e.chance, Chance::Likely);
        assert_eq!(
            e.min_s,
            Some(4),
            "50 at 10 a second, with a second's credit"
        );
        assert_eq!(e.expected_s, Some(5));
        assert_eq!(e.max_s, Some(6));
    }

    #[test]
    fn those_before_who_may_buy_several_each_make_a_unit_less_likely() {
        // Three before, five left: a unit each leaves two, but two each could
        // take six.
        let mut l = line(2, 5, 1);
        assert_eq!(l.estimate().chance, Chance::Likely);
        l.per_user = 2;
        assert_eq!(l.estimate().chance, Chance::Possible);
        l.per_user = 1;
        l.units_left = 3;
        assert_eq!(l.estimate().chance, Chance::Unlikely, "no pass share yet");
    }

    #[test]
    fn a_turn_behind_the_units_held_waits_for_passes() {
        // Six let in hold the last six units; two wait ahead. The turn needs three
        // passes: the soonest is the third open admission's end.
        let mut l = line(2, 6, 6);
        l.needed_end_in_ms = Some(21_000);
        let e = l.estimate();
        assert_eq!(e.min_s, Some(21));
        assert_eq!(e.max_s, None, "nobody passed yet: maybe never");
        assert_eq!(e.chance, Chance::Unlikely);
        // Half of those ended passed, over 40: later than the soonest, and bounded.
        l.pass_share = Some((0.5, 40.0));
        let e = l.estimate();
        assert_eq!(e.chance, Chance::Possible, "8 before, about 4 buy, 6 left");
        let (min, exp, max) = (e.min_s.unwrap(), e.expected_s.unwrap(), e.max_s.unwrap());
        assert!(min <= exp && exp <= max, "{e:?}");
        assert!(max > 30, "{e:?}");
    }

    #[test]
    fn more_ahead_than_the_units_can_reach_is_unlikely_and_unbounded() {
        // The 140th of a line for 50 units, nobody let in yet.
        let mut l = line(139, 50, 0);
        let e = l.estimate();
        assert_eq!(e.chance, Chance::Unlikely);
        assert_eq!((e.expected_s, e.max_s), (None, None));
        assert!(e.min_s.unwrap() >= 60, "two lives at least: {e:?}");
        // A tenth passes: 139 before, about 125 buy, 50 left: still unlikely.
        l.pass_share = Some((0.1, 50.0));
        assert_eq!(l.estimate().chance, Chance::Unlikely);
    }

    #[test]
    fn sold_out_has_no_wait() {
        let e = line(3, 0, 0).estimate();
        assert_eq!((e.min_s, e.max_s, e.expected_s), (None, None, None));
        assert_eq!(e.chance, Chance::Unlikely);
    }
}
