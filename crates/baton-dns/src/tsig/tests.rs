use super::TsigKey;

const KEYGEN: &str = r#"key "baton-c1" {
	algorithm hmac-sha256;
	secret "pXKMGzZ8nUHSBbR3vVKXkR7XzlzrQ/Hb3xbCl+8c9QE=";
};
"#;

#[test]
fn parses_tsig_keygen_output() {
    let key = TsigKey::parse(KEYGEN).unwrap();
    assert_eq!(key.name(), "baton-c1");
    assert_eq!(key.algorithm(), "hmac-sha256");
    assert!(key.signer().is_ok());
}

#[test]
fn ignores_comments_and_extra_whitespace() {
    let text = "# made by hand\n/* block\n comment */ key baton-c1. { // trailing\n algorithm HMAC-SHA256 ; secret \"pXKMGzZ8nUHSBbR3vVKXkR7XzlzrQ/Hb3xbCl+8c9QE=\"; };";
    let key = TsigKey::parse(text).unwrap();
    assert_eq!(key.name(), "baton-c1");
}

#[test]
fn errors_never_contain_the_secret() {
    let bad = r#"key "k" { algorithm hmac-md5; secret "c2VjcmV0LXZhbHVl"; };"#;
    let err = TsigKey::parse(bad).unwrap_err();
    assert!(err.contains("unsupported"), "{err}");
    assert!(!err.contains("c2VjcmV0LXZhbHVl"));
    let not_b64 = r#"key "k" { algorithm hmac-sha256; secret "not base64 !!"; };"#;
    let err = TsigKey::parse(not_b64).unwrap_err();
    assert!(!err.contains("not base64 !!"), "{err}");
    let key = TsigKey::parse(KEYGEN).unwrap();
    assert!(!format!("{key:?}").contains("pXKMGzZ8"));
}

#[test]
fn rejects_missing_parts() {
    assert!(TsigKey::parse("").is_err());
    assert!(TsigKey::parse(r#"key "k" { algorithm hmac-sha256; };"#).is_err());
    assert!(TsigKey::parse(r#"key "k" { secret "AAAA"; };"#).is_err());
    assert!(TsigKey::parse(r#"key "k" { algorithm hmac-sha256; secret "AAAA"; "#).is_err());
}
