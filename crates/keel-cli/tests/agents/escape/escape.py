"""Escape attempts, run inside a Keel sandbox by the escape suite (tests/it/sandbox_escape.rs).

Usage: escape.py CASE [ARG...]. Each case tries one way out of the sandbox and prints one
JSON line, {"case": CASE, "contained": bool, "detail": "..."}, then exits 0 when the
attempt was contained and 1 when it got through. Some cases (limits) are meant to be
killed by the sandbox; the test then checks the run's outcome instead.

Nothing here is harmful if it does get through: writes go to throwaway names, and the
only "dangerous" file (/proc/sysrq-trigger) is opened but never written.

Standard library only (ctypes for raw system calls).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import signal
import socket
import stat
import subprocess
import sys
import time

LIBC = ctypes.CDLL(None, use_errno=True)

# System call numbers (x86_64, aarch64).
SYSCALLS = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "keyctl": 250, "add_key": 248, "bpf": 321,
        "perf_event_open": 298, "io_uring_setup": 425, "userfaultfd": 323,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "mount": 165, "umount2": 166,
        "pivot_root": 155, "unshare": 272, "chroot": 161, "syslog": 103, "setns": 308,
        "clone3": 435,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "keyctl": 219, "add_key": 217, "bpf": 280,
        "perf_event_open": 241, "io_uring_setup": 425, "userfaultfd": 282,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "mount": 40, "umount2": 39,
        "pivot_root": 41, "unshare": 97, "chroot": 51, "syslog": 116, "setns": 268,
        "clone3": 435,
    },
}[platform.machine()]

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000


def syscall(name: str, *args: int) -> tuple[int, int]:
    """Returns (result, errno) of a raw system call with integer arguments."""
    ctypes.set_errno(0)
    result = LIBC.syscall(ctypes.c_long(SYSCALLS[name]), *[ctypes.c_long(a) for a in args])
    return result, ctypes.get_errno()


def denied_by_filter(name: str, *args: int) -> tuple[bool, str]:
    """A call the seccomp policy denies must fail with EPERM (not EFAULT/EINVAL, which
    would mean the kernel looked at the arguments, i.e. the filter let it through)."""
    result, err = syscall(name, *args)
    detail = f"{name} -> {result} ({errno.errorcode.get(err, err)})"
    return result == -1 and err == errno.EPERM, detail


def fails(action, *exceptions) -> tuple[bool, str]:
    """True if `action()` raises (one of) `exceptions` (default: any OSError)."""
    try:
        value = action()
    except exceptions or (OSError,) as exc:  # type: ignore[misc]
        return True, f"{type(exc).__name__}: {exc}"
    return False, f"succeeded: {value!r}"[:300]


# Host secrets -------------------------------------------------------------------------

def case_read_shadow():
    return fails(lambda: open("/etc/shadow").read())


def case_read_data_dir(data_dir):
    return fails(lambda: os.listdir(data_dir))


def case_read_sqlite(data_dir):
    return fails(lambda: open(os.path.join(data_dir, "keel.db"), "rb").read(16))


def case_read_ssh(home):
    ok1, d1 = fails(lambda: os.listdir(os.path.join(home, ".ssh")))
    ok2, d2 = fails(lambda: open(os.path.join(home, ".ssh", "id_ed25519")).read())
    return ok1 and ok2, f"{d1}; {d2}"


def case_masked_home_secrets():
    """Runs with the working directory = a home that has .ssh and .aws inside."""
    def listing(path):
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            return f"unlistable ({exc.strerror})"

    ok, detail = fails(lambda: open(".ssh/id_ed25519").read())
    ok_aws, detail_aws = fails(lambda: open(".aws/credentials").read())
    ssh, aws = listing(".ssh"), listing(".aws")
    hidden = not isinstance(ssh, list) or not ssh
    hidden_aws = not isinstance(aws, list) or not aws
    return ok and ok_aws and hidden and hidden_aws, f"{detail}; {detail_aws}; .ssh: {ssh}; .aws: {aws}"


def case_proc_1_environ():
    try:
        text = open("/proc/1/environ", "rb").read()
    except OSError as exc:
        return True, f"{type(exc).__name__}: {exc}"
    return text == b"", f"init's environment is readable: {text[:200]!r}"


def case_host_env(*names):
    token = os.environ.get("KEEL_RUN_TOKEN", "")
    # OPENAI_API_KEY and ANTHROPIC_API_KEY hold the run token (the gateway's "key"), never
    # the kernel's real keys.
    leaked = {name: os.environ[name] for name in names if os.environ.get(name, token) != token}
    allowed = {"HOME", "TMPDIR", "LANG", "PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "NODE_PATH", "KEEL_SOCKET",
               "KEEL_RUN_TOKEN", "KEEL_RUN_ID", "OPENAI_BASE_URL", "OPENAI_API_KEY",
               "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "KEEL_MCP_URL", "LC_CTYPE",
               # Keel's own switches for agent frameworks (keel-kernel's run/frameworks.rs).
               "OPENAI_AGENTS_DISABLE_TRACING", "CREWAI_DISABLE_TELEMETRY", "LITELLM_LOCAL_MODEL_COST_MAP"}
    extra = sorted(set(os.environ) - allowed)
    keys_are_tokens = all(os.environ.get(k, token) == token for k in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"))
    return not leaked and not extra and keys_are_tokens, f"leaked {leaked}, unexpected {extra}"


# Writing outside the workspace --------------------------------------------------------

def case_write_outside():
    results = []
    for path in ["/etc/keel-escape", "/usr/keel-escape", "/keel-escape", "/proc/keel-escape",
                 "/run/keel/keel-escape", "/run/keel/sdk/keel/keel-escape",
                 "/run/keel/node/keel/keel-escape", os.path.join(os.getcwd(), "keel-escape")]:
        ok, detail = fails(lambda p=path: open(p, "w").write("x"))
        results.append((ok, f"{path}: {detail}"))
    inside = []
    for path in ["/workspace/ok", "/tmp/ok"]:
        with open(path, "w") as f:
            f.write("fine")
        inside.append(path)
    return all(ok for ok, _ in results), "; ".join(d for _, d in results) + f"; wrote {inside}"


def case_write_cwd():
    return fails(lambda: open("keel-escape-write-test", "w").write("x"))


def case_symlink_escape(data_dir):
    targets = ["/etc/shadow", os.path.join(data_dir, "keel.db"), "/proc/1/root/etc/shadow"]
    results = []
    for i, target in enumerate(targets):
        link = f"/tmp/link{i}"
        os.symlink(target, link)
        results.append(fails(lambda l=link: open(l, "rb").read(16)))
    return all(ok for ok, _ in results), "; ".join(d for _, d in results)


def case_hardlink_escape():
    results = [
        fails(lambda: os.link("/etc/passwd", "/tmp/passwd-link")),
        fails(lambda: os.link(sys.executable, "/workspace/python-link")),
        fails(lambda: os.link("/etc/ld.so.cache", "/workspace/cache-link")),
    ]
    return all(ok for ok, _ in results), "; ".join(d for _, d in results)


def case_dotdot_traversal(data_dir):
    results = [
        fails(lambda: open("/workspace/../../../../../etc/shadow").read()),
        fails(lambda: os.listdir("/tmp/../../../../" + data_dir.lstrip("/"))),
        fails(lambda: open(os.getcwd() + "/../" * 12 + "etc/shadow").read()),
    ]
    top = sorted(os.listdir("/../../.."))
    host_only = [name for name in ("home", "boot", "var", "srv", "mnt", "sys") if name in top]
    return all(ok for ok, _ in results) and not host_only, f"/../../.. lists {top}; " + "; ".join(d for _, d in results)


def case_proc_self_root():
    same = sorted(os.listdir("/proc/self/root")) == sorted(os.listdir("/"))
    ok, detail = fails(lambda: os.listdir("/proc/1/root"))
    ok2, detail2 = fails(lambda: open("/proc/1/root/etc/shadow").read())
    return same and ok and ok2, f"/proc/self/root is the sandbox root: {same}; {detail}; {detail2}"


# Privilege --------------------------------------------------------------------------

def case_mknod():
    results = [
        fails(lambda: os.mknod("/tmp/null2", stat.S_IFCHR | 0o666, os.makedev(1, 3))),
        fails(lambda: os.mknod("/workspace/sda", stat.S_IFBLK | 0o666, os.makedev(8, 0))),
    ]
    return all(ok for ok, _ in results), "; ".join(d for _, d in results)


def case_mount():
    return denied_by_filter("mount", 0, 0, 0, 0, 0)


def case_umount():
    return denied_by_filter("umount2", 0, 0)


def case_pivot_root():
    return denied_by_filter("pivot_root", 0, 0)


def case_chroot():
    return denied_by_filter("chroot", 0)


def case_nested_unshare():
    user = denied_by_filter("unshare", CLONE_NEWUSER)
    mount_ns = denied_by_filter("unshare", CLONE_NEWNS)
    clone3, err = syscall("clone3", 0, 0)
    # The tool a human would try first.
    tool = subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True, text=True)
    ok = user[0] and mount_ns[0] and clone3 == -1 and err == errno.ENOSYS and tool.returncode != 0
    return ok, f"{user[1]}; {mount_ns[1]}; clone3 errno {err}; unshare tool: {tool.returncode} {tool.stderr.strip()}"


def case_setns():
    return denied_by_filter("setns", 0, 0)


def case_setuid_and_no_new_privs():
    status = open("/proc/self/status").read()
    nnp = "NoNewPrivs:\t1" in status
    mounts = open("/proc/self/mountinfo").read().splitlines()
    usr = [m for m in mounts if m.split()[4] == "/usr"]
    nosuid = bool(usr) and all("nosuid" in m.split()[5] for m in usr)
    # A setuid binary, if the host has one, runs without any privilege.
    setuid = next((p for p in ("/usr/bin/passwd", "/usr/bin/su", "/usr/bin/mount", "/usr/bin/newgrp")
                   if os.path.exists(p) and os.stat(p).st_mode & stat.S_ISUID), None)
    child = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
    caps = {line.split(":")[0]: line.split()[1] for line in child.splitlines() if line.startswith("Cap")}
    no_caps = all(int(caps[k], 16) == 0 for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb"))
    return nnp and nosuid and no_caps, f"NoNewPrivs {nnp}, /usr nosuid {nosuid}, setuid binary {setuid}, child caps {caps}"


def case_ptrace(kernel_pid):
    attach = denied_by_filter("ptrace", 16, int(kernel_pid), 0, 0)  # PTRACE_ATTACH
    init = denied_by_filter("ptrace", 16, 1, 0, 0)
    traceme = denied_by_filter("ptrace", 0, 0, 0, 0)  # PTRACE_TRACEME
    return attach[0] and init[0] and traceme[0], f"{attach[1]}; {init[1]}; {traceme[1]}"


def case_process_vm_readv(kernel_pid):
    buf = ctypes.create_string_buffer(16)
    local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 16)
    remote = (ctypes.c_void_p * 2)(0x400000, 16)
    a = denied_by_filter("process_vm_readv", int(kernel_pid), ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
    b = denied_by_filter("process_vm_readv", 1, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
    return a[0] and b[0], f"{a[1]}; {b[1]}"


def case_keyctl():
    get = denied_by_filter("keyctl", 0, -4, 0)  # KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING
    add = denied_by_filter("add_key", 0, 0, 0, 0, 0)
    return get[0] and add[0], f"{get[1]}; {add[1]}"


def case_bpf():
    return denied_by_filter("bpf", 5, 0, 0)  # BPF_PROG_LOAD


def case_perf_event_open():
    return denied_by_filter("perf_event_open", 0, 0, -1, -1, 0)


def case_io_uring():
    return denied_by_filter("io_uring_setup", 8, 0)


def case_userfaultfd():
    return denied_by_filter("userfaultfd", 0)


def case_open_by_handle_at():
    a = denied_by_filter("open_by_handle_at", -100, 0, 0)
    b = denied_by_filter("name_to_handle_at", -100, 0, 0, 0, 0)
    return a[0] and b[0], f"{a[1]}; {b[1]}"


def case_syslog():
    return denied_by_filter("syslog", 3, 0, 0)  # SYSLOG_ACTION_READ_ALL


def case_proc_sys_write():
    results = [
        fails(lambda: open("/proc/sys/vm/drop_caches", "w")),
        fails(lambda: open("/proc/sysrq-trigger", "w")),
        fails(lambda: open("/proc/sys/kernel/core_pattern", "w")),
    ]
    return all(ok for ok, _ in results), "; ".join(d for _, d in results)


def case_devices_and_sysfs():
    devices = sorted(os.listdir("/dev"))
    allowed = {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr", "shm"}
    extra = [d for d in devices if d not in allowed]
    no_sys, detail = fails(lambda: os.listdir("/sys/class"))
    tty, tty_detail = fails(lambda: open("/dev/tty"))
    return not extra and no_sys and tty, f"/dev lists {devices}; {detail}; {tty_detail}"


# File descriptors, sockets, signals, terminals ----------------------------------------

def case_leaked_fds():
    def fds():
        names = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                names[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass  # The directory listing's own fd, gone by now.
        return names

    before = fds()
    import keel  # noqa: E402  (the SDK is on PYTHONPATH inside the sandbox)

    client = keel.connect()
    after = fds()
    client.close()
    unexpected = {fd: target for fd, target in before.items() if fd > 2}
    new = {fd: target for fd, target in after.items() if fd not in before}
    sockets_only = all(target.startswith("socket:") for target in new.values()) and len(new) == 1
    std = all(before.get(fd, "").startswith(("pipe:", "/dev/null")) for fd in (0, 1, 2))
    return not unexpected and sockets_only and std, f"before {before}; after connect {after}"


def case_abstract_unix(name):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return fails(lambda: sock.connect("\0" + name))


def case_signal_host(host_pid):
    results = [fails(lambda: os.kill(int(host_pid), 0)), fails(lambda: os.kill(int(host_pid), signal.SIGTERM))]
    # The sandbox's init (PID 1) cannot be killed from inside: the kernel drops SIGKILL
    # sent to a PID namespace's init from within it.
    try:
        os.kill(1, signal.SIGKILL)
    except OSError:
        pass
    time.sleep(0.2)
    init_alive = os.path.exists("/proc/1/status")
    results.append((init_alive, f"init alive after SIGKILL: {init_alive}"))
    return all(ok for ok, _ in results), "; ".join(d for _, d in results)


def case_tiocsti():
    import fcntl
    import termios

    results = []
    for fd in (0, 1, 2):
        try:
            fcntl.ioctl(fd, termios.TIOCSTI, b"x")
            results.append((False, f"fd {fd}: TIOCSTI accepted"))
        except OSError as exc:
            results.append((exc.errno == errno.EPERM, f"fd {fd}: {exc}"))
    return all(ok for ok, _ in results), "; ".join(d for _, d in results)


# Network ------------------------------------------------------------------------------

def connect(family, address, kind=socket.SOCK_STREAM):
    def attempt():
        with socket.socket(family, kind) as sock:
            sock.settimeout(3)
            sock.connect(address)
            return "connected"
    return fails(attempt, OSError)


def case_net_curl():
    if not os.path.exists("/usr/bin/curl"):
        return False, "curl is not installed on this host (CI installs it: apt-get install curl)"
    run = subprocess.run(["curl", "-sS", "-m", "5", "http://example.com/"], capture_output=True, text=True)
    return run.returncode != 0, f"curl exit {run.returncode}: {run.stderr.strip()}"


def case_net_raw_socket():
    results = [fails(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
               fails(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))]
    return all(ok for ok, _ in results), "; ".join(d for _, d in results)


def case_net_bash_dev_tcp():
    run = subprocess.run(["bash", "-c", "echo x > /dev/tcp/1.1.1.1/80"], capture_output=True, text=True, timeout=20)
    return run.returncode != 0, f"bash exit {run.returncode}: {run.stderr.strip()}"


def case_net_dns():
    return fails(lambda: socket.getaddrinfo("example.com", 80), OSError)


def case_net_udp():
    def send():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            return sock.sendto(b"\x00" * 12, ("8.8.8.8", 53))
    return fails(send)


def case_net_ipv6():
    return connect(socket.AF_INET6, ("2606:4700:4700::1111", 80))


def case_net_host_loopback(port):
    return connect(socket.AF_INET, ("127.0.0.1", int(port)))


def case_net_metadata():
    return connect(socket.AF_INET, ("169.254.169.254", 80))


def case_net_netlink():
    return fails(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))


def proxy_connect(target):
    """CONNECT through HTTPS_PROXY; returns the proxy's status line."""
    proxy = os.environ["HTTPS_PROXY"].removeprefix("http://")
    host, port = proxy.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reply = sock.recv(4096).decode(errors="replace")
        status = reply.split("\r\n", 1)[0]
        if " 200 " in status + " ":
            sock.sendall(b"ping")
            echoed = sock.recv(4)
            return status, echoed
        return status, b""


def case_allowlist(allowed_target, denied_target):
    status, echoed = proxy_connect(allowed_target)
    allowed_ok = status.startswith("HTTP/1.1 200") and echoed == b"ping"
    denied_status, _ = proxy_connect(denied_target)
    denied_ok = denied_status.startswith("HTTP/1.1 403")
    host, port = denied_target.rsplit(":", 1)
    direct_ok, direct = connect(socket.AF_INET, (host, int(port))) if host[0].isdigit() else (True, "not an address")
    return allowed_ok and denied_ok and direct_ok, f"allowed: {status} {echoed!r}; denied: {denied_status}; direct: {direct}"


def case_allowlist_by_name(denied_name):
    status, _ = proxy_connect(f"{denied_name}:443")
    dns, detail = fails(lambda: socket.getaddrinfo(denied_name, 443), OSError)
    return status.startswith("HTTP/1.1 403") and dns, f"proxy: {status}; {detail}"


# Limits -------------------------------------------------------------------------------

def case_fork_bomb(attempts):
    children = []
    refused = None
    for _ in range(int(attempts)):
        try:
            pid = os.fork()
        except OSError as exc:
            refused = exc
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    count = len(children)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    return refused is not None, f"forked {count} before: {refused}"


def case_memory_bomb(megabytes):
    blocks = []
    for _ in range(int(megabytes)):
        blocks.append(bytearray(1 << 20))
    return False, f"allocated {len(blocks)} MiB without being stopped"


def case_disk_fill_file(megabytes):
    def write():
        with open("/workspace/big", "wb") as f:
            for _ in range(int(megabytes)):
                f.write(b"\0" * (1 << 20))
    return fails(write)


def case_disk_fill(megabytes):
    written = 0
    try:
        for i in range(int(megabytes)):
            with open(f"/workspace/fill{i}", "wb") as f:
                f.write(b"\1" * (1 << 20))
            written += 1
    except OSError as exc:
        return True, f"stopped after {written} MiB: {exc}"
    return False, f"wrote {written} MiB"


def case_fd_exhaustion(count):
    files = []
    try:
        for _ in range(int(count)):
            files.append(open("/dev/null"))
    except OSError as exc:
        return exc.errno == errno.EMFILE, f"opened {len(files)}: {exc}"
    return False, f"opened {len(files)} files"


def case_cpu_spin(seconds):
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        pass
    return False, "spun without being stopped"


def case_sleep(seconds):
    time.sleep(float(seconds))
    return False, "slept without being stopped"


def case_stdout_flood(megabytes):
    line = "y" * 1023
    for _ in range(int(megabytes) * 1024):
        print(line)
    sys.stdout.flush()
    return True, "flooded"


def case_survivors(marker):
    """Leaves a daemon behind (double fork, new session, no KEEL_* in its environment)."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve("/bin/sleep", ["sleep", marker], {})
        os._exit(0)
    time.sleep(0.5)
    return True, "left a daemon behind"


def main() -> int:
    case, args = sys.argv[1], sys.argv[2:]
    function = globals().get(f"case_{case}")
    if function is None:
        print(json.dumps({"case": case, "contained": False, "detail": "no such case"}))
        return 2
    try:
        contained, detail = function(*args)
    except Exception as exc:  # noqa: BLE001 - an unexpected error is reported, not hidden
        contained, detail = False, f"the case itself failed: {type(exc).__name__}: {exc}"
    print(json.dumps({"case": case, "contained": bool(contained), "detail": detail}), flush=True)
    return 0 if contained else 1


if __name__ == "__main__":
    sys.exit(main())
