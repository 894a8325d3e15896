//! The key a SQLite database's credentials are sealed under when
//! `TOK_SECRET_KEY` is not set: generated on the first start into a file
//! beside the database (`tok.db` → `tok.db.key`, mode 0600) and read on
//! every later start, so a laptop needs no setup and its credentials are
//! still not in the database file. Back it up with the database: without it
//! the credentials do not open.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::secrets::Keyring;

/// The key file of the SQLite database at `database`.
pub fn path_for(database: &Path) -> PathBuf {
    let mut name = database.file_name().unwrap_or_default().to_os_string();
    name.push(".key");
    database.with_file_name(name)
}

/// The key in `path`, generated first when the file does not exist. A
/// new file is written whole under another name and then linked to its
/// own, so a process starting at the same time reads either no file or the
/// whole key, and two never write two keys.
pub fn load_or_create(path: &Path) -> std::io::Result<Keyring> {
    match read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => return other,
    }
    let (keys, text) = Keyring::generate();
    let temporary = path.with_extension(format!("key-{}", crate::random_token()));
    let written = write_private(&temporary, &text).and_then(|()| {
        match std::fs::hard_link(&temporary, path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            other => other.map(|()| true),
        }
    });
    let _ = std::fs::remove_file(&temporary);
    if written? {
        tracing::info!(
            file = %path.display(),
            key = keys.ids()[0],
            "generated the key that seals connection credentials (TOK_SECRET_KEY is not set); \
             back it up with the database"
        );
        Ok(keys)
    } else {
        read(path)
    }
}

fn read(path: &Path) -> std::io::Result<Keyring> {
    let text = std::fs::read_to_string(path)?;
    Keyring::parse(text.trim(), &path.display().to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    writeln!(file, "{text}")?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_made_once_private_and_read_again() {
        let dir = std::env::temp_dir().join(format!("tok-key-{}", crate::random_token()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = path_for(&dir.join("tok.db"));
        assert_eq!(path, dir.join("tok.db.key"));
        let made = load_or_create(&path).unwrap();
        let again = load_or_create(&path).unwrap();
        assert_eq!(made.ids(), again.ids());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "only the key file stays: {left:?}");
        std::fs::write(&path, "short\n").unwrap();
        let error = load_or_create(&path).unwrap_err().to_string();
        assert!(error.contains("tok.db.key: key 1"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
