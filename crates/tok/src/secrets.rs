//! `tok secrets rotate`: seals every connection credential and webhook
//! signing secret not yet under the newest key of `TOK_SECRET_KEY` under
//! it, in every database the
//! configuration names, so that the older keys can then be dropped from
//! `TOK_SECRET_KEY`. Safe beside running processes (each batch is a short
//! transaction, serialized with the others' on PostgreSQL) and idempotent:
//! run again, it seals nothing. docs/security.md has the procedure.

use anyhow::Context as _;
use tok_store::Reseal;

use crate::config::Config;

/// Rotates and says, database by database, how many it sealed anew.
pub async fn rotate(config: &Config) -> anyhow::Result<String> {
    let Some(newest) = config.secret_keys.newest().map(|k| k.id().to_owned()) else {
        anyhow::bail!(
            "TOK_SECRET_KEY is not set: rotation seals under its first key; set it to the new key \
             followed by the old ones (comma-separated), e.g. `$(openssl rand -base64 32),<old key>`"
        );
    };
    let store = crate::open_store(config).await?;
    // The platform's audit row, written ahead: the re-sealing is many
    // short transactions over every database.
    let row = crate::platform_audit::row(
        "tok secrets rotate",
        "secret_key.rotated",
        tok_store::Target {
            kind: "secret_key".into(),
            id: Some(newest.clone()),
        },
        format!("re-sealing under key {newest}"),
    );
    let sealing = store.seal_credentials(Reseal::All);
    let done = crate::platform_audit::ahead(&*store, row, sealing, |done| {
        let sealed: u64 = done.iter().map(|d| d.resealed).sum();
        format!("re-sealed {sealed} secrets under key {newest}")
    })
    .await?
    .context("the credentials were not all sealed anew; run `tok secrets rotate` again once the cause is fixed")?;
    let mut out = String::new();
    for database in &done {
        out.push_str(&format!(
            "{}: re-sealed {} connection credentials and the signing secrets of {} sources under \
             key {newest}\n",
            database.database, database.resealed, database.signing_secrets
        ));
    }
    let older: Vec<&str> = config.secret_keys.ids().into_iter().skip(1).collect();
    if older.is_empty() {
        out.push_str(&format!(
            "every credential and signing secret is sealed under key {newest}\n"
        ));
    } else {
        out.push_str(&format!(
            "every credential and signing secret is sealed under key {newest}: the older keys ({}) \
             may now be removed from TOK_SECRET_KEY on every process\n",
            older.join(", ")
        ));
    }
    Ok(out)
}
