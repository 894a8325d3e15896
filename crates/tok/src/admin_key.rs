//! `tok admin-key rotate`: the one way the platform admin key changes once
//! it exists. It makes a new key the only admin key, revoking the one
//! before on every process at once (keys are looked up on every request),
//! in one transaction serialized with any other rotation. A start never
//! rotates it: a node restarted with an old `TOK_ADMIN_KEY` changes nothing
//! and says so (`ensure_admin_key` in the crate root). docs/security.md,
//! "The admin key", has the procedure.

use anyhow::Context as _;
use tok_store::{AdminKeyState, hash_secret, random_token};

use crate::config::Config;

/// Rotates the admin key: to a generated key, printed once, or with
/// `from_env` to `TOK_ADMIN_KEY` as this command sees it. Says what it did.
pub async fn rotate(config: &Config, from_env: bool) -> anyhow::Result<String> {
    let (key, shown) = if from_env {
        let Some(key) = &config.admin_key else {
            anyhow::bail!(
                "--from-env makes TOK_ADMIN_KEY the admin key, and it is not set: set it to the \
                 new key (from your secret store), or leave --from-env out to have one generated"
            );
        };
        (key.0.clone(), false)
    } else {
        (format!("tok_admin_{}", random_token()), true)
    };
    let store = crate::open_store(config).await?;
    let hash = hash_secret(&key);
    if store.admin_key_state(&hash).await? == AdminKeyState::Current {
        return Ok("TOK_ADMIN_KEY is the platform admin key already: nothing changed\n".into());
    }
    let revoked = crate::audited_admin_key(
        &*store,
        &hash,
        "key.rotated",
        "tok admin-key rotate",
        store.rotate_admin_key(&hash),
        |revoked| {
            format!(
                "admin key rotated by `tok admin-key rotate`: {revoked} platform admin key(s) \
                 before it revoked"
            )
        },
    )
    .await
    .context("the admin key was not rotated")?;
    let mut out = format!(
        "the platform admin key is rotated: {revoked} admin key(s) before it are refused from now \
         on, on every process\n"
    );
    if shown {
        out.push_str(&format!(
            "the new platform admin key (shown once, store it now): {key}\n"
        ));
    }
    out.push_str(
        "set TOK_ADMIN_KEY to it on every process at their next restart; a process started with \
         the key before changes nothing and logs an error saying so\n",
    );
    Ok(out)
}
