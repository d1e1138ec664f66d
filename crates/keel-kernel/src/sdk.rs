//! The SDKs for agents (Python and Node), compiled into the binary and unpacked into the
//! data directory at start, so `import keel` and `require("keel")` work in every agent
//! without installing anything.

use std::path::Path;

use crate::paths::DataDir;

/// The Python package `keel`, as `PYTHONPATH` expects it (`<dir>/keel/__init__.py`).
const PYTHON: &[(&str, &str)] = &[
    ("keel/__init__.py", include_str!("../../../sdk/python/keel/__init__.py")),
    ("keel/_client.py", include_str!("../../../sdk/python/keel/_client.py")),
    ("keel/py.typed", include_str!("../../../sdk/python/keel/py.typed")),
];

/// The Node package `keel`, as `NODE_PATH` expects it (`<dir>/keel/package.json`): the
/// compiled CommonJS module, its ESM wrapper and its type declarations, as committed
/// (`scripts/test` checks that `dist/` is what `src/` compiles to).
const NODE: &[(&str, &str)] = &[
    ("keel/package.json", include_str!("../../../sdk/typescript/package.json")),
    ("keel/dist/index.js", include_str!("../../../sdk/typescript/dist/index.js")),
    ("keel/dist/index.d.ts", include_str!("../../../sdk/typescript/dist/index.d.ts")),
    ("keel/dist/index.mjs", include_str!("../../../sdk/typescript/dist/index.mjs")),
    ("keel/dist/index.d.mts", include_str!("../../../sdk/typescript/dist/index.d.mts")),
];

/// Unpacks both SDKs into their places in the data directory.
pub(crate) fn unpack(dir: &DataDir) -> std::io::Result<()> {
    unpack_files(&dir.python_sdk(), PYTHON)?;
    unpack_files(&dir.node_sdk(), NODE)
}

/// Writes `files` under `dir` unless an identical copy is already there. Each file is
/// written to a temporary name and renamed, so a running agent never loads half a file.
fn unpack_files(dir: &Path, files: &[(&str, &str)]) -> std::io::Result<()> {
    for (name, contents) in files {
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
