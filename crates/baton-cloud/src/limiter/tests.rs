use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Priority, RateGate};

#[tokio::test(start_paused = true)]
async fn grants_are_spaced_by_the_interval() {
    let gate = Arc::new(RateGate::new(Some(4.0)));
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..9 {
        let gate = gate.clone();
        handles.push(tokio::spawn(async move {
            gate.acquire(Priority::Normal).await;
            Instant::now()
        }));
    }
    let mut times: Vec<Duration> = Vec::new();
    for h in handles {
        times.push(h.await.unwrap() - start);
    }
    times.sort();
    // 9 grants at 4/s: the first at once, the last after 8 intervals = 2 s.
    assert_eq!(times[0], Duration::ZERO);
    assert_eq!(times[8], Duration::from_secs(2));
    for w in times.windows(2) {
        assert!(
            w[1].checked_sub(w[0]).unwrap() >= Duration::from_millis(250),
            "{times:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn urgent_jumps_the_queue() {
    let gate = Arc::new(RateGate::new(Some(1.0)));
    gate.acquire(Priority::Normal).await; // uses the slot at t=0
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for i in 0..3 {
        let (gate, order) = (gate.clone(), order.clone());
        handles.push(tokio::spawn(async move {
            gate.acquire(Priority::Normal).await;
            order.lock().unwrap().push(format!("normal{i}"));
        }));
    }
    tokio::task::yield_now().await;
    {
        let (gate, order) = (gate.clone(), order.clone());
        handles.push(tokio::spawn(async move {
            gate.acquire(Priority::Urgent).await;
            order.lock().unwrap().push("urgent".to_owned());
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, ["urgent", "normal0", "normal1", "normal2"]);
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiter_gives_its_place_up() {
    let gate = Arc::new(RateGate::new(Some(1.0)));
    gate.acquire(Priority::Normal).await;
    let first = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.acquire(Priority::Normal).await })
    };
    tokio::task::yield_now().await;
    first.abort();
    let _ = first.await;
    let start = Instant::now();
    gate.acquire(Priority::Normal).await;
    assert_eq!(Instant::now() - start, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn defer_pauses_everyone() {
    let gate = RateGate::new(None);
    let start = Instant::now();
    gate.defer(start + Duration::from_secs(3));
    gate.acquire(Priority::Urgent).await;
    assert_eq!(Instant::now() - start, Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn acquire_until_gives_up_at_the_deadline_and_frees_its_place() {
    let gate = Arc::new(RateGate::new(Some(1.0)));
    gate.acquire(Priority::Normal).await; // next slot at t=1 s
    let start = Instant::now();
    let deadline = start + Duration::from_millis(400);
    assert!(
        !gate
            .acquire_until(Priority::Normal, || Some(deadline), None)
            .await
    );
    assert_eq!(
        Instant::now() - start,
        Duration::from_millis(400),
        "gave up at the deadline"
    );
    // Its place is gone: the next waiter is granted at the next slot, not one later.
    gate.acquire(Priority::Normal).await;
    assert_eq!(Instant::now() - start, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn acquire_until_follows_an_extended_deadline() {
    let gate = Arc::new(RateGate::new(Some(1.0)));
    gate.acquire(Priority::Normal).await; // next slot at t=1 s
    let start = Instant::now();
    // The deadline is always 300 ms ahead (a lease renewed in time): the grant comes.
    let extending = || Some(Instant::now() + Duration::from_millis(300));
    assert!(gate.acquire_until(Priority::Normal, extending, None).await);
    assert_eq!(Instant::now() - start, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn acquire_until_without_a_deadline_does_not_queue() {
    let gate = Arc::new(RateGate::new(Some(1.0)));
    assert!(!gate.acquire_until(Priority::Urgent, || None, None).await);
    assert!(
        !gate
            .acquire_until(Priority::Urgent, || Some(Instant::now()), None)
            .await
    );
    // The slot at t=0 was not used by the refused callers.
    let start = Instant::now();
    gate.acquire(Priority::Normal).await;
    assert_eq!(Instant::now(), start);
}

#[tokio::test(start_paused = true)]
async fn next_grant_shows_a_pause() {
    let gate = RateGate::new(Some(4.0));
    let start = Instant::now();
    assert!(gate.next_grant() <= start);
    gate.defer(start + Duration::from_secs(5));
    assert_eq!(gate.next_grant(), start + Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn acquire_until_gives_up_as_soon_as_the_term_ends() {
    use crate::fence::Lead;
    let gate = Arc::new(RateGate::new(Some(1.0)));
    gate.acquire(Priority::Normal).await; // next slot at t=1 s
    let start = Instant::now();
    let until = start + Duration::from_secs(5);
    let (tx, rx) = tokio::sync::watch::channel(Some(Lead { term: 1, until }));
    let waiter = tokio::spawn({
        let gate = Arc::clone(&gate);
        let rx = rx.clone();
        async move {
            let lead = || rx.borrow().filter(|l| l.term == 1).map(|l| l.until);
            let granted = gate.acquire_until(Priority::Normal, lead, Some(rx.clone())).await;
            (granted, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.send_replace(None);
    let (granted, gave_up) = waiter.await.unwrap();
    assert!(!granted);
    assert_eq!(
        gave_up - start,
        Duration::from_millis(200),
        "at the change, not at `until`"
    );
}

#[tokio::test(start_paused = true)]
async fn a_bucket_near_empty_slows_normal_calls_to_its_refill_and_keeps_a_reserve_for_urgent_ones() {
    let gate = Arc::new(RateGate::new(None));
    let start = Instant::now();
    // 12 left of 3,600, full again in 3,588 s: one a second; 10 kept for urgent calls.
    gate.observe_budget(3600, 12, 1_000_000 + 3588, 1_000_000, 10);
    gate.acquire(Priority::Normal).await; // 11 left
    gate.acquire(Priority::Normal).await; // 10 left: the reserve
    assert_eq!(Instant::now(), start);
    // Urgent calls still go at once.
    for _ in 0..5 {
        gate.acquire(Priority::Urgent).await;
    }
    assert_eq!(Instant::now(), start);
    // 5 left, 10 reserved: a normal call waits until 11 are there (6 refills).
    gate.acquire(Priority::Normal).await;
    let waited = Instant::now() - start;
    assert!(
        waited >= Duration::from_secs(6) && waited < Duration::from_millis(6_100),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_bucket_lets_calls_burst() {
    let gate = Arc::new(RateGate::new(None));
    gate.observe_budget(3600, 3600, 1_000_000, 1_000_000, 100);
    let start = Instant::now();
    for _ in 0..500 {
        gate.acquire(Priority::Normal).await;
    }
    assert_eq!(Instant::now(), start);
}
