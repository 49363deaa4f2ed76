use rand::SeedableRng as _;
use rand::rngs::StdRng;
use rstest::rstest;

use super::*;

#[rstest]
#[case("120", Latency::Fixed(120))]
#[case(" 0 ", Latency::ZERO)]
#[case("300,2000", Latency::p50_p99(300, 2000))]
#[case("p50:300,p90:800,p99:2000", Latency::Percentiles(vec![(50.0, 300), (90.0, 800), (99.0, 2000)]))]
#[case("50:10, P100:40", Latency::Percentiles(vec![(50.0, 10), (100.0, 40)]))]
fn parses_each_form(#[case] text: &str, #[case] want: Latency) {
    assert_eq!(text.parse::<Latency>().unwrap(), want);
    // Shown as it is read.
    assert_eq!(want.to_string().parse::<Latency>().unwrap(), want);
}

#[rstest]
#[case("fast", "is not a number")]
#[case("2000,300", "below p50")]
#[case("p90:800,p50:300", "above the one before")]
#[case("p50:300,p90:200", "below an earlier percentile")]
#[case("p101:3", "within 0..=100")]
#[case("p50", "is not a number")]
fn rejects_nonsense_naming_it(#[case] text: &str, #[case] why: &str) {
    let err = text.parse::<Latency>().unwrap_err();
    assert!(err.contains(why), "{text}: {err}");
    assert!(err.contains(text.trim()), "names the value: {err}");
}

#[test]
fn json_keeps_a_plain_number_for_a_fixed_latency() {
    assert_eq!(serde_json::to_value(Latency::Fixed(50)).unwrap(), 50);
    assert_eq!(
        serde_json::to_value(Latency::p50_p99(300, 2000)).unwrap(),
        "300,2000"
    );
    let back: Latency = serde_json::from_value(serde_json::json!("p50:1,p99:9")).unwrap();
    assert_eq!(back, Latency::Percentiles(vec![(50.0, 1), (99.0, 9)]));
    assert!(serde_json::from_value::<Latency>(serde_json::json!("9,1")).is_err());
}

/// The sampled percentiles of `latency` over many draws, in ms.
fn sampled(latency: &Latency, percentiles: &[usize]) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut ms: Vec<f64> = (0..100_000)
        .map(|_| latency.sample(&mut rng).as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    percentiles.iter().map(|p| ms[p * ms.len() / 100 - 1]).collect()
}

#[test]
fn a_p50_p99_distribution_has_those_percentiles_and_a_tail() {
    let got = sampled(&Latency::p50_p99(300, 2000), &[50, 99, 100]);
    assert!((280.0..320.0).contains(&got[0]), "p50 {}", got[0]);
    assert!((1800.0..2200.0).contains(&got[1]), "p99 {}", got[1]);
    assert!(got[2] > 3000.0, "a long tail beyond p99: max {}", got[2]);
}

#[test]
fn percentile_points_are_followed_linearly() {
    let latency: Latency = "p50:100,p100:200".parse().unwrap();
    let got = sampled(&latency, &[25, 50, 75, 100]);
    for (got, want) in got.iter().zip([50.0, 100.0, 150.0, 200.0]) {
        assert!((got - want).abs() < 5.0, "{got} vs {want}");
    }
    assert_eq!(sampled(&Latency::Fixed(40), &[1, 100]), [40.0, 40.0]);
}
