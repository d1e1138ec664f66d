//! The Python SDK, compiled into the binary and unpacked into the data directory at start,
//! so `import keel` works in every agent without installing anything.

use std::path::Path;

const FILES: &[(&str, &str)] = &[
    ("keel/__init__.py", include_str!("../../../sdk/python/keel/__init__.py")),
    ("keel/_client.py", include_str!("../../../sdk/python/keel/_client.py")),
    ("keel/py.typed", include_str!("../../../sdk/python/keel/py.typed")),
];

/// Writes the SDK under `dir` unless an identical copy is already there. Each file is
/// written to a temporary name and renamed, so a running agent never imports half a file.
pub(crate) fn unpack(dir: &Path) -> std::io::Result<()> {
    for (name, contents) in FILES {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|existing| existing == contents.as_bytes()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, contents)?;
        std::fs::rename(&temporary, &path)?;
    }
    Ok(())
}
