//! The record of a FIP's last move and the hold-down it started ([`HoldDown`]): kept per FIP by
//! every replica, written by the one that moves ([`FIP_LAST_MOVE_ANNOTATION`]) and read back by
//! the others, so that a new leader holds the FIP as the one that moved it would have.

use std::net::IpAddr;
use std::time::Duration;

use baton_core::failover::{LastMove, Reason};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use tokio::time::Instant;

use super::EndpointState;
use crate::names::FIP_LAST_MOVE_ANNOTATION;

/// After a move, a FIP that does not answer through the cloud's route (while its holder answers
/// directly) is not moved again at once: the route may still be propagating, or the path may be
/// broken only from this replica's vantage point, and moving would not mend it — it would move
/// the FIP every few hundred milliseconds. Any move holds such moves for [`HoldDown::SETTLE`];
/// a move *because* the FIP was unreachable holds them for [`HoldDown::BASE`], doubling with
/// each such move within [`HoldDown::MAX`] of the previous one, up to `MAX`. A holder that fails
/// its direct probes is moved at once, unless its failure began with the move to it
/// ([`storm_held`]).
///
/// Every replica keeps one per FIP, and they agree through the record of the last move on the
/// endpoint Service ([`MoveRecord`]): the replica that moves writes it, every replica takes in
/// a record newer than the last move it knows ([`HoldDown::seed`]).
///
/// [`storm_held`]: baton_core::failover::storm_held
#[derive(Debug, Default)]
pub(super) struct HoldDown {
    until: Option<Instant>,
    /// The last move for an unreachable FIP, and the hold it started.
    last: Option<(Instant, Duration)>,
    /// The last move: when, from which server, to which.
    last_move: Option<(Instant, Option<u64>, u64)>,
    /// The record of the last move (its time, and the annotation's text): this replica's own
    /// after it moved, else the one read.
    record: Option<(Timestamp, String)>,
    /// Whether the current hold was already reported.
    pub(super) reported: bool,
}

impl HoldDown {
    const SETTLE: Duration = Duration::from_secs(5);
    const BASE: Duration = Duration::from_secs(30);
    const MAX: Duration = Duration::from_secs(300);

    /// Records a move at `clocks` from `from` to `to` for `reason`, and the record every replica
    /// reads.
    pub(super) fn moved(&mut self, clocks: Clocks, from: Option<u64>, to: u64, reason: Reason) {
        let now = clocks.now;
        let hold = if reason == Reason::FipUnreachable {
            let hold = match self.last {
                Some((at, prev)) if now.saturating_duration_since(at) < Self::MAX => {
                    (prev * 2).min(Self::MAX)
                }
                _ => Self::BASE,
            };
            self.last = Some((now, hold));
            hold
        } else {
            Self::SETTLE
        };
        let until = self.until.map_or(now + hold, |u| u.max(now + hold));
        self.until = Some(until);
        self.last_move = Some((now, from, to));
        self.reported = false;
        let record = MoveRecord {
            at: stamp(clocks.wall),
            from,
            to,
            reason: reason.as_str().to_owned(),
            hold_until: stamp(clocks.wall_of(until)),
            unreachable: self.last.map(|(at, hold)| UnreachableRecord {
                at: stamp(clocks.wall_of(at)),
                hold_ms: u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
            }),
        };
        self.record = serde_json::to_string(&record).ok().map(|raw| (clocks.wall, raw));
    }

    /// Takes in the record `raw` (read as `rec`) of a move, unless this replica already knows
    /// it or a later one: its hold, its doubling history and the move itself then count here as
    /// if this replica had made it. Times are converted through the wall clock (`clocks`); a
    /// time ahead of it (a clock skewed ahead) counts as now, and no hold reaches further than
    /// [`Self::MAX`] from now.
    fn seed(&mut self, clocks: Clocks, raw: &str, rec: &Recorded) {
        if self
            .record
            .as_ref()
            .is_some_and(|(at, known)| known == raw || *at >= rec.at)
        {
            return;
        }
        let now = clocks.now;
        self.last_move = clocks
            .instant_of(rec.at)
            .map(|at| (at.min(now), rec.from, rec.to));
        if let Some(until) = clocks.instant_of(rec.hold_until).map(|u| u.min(now + Self::MAX))
            && until > now
        {
            self.until = Some(self.until.map_or(until, |u| u.max(until)));
        }
        if let Some((at, hold)) = rec.unreachable
            && let Some(at) = clocks.instant_of(at).map(|at| at.min(now))
            && self.last.is_none_or(|(known, _)| known < at)
        {
            self.last = Some((at, hold.min(Self::MAX)));
        }
        self.reported = false;
        self.record = Some((rec.at, raw.to_owned()));
    }

    /// The last move, as the rules against ping-pong see it at `now`.
    pub(super) fn last_move(&self, now: Instant) -> Option<LastMove> {
        self.last_move.map(|(at, from, to)| LastMove {
            from,
            to,
            ago: now.saturating_duration_since(at),
        })
    }

    /// The text [`FIP_LAST_MOVE_ANNOTATION`] should have, once this replica knows of a move.
    pub(super) fn record_text(&self) -> Option<&str> {
        self.record.as_ref().map(|(_, raw)| raw.as_str())
    }

    /// Records that the FIP's route changed at `now` without this replica moving it. Until the
    /// nodes have learnt the new holder (its annotations), the FIP may not answer from every
    /// vantage point (the holder's own packets for its FIP need its agent's rule), so the change
    /// settles like any move.
    pub(super) fn route_changed(&mut self, now: Instant) {
        let until = now + Self::SETTLE;
        if self.until.is_none_or(|u| u <= now) {
            self.reported = false;
        }
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// Whether a move for `reason` is held back at `now`.
    pub(super) fn holds(&self, now: Instant, reason: Reason) -> bool {
        reason == Reason::FipUnreachable && self.until.is_some_and(|u| now < u)
    }
}

/// The last move of a FIP and the hold-down it started, as [`FIP_LAST_MOVE_ANNOTATION`] says it
/// (JSON; times RFC 3339 in UTC, to the millisecond).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MoveRecord {
    /// When the move was made.
    at: String,
    /// The server id it moved the FIP away from (absent: the FIP was unassigned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from: Option<u64>,
    /// The server id it moved the FIP to.
    to: u64,
    /// Why (`HolderDown`, `FipUnreachable`, …: the Event's and the metrics' reason).
    reason: String,
    /// Until when a move of an unreachable FIP is held back.
    hold_until: String,
    /// The last move *because* the FIP was unreachable and the hold it started (the next such
    /// move within 5 minutes doubles it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unreachable: Option<UnreachableRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UnreachableRecord {
    at: String,
    hold_ms: u64,
}

/// A [`MoveRecord`] read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Recorded {
    at: Timestamp,
    from: Option<u64>,
    to: u64,
    hold_until: Timestamp,
    unreachable: Option<(Timestamp, Duration)>,
}

impl Recorded {
    /// Reads the annotation's text; the error names the field that is wrong.
    fn parse(raw: &str) -> Result<Self, String> {
        let rec: MoveRecord = serde_json::from_str(raw).map_err(|e| format!("not a move record: {e}"))?;
        let time = |field: &str, v: &str| {
            v.parse::<Timestamp>()
                .map_err(|e| format!("{field} {v:?} is no RFC 3339 time: {e}"))
        };
        Ok(Self {
            at: time("at", &rec.at)?,
            from: rec.from,
            to: rec.to,
            hold_until: time("holdUntil", &rec.hold_until)?,
            unreachable: match rec.unreachable {
                Some(u) => Some((time("unreachable.at", &u.at)?, Duration::from_millis(u.hold_ms))),
                None => None,
            },
        })
    }
}

/// A wall-clock time as the record writes it: RFC 3339, UTC, milliseconds.
fn stamp(t: Timestamp) -> String {
    format!(
        "{:.3}",
        t.round(k8s_openapi::jiff::Unit::Millisecond).unwrap_or(t)
    )
}

/// One moment on both clocks: the record's wall-clock times become this process's monotonic
/// ones through it (so another node's clock enters only as its skew from this one).
#[derive(Debug, Clone, Copy)]
pub(super) struct Clocks {
    pub(super) now: Instant,
    wall: Timestamp,
}

impl Clocks {
    pub(super) fn now() -> Self {
        Self {
            now: Instant::now(),
            wall: Timestamp::now(),
        }
    }

    fn wall_of(self, t: Instant) -> Timestamp {
        let moved = if t >= self.now {
            self.wall.checked_add(t - self.now)
        } else {
            self.wall.checked_sub(self.now - t)
        };
        moved.unwrap_or(self.wall)
    }

    /// `None`: further in the past than this process's monotonic clock reaches.
    fn instant_of(self, t: Timestamp) -> Option<Instant> {
        let d = t.duration_since(self.wall);
        if d.is_negative() {
            self.now.checked_sub(d.unsigned_abs())
        } else {
            Some(self.now + d.unsigned_abs())
        }
    }
}

impl EndpointState {
    /// Reads the record of the FIP's last move on its Service (each text once): a move another
    /// replica made, a previous leader's hold, count here too. A garbled record is ignored (and
    /// logged once); the leader writes its own over it after its next move.
    pub(super) fn read_record(&mut self, svc: &Service, clocks: Clocks, fip: IpAddr) {
        let Some(raw) = svc.annotations().get(FIP_LAST_MOVE_ANNOTATION) else {
            self.record_seen = None;
            return;
        };
        if self.record_seen.as_deref() == Some(raw.as_str()) {
            return;
        }
        self.record_seen = Some(raw.clone());
        match Recorded::parse(raw) {
            Ok(rec) => self.hold.seed(clocks, raw, &rec),
            Err(error) => {
                tracing::warn!(%fip, %error, annotation = FIP_LAST_MOVE_ANNOTATION, "ignoring the garbled record of the FIP's last move");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Both clocks of one replica in a test: the monotonic one (paused tokio time) and a wall
    /// clock `skew` ahead of the shared one.
    fn clocks_at(now: Instant, origin: Instant, skew_ms: i64) -> Clocks {
        let wall0 = Timestamp::from_second(1_795_000_000).unwrap();
        Clocks {
            now,
            wall: wall0
                .checked_add(now - origin)
                .unwrap()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(skew_ms))
                .unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_fip_is_held_after_a_move_and_the_hold_doubles() {
        let origin = Instant::now();
        let c = |t: Instant| clocks_at(t, origin, 0);
        let mut hold = HoldDown::default();
        let t0 = Instant::now();
        assert!(
            !hold.holds(t0, Reason::FipUnreachable),
            "nothing held before any move"
        );

        // Any move settles first: a route still propagating is not a reason to move again.
        hold.moved(c(t0), Some(1), 2, Reason::HolderDown);
        assert!(hold.holds(t0 + Duration::from_secs(4), Reason::FipUnreachable));
        assert!(
            !hold.holds(t0 + Duration::from_secs(4), Reason::HolderDown),
            "a dead holder always moves"
        );
        assert!(!hold.holds(t0 + HoldDown::SETTLE, Reason::FipUnreachable));

        // A move because the FIP was unreachable holds the next one 30 s, then 60 s, …
        let t1 = t0 + Duration::from_secs(10);
        hold.moved(c(t1), Some(2), 3, Reason::FipUnreachable);
        assert!(hold.holds(t1 + Duration::from_secs(29), Reason::FipUnreachable));
        assert!(!hold.holds(t1 + HoldDown::BASE, Reason::FipUnreachable));
        let t2 = t1 + Duration::from_secs(31);
        hold.moved(c(t2), Some(3), 1, Reason::FipUnreachable);
        assert!(hold.holds(t2 + Duration::from_secs(59), Reason::FipUnreachable));
        assert!(!hold.holds(t2 + Duration::from_secs(60), Reason::FipUnreachable));

        // … capped at 5 minutes, and back to 30 s after a quiet 5 minutes.
        let mut t = t2;
        for _ in 0..6 {
            t += Duration::from_secs(1);
            hold.moved(c(t), Some(1), 2, Reason::FipUnreachable);
        }
        assert!(hold.holds(t + HoldDown::MAX - Duration::from_secs(1), Reason::FipUnreachable));
        assert!(!hold.holds(t + HoldDown::MAX, Reason::FipUnreachable));
        let later = t + HoldDown::MAX + Duration::from_secs(1);
        hold.moved(c(later), Some(2), 3, Reason::FipUnreachable);
        assert!(!hold.holds(later + HoldDown::BASE, Reason::FipUnreachable));

        // A move someone else made settles too (the nodes learn the new holder from this
        // replica's annotations), never shortening a hold already running.
        let mut hold = HoldDown::default();
        let t3 = Instant::now();
        hold.route_changed(t3);
        assert!(hold.holds(t3 + Duration::from_secs(4), Reason::FipUnreachable));
        assert!(!hold.holds(t3, Reason::HolderDown), "a dead holder always moves");
        assert!(!hold.holds(t3 + HoldDown::SETTLE, Reason::FipUnreachable));
        hold.moved(c(t3), Some(1), 2, Reason::FipUnreachable);
        hold.route_changed(t3 + Duration::from_secs(1));
        assert!(hold.holds(
            t3 + HoldDown::BASE - Duration::from_secs(1),
            Reason::FipUnreachable
        ));
    }

    /// Reads `hold`'s record as another replica would.
    fn record_of(hold: &HoldDown) -> (String, Recorded) {
        let raw = hold.record_text().expect("a record after a move").to_owned();
        let rec = Recorded::parse(&raw).unwrap();
        (raw, rec)
    }

    #[tokio::test(start_paused = true)]
    async fn another_replica_holds_as_the_one_that_moved_and_doubles_its_hold() {
        let origin = Instant::now();
        let (a, b) = (
            |t: Instant| clocks_at(t, origin, 0),
            |t: Instant| clocks_at(t, origin, 0),
        );
        let t0 = Instant::now();
        // Replica A moves the FIP because it was unreachable: 30 s.
        let mut hold_a = HoldDown::default();
        hold_a.moved(a(t0), Some(1), 2, Reason::FipUnreachable);
        let (raw, rec) = record_of(&hold_a);
        let json: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(json["from"], 1);
        assert_eq!(json["to"], 2);
        assert_eq!(json["reason"], "FipUnreachable");
        assert_eq!(json["at"], "2026-11-18T11:06:40.000Z", "RFC 3339, UTC, ms");
        assert_eq!(json["holdUntil"], "2026-11-18T11:07:10.000Z");
        assert_eq!(json["unreachable"]["holdMs"], 30_000);

        // Replica B reads it 3 s later (it becomes leader): the same hold, the same last move.
        let t1 = t0 + Duration::from_secs(3);
        let mut hold_b = HoldDown::default();
        hold_b.seed(b(t1), &raw, &rec);
        assert!(hold_b.holds(t0 + Duration::from_secs(29), Reason::FipUnreachable));
        assert!(!hold_b.holds(t0 + HoldDown::BASE, Reason::FipUnreachable));
        assert_eq!(
            hold_b.last_move(t1),
            Some(LastMove {
                from: Some(1),
                to: 2,
                ago: Duration::from_secs(3)
            })
        );
        assert_eq!(hold_b.record_text(), Some(raw.as_str()), "nothing to write back");
        // Its own next unreachable move doubles A's hold: 60 s.
        let t2 = t0 + HoldDown::BASE + Duration::from_secs(1);
        hold_b.moved(b(t2), Some(2), 3, Reason::FipUnreachable);
        assert!(hold_b.holds(t2 + Duration::from_secs(59), Reason::FipUnreachable));
        assert!(!hold_b.holds(t2 + Duration::from_secs(60), Reason::FipUnreachable));

        // A reads B's record back: its hold follows; an older record (its own) changes nothing.
        hold_a.seed(a(t2), &record_of(&hold_b).0, &record_of(&hold_b).1);
        assert!(hold_a.holds(t2 + Duration::from_secs(59), Reason::FipUnreachable));
        assert_eq!(hold_a.last_move(t2).map(|m| m.to), Some(3));
        hold_a.seed(a(t2), &raw, &rec);
        assert_eq!(
            hold_a.last_move(t2).map(|m| m.to),
            Some(3),
            "an older record is no news"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_shifts_a_shared_hold_by_its_skew_and_never_past_the_maximum() {
        let origin = Instant::now();
        let t0 = Instant::now();
        let mut writer = HoldDown::default();
        writer.moved(clocks_at(t0, origin, 0), Some(1), 2, Reason::FipUnreachable);
        let (raw, rec) = record_of(&writer);
        // A reader whose clock runs 2 s ahead sees the hold end 2 s early, and the move 2 s
        // older than it is.
        let mut ahead = HoldDown::default();
        ahead.seed(clocks_at(t0, origin, 2_000), &raw, &rec);
        assert!(ahead.holds(t0 + Duration::from_secs(27), Reason::FipUnreachable));
        assert!(!ahead.holds(t0 + Duration::from_secs(28), Reason::FipUnreachable));
        assert_eq!(ahead.last_move(t0).map(|m| m.ago), Some(Duration::from_secs(2)));
        // One running 2 s behind, 2 s late; the move, in its future, counts as made now.
        let mut behind = HoldDown::default();
        behind.seed(clocks_at(t0, origin, -2_000), &raw, &rec);
        assert!(behind.holds(t0 + Duration::from_secs(31), Reason::FipUnreachable));
        assert!(!behind.holds(t0 + Duration::from_secs(32), Reason::FipUnreachable));
        assert_eq!(behind.last_move(t0).map(|m| m.ago), Some(Duration::ZERO));
        // A clock an hour behind would hold for an hour: capped at the longest hold.
        let mut far = HoldDown::default();
        far.seed(clocks_at(t0, origin, -3_600_000), &raw, &rec);
        assert!(far.holds(
            t0 + HoldDown::MAX - Duration::from_secs(1),
            Reason::FipUnreachable
        ));
        assert!(!far.holds(t0 + HoldDown::MAX, Reason::FipUnreachable));
    }

    #[rstest::rstest]
    #[case("", "not a move record")]
    #[case("{", "not a move record")]
    #[case(
        r#"{"at":"2026-11-18T21:46:40.000Z","to":2,"reason":"HolderDown"}"#,
        "holdUntil"
    )]
    #[case(
        r#"{"at":"yesterday","to":2,"reason":"HolderDown","holdUntil":"2026-11-18T21:46:45.000Z"}"#,
        "at \"yesterday\""
    )]
    #[case(r#"{"at":"2026-11-18T21:46:40.000Z","to":"cp-2","reason":"HolderDown","holdUntil":"2026-11-18T21:46:45.000Z"}"#, "not a move record")]
    #[case(r#"{"at":"2026-11-18T21:46:40.000Z","to":2,"reason":"HolderDown","holdUntil":"2026-11-18T21:46:45.000Z","unreachable":{"at":"x","holdMs":1}}"#, "unreachable.at")]
    fn a_garbled_record_is_refused_naming_the_field(#[case] raw: &str, #[case] names: &str) {
        let error = Recorded::parse(raw).unwrap_err();
        assert!(error.contains(names), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_garbled_record_on_the_service_is_ignored() {
        let origin = Instant::now();
        let mut state = EndpointState::default();
        let mut svc = Service::default();
        svc.metadata.annotations = Some(BTreeMap::from([(
            FIP_LAST_MOVE_ANNOTATION.to_owned(),
            "{garbage".to_owned(),
        )]));
        let ip: IpAddr = "203.0.113.5".parse().unwrap();
        state.read_record(&svc, clocks_at(Instant::now(), origin, 0), ip);
        assert!(state.hold.last_move(Instant::now()).is_none());
        assert!(!state.hold.holds(Instant::now(), Reason::FipUnreachable));
        assert_eq!(
            state.hold.record_text(),
            None,
            "nothing of it kept, nothing to write"
        );
        // A valid one later is read.
        let mut writer = HoldDown::default();
        writer.moved(
            clocks_at(Instant::now(), origin, 0),
            Some(1),
            2,
            Reason::HolderDown,
        );
        svc.metadata.annotations.as_mut().unwrap().insert(
            FIP_LAST_MOVE_ANNOTATION.to_owned(),
            writer.record_text().unwrap().to_owned(),
        );
        state.read_record(&svc, clocks_at(Instant::now(), origin, 0), ip);
        assert_eq!(state.hold.last_move(Instant::now()).map(|m| m.to), Some(2));
    }
}
