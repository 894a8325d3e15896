//! One process serves a SQLite file: the engine releases every claim at its
//! start (no other process can hold one), and the file has one writer. A
//! second `tok serve` on the same file would release the first one's
//! claims and run their steps again, so it refuses to start. The lock is
//! an OS file lock on `<database>.lock`, next to the database: it ends
//! with the process however it ends, SIGKILL included.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::str::FromStr as _;

use anyhow::Context as _;

/// The lock this process holds on a SQLite file while it serves it.
#[derive(Debug)]
pub struct ServeLock {
    _file: File,
}

/// Takes the lock of the SQLite database `url` names; `None` for any other
/// database (PostgreSQL serves many processes) or an in-memory one.
pub fn lock_sqlite(url: &str) -> anyhow::Result<Option<ServeLock>> {
    if !url.starts_with("sqlite:") {
        return Ok(None);
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .with_context(|| format!("`{url}` is not a SQLite database URL"))?;
    let database = options.get_filename();
    if database.as_os_str().is_empty() || database.to_string_lossy().contains(":memory:") {
        return Ok(None);
    }
    if let Some(dir) = database.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("could not create the folder {}", dir.display()))?;
    }
    let mut path = PathBuf::from(database);
    path.as_mut_os_string().push(".lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("could not open the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(ServeLock { _file: file })),
        Err(TryLockError::WouldBlock) => anyhow::bail!(
            "another tok process already serves the SQLite database {} (it holds {}): \
             one process serves a SQLite file; stop the other one, or use PostgreSQL \
             to run several processes",
            database.display(),
            path.display()
        ),
        Err(TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("could not lock {}", path.display()))
        }
    }
}
