//! The kernel's shape, held by tests (ARCHITECTURE.md, "The kernel's modules"): the
//! subsystems name neither `Kernel` nor `LiveRun`, `run/` never names `syscall/`, only
//! `kernel.rs` and `kernel/` have public methods on `Kernel`, no file grows past about
//! 600 lines without saying why at its top, `keel-server` does not depend on the store,
//! and the binary serves every router through `client::serve`.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `src`, as (path relative to `src`, text).
fn sources() -> Vec<(String, String)> {
    sources_under(&src())
}

/// Every `.rs` file under `root`, as (path relative to `root`, text).
fn sources_under(root: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path.strip_prefix(root).unwrap().display().to_string();
                files.push((name, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// The code of a file: its lines without `//` comments and without its `#[cfg(test)]`
/// module (tests may build whatever they need).
fn code(text: &str) -> Vec<&str> {
    let body = text.split("\n#[cfg(test)]").next().unwrap_or(text);
    body.lines().map(|line| line.split("//").next().unwrap_or("")).collect()
}

fn names(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// The kernel's own layers: the `Kernel` type's methods live here, by concern.
fn in_kernel_layers(file: &str) -> bool {
    file == "kernel.rs"
        || file == "lib.rs"
        || ["kernel/", "run/", "syscall/"].iter().any(|d| file.starts_with(d))
}

#[test]
fn subsystems_name_neither_the_kernel_nor_a_live_run() {
    for (file, text) in sources().iter().filter(|(file, _)| !in_kernel_layers(file)) {
        for (n, line) in code(text).iter().enumerate() {
            for word in ["Kernel", "LiveRun"] {
                assert!(!names(line, word), "{file}:{}: a subsystem names {word}: {line}", n + 1);
            }
        }
    }
}

#[test]
fn run_never_names_syscall() {
    for (file, text) in sources().iter().filter(|(file, _)| file.starts_with("run/")) {
        for (n, line) in code(text).iter().enumerate() {
            assert!(!line.contains("crate::syscall"), "{file}:{}: run/ names syscall/: {line}", n + 1);
        }
    }
}

#[test]
fn only_kernel_rs_has_public_methods_on_the_kernel() {
    for (file, text) in sources() {
        if file == "kernel.rs" || file.starts_with("kernel/") {
            continue;
        }
        let mut in_kernel_impl = false;
        for (n, line) in code(&text).iter().enumerate() {
            if line.starts_with("impl ") {
                in_kernel_impl = names(line, "Kernel") && !line.contains(" for ");
            }
            let public = line.starts_with("    pub fn ") || line.starts_with("    pub async fn ");
            assert!(
                !(in_kernel_impl && public),
                "{file}:{}: a public Kernel method outside kernel.rs: {line}",
                n + 1
            );
        }
    }
}

#[test]
fn no_file_passes_about_600_lines_without_a_reason_at_its_top() {
    for (file, text) in sources() {
        let lines = text.lines().count();
        let explained = text.lines().take(12).any(|line| line.contains("Longer than 600 lines"));
        assert!(lines <= 650 || explained, "{file} has {lines} lines; split it, or say why at its top");
    }
}

#[test]
fn the_server_reaches_the_store_only_through_the_kernel() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../keel-server/Cargo.toml");
    let manifest = std::fs::read_to_string(manifest).unwrap();
    assert!(!manifest.contains("keel-store"), "keel-server must not depend on keel-store");
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("../keel-store/Cargo.toml");
    let store = std::fs::read_to_string(store).unwrap();
    let default = store.lines().find(|line| line.trim_start().starts_with("default")).unwrap_or("");
    assert!(!default.contains("conformance"), "the conformance suite stays out of product builds");
}

/// `axum::serve` given a router rebuilds it for every connection it accepts;
/// `keel-cli`'s `client::serve` makes it a service once. No listener may bypass it.
#[test]
fn the_binary_serves_every_router_through_client_serve() {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("../keel-cli/src");
    let calls: Vec<String> = sources_under(&cli)
        .iter()
        .flat_map(|(file, text)| {
            code(text)
                .into_iter()
                .enumerate()
                .filter(|(_, line)| line.contains("axum::serve("))
                .map(move |(number, line)| format!("{file}:{}: {}", number + 1, line.trim()))
        })
        .collect();
    assert_eq!(calls.len(), 1, "only `client::serve` calls axum::serve: {calls:#?}");
    assert!(
        calls[0].starts_with("client.rs:") && calls[0].contains("router.into_make_service()"),
        "{calls:#?}"
    );
}
