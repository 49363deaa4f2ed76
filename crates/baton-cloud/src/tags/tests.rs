use super::*;

#[test]
fn service_tag_known_vector() {
    // printf 'default/nginx' | openssl dgst -sha256 -binary | base64
    assert_eq!(
        service_tag("default", "nginx"),
        "l7RnKS8k48oG3Qv3Pxx8FzEMj3X3E5c8JPOIzyLWWdY="
    );
    assert_eq!(service_tag("kube-system", "x").len(), 44);
}

#[test]
fn fip_tags_have_three_entries() {
    let t = service_fip_tags("default", "nginx", "uid-1");
    assert_eq!(t.len(), 3);
    assert_eq!(t[USAGE_KEY], USAGE_VALUE);
    assert_eq!(t[CLUSTER_KEY], "uid-1");
}

#[test]
fn matching_needs_all_pairs_and_a_non_empty_selector() {
    let have = service_fip_tags("default", "nginx", "uid-1");
    let mut wanted = have.clone();
    assert!(matches_all(&have, &wanted));
    wanted.insert(CLUSTER_KEY.into(), "other".into());
    assert!(!matches_all(&have, &wanted));
    assert!(!matches_all(&have, &Tags::new()));
    let partial = Tags::from([(USAGE_KEY.to_owned(), USAGE_VALUE.to_owned())]);
    assert!(matches_all(&have, &partial));
}

#[test]
fn on_hetzner_the_service_label_is_the_same_hash_in_62_hex_digits() {
    // printf 'default/nginx' | sha256sum | cut -c1-62
    let label = service_tag_on(crate::CloudKind::Hetzner, "default", "nginx");
    assert_eq!(
        label,
        "97b467292f24e3ca06dd0bf73f1c7c17310c8f75f713973c24f388cf22d659d6"[..62]
    );
    assert!(label.chars().all(|c| c.is_ascii_hexdigit()));
    let tags = service_fip_tags_on(crate::CloudKind::Hetzner, "default", "nginx", "uid-1");
    assert_eq!(tags[SERVICE_KEY], label);
    assert_eq!(tags[USAGE_KEY], USAGE_VALUE);
    assert_eq!(
        service_fip_tags_on(crate::CloudKind::Cherry, "default", "nginx", "uid-1"),
        service_fip_tags("default", "nginx", "uid-1")
    );
}
