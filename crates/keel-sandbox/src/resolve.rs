//! Host-side discovery for the mount plan: where the command's program really is (through
//! `PATH`, pyenv shims, virtualenvs and `#!` interpreters), which installation it needs
//! bound, and what this host's system directories and `/etc` look like.
//!
//! The result is data for `plan::build`; nothing here mounts anything.

use std::path::{Path, PathBuf};

use crate::plan::{ArgumentFile, DEVICES, ETC_ENTRIES, EntryKind, HostLayout, SYSTEM_DIRS};

/// The command's program, found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What to exec: an absolute path, the same inside the sandbox as on the host.
    pub program: PathBuf,
    /// Installations the program needs, bound read-only at the same path.
    pub binds: Vec<PathBuf>,
    /// Directories to put first on the agent's `PATH` (the interpreter's `bin`).
    pub path_dirs: Vec<PathBuf>,
}

/// Looks the program up like a shell would (a name with a `/` is a path relative to
/// `cwd`), follows pyenv shims to the real interpreter, and collects the installations
/// it needs. `env` reads the run's environment first, then the kernel's.
pub fn resolve(
    program: &str,
    cwd: &Path,
    path_var: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Resolved, String> {
    let found = if program.contains('/') {
        let path = cwd.join(program);
        if !is_executable(&path) {
            return Err(format!("{} is not an executable file", path.display()));
        }
        path
    } else {
        search_path(program, path_var, None)
            .ok_or_else(|| format!("{program:?} was not found on PATH ({path_var})"))?
    };
    let program_path = match pyenv_shim(&found) {
        Some(root) => pyenv_target(&root, program_name(&found), cwd, path_var, env).ok_or_else(|| {
            format!("{} is a pyenv shim, and no pyenv version provides it", found.display())
        })?,
        None => found,
    };
    let mut resolved = Resolved { program: program_path.clone(), binds: Vec::new(), path_dirs: Vec::new() };
    let home = env("HOME").map(PathBuf::from);
    collect_installation(&program_path, path_var, home.as_deref(), &mut resolved, 0);
    if let Some(dir) = program_path.parent()
        && !is_system(dir)
    {
        resolved.path_dirs.insert(0, dir.to_path_buf());
    }
    resolved.binds.sort();
    resolved.binds.dedup();
    resolved.path_dirs.dedup();
    Ok(resolved)
}

/// The command's arguments (not the program) that name an existing regular file on the
/// host, absolute or relative to `cwd`: `python3 /elsewhere/agent.py`. Other arguments
/// (flags, code, directories, missing paths) are not ours to interpret and are skipped.
/// What gets bound is `plan::argument_binds`' decision.
pub fn argument_files(args: &[String], cwd: &Path) -> Vec<ArgumentFile> {
    let mut files = Vec::new();
    for arg in args {
        if arg.is_empty() {
            continue;
        }
        let named = normalize(&cwd.join(arg));
        // `metadata` follows symlinks: a link to a file counts, a link to a directory not.
        if !std::fs::metadata(&named).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&named) else { continue };
        let file = ArgumentFile { named, real };
        if !files.contains(&file) {
            files.push(file);
        }
    }
    files
}

/// `path` without `.` components and with each `..` taking away the component before it,
/// without looking at the file system: the path an agent sees inside the sandbox, where
/// the directories leading to a bound file are plain directories.
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn program_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or_default()
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn search_path(name: &str, path_var: &str, skip_under: Option<&Path>) -> Option<PathBuf> {
    path_var
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(Path::new)
        .filter(|dir| skip_under.is_none_or(|skip| !dir.starts_with(skip)))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_system(path: &Path) -> bool {
    SYSTEM_DIRS.iter().any(|dir| path.starts_with(dir))
}

/// If `path` is a pyenv shim, the pyenv root it belongs to. Shims are small shell
/// scripts that `export PYENV_ROOT="..."` and exec `pyenv exec`.
fn pyenv_shim(path: &Path) -> Option<PathBuf> {
    if path.parent()?.file_name()? != "shims" {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    if !text.contains("pyenv") {
        return None;
    }
    text.lines().find_map(|line| {
        let value = line.trim().strip_prefix("export PYENV_ROOT=")?;
        Some(PathBuf::from(value.trim_matches('"')))
    })
}

/// The version names pyenv would pick, in its order: `PYENV_VERSION`, the nearest
/// `.python-version` above `cwd`, `$PYENV_ROOT/version`, else `system`.
fn pyenv_versions(root: &Path, cwd: &Path, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let split = |text: &str| -> Vec<String> {
        text.split(|c: char| c == ':' || c.is_whitespace())
            .filter(|v| !v.is_empty() && !v.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    if let Some(versions) = env("PYENV_VERSION").filter(|v| !v.is_empty()) {
        return split(&versions);
    }
    for dir in cwd.ancestors() {
        if let Ok(text) = std::fs::read_to_string(dir.join(".python-version")) {
            return split(&text);
        }
    }
    if let Ok(text) = std::fs::read_to_string(root.join("version")) {
        let versions = split(&text);
        if !versions.is_empty() {
            return versions;
        }
    }
    vec!["system".to_owned()]
}

fn pyenv_target(
    root: &Path,
    name: &str,
    cwd: &Path,
    path_var: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<PathBuf> {
    for version in pyenv_versions(root, cwd, env) {
        if version == "system" {
            if let Some(found) = search_path(name, path_var, Some(root)) {
                return Some(found);
            }
            continue;
        }
        let candidate = root.join("versions").join(&version).join("bin").join(name);
        if is_executable(&candidate) {
            return Some(candidate);
        }
    }
    None
}

/// The directory an executable was installed into: `<prefix>` for `<prefix>/bin/x`,
/// else the executable's own directory. Never `/` or the home directory itself (that
/// would expose everything in it): then just the executable's directory.
fn installation_of(executable: &Path, home: Option<&Path>) -> Option<PathBuf> {
    let dir = executable.parent()?;
    let prefix = match dir.file_name().and_then(|n| n.to_str()) {
        Some("bin" | "sbin") => dir.parent()?.to_path_buf(),
        _ => dir.to_path_buf(),
    };
    let too_wide = prefix.components().count() <= 1 || home.is_some_and(|h| prefix == h);
    Some(if too_wide { dir.to_path_buf() } else { prefix })
}

fn collect_installation(
    executable: &Path,
    path_var: &str,
    home: Option<&Path>,
    resolved: &mut Resolved,
    depth: usize,
) {
    if depth > 3 {
        return;
    }
    let real = std::fs::canonicalize(executable).unwrap_or_else(|_| executable.to_path_buf());
    for path in [executable, real.as_path()] {
        if is_system(path) {
            continue;
        }
        let Some(install) = installation_of(path, home) else { continue };
        // A virtualenv names its base interpreter's directory in pyvenv.cfg.
        if let Ok(config) = std::fs::read_to_string(install.join("pyvenv.cfg")) {
            let base = config.lines().find_map(|line| {
                let (key, value) = line.split_once('=')?;
                (key.trim() == "home").then(|| PathBuf::from(value.trim()))
            });
            if let Some(base) = base.filter(|b| !is_system(b)) {
                let base_python = base.join("python3");
                if let Some(base_install) = installation_of(&base_python, home) {
                    resolved.binds.push(base_install);
                }
                resolved.path_dirs.push(base);
            }
        }
        resolved.binds.push(install);
    }
    // A script: its interpreter (and, through `/usr/bin/env`, the program it names).
    if let Some((interpreter, argument)) = shebang(&real) {
        let next = if program_name(&interpreter) == "env" {
            argument.as_deref().and_then(|name| search_path(name, path_var, None))
        } else {
            Some(interpreter)
        };
        if let Some(next) = next {
            let next = match pyenv_shim(&next) {
                Some(_) => return, // Resolved through the shim by the caller's rules.
                None => next,
            };
            if let Some(dir) = next.parent()
                && !is_system(dir)
            {
                resolved.path_dirs.push(dir.to_path_buf());
            }
            collect_installation(&next, path_var, home, resolved, depth + 1);
        }
    }
}

/// The interpreter of a `#!` script and its first argument.
fn shebang(path: &Path) -> Option<(PathBuf, Option<String>)> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?.trim();
    let mut parts = text.split_whitespace();
    let interpreter = PathBuf::from(parts.next()?);
    Some((interpreter, parts.next().map(str::to_owned)))
}

/// What this host's system directories, `/etc` allowlist and devices look like.
pub fn host_layout() -> HostLayout {
    let kind = |path: &Path| -> Option<EntryKind> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        if meta.file_type().is_symlink() {
            Some(EntryKind::Symlink(std::fs::read_link(path).ok()?))
        } else if meta.is_dir() {
            Some(EntryKind::Dir)
        } else {
            Some(EntryKind::File)
        }
    };
    let system =
        SYSTEM_DIRS.iter().map(PathBuf::from).filter_map(|path| kind(&path).map(|k| (path, k))).collect();
    let mut names: Vec<String> = ETC_ENTRIES.iter().map(|s| (*s).to_owned()).collect();
    if let Ok(entries) = std::fs::read_dir("/etc") {
        for entry in entries.flatten() {
            if let Some(name) = entry.file_name().to_str()
                && name.starts_with("python")
            {
                names.push(name.to_owned());
            }
        }
    }
    names.sort();
    let etc = names
        .iter()
        .map(|name| Path::new("/etc").join(name))
        .filter_map(|path| kind(&path).map(|k| (path, k)))
        .collect();
    let devices = DEVICES.iter().map(PathBuf::from).filter(|p| p.exists()).collect();
    HostLayout { system, etc, devices }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn executable(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn pyenv_shims_lead_to_the_selected_version() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pyenv");
        let shim = root.join("shims/python3");
        executable(
            &shim,
            &format!(
                "#!/usr/bin/env bash\nexport PYENV_ROOT=\"{}\"\nexec \"{}/libexec/pyenv\" exec python3\n",
                root.display(),
                root.display()
            ),
        );
        let real = root.join("versions/3.11.7/bin/python3");
        executable(&real, "\x7fELF");
        executable(&root.join("versions/3.9.1/bin/python3"), "\x7fELF");
        std::fs::write(root.join("version"), "3.11.7\n").unwrap();
        let project = dir.path().join("project");
        std::fs::create_dir_all(&project).unwrap();
        let path_var = format!("{}:/usr/bin", root.join("shims").display());
        let no_env = |_: &str| None;

        let resolved = resolve("python3", &project, &path_var, &no_env).unwrap();
        assert_eq!(resolved.program, real);
        assert_eq!(resolved.binds, vec![root.join("versions/3.11.7")]);
        assert_eq!(resolved.path_dirs, vec![root.join("versions/3.11.7/bin")]);

        // A .python-version in the project wins over the global one; PYENV_VERSION wins
        // over both.
        std::fs::write(project.join(".python-version"), "3.9.1\n").unwrap();
        let resolved = resolve("python3", &project, &path_var, &no_env).unwrap();
        assert_eq!(resolved.program, root.join("versions/3.9.1/bin/python3"));
        let env = |name: &str| (name == "PYENV_VERSION").then(|| "3.11.7".to_owned());
        let resolved = resolve("python3", &project, &path_var, &env).unwrap();
        assert_eq!(resolved.program, real);
    }

    #[test]
    fn virtualenvs_bind_their_base_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base/bin/python3");
        executable(&base, "\x7fELF");
        let venv = dir.path().join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::os::unix::fs::symlink(&base, venv.join("bin/python")).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), format!("home = {}\n", base.parent().unwrap().display()))
            .unwrap();
        let resolved =
            resolve("python", dir.path(), &venv.join("bin").display().to_string(), &|_| None).unwrap();
        assert_eq!(resolved.program, venv.join("bin/python"));
        assert!(resolved.binds.contains(&venv), "{resolved:?}");
        assert!(resolved.binds.contains(&dir.path().join("base")), "{resolved:?}");
    }

    #[test]
    fn scripts_bring_their_interpreter_and_missing_programs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let tool_python = dir.path().join("tools/bin/python9");
        executable(&tool_python, "\x7fELF");
        let script = dir.path().join("work/run.py");
        executable(&script, &format!("#!{}\nprint(1)\n", tool_python.display()));
        let resolved = resolve("./run.py", &dir.path().join("work"), "/usr/bin", &|_| None).unwrap();
        assert!(resolved.binds.contains(&dir.path().join("tools")), "{resolved:?}");

        let err = resolve("no-such-program-xyz", dir.path(), "/usr/bin:/bin", &|_| None).unwrap_err();
        assert!(err.contains("not found on PATH"), "{err}");
        let err = resolve("./missing", dir.path(), "/usr/bin", &|_| None).unwrap_err();
        assert!(err.contains("not an executable"), "{err}");
    }

    #[test]
    fn system_programs_need_no_extra_binds() {
        let resolved = resolve("sh", Path::new("/tmp"), "/usr/bin:/bin", &|_| None).unwrap();
        assert!(resolved.binds.is_empty(), "{resolved:?}");
        assert!(resolved.path_dirs.is_empty());
    }

    #[test]
    fn arguments_that_name_files_are_found_and_others_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("agent.py"), "print(1)\n").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("agent.py"), dir.path().join("link.py")).unwrap();
        let cwd = dir.path().join("work");
        std::fs::create_dir_all(&cwd).unwrap();
        let args: Vec<String> = [
            "-u",
            &elsewhere.join("agent.py").display().to_string(),
            "../elsewhere/./agent.py",
            "../link.py",
            "print(1)",
            &elsewhere.display().to_string(),
            "missing.py",
            "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let real = std::fs::canonicalize(elsewhere.join("agent.py")).unwrap();
        let files = argument_files(&args, &cwd);
        assert_eq!(
            files,
            [
                ArgumentFile { named: elsewhere.join("agent.py"), real: real.clone() },
                ArgumentFile { named: dir.path().join("link.py"), real },
            ],
            "absolute and relative names of the same file are one; a symlink keeps both names"
        );
    }

    #[test]
    fn home_is_never_bound_whole() {
        assert_eq!(
            installation_of(Path::new("/home/u/bin/tool"), Some(Path::new("/home/u"))),
            Some(PathBuf::from("/home/u/bin"))
        );
        assert_eq!(installation_of(Path::new("/x/tool"), None), Some(PathBuf::from("/x")));
        assert_eq!(installation_of(Path::new("/bin/tool"), None), Some(PathBuf::from("/bin")));
    }
}
