use super::*;

#[test]
fn parses_an_attached_fip_like_the_real_api() {
    // A FIP targeted to a server, trimmed from the `attached_ip` fixture of Cherry Servers'
    // Python SDK (cherryservers/cherryservers-sdk-python) as the real API sends it.
    let json = r#"{"id":"bab8f4a1-0000-4000-8000-000000000001","address":"5.199.171.0","address_family":4,
      "cidr":"5.199.171.0/32","type":"floating-ip",
      "region":{"id":1,"name":"EU-Nord-1","slug":"eu_nord_1","region_iso_2":"LT","href":"/regions/1",
                "bgp":{"hosts":["46.166.166.122","46.166.166.123"],"asn":12345},"location":"Lithuania, Šiauliai"},
      "routed_to":{"id":"3ee8e5ce-0000-4000-8000-000000000002","address":"188.214.132.158","address_family":4,
                   "cidr":"188.214.132.128/25","gateway":"188.214.132.129","type":"primary-ip","region":{"id":1}},
      "targeted_to":{"id":622690,"href":"/servers/622690","hostname":"trusted-panda"},
      "ptr_record":"test.","a_record":"test.cloud.cherryservers.net.","ddos_scrubbing":false,
      "tags":{"env":"test"},"project":{"id":123456,"name":"cherryctl","bgp":{"enabled":false,"local_asn":0},
      "href":"/projects/123456"},"href":"/ips/bab8f4a1","some_new_field":[1,2]}"#;
    let ip: IpAddress = serde_json::from_str(json).unwrap();
    assert_eq!(ip.ip_type, IpType::FloatingIp);
    assert_eq!(ip.target(), Some(ServerId(622_690)));
    assert_eq!(ip.routed_to.as_ref().unwrap().ip_type, IpType::PrimaryIp);
    assert_eq!(ip.tags.get("env").map(String::as_str), Some("test"));
    assert_eq!(ip.region.unwrap().bgp.asn, 12345);
}

#[test]
fn null_tags_and_zero_target_read_as_empty() {
    let json =
        r#"{"id":"x","address":"203.0.113.9","type":"floating-ip","tags":null,"targeted_to":{"id":0}}"#;
    let ip: IpAddress = serde_json::from_str(json).unwrap();
    assert!(ip.tags.is_empty());
    assert_eq!(ip.target(), None);
}

#[test]
fn unknown_ip_type_does_not_fail() {
    let json = r#"{"id":"x","address":"2001:db8::1","type":"ipv6-thing"}"#;
    let ip: IpAddress = serde_json::from_str(json).unwrap();
    assert_eq!(ip.ip_type, IpType::Unknown);
}

#[test]
fn targeted_to_accepts_string_and_number() {
    for (raw, want) in [
        (r#""622690""#, Some(ServerId(622_690))),
        ("622690", Some(ServerId(622_690))),
        (r#""0""#, None),
        ("0", None),
    ] {
        let t: TargetedTo = serde_json::from_str(raw).unwrap();
        assert_eq!(t.0, want, "{raw}");
    }
    assert!(serde_json::from_str::<TargetedTo>(r#""abc""#).is_err());
    assert!(serde_json::from_str::<TargetedTo>("-1").is_err());
}

#[test]
fn targeted_to_is_sent_as_a_string() {
    let req = UpdateIpRequest {
        targeted_to: Some(TargetedTo(Some(ServerId(7)))),
        ..Default::default()
    };
    assert_eq!(serde_json::to_string(&req).unwrap(), r#"{"targeted_to":"7"}"#);
    let req = UpdateIpRequest {
        targeted_to: Some(TargetedTo::NONE),
        ..Default::default()
    };
    assert_eq!(serde_json::to_string(&req).unwrap(), r#"{"targeted_to":"0"}"#);
}

#[test]
fn create_request_leaves_out_empty_fields() {
    let req = CreateIpRequest {
        region: "LT-Siauliai".into(),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&req).unwrap(),
        r#"{"region":"LT-Siauliai"}"#
    );
}

#[test]
fn server_reads_primary_ip() {
    let json = r#"{"id":899712,"hostname":"model-thrush","state":"active",
      "bgp":{"enabled":false},"tags":{},
      "ip_addresses":[{"id":"a","address":"10.179.192.2","type":"private-ip"},
                      {"id":"b","address":"46.166.169.95","type":"primary-ip"}]}"#;
    let s: Server = serde_json::from_str(json).unwrap();
    assert_eq!(
        s.first_ipv4(&IpType::PrimaryIp),
        Some("46.166.169.95".parse().unwrap())
    );
    assert_eq!(s.provider_id(), "cherryservers://899712");
}
