//! The exclusive lock of a sweep's output directory.

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::Path;

/// Takes the exclusive lock of a sweep's output directory (`.infersched-sweep.lock`, with
/// the holder's process id inside), or says who holds it. The OS releases the lock when
/// the file is closed or the process dies, so a killed sweep never leaves it held.
pub(super) fn lock_output_dir(out: &Path) -> Result<std::fs::File> {
    let path = out.join(".infersched-sweep.lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => {
            f.set_len(0)?;
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
