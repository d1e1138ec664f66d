//! The workspace file tools (`fs.read`, `fs.write`, `fs.list`), confined to a root
//! directory on the host. Every path is resolved by the kernel with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from a descriptor of the root, so
//! `..`, absolute paths and symlinks (including ones swapped in between a check and a
//! use) cannot reach outside it: there is no check-then-use on path strings at all.
//! New names are created with `*at` calls on a descriptor of their parent, which was
//! itself resolved beneath the root.

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

/// Bytes `fs.read` returns when the call does not say.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
/// The most bytes `fs.read` returns and `fs.write` accepts.
pub const MAX_BYTES: u64 = 16 << 20;
/// Entries `fs.list` returns when the call does not say.
pub const DEFAULT_MAX_ENTRIES: u64 = 1000;
/// The most entries `fs.list` returns.
pub const MAX_ENTRIES: u64 = 100_000;

/// The raw system calls of this module, each with its contract.
mod sys {
    use std::ffi::CStr;
    use std::io;
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};

    /// `struct open_how` of linux/openat2.h.
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }

    /// Resolution that never leaves `dirfd`'s directory and never follows /proc magic
    /// links.
    pub const BENEATH: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

    pub fn openat2(dirfd: RawFd, path: &CStr, flags: i32, mode: u32, resolve: u64) -> io::Result<OwnedFd> {
        let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: u64::from(mode), resolve };
        loop {
            // SAFETY: `path` is a NUL-terminated string and `how` a properly laid out
            // open_how that both outlive the call; the kernel reads `size_of` bytes of it.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    dirfd,
                    path.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            if fd >= 0 {
                // SAFETY: the kernel just returned this fd; nobody else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
            }
            let error = io::Error::last_os_error();
            // EAGAIN: a rename raced the resolution; the kernel asks to try again.
            if !matches!(error.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) {
                return Err(error);
            }
        }
    }

    fn check(result: libc::c_int) -> io::Result<()> {
        if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// `name` must be a single path component: nothing is resolved but `dirfd`.
    pub fn mkdirat(dirfd: RawFd, name: &CStr) -> io::Result<()> {
        // SAFETY: a NUL-terminated string that outlives the call.
        check(unsafe { libc::mkdirat(dirfd, name.as_ptr(), 0o777) })
    }

    /// `name` must be a single path component. O_EXCL|O_CREAT never follows a symlink.
    pub fn create_new(dirfd: RawFd, name: &CStr) -> io::Result<OwnedFd> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::openat(dirfd, name.as_ptr(), flags, 0o644 as libc::c_uint) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd; nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Both names are single components in `dirfd`; a symlink at `to` is replaced, not
    /// followed.
    pub fn renameat(dirfd: RawFd, from: &CStr, to: &CStr) -> io::Result<()> {
        // SAFETY: NUL-terminated strings that outlive the call.
        check(unsafe { libc::renameat(dirfd, from.as_ptr(), dirfd, to.as_ptr()) })
    }

    pub fn unlinkat(dirfd: RawFd, name: &CStr) -> io::Result<()> {
        // SAFETY: a NUL-terminated string that outlives the call.
        check(unsafe { libc::unlinkat(dirfd, name.as_ptr(), 0) })
    }
}

/// A path relative to the root as the tools take it: not absolute, no NUL.
fn relative(tool: &str, path: &str) -> Result<CString, String> {
    if path.is_empty() {
        return Err(format!(
            "{tool}: `path` is empty; give a path relative to the workspace, e.g. \"notes.txt\""
        ));
    }
    if path.starts_with('/') {
        return Err(format!(
            "{tool}: path {path:?} is absolute; give a path relative to the workspace (it is the only directory the tool can reach)"
        ));
    }
    CString::new(path).map_err(|_| format!("{tool}: path {path:?} contains a NUL byte"))
}

/// An OS error while resolving or using `path`, in words.
fn explain(tool: &str, path: &str, error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::EXDEV) => format!(
            "{tool}: path {path:?} leads outside the workspace (through `..`, an absolute symlink, or a symlink out of it); only paths inside it can be used"
        ),
        Some(libc::ELOOP) => {
            format!(
                "{tool}: path {path:?} has too many levels of symlinks (a loop?) or a link that may not be followed"
            )
        }
        Some(libc::ENOENT) => format!("{tool}: {path:?} does not exist in the workspace"),
        Some(libc::ENOTDIR) => format!("{tool}: a part of {path:?} is not a directory"),
        Some(libc::EISDIR) => format!("{tool}: {path:?} is a directory"),
        Some(libc::EACCES) | Some(libc::EPERM) => format!("{tool}: permission denied for {path:?}"),
        Some(libc::ENOSYS) => format!(
            "{tool}: this Linux kernel lacks openat2 (Linux 5.6 or later), which the file tools need to keep paths inside the workspace"
        ),
        _ => format!("{tool}: {path:?}: {error}"),
    }
}

fn open_root(tool: &str, root: &Path) -> Result<OwnedFd, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)
        .map(OwnedFd::from)
        .map_err(|e| format!("{tool}: the workspace {} cannot be opened: {e}", root.display()))
}

fn open_beneath(root: &OwnedFd, path: &CString, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    sys::openat2(root.as_raw_fd(), path, flags, mode, sys::BENEATH)
}

fn field_u64(tool: &str, args: &Value, name: &str, default: u64, max: u64) -> Result<u64, String> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => match value.as_u64() {
            Some(n) if n <= max => Ok(n),
            _ => Err(format!("{tool}: `{name}` must be a whole number from 0 to {max}, got {value}")),
        },
    }
}

fn field_bool(tool: &str, args: &Value, name: &str) -> Result<bool, String> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{tool}: `{name}` must be true or false, got {other}")),
    }
}

fn field_str<'a>(tool: &str, args: &'a Value, name: &str) -> Result<Option<&'a str>, String> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("{tool}: `{name}` must be a string, got {other}")),
    }
}

fn required_path<'a>(tool: &str, args: &'a Value) -> Result<&'a str, String> {
    if !args.is_object() {
        return Err(format!("{tool}: the arguments must be a JSON object"));
    }
    field_str(tool, args, "path")?.ok_or_else(|| format!("{tool}: `path` (a string) is required"))
}

async fn blocking<T: Send + 'static>(
    tool: &'static str,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work).await.map_err(|e| format!("{tool}: the call failed: {e}"))?
}

/// `fs.read {path, offset?, max_bytes?}` → `{content, encoding, bytes, size, truncated}`.
pub async fn read(root: &Path, args: &Value) -> Result<Value, String> {
    const TOOL: &str = "fs.read";
    let path = required_path(TOOL, args)?.to_owned();
    let offset = field_u64(TOOL, args, "offset", 0, u64::MAX)?;
    let max_bytes = field_u64(TOOL, args, "max_bytes", DEFAULT_MAX_BYTES, MAX_BYTES)?;
    let c_path = relative(TOOL, &path)?;
    let root = root.to_path_buf();
    blocking(TOOL, move || {
        let root = open_root(TOOL, &root)?;
        // O_NONBLOCK: opening a FIFO must not hang; it is refused below anyway.
        let fd = open_beneath(&root, &c_path, libc::O_RDONLY | libc::O_NONBLOCK, 0)
            .map_err(|e| explain(TOOL, &path, &e))?;
        let mut file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(|e| explain(TOOL, &path, &e))?;
        if meta.is_dir() {
            return Err(format!("{TOOL}: {path:?} is a directory; list it with fs.list"));
        }
        if !meta.is_file() {
            return Err(format!("{TOOL}: {path:?} is not a regular file"));
        }
        let size = meta.len();
        file.seek(SeekFrom::Start(offset)).map_err(|e| explain(TOOL, &path, &e))?;
        let mut data = Vec::with_capacity(max_bytes.min(size.saturating_sub(offset)) as usize);
        Read::by_ref(&mut file)
            .take(max_bytes)
            .read_to_end(&mut data)
            .map_err(|e| explain(TOOL, &path, &e))?;
        let mut probe = [0u8; 1];
        let more = data.len() as u64 == max_bytes
            && file.read(&mut probe).map_err(|e| explain(TOOL, &path, &e))? > 0;
        Ok(render(data, more, size))
    })
    .await
}

/// The content as text when it is UTF-8 (a character cut by the byte limit is left for
/// the next read), base64 otherwise.
fn render(mut data: Vec<u8>, truncated: bool, size: u64) -> Value {
    if let Err(error) = std::str::from_utf8(&data)
        && truncated
        && error.error_len().is_none()
        && error.valid_up_to() > 0
    {
        data.truncate(error.valid_up_to());
    }
    let bytes = data.len();
    match String::from_utf8(data) {
        Ok(text) => {
            json!({"content": text, "encoding": "utf8", "bytes": bytes, "size": size, "truncated": truncated})
        }
        Err(not_text) => json!({
            "content": BASE64.encode(not_text.as_bytes()),
            "encoding": "base64",
            "bytes": bytes,
            "size": size,
            "truncated": truncated,
        }),
    }
}

/// The parent directory and the final name of a path to create.
fn split_for_create(tool: &str, path: &str) -> Result<(CString, CString), String> {
    let p = Path::new(path);
    let name = match p.components().next_back() {
        Some(Component::Normal(name)) if !path.ends_with('/') => name,
        _ => return Err(format!("{tool}: path {path:?} does not name a file (it ends in `/`, `.` or `..`)")),
    };
    let parent = p.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let c =
        |bytes: &[u8]| CString::new(bytes).map_err(|_| format!("{tool}: path {path:?} contains a NUL byte"));
    Ok((c(parent.as_os_str().as_bytes())?, c(name.as_bytes())?))
}

/// Creates the missing directories of `dir` (relative), each one beneath the root.
fn create_dirs(tool: &str, root: &OwnedFd, dir: &Path, shown: &str) -> Result<(), String> {
    let mut prefix = PathBuf::new();
    for component in dir.components() {
        let parent = prefix.clone();
        prefix.push(component);
        let Component::Normal(name) = component else { continue };
        let c_prefix =
            CString::new(prefix.as_os_str().as_bytes()).map_err(|_| format!("{tool}: NUL in path"))?;
        match open_beneath(root, &c_prefix, libc::O_PATH | libc::O_DIRECTORY, 0) {
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(explain(tool, shown, &e)),
        }
        let parent = if parent.as_os_str().is_empty() { PathBuf::from(".") } else { parent };
        let c_parent =
            CString::new(parent.as_os_str().as_bytes()).map_err(|_| format!("{tool}: NUL in path"))?;
        let parent_fd = open_beneath(root, &c_parent, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| explain(tool, shown, &e))?;
        let c_name = CString::new(name.as_bytes()).map_err(|_| format!("{tool}: NUL in path"))?;
        match sys::mkdirat(parent_fd.as_raw_fd(), &c_name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(explain(tool, shown, &e)),
        }
    }
    Ok(())
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `fs.write {path, content, encoding?, append?, create_dirs?}` → `{bytes}`. Without
/// `append` the file is replaced atomically (a temporary file in the same directory,
/// renamed over it), so readers see the old or the new content, never a mix.
pub async fn write(root: &Path, args: &Value) -> Result<Value, String> {
    const TOOL: &str = "fs.write";
    let path = required_path(TOOL, args)?.to_owned();
    let content = field_str(TOOL, args, "content")?
        .ok_or_else(|| format!("{TOOL}: `content` (a string) is required"))?;
    let data = match field_str(TOOL, args, "encoding")?.unwrap_or("utf8") {
        "utf8" | "utf-8" => content.as_bytes().to_vec(),
        "base64" => {
            BASE64.decode(content).map_err(|e| format!("{TOOL}: `content` is not valid base64: {e}"))?
        }
        other => return Err(format!("{TOOL}: `encoding` must be \"utf8\" or \"base64\", got {other:?}")),
    };
    if data.len() as u64 > MAX_BYTES {
        return Err(format!(
            "{TOOL}: the content is {} bytes; at most {MAX_BYTES} can be written at once",
            data.len()
        ));
    }
    let append = field_bool(TOOL, args, "append")?;
    let make_dirs = field_bool(TOOL, args, "create_dirs")?;
    let c_path = relative(TOOL, &path)?;
    let (c_parent, c_name) = split_for_create(TOOL, &path)?;
    let root = root.to_path_buf();
    blocking(TOOL, move || {
        let root = open_root(TOOL, &root)?;
        if make_dirs && let Some(parent) = Path::new(&path).parent() {
            create_dirs(TOOL, &root, parent, &path)?;
        }
        let bytes = data.len();
        if append {
            let fd = open_beneath(&root, &c_path, libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT, 0o644)
                .map_err(|e| explain(TOOL, &path, &e))?;
            let mut file = std::fs::File::from(fd);
            if !file.metadata().map_err(|e| explain(TOOL, &path, &e))?.is_file() {
                return Err(format!("{TOOL}: {path:?} is not a regular file"));
            }
            file.write_all(&data).map_err(|e| explain(TOOL, &path, &e))?;
            return Ok(json!({"bytes": bytes}));
        }
        let dir = open_beneath(&root, &c_parent, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| explain(TOOL, &path, &e))?;
        let temp = format!(
            ".keel-write-{}-{}.tmp",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let c_temp = CString::new(temp).map_err(|_| format!("{TOOL}: temporary name"))?;
        let fd = sys::create_new(dir.as_raw_fd(), &c_temp).map_err(|e| explain(TOOL, &path, &e))?;
        let mut file = std::fs::File::from(fd);
        // A replaced file keeps its permissions (an executable script stays one). Looked
        // up through the parent's descriptor without following a final symlink.
        let existing = format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), c_name.to_string_lossy());
        if let Ok(meta) = std::fs::symlink_metadata(&existing)
            && meta.is_file()
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = file.set_permissions(std::fs::Permissions::from_mode(meta.permissions().mode() & 0o7777));
        }
        let written = file
            .write_all(&data)
            .and_then(|()| file.sync_data())
            .and_then(|()| sys::renameat(dir.as_raw_fd(), &c_temp, &c_name));
        if let Err(e) = written {
            let _ = sys::unlinkat(dir.as_raw_fd(), &c_temp);
            return Err(explain(TOOL, &path, &e));
        }
        Ok(json!({"bytes": bytes}))
    })
    .await
}

/// `fs.list {path?, recursive?, max_entries?}` → `{entries: [{path, kind, bytes}],
/// truncated}`. Paths are relative to the workspace root; entries of a directory come
/// sorted by name, a directory before its contents. Symlinks are listed, not followed.
pub async fn list(root: &Path, args: &Value) -> Result<Value, String> {
    const TOOL: &str = "fs.list";
    if !args.is_object() && !args.is_null() {
        return Err(format!("{TOOL}: the arguments must be a JSON object"));
    }
    let path = field_str(TOOL, args, "path")?.unwrap_or(".").to_owned();
    let recursive = field_bool(TOOL, args, "recursive")?;
    let max_entries = field_u64(TOOL, args, "max_entries", DEFAULT_MAX_ENTRIES, MAX_ENTRIES)?;
    let c_path = relative(TOOL, &path)?;
    let root = root.to_path_buf();
    blocking(TOOL, move || {
        let root = open_root(TOOL, &root)?;
        let dir = open_beneath(&root, &c_path, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| explain(TOOL, &path, &e))?;
        let trimmed = path.trim_start_matches("./").trim_end_matches('/');
        let prefix = if trimmed == "." || trimmed.is_empty() { String::new() } else { format!("{trimmed}/") };
        let mut entries = Vec::new();
        let mut truncated = false;
        let mut queue = std::collections::VecDeque::from([(dir, prefix)]);
        'walk: while let Some((dir, prefix)) = queue.pop_front() {
            let mut children = Vec::new();
            let listing = read_dir(&dir).map_err(|e| explain(TOOL, &prefix, &e))?;
            for (name, kind, bytes) in listing {
                if entries.len() as u64 >= max_entries {
                    truncated = true;
                    break 'walk;
                }
                let shown = format!("{prefix}{name}");
                if recursive && kind == "dir" {
                    children.push((name.clone(), format!("{shown}/")));
                }
                entries.push(json!({"path": shown, "kind": kind, "bytes": bytes}));
            }
            for (name, child_prefix) in children {
                let Ok(c_name) = CString::new(name) else { continue };
                // No symlinks at all: the entry was a directory when listed; if it was
                // swapped for a link since, it is skipped, not followed.
                let opened = sys::openat2(
                    dir.as_raw_fd(),
                    &c_name,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    0,
                    sys::BENEATH | libc::RESOLVE_NO_SYMLINKS,
                );
                if let Ok(child) = opened {
                    queue.push_back((child, child_prefix));
                }
            }
        }
        Ok(json!({"entries": entries, "truncated": truncated}))
    })
    .await
}

/// The entries of an open directory, sorted by name: (name, kind, bytes).
fn read_dir(dir: &OwnedFd) -> std::io::Result<Vec<(String, &'static str, u64)>> {
    // The directory is read through its own descriptor (this process's fd link), so
    // nothing is resolved by name again.
    let raw: RawFd = dir.as_raw_fd();
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/self/fd/{raw}"))? {
        let entry = entry?;
        // fstatat on the directory, without following a final symlink.
        let Ok(meta) = entry.metadata() else { continue };
        let kind = if meta.is_symlink() {
            "symlink"
        } else if meta.is_dir() {
            "dir"
        } else if meta.is_file() {
            "file"
        } else {
            // FIFOs, sockets, devices.
            "special"
        };
        let bytes = if meta.is_file() { meta.len() } else { 0 };
        out.push((entry.file_name().to_string_lossy().into_owned(), kind, bytes));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hello.txt"), "hello").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), "aa").unwrap();
        dir
    }

    async fn read_err(root: &Path, path: &str) -> String {
        read(root, &json!({"path": path})).await.unwrap_err()
    }

    #[tokio::test]
    async fn reads_text_inside_the_root() {
        let ws = workspace();
        let out = read(ws.path(), &json!({"path": "hello.txt"})).await.unwrap();
        assert_eq!(
            out,
            json!({"content": "hello", "encoding": "utf8", "bytes": 5, "size": 5, "truncated": false})
        );
        let out = read(ws.path(), &json!({"path": "./sub/../sub/a.txt"})).await.unwrap();
        assert_eq!(out["content"], "aa");
        let out = read(ws.path(), &json!({"path": "hello.txt", "offset": 1, "max_bytes": 3})).await.unwrap();
        assert_eq!(out["content"], "ell");
        assert_eq!(out["truncated"], true);
        let out = read(ws.path(), &json!({"path": "hello.txt", "offset": 99})).await.unwrap();
        assert_eq!(out["content"], "");
        assert_eq!(out["truncated"], false);
    }

    #[tokio::test]
    async fn dot_dot_and_absolute_paths_are_refused() {
        let ws = workspace();
        let message = read_err(ws.path(), "../etc/passwd").await;
        assert!(message.contains("leads outside the workspace"), "{message}");
        let message = read_err(ws.path(), "sub/../../etc/passwd").await;
        assert!(message.contains("leads outside the workspace"), "{message}");
        let message = read_err(ws.path(), "/etc/passwd").await;
        assert!(message.contains("is absolute"), "{message}");
        let message = read_err(ws.path(), "a\0b").await;
        assert!(message.contains("NUL byte"), "{message}");
        let message = read_err(ws.path(), "").await;
        assert!(message.contains("empty"), "{message}");
        let message = read(ws.path(), &json!({"path": 3})).await.unwrap_err();
        assert!(message.contains("`path` must be a string"), "{message}");
    }

    #[tokio::test]
    async fn symlinks_out_of_the_root_are_refused() {
        let ws = workspace();
        symlink("/etc", ws.path().join("etc")).unwrap();
        symlink("../../etc/passwd", ws.path().join("sub/up")).unwrap();
        symlink(ws.path().parent().unwrap(), ws.path().join("parent")).unwrap();
        for path in ["etc/passwd", "sub/up", "parent"] {
            let message = read_err(ws.path(), path).await;
            assert!(message.contains("leads outside the workspace"), "{path}: {message}");
        }
        let message = list(ws.path(), &json!({"path": "etc"})).await.unwrap_err();
        assert!(message.contains("leads outside the workspace"), "{message}");
        let message = write(ws.path(), &json!({"path": "etc/evil", "content": "x"})).await.unwrap_err();
        assert!(message.contains("leads outside the workspace"), "{message}");
        // A dangling link to outside cannot be used to create a file there either.
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path().join("made"), ws.path().join("dangling")).unwrap();
        for append in [true, false] {
            let result =
                write(ws.path(), &json!({"path": "dangling", "content": "x", "append": append})).await;
            if append {
                assert!(result.unwrap_err().contains("leads outside"));
            } else {
                // Replacing renames over the link itself, inside the workspace.
                result.unwrap();
                assert!(ws.path().join("dangling").is_file());
            }
            assert!(!outside.path().join("made").exists());
        }
        let message = write(ws.path(), &json!({"path": "etc/x/y", "content": "x", "create_dirs": true}))
            .await
            .unwrap_err();
        assert!(message.contains("leads outside the workspace"), "{message}");
    }

    #[tokio::test]
    async fn symlinks_inside_the_root_work() {
        let ws = workspace();
        symlink("sub", ws.path().join("linked")).unwrap();
        symlink("a.txt", ws.path().join("sub/alias")).unwrap();
        let out = read(ws.path(), &json!({"path": "linked/a.txt"})).await.unwrap();
        assert_eq!(out["content"], "aa");
        let out = read(ws.path(), &json!({"path": "linked/alias"})).await.unwrap();
        assert_eq!(out["content"], "aa");
        write(ws.path(), &json!({"path": "linked/b.txt", "content": "b"})).await.unwrap();
        assert_eq!(std::fs::read_to_string(ws.path().join("sub/b.txt")).unwrap(), "b");
    }

    #[tokio::test]
    async fn symlink_loops_are_refused() {
        let ws = workspace();
        symlink("loop2", ws.path().join("loop1")).unwrap();
        symlink("loop1", ws.path().join("loop2")).unwrap();
        let message = read_err(ws.path(), "loop1").await;
        assert!(message.contains("too many levels of symlinks"), "{message}");
        let message = read_err(ws.path(), "loop1/x").await;
        assert!(message.contains("too many levels of symlinks"), "{message}");
    }

    #[tokio::test]
    async fn links_into_proc_are_refused() {
        let ws = workspace();
        symlink("/proc/self/root", ws.path().join("proc_root")).unwrap();
        let message = read_err(ws.path(), "proc_root/etc/passwd").await;
        assert!(message.contains("leads outside"), "{message}");
    }

    #[tokio::test]
    async fn large_files_are_truncated_and_binary_is_base64() {
        let ws = workspace();
        std::fs::write(ws.path().join("big"), vec![b'x'; (DEFAULT_MAX_BYTES + 10) as usize]).unwrap();
        let out = read(ws.path(), &json!({"path": "big"})).await.unwrap();
        assert_eq!(out["bytes"], DEFAULT_MAX_BYTES);
        assert_eq!(out["size"], DEFAULT_MAX_BYTES + 10);
        assert_eq!(out["truncated"], true);
        let message = read(ws.path(), &json!({"path": "big", "max_bytes": MAX_BYTES + 1})).await.unwrap_err();
        assert!(message.contains("`max_bytes` must be a whole number from 0 to"), "{message}");
        let out =
            read(ws.path(), &json!({"path": "big", "max_bytes": DEFAULT_MAX_BYTES + 10})).await.unwrap();
        assert_eq!(out["truncated"], false);

        let binary = [0u8, 159, 146, 150, 255];
        std::fs::write(ws.path().join("bin"), binary).unwrap();
        let out = read(ws.path(), &json!({"path": "bin"})).await.unwrap();
        assert_eq!(out["encoding"], "base64");
        assert_eq!(BASE64.decode(out["content"].as_str().unwrap()).unwrap(), binary);

        // A multi-byte character cut by the limit stays text; the cut part is left.
        std::fs::write(ws.path().join("utf"), "a\u{e9}").unwrap();
        let out = read(ws.path(), &json!({"path": "utf", "max_bytes": 2})).await.unwrap();
        assert_eq!(out["encoding"], "utf8");
        assert_eq!(out["content"], "a");
        assert_eq!(out["bytes"], 1);
        assert_eq!(out["truncated"], true);
    }

    #[tokio::test]
    async fn directories_and_special_files_are_not_read() {
        let ws = workspace();
        let message = read_err(ws.path(), "sub").await;
        assert!(message.contains("is a directory; list it with fs.list"), "{message}");
        let fifo = CString::new(ws.path().join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let message = read_err(ws.path(), "fifo").await;
        assert!(message.contains("not a regular file"), "{message}");
        let message = read_err(ws.path(), "missing.txt").await;
        assert!(message.contains("does not exist"), "{message}");
    }

    #[tokio::test]
    async fn writes_read_back_replace_append_and_create_dirs() {
        let ws = workspace();
        let out = write(ws.path(), &json!({"path": "new.txt", "content": "one"})).await.unwrap();
        assert_eq!(out, json!({"bytes": 3}));
        write(ws.path(), &json!({"path": "new.txt", "content": "two!"})).await.unwrap();
        assert_eq!(read(ws.path(), &json!({"path": "new.txt"})).await.unwrap()["content"], "two!");
        write(ws.path(), &json!({"path": "new.txt", "content": "+", "append": true})).await.unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let script = ws.path().join("run.sh");
            std::fs::write(&script, "old").unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
            write(ws.path(), &json!({"path": "run.sh", "content": "new"})).await.unwrap();
            let mode = std::fs::metadata(&script).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o750, "a replaced file keeps its permissions");
        }
        assert_eq!(std::fs::read_to_string(ws.path().join("new.txt")).unwrap(), "two!+");
        let bytes = [1u8, 2, 255];
        write(ws.path(), &json!({"path": "b.bin", "content": BASE64.encode(bytes), "encoding": "base64"}))
            .await
            .unwrap();
        assert_eq!(std::fs::read(ws.path().join("b.bin")).unwrap(), bytes);
        let message = write(ws.path(), &json!({"path": "x/y/z.txt", "content": "z"})).await.unwrap_err();
        assert!(message.contains("does not exist"), "{message}");
        write(ws.path(), &json!({"path": "x/y/z.txt", "content": "z", "create_dirs": true})).await.unwrap();
        assert_eq!(std::fs::read_to_string(ws.path().join("x/y/z.txt")).unwrap(), "z");
        // No temporary files are left behind.
        let names: Vec<String> = std::fs::read_dir(ws.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.contains(".keel-write-")), "{names:?}");
        for (args, says) in [
            (json!({"path": "a", "content": "%%", "encoding": "base64"}), "not valid base64"),
            (json!({"path": "a", "content": "x", "encoding": "latin1"}), "\"utf8\" or \"base64\""),
            (json!({"path": "a"}), "`content` (a string) is required"),
            (json!({"path": "sub/", "content": "x"}), "does not name a file"),
            (json!({"path": "sub/..", "content": "x"}), "does not name a file"),
            (json!({"path": "a", "content": "x", "append": "yes"}), "`append` must be true or false"),
            (json!({"path": "sub", "content": "x", "append": true}), "is a directory"),
        ] {
            let message = write(ws.path(), &args).await.unwrap_err();
            assert!(message.contains(says), "{args}: {message}");
        }
        let huge = "x".repeat(MAX_BYTES as usize + 1);
        let message = write(ws.path(), &json!({"path": "huge", "content": huge})).await.unwrap_err();
        assert!(message.contains("at most"), "{message}");
    }

    #[tokio::test]
    async fn lists_flat_recursive_and_bounded() {
        let ws = workspace();
        std::fs::create_dir(ws.path().join("sub/deeper")).unwrap();
        std::fs::write(ws.path().join("sub/deeper/c.txt"), "ccc").unwrap();
        symlink("/etc", ws.path().join("sub/etc")).unwrap();
        let out = list(ws.path(), &json!({})).await.unwrap();
        assert_eq!(
            out,
            json!({"entries": [
                {"path": "hello.txt", "kind": "file", "bytes": 5},
                {"path": "sub", "kind": "dir", "bytes": 0},
            ], "truncated": false})
        );
        let out = list(ws.path(), &json!({"recursive": true})).await.unwrap();
        let paths: Vec<&str> =
            out["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["hello.txt", "sub", "sub/a.txt", "sub/deeper", "sub/etc", "sub/deeper/c.txt"]);
        assert_eq!(out["entries"][4]["kind"], "symlink", "a link is listed, not followed");
        let out =
            list(ws.path(), &json!({"path": "sub/", "recursive": true, "max_entries": 2})).await.unwrap();
        let paths: Vec<&str> =
            out["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["sub/a.txt", "sub/deeper"]);
        assert_eq!(out["truncated"], true);
        let message = list(ws.path(), &json!({"path": "../"})).await.unwrap_err();
        assert!(message.contains("leads outside"), "{message}");
        let message = list(ws.path(), &json!({"path": "hello.txt"})).await.unwrap_err();
        assert!(message.contains("not a directory"), "{message}");
    }
}
