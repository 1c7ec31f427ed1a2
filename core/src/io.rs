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
/// A symbolic link is followed: its target is written (and the link kept). Anything other
/// than a regular file (a device such as `/dev/full`, a FIFO, a socket, a directory) is
/// refused with [`io::ErrorKind::InvalidInput`], never replaced.
pub fn write_atomic<F>(path: &Path, write: F) -> io::Result<()>
where
    F: FnOnce(&mut dyn Write) -> io::Result<()>,
{
    let resolved;
    let path = match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            resolved = resolve_link(path)?;
            resolved.as_path()
        }
        _ => path,
    };
    if let Ok(m) = fs::metadata(path)
        && !m.is_file()
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "refusing to replace {}: it is {}, not a regular file",
                path.display(),
                describe_file_type(&m.file_type())
            ),
        ));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)?;
    remove_stale_temp_files(dir);
    let mut builder = tempfile::Builder::new();
    let prefix = format!("{TEMP_PREFIX}{}-", std::process::id());
    builder.prefix(&prefix).suffix(TEMP_SUFFIX);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // open(2) takes the umask off, so this is exactly File::create's mode.
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir)?;
    let _registered = InFlight::register(tmp.path());
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

/// `s` cut to 80 characters for an error message, with its length when cut: a 200 MB
/// field is never echoed whole.
pub fn excerpt(s: &str) -> String {
    const MAX: usize = 80;
    match s.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}... ({} bytes)", &s[..cut], s.len()),
        None => s.to_owned(),
    }
}

/// Temporary files are named `.infersched-<pid>-<random>.tmp`.
const TEMP_PREFIX: &str = ".infersched-";
const TEMP_SUFFIX: &str = ".tmp";

/// The temporary files this process is writing now, for [`remove_in_flight_temp_files`].
static IN_FLIGHT: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Registers a temporary file while it is being written; unregisters on drop.
struct InFlight(std::path::PathBuf);

impl InFlight {
    fn register(path: &Path) -> Self {
        if let Ok(mut v) = IN_FLIGHT.lock() {
            v.push(path.to_owned());
        }
        Self(path.to_owned())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut v) = IN_FLIGHT.lock() {
            v.retain(|p| p != &self.0);
        }
    }
}

/// Removes the temporary files this process is writing now: for an interrupt handler that
/// is about to exit without running destructors. Returns how many were removed.
pub fn remove_in_flight_temp_files() -> usize {
    in_flight_temp_files()
        .iter()
        .filter(|p| fs::remove_file(p).is_ok())
        .count()
}

/// The temporary files this process is writing now. Another thread registering or
/// unregistering a file holds the lock for a moment: retry a bounded number of times rather
/// than block (an interrupt handler calls this) or give up at once (which left files behind
/// and made a test flaky).
fn in_flight_temp_files() -> Vec<std::path::PathBuf> {
    for _ in 0..10_000 {
        match IN_FLIGHT.try_lock() {
            Ok(v) => return v.clone(),
            Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner().clone(),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    Vec::new()
}

/// Removes temporary files in `dir` left by processes that no longer run (killed before
/// they could clean up). Files of running processes are left alone. Best effort: errors
/// are ignored. On systems without `/proc` nothing is removed.
pub fn remove_stale_temp_files(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = name
            .strip_prefix(TEMP_PREFIX)
            .filter(|_| name.ends_with(TEMP_SUFFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Refuses output paths that are symbolic links, for commands that write only files of
/// their own (a sweep's directory, a calibration run): an error naming the first link.
pub fn refuse_links<P: AsRef<Path>>(paths: &[P]) -> io::Result<()> {
    for p in paths {
        let p = p.as_ref();
        if fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symbolic link; this command writes only files of its own, never through a link (remove it or choose another output directory)",
                    p.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The file a symbolic link points to (following chains), whether or not it exists yet.
fn resolve_link(link: &Path) -> io::Result<std::path::PathBuf> {
    let mut path = link.to_path_buf();
    for _ in 0..40 {
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&path)?;
                path = match path.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => return Ok(path),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: too many levels of symbolic links", link.display()),
    ))
}

fn describe_file_type(t: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Writes `bytes` to `path` atomically (see [`write_atomic`]).
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(path, |w| w.write_all(bytes))
}

/// A number for a message: as written for everyday magnitudes, in scientific notation
/// (`1.37e301`) where plain digits would run long, so input is never echoed as hundreds
/// of digits.
pub fn short_number(v: f64) -> String {
    if v.is_finite() && v != 0.0 && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn special_files_are_refused_and_links_are_written_through() {
        let dir = tempfile::tempdir().unwrap();
        // A socket stands in for a device or FIFO: not a regular file.
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = write_bytes_atomic(&sock, b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            e.to_string().contains("a socket, not a regular file"),
            "{e}"
        );
        let kind = fs::symlink_metadata(&sock).unwrap().file_type();
        assert!(
            std::os::unix::fs::FileTypeExt::is_socket(&kind),
            "left in place"
        );
        let e = write_bytes_atomic(dir.path(), b"x").unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        // A link to a file: the file gets the bytes, the link stays a link.
        let target = dir.path().join("target.txt");
        fs::write(&target, b"old").unwrap();
        let link = dir.path().join("link.txt");
        std::os::unix::fs::symlink("target.txt", &link).unwrap();
        // Commands that write only their own files refuse it instead.
        let e = refuse_links(&[target.clone(), link.clone()]).unwrap_err();
        assert!(e.to_string().contains("link.txt is a symbolic link"), "{e}");
        assert!(refuse_links(&[target.clone(), dir.path().join("absent")]).is_ok());
        write_bytes_atomic(&link, b"new").unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&target).unwrap(), b"new");
        // A dangling link creates its target.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink("created.txt", &dangling).unwrap();
        write_bytes_atomic(&dangling, b"made").unwrap();
        assert_eq!(fs::read(dir.path().join("created.txt")).unwrap(), b"made");
        // A link to a special file is refused like the file itself.
        let to_sock = dir.path().join("to-sock");
        std::os::unix::fs::symlink(&sock, &to_sock).unwrap();
        assert!(write_bytes_atomic(&to_sock, b"x").is_err());
    }

    #[test]
    fn temp_files_of_dead_processes_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        // pid 4294967 is above Linux's pid_max (4194304): never running.
        let dead = dir.path().join(".infersched-4294967-abc.tmp");
        let live = dir
            .path()
            .join(format!(".infersched-{}-abc.tmp", std::process::id()));
        let other = dir.path().join(".infersched-notapid.tmp");
        for p in [&dead, &live, &other] {
            fs::write(p, b"x").unwrap();
        }
        write_bytes_atomic(&dir.path().join("out.txt"), b"ok").unwrap();
        if Path::new("/proc/self").exists() {
            assert!(!dead.exists());
        }
        assert!(live.exists() && other.exists());
        // While a write is in flight its temporary file is known (other tests' writes may
        // be in flight too: only this directory's is touched), and once it is removed the
        // write fails cleanly.
        let target = dir.path().join("slow.txt");
        write_atomic(&target, |_| {
            let mine: Vec<_> = in_flight_temp_files()
                .into_iter()
                .filter(|p| p.starts_with(dir.path()))
                .collect();
            assert_eq!(mine.len(), 1);
            fs::remove_file(&mine[0])
        })
        .unwrap_err();
        assert!(!target.exists());
        assert!(
            in_flight_temp_files()
                .iter()
                .all(|p| !p.starts_with(dir.path()))
        );
    }

    #[test]
    fn excerpts_are_bounded() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(1000);
        let e = excerpt(&long);
        assert!(
            e.starts_with(&"é".repeat(80)) && e.ends_with("... (2000 bytes)"),
            "{e}"
        );
        // Through a reader: a huge request id in a schedule CSV.
        let text = format!("batch,request,tokens\n0,{},1\n", "7".repeat(100_000));
        let err = crate::Schedule::from_csv_str(&text, Path::new("s.csv"))
            .unwrap_err()
            .to_string();
        assert!(
            err.len() < 300 && err.contains("from 0 to 4294967295"),
            "{err}"
        );
    }

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
