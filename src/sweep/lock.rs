//! The exclusive lock of a sweep's output directory.

use anyhow::{Context, Result, bail};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Takes the exclusive lock of a sweep's output directory (`.infersched-sweep.lock`, with
/// the holder's process id inside), or says who holds it. The OS releases the lock when
/// the file is closed or the process dies, so a killed sweep never leaves it held.
/// The lock is opened without following links and must be a regular file holding nothing
/// but a process id (what a sweep writes): anything else is refused, never truncated.
pub(super) fn lock_output_dir(out: &Path) -> Result<std::fs::File> {
    let path = out.join(".infersched-sweep.lock");
    crate::core::io::refuse_links(&[&path])?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // A link made between the check and the open fails here (ELOOP).
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let mut f = options
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    if !f.metadata()?.is_file() {
        bail!(
            "{} is not a regular file; remove it or choose another --out",
            path.display()
        );
    }
    match f.try_lock() {
        Ok(()) => {
            let mut held = String::new();
            let ours = f.read_to_string(&mut held).is_ok()
                && held.trim().chars().all(|c| c.is_ascii_digit());
            if !ours {
                bail!(
                    "{} holds something other than a sweep's process id; it was not written by infersched, so it is left as it is (remove it or choose another --out)",
                    path.display()
                );
            }
            f.set_len(0)?;
            f.rewind()?;
            write!(f, "{}", std::process::id())?;
            f.flush()?;
            Ok(f)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "{}: another sweep (process {}) is writing to this directory; wait for it to finish or choose another --out",
                out.display(),
                if holder.trim().is_empty() {
                    "unknown"
                } else {
                    holder.trim()
                }
            )
        }
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}
