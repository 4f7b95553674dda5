//! The local state file of the embedded (memory) backend: written atomically (temp file,
//! fsync, rename, fsync of the folder), read at boot. A file that cannot be parsed is
//! moved aside as `<name>.corrupt-<unix ms>` and reported; keypool then starts empty.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use keypool_core::UnixMs;

use super::{STATE_FILE_VERSION, StateExport};
use crate::StoreError;

/// What reading the state file at boot found.
#[derive(Debug)]
pub enum StateFileLoad {
    /// No file yet: a first start.
    Missing,
    /// The file was read.
    Loaded(Box<StateExport>),
    /// The file could not be parsed; it was renamed to `moved_to` and keypool starts
    /// with empty state.
    Corrupt {
        /// Where the unreadable file now is.
        moved_to: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The file exists but could not be read or moved (permissions, I/O); keypool starts
    /// with empty state and leaves the file where it is.
    Unreadable(String),
}

/// Reads the state file at `path` (see [`StateFileLoad`]). Never panics and never
/// deletes a file.
pub fn load(path: &Path, now: UnixMs) -> StateFileLoad {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return StateFileLoad::Missing,
        Err(e) => return StateFileLoad::Unreadable(format!("cannot read {}: {e}", path.display())),
    };
    let reason = match serde_json::from_slice::<StateExport>(&bytes) {
        Ok(export) if export.version == STATE_FILE_VERSION => {
            return StateFileLoad::Loaded(Box::new(export));
        }
        Ok(export) => format!(
            "version {} is not the supported {STATE_FILE_VERSION}",
            export.version
        ),
        Err(e) => format!("not a keypool state file: {e}"),
    };
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".corrupt-{now}"));
    let moved_to = path.with_file_name(name);
    match fs::rename(path, &moved_to) {
        Ok(()) => StateFileLoad::Corrupt { moved_to, reason },
        Err(e) => StateFileLoad::Unreadable(format!(
            "{} is corrupt ({reason}) and could not be moved aside: {e}",
            path.display()
        )),
    }
}

/// Writes `export` to `path` atomically: a reader (or a crash) sees the old file or the
/// new one, never a mix.
pub fn save(path: &Path, export: &StateExport) -> Result<(), StoreError> {
    let err = |source| StoreError::WriteState {
        path: path.to_path_buf(),
        source,
    };
    let json = serde_json::to_vec(export).map_err(|e| err(std::io::Error::other(e)))?;
    // One temporary file per write, so that two writes never share one.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}-{n}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        // owner only: the state holds the OAuth tokens that accounts rotated
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            f.set_permissions(fs::Permissions::from_mode(0o600))?;
        }
        f.write_all(&json)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // make the rename itself durable; not every platform can open a folder
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        err(e)
    })
}
