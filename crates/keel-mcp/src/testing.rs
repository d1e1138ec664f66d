//! Test helpers (feature `testing`): install the reference MCP servers and clients that the
//! interop tests run, so the kernel's tests can reuse the same installs.
//!
//! They fail with a message saying what to install rather than skipping: a test that needs
//! node or Python's `mcp` must not pass silently on a machine without them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned npm package of the reference filesystem server.
pub const FILESYSTEM_SERVER_PACKAGE: &str = "@modelcontextprotocol/server-filesystem";
/// Its pinned version.
pub const FILESYSTEM_SERVER_VERSION: &str = "2026.8.31";
/// The pinned PyPI requirement of the official Python SDK (also in
/// `scripts/test-requirements.txt`).
pub const PYTHON_MCP_REQUIREMENT: &str = "mcp==1.30.0";

/// Cargo's target directory of the running test binary (`CARGO_TARGET_DIR` if set).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // Test binaries live in `<target>/<profile>/deps/`.
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Where the npm packages for the tests are installed: `<target>/mcp-npm`.
pub fn npm_prefix() -> PathBuf {
    target_dir().join("mcp-npm")
}

/// The entry point of the reference filesystem server, installed under `prefix` with
/// `npm install --prefix <prefix> @modelcontextprotocol/server-filesystem@2026.8.31` unless
/// that version is already there. Run it as `node <entry> <allowed dir>...`.
pub fn install_filesystem_server(prefix: &Path) -> Result<PathBuf, String> {
    let package_dir = prefix.join("node_modules").join(FILESYSTEM_SERVER_PACKAGE);
    let entry = package_dir.join("dist").join("index.js");
    let installed_version = std::fs::read_to_string(package_dir.join("package.json"))
        .ok()
        .and_then(|manifest| serde_json::from_str::<serde_json::Value>(&manifest).ok())
        .and_then(|manifest| manifest["version"].as_str().map(str::to_owned));
    if entry.is_file() && installed_version.as_deref() == Some(FILESYSTEM_SERVER_VERSION) {
        return Ok(entry);
    }
    std::fs::create_dir_all(prefix)
        .map_err(|error| format!("could not create {}: {error}", prefix.display()))?;
    let spec = format!("{FILESYSTEM_SERVER_PACKAGE}@{FILESYSTEM_SERVER_VERSION}");
    let output = Command::new("npm")
        .arg("install")
        .arg("--prefix")
        .arg(prefix)
        .args(["--no-audit", "--no-fund", "--loglevel=error", &spec])
        .output()
        .map_err(|error| {
            format!("could not run `npm` ({error}); install Node.js 20+ with npm, which the MCP interop tests need")
        })?;
    if !output.status.success() {
        return Err(format!(
            "`npm install --prefix {} {spec}` failed ({}):\n{}",
            prefix.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    if !entry.is_file() {
        return Err(format!("npm installed {spec} but {} is missing", entry.display()));
    }
    Ok(entry)
}

/// A Python interpreter (`python3`, or `KEEL_TEST_PYTHON`) that can `import mcp`; installs
/// [`PYTHON_MCP_REQUIREMENT`] with `python -m pip install` when it cannot.
pub fn python_with_mcp() -> Result<String, String> {
    let python = std::env::var("KEEL_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let imports = |python: &str| {
        Command::new(python)
            .args(["-c", "import mcp.client.streamable_http, mcp.server.fastmcp"])
            .output()
            .map(|output| output.status.success())
    };
    match imports(&python) {
        Ok(true) => return Ok(python),
        Ok(false) => {}
        Err(error) => return Err(format!("could not run `{python}` ({error}); install Python 3.10+")),
    }
    let output = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", PYTHON_MCP_REQUIREMENT])
        .output()
        .map_err(|error| format!("could not run `{python} -m pip` ({error})"))?;
    if !output.status.success() || !matches!(imports(&python), Ok(true)) {
        return Err(format!(
            "`{python} -m pip install {PYTHON_MCP_REQUIREMENT}` did not make `import mcp` work ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(python)
}
