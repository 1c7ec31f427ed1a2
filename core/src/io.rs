//! Output files are written whole or not at all: to a temporary file in the target's
//! directory, then renamed over the target. A new file gets the mode `File::create` would
//! give it (0666 less the umask); a replaced file keeps its mode.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// Writes `path` atomically: the bytes produced by `write` go to a temporary file beside
/// `path`, which is renamed over `path` only once `write` succeeded and the data is flushed.
/// On error no partial file is left behind. A new file's mode is 0666 less the umask, as
/// with `File::create`; an existing file's mode is kept.
pub fn write_atomic<F>(path: &Path, write: F) -> io::Result<()>
where
    F: FnOnce(&mut dyn Write) -> io::Result<()>,
{
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)?;
    let mut builder = tempfile::Builder::new();
    builder.prefix(".infersched-").suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // open(2) takes the umask off, so this is exactly File::create's mode.
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir)?;
    if let Ok(existing) = fs::metadata(path) {
        fs::set_permissions(tmp.path(), existing.permissions())?;
    }
    {
        let mut buffered = io::BufWriter::new(tmp.as_file_mut());
        write(&mut buffered)?;
        buffered.flush()?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Writes `bytes` to `path` atomically (see [`write_atomic`]).
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(path, |w| w.write_all(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.json");
        let err = write_atomic(&target, |w| {
            w.write_all(b"partial")?;
            Err(io::Error::other("boom"))
        });
        assert!(err.is_err());
        assert!(!target.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn successful_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("sub/out.txt");
        write_bytes_atomic(&target, b"one").unwrap();
        write_bytes_atomic(&target, b"two").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
    }

    #[cfg(unix)]
    #[test]
    fn new_files_get_file_create_mode_and_replaced_files_keep_theirs() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // What File::create gives under this process's umask.
        let plain = dir.path().join("plain");
        fs::File::create(&plain).unwrap();
        let fresh = dir.path().join("fresh.json");
        write_bytes_atomic(&fresh, b"x").unwrap();
        assert_eq!(mode(&fresh), mode(&plain));
        let kept = dir.path().join("kept.csv");
        fs::write(&kept, b"old").unwrap();
        fs::set_permissions(&kept, fs::Permissions::from_mode(0o640)).unwrap();
        write_bytes_atomic(&kept, b"new").unwrap();
        assert_eq!(mode(&kept), 0o640);
        assert_eq!(fs::read(&kept).unwrap(), b"new");
    }
}
