//! The machine's resources, for decisions made before allocating: how much memory is
//! available to this process.

/// Bytes of memory this process can still use: the smaller of the system's available
/// memory (`MemAvailable` in `/proc/meminfo`) and what its cgroup's limit leaves
/// (`memory.max` less `memory.current`, cgroup v2). `None` where neither can be read.
pub fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    let cgroup =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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
}
