//! The machine's resources, for decisions made before allocating: how much memory is
//! available to this process.

/// Bytes of memory this process can still use: the smallest of the system's available
/// memory (`MemAvailable` in `/proc/meminfo`), what its cgroup's limit leaves
/// (`memory.max` less `memory.current`, cgroup v2), and what its address-space limit
/// leaves (`ulimit -v`, RLIMIT_AS in `/proc/self/limits`, less the virtual size `VmSize`
/// and a reserve for the worker threads' stacks and allocator arenas). `None` where none
/// can be read.
pub fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| kib_field(&t, "MemAvailable:"));
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    let cgroup =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    let address_space = address_space_left();
    [meminfo, cgroup, address_space].into_iter().flatten().min()
}

/// Address space reserved per worker thread beyond what is mapped now: glibc's per-thread
/// malloc arena (64 MiB of address space) and a thread's stack (8 MiB).
const PER_THREAD_RESERVE: u64 = 72 << 20;

/// What the soft address-space limit leaves this process, if it has one.
fn address_space_left() -> Option<u64> {
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| address_space_limit(&t))?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let mapped = kib_field(&status, "VmSize:")?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    Some(
        limit
            .saturating_sub(mapped)
            .saturating_sub(threads * PER_THREAD_RESERVE),
    )
}

/// The soft "Max address space" limit in bytes from `/proc/self/limits`; None when it is
/// unlimited or absent.
fn address_space_limit(limits: &str) -> Option<u64> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max address space"))?;
    rest.split_whitespace().next()?.parse::<u64>().ok()
}

/// A `Name:   1234 kB` field of `/proc/meminfo` or `/proc/self/status`, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// `bytes` in GiB, for messages.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_memory_is_read_on_linux() {
        if std::path::Path::new("/proc/meminfo").exists() {
            let m = available_memory_bytes().unwrap();
            assert!(m > 0);
        }
        assert_eq!(gib(3 << 30), 3.0);
    }

    #[test]
    fn the_address_space_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max cpu time              unlimited            unlimited            seconds   \n\
                    Max address space         10240000000          unlimited            bytes     \n";
        assert_eq!(address_space_limit(text), Some(10_240_000_000));
        let unlimited = text.replace("10240000000 ", "unlimited   ");
        assert_eq!(address_space_limit(&unlimited), None);
        assert_eq!(address_space_limit("Max open files 1024 1024 files"), None);
        assert_eq!(
            kib_field("VmPeak:\t  100 kB\nVmSize:\t  2048 kB\n", "VmSize:"),
            Some(2048 * 1024)
        );
    }
}
