//! The SDKs for agents (Python and Node), compiled into the binary and unpacked into the
//! data directory at start, so `import keel` and `require("keel")` work in every agent
//! without installing anything. The Python SDK's bytecode is compiled there too: agents
//! see the directory read-only, so without it every Python agent would compile the SDK
//! again at each start (27% of the instructions of a bare `python3 -c 'import keel'`).

use std::path::Path;
use std::time::Duration;

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

/// How long the Python SDK's compilation may take before it is given up.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(30);

/// Unpacks both SDKs into their places in the data directory, and compiles the Python
/// SDK's bytecode when it changed or has none yet.
pub(crate) async fn unpack(dir: &DataDir) -> std::io::Result<()> {
    let python = dir.python_sdk();
    let changed = unpack_files(&python, PYTHON)?;
    unpack_files(&dir.node_sdk(), NODE)?;
    if changed || !python.join("keel/__pycache__").is_dir() {
        compile_python(&python).await;
    }
    Ok(())
}

/// Has the host's `python3` write the SDK's bytecode beside it (`keel/__pycache__`), so
/// an agent's `import keel` loads it instead of compiling the source. The files record
/// their source's hash (`checked-hash`), which the interpreter checks at each import:
/// a stale file is never used, whatever the files' times. Best effort: without
/// `python3` (a kernel for Node agents, say) or with another Python version than the
/// agents', they compile the SDK themselves as before.
async fn compile_python(dir: &Path) {
    let mut command = tokio::process::Command::new("python3");
    // `-I`: none of the kernel's PYTHON* variables (a pycache prefix would put the files
    // elsewhere) nor the user's site packages.
    command
        .args(["-I", "-m", "compileall", "-q", "--invalidation-mode", "checked-hash"])
        .arg(dir.join("keel"))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(COMPILE_TIMEOUT, command.output()).await {
        Ok(Ok(out)) if out.status.success() => {}
        Ok(Ok(out)) => tracing::warn!(
            "python3 could not compile the Python SDK's bytecode ({}): Python agents compile it at each start; {} {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!("no python3 to compile the Python SDK's bytecode with")
        }
        Ok(Err(err)) => tracing::warn!("python3 could not be started to compile the Python SDK: {err}"),
        Err(_) => tracing::warn!(
            "python3 took over {COMPILE_TIMEOUT:?} compiling the Python SDK and was stopped: Python agents compile it at each start"
        ),
    }
}

/// Writes `files` under `dir` unless an identical copy is already there. Each file is
/// written to a temporary name and renamed, so a running agent never loads half a file.
/// Says whether any file was written.
fn unpack_files(dir: &Path, files: &[(&str, &str)]) -> std::io::Result<bool> {
    let mut changed = false;
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
        changed = true;
    }
    Ok(changed)
}
