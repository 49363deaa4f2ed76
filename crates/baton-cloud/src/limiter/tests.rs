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
