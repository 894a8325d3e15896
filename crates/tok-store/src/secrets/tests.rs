//! The keyring's and the envelope's tests.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use tok_core::ids::TenantId;

use super::*;

fn owner<'a>(tenant: &'a TenantId, id: &'a str) -> Owner<'a> {
    Owner {
        tenant,
        connection_id: id,
        connection_name: "shop",
    }
}

fn credentials() -> Value {
    json!({ "bearer": "sk_live_secret", "headers": { "X-Api-Key": "k" } })
}

#[test]
fn a_sealed_credential_opens_to_what_was_sealed_and_shows_none_of_it() {
    let (keys, _) = Keyring::generate();
    let tenant = TenantId::from("ten_a".to_owned());
    let sealed = keys.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
    let text = sealed.to_string();
    assert!(!text.contains("sk_live_secret"), "{text}");
    assert_eq!(sealed["sealed"], "v1");
    assert_eq!(sealed["key"], keys.ids()[0]);
    assert_eq!(sealed_under(&sealed), Some(keys.ids()[0]));
    assert!(holds_credentials(&sealed));
    assert_eq!(
        keys.open(owner(&tenant, "con_1"), sealed).unwrap(),
        credentials()
    );
}

#[test]
fn two_seals_of_one_credential_differ() {
    let (keys, _) = Keyring::generate();
    let tenant = TenantId::from("ten_a".to_owned());
    let a = keys.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
    let b = keys.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
    assert_ne!(a["nonce"], b["nonce"]);
    assert_ne!(a["data"], b["data"]);
}

#[test]
fn a_seal_moved_to_another_connection_or_tenant_does_not_open() {
    let (keys, _) = Keyring::generate();
    let (a, b) = (
        TenantId::from("ten_a".to_owned()),
        TenantId::from("ten_b".to_owned()),
    );
    let sealed = keys.seal(owner(&a, "con_1"), &credentials()).unwrap();
    let id = keys.ids()[0].to_owned();
    let broken = SecretError::Broken {
        owner: "the credentials of connection `shop`".into(),
        key: id,
    };
    assert_eq!(
        keys.open(owner(&a, "con_2"), sealed.clone()),
        Err(broken.clone())
    );
    assert_eq!(keys.open(owner(&b, "con_1"), sealed.clone()), Err(broken));
    let mut altered = sealed;
    let data = altered["data"].as_str().unwrap().to_owned();
    let flipped = if data.starts_with('A') { "B" } else { "A" };
    altered["data"] = json!(format!("{flipped}{}", &data[1..]));
    assert!(matches!(
        keys.open(owner(&a, "con_1"), altered),
        Err(SecretError::Broken { .. })
    ));
}

#[test]
fn an_older_key_opens_and_the_newest_seals() {
    let (old, old_text) = Keyring::generate();
    let (new, new_text) = Keyring::generate();
    let both = Keyring::parse(&format!("{new_text}, {old_text}"), "TOK_SECRET_KEY").unwrap();
    assert_eq!(both.ids(), vec![new.ids()[0], old.ids()[0]]);
    let tenant = TenantId::from("ten_a".to_owned());
    let under_old = old.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
    assert_eq!(
        both.open(owner(&tenant, "con_1"), under_old).unwrap(),
        credentials()
    );
    let resealed = both.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
    assert_eq!(sealed_under(&resealed), Some(new.ids()[0]));
}

#[test]
fn a_key_not_held_is_named_with_the_ones_that_are() {
    let (old, _) = Keyring::generate();
    let (new, _) = Keyring::generate();
    let tenant = TenantId::from("ten_a".to_owned());
    let sealed = old.seal(owner(&tenant, "con_1"), &credentials()).unwrap();
    let error = new
        .open(owner(&tenant, "con_1"), sealed.clone())
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains(old.ids()[0]), "{message}");
    assert!(message.contains(new.ids()[0]), "{message}");
    assert!(message.contains("TOK_SECRET_KEY"), "{message}");
    let none = Keyring::default()
        .open(owner(&tenant, "con_1"), sealed)
        .unwrap_err();
    assert!(none.to_string().contains("holds none"), "{none}");
}

#[test]
fn nothing_to_hide_needs_no_key_and_plain_credentials_open_as_they_are() {
    let none = Keyring::default();
    let tenant = TenantId::from("ten_a".to_owned());
    assert_eq!(
        none.seal(owner(&tenant, "c"), &json!({})).unwrap(),
        json!({})
    );
    assert_eq!(
        none.seal(owner(&tenant, "c"), &Value::Null).unwrap(),
        json!({})
    );
    assert_eq!(
        none.seal(owner(&tenant, "c"), &credentials()),
        Err(SecretError::NoKey)
    );
    assert!(SecretError::NoKey.to_string().contains("TOK_SECRET_KEY"));
    assert_eq!(
        none.open(owner(&tenant, "c"), credentials()).unwrap(),
        credentials()
    );
    assert!(!holds_credentials(&json!({})));
    assert!(holds_credentials(&credentials()));
}

#[test]
fn an_unknown_envelope_version_says_so() {
    let (keys, _) = Keyring::generate();
    let tenant = TenantId::from("ten_a".to_owned());
    let mut sealed = keys.seal(owner(&tenant, "c"), &credentials()).unwrap();
    sealed["sealed"] = json!("v9");
    let error = keys.open(owner(&tenant, "c"), sealed).unwrap_err();
    assert!(error.to_string().contains("version `v9`"), "{error}");
}

#[test]
fn bad_keys_are_refused_without_showing_them() {
    let short = BASE64.encode([7u8; 16]);
    let error = Keyring::parse(&short, "TOK_SECRET_KEY").unwrap_err();
    assert!(error.contains("key 1 is 16 bytes; expected 32"), "{error}");
    assert!(!error.contains(&short), "{error}");
    let error = Keyring::parse("not base64!", "TOK_SECRET_KEY").unwrap_err();
    assert!(error.contains("key 1 is not base64"), "{error}");
    assert!(!error.contains("not base64!"), "{error}");
    let (_, key) = Keyring::generate();
    let error = Keyring::parse(&format!("{key},"), "TOK_SECRET_KEY").unwrap_err();
    assert!(error.contains("key 2 is empty"), "{error}");
    let error = Keyring::parse(&format!("{key},{key}"), "TOK_SECRET_KEY").unwrap_err();
    assert!(error.contains("named twice"), "{error}");
}

fn source<'a>(tenant: &'a TenantId, id: &'a str) -> SourceOwner<'a> {
    SourceOwner {
        tenant,
        source_id: id,
        source_name: "eshop",
    }
}

#[test]
fn a_sealed_signing_secret_opens_for_its_source_only() {
    let (keys, _) = Keyring::generate();
    let (a, b) = (
        TenantId::from("ten_a".to_owned()),
        TenantId::from("ten_b".to_owned()),
    );
    let secret = "whsec_c2VjcmV0IG9mIHRoZSBzZW5kZXI=";
    let sealed = keys.seal_text(source(&a, "src_1"), secret).unwrap();
    assert!(!sealed.contains(secret), "{sealed}");
    assert_eq!(text_sealed_under(&sealed).as_deref(), Some(keys.ids()[0]));
    assert_eq!(
        keys.open_text(source(&a, "src_1"), &sealed).unwrap(),
        secret
    );
    for (tenant, id) in [(&a, "src_2"), (&b, "src_1")] {
        let error = keys.open_text(source(tenant, id), &sealed).unwrap_err();
        assert!(matches!(error, SecretError::Broken { .. }), "{error}");
        assert!(error.to_string().contains("source `eshop`"), "{error}");
    }
    // A connection's seal of the same ids is not a source's.
    let as_credentials = keys
        .seal(owner(&a, "src_1"), &json!({ "bearer": secret }))
        .unwrap();
    assert!(
        keys.open_text(source(&a, "src_1"), &as_credentials.to_string())
            .is_err()
    );
    // A secret stored before sealing opens as it is, and is known as plain.
    assert_eq!(keys.open_text(source(&a, "src_1"), secret).unwrap(), secret);
    assert_eq!(text_sealed_under(secret), None);
    assert_eq!(text_sealed_under("{\"a\": 1}"), None);
    assert_eq!(
        Keyring::default().seal_text(source(&a, "src_1"), secret),
        Err(SecretError::NoKey)
    );
}

#[test]
fn a_keyring_prints_its_ids_and_no_key() {
    let (keys, text) = Keyring::generate();
    let printed = format!("{keys:?}");
    assert!(printed.contains(keys.ids()[0]), "{printed}");
    assert!(!printed.contains(&text), "{printed}");
}
