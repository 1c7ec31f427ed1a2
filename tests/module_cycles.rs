//! Layers import one way: no crate of the workspace has a cycle among its modules.
//!
//! A module `a` depends on `b` when its code (tests excluded) names `b` through
//! `use crate::b`, `use super::b`, `use self::b`, a `crate::b::...` path, or `use b::...`
//! for its own child `b`. The test finds the strongly connected components of that graph
//! (Tarjan) in every crate's `src/` and fails naming each cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path inside its crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// The crates of the workspace: their `src/` folders.
const CRATES: &[&str] = &[
    "src",
    "core/src",
    "workload/src",
    "cost-model/src",
    "schedulers/src",
    "solver/src",
    "kernels-calibration/src",
    "test-kit/src",
    "python/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every module of the crate at `src`, with its file.
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(src).unwrap().with_extension("");
            let mut path: ModPath = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                path.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                path.pop();
            }
            (path, f)
        })
        .collect()
}

/// The code of a file without its unit tests and line comments.
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(cut) => &text[..cut],
        None => &text[..],
    };
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a `use` tree names, with braces expanded: `a::{b, c::d}` gives `a::b`,
/// `a::c::d`.
fn use_paths(prefix: &[String], tree: &str) -> Vec<ModPath> {
    let tree = tree.trim().trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let head: ModPath = tree[..open]
            .split("::")
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().to_string())
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut parts = Vec::new();
        let (mut depth, mut current) = (0, String::new());
        for ch in inner.chars() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(std::mem::take(&mut current));
                    continue;
                }
                _ => {}
            }
            current.push(ch);
        }
        parts.push(current);
        let base: ModPath = prefix.iter().cloned().chain(head).collect();
        return parts
            .iter()
            .filter(|p| !p.trim().is_empty())
            .flat_map(|p| use_paths(&base, p))
            .collect();
    }
    let mut path: ModPath = prefix.to_vec();
    path.extend(
        tree.split("::")
            .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
            .filter(|s| !s.is_empty()),
    );
    vec![path]
}

/// The longest prefix of `path` that is a module of `mods`.
fn resolve(mods: &BTreeMap<ModPath, PathBuf>, path: &[String]) -> Option<ModPath> {
    (1..=path.len())
        .rev()
        .map(|k| path[..k].to_vec())
        .find(|p| mods.contains_key(p))
}

/// Each module's dependencies on the crate's other modules (not on its own ancestors).
fn dependencies(mods: &BTreeMap<ModPath, PathBuf>) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut edges = BTreeMap::new();
    for (m, file) in mods {
        let text = code(file);
        let mut deps = BTreeSet::new();
        let mut add = |path: ModPath| {
            let path: ModPath = path.into_iter().filter(|s| s != "self").collect();
            if let Some(r) = resolve(mods, &path)
                && &r != m
                && !(r.len() < m.len() && m[..r.len()] == r[..])
            {
                deps.insert(r);
            }
        };
        for stmt in text.split(';') {
            let Some(at) = stmt.find("use ") else {
                continue;
            };
            if at > 0
                && stmt[..at]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let tree = stmt[at + 4..].trim();
            let (head, rest) = tree.split_once("::").unwrap_or((tree, ""));
            let base: ModPath = match head {
                "crate" => Vec::new(),
                "super" => m[..m.len().saturating_sub(1)].to_vec(),
                "self" => m.clone(),
                child => {
                    let own: ModPath = m.iter().cloned().chain([child.to_string()]).collect();
                    if mods.contains_key(&own) {
                        add(own);
                    }
                    continue;
                }
            };
            for mut p in use_paths(&base, rest) {
                while p.first().is_some_and(|s| s == "super") {
                    p.remove(0);
                }
                add(p);
            }
        }
        for (at, _) in text.match_indices("crate::") {
            let path: ModPath = text[at + 7..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            add(path);
        }
        edges.insert(m.clone(), deps);
    }
    edges
}

/// The cycles (strongly connected components of more than one module), by Tarjan.
fn cycles(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on_stack: BTreeSet<ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &ModPath) {
            let i = self.index.len();
            self.index.insert(v.clone(), i);
            self.low.insert(v.clone(), i);
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            for w in &self.edges[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v.clone(), low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v.clone(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(&w);
                    let done = &w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "lib".to_string()
    } else {
        m.join("::")
    }
}

#[test]
fn no_crate_has_a_module_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for krate in CRATES {
        let mods = modules(&root.join(krate));
        for cycle in cycles(&dependencies(&mods)) {
            let names: Vec<String> = cycle.iter().map(name).collect();
            found.push(format!("{krate}: {}", names.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "module import cycles:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_a_cycle_and_only_a_cycle() {
    // a -> b -> c -> a is one cycle; d -> a is not part of it.
    let m = |s: &str| vec![s.to_string()];
    let edges: BTreeMap<ModPath, BTreeSet<ModPath>> = [
        (m("a"), [m("b")].into()),
        (m("b"), [m("c")].into()),
        (m("c"), [m("a")].into()),
        (m("d"), [m("a")].into()),
    ]
    .into();
    assert_eq!(cycles(&edges), vec![vec![m("a"), m("b"), m("c")]]);
    // Braced use trees name each path.
    let paths = use_paths(&[], "x::{y, z::{w, v}}");
    assert_eq!(
        paths,
        vec![
            vec!["x".to_string(), "y".to_string()],
            vec!["x".to_string(), "z".to_string(), "w".to_string()],
            vec!["x".to_string(), "z".to_string(), "v".to_string()],
        ]
    );
}
