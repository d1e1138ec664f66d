//! The seccomp policy of the process tier, as reviewed data: every denied system call (or
//! argument pattern) carries the reason it is denied. Everything not listed is allowed:
//! the namespaces, the mount plan and Landlock already confine what the allowed calls
//! can reach; this filter removes kernel attack surface and the calls that would undo
//! the other layers.
//!
//! `compile` turns the policy into one BPF program (laid out in `program`); the sandbox's
//! init installs it on itself before it forks the agent, which inherits it.

mod program;

use seccompiler::BpfProgram;

/// When a listed call is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Always.
    Always,
    /// When argument `arg` has any of the bits of `mask` set (one rule per bit).
    AnyBit { arg: u8, mask: u64 },
    /// When argument `arg` equals one of `values`.
    ArgIs { arg: u8, values: &'static [u64] },
    /// `socket`/`socketpair` families other than the allowed ones.
    SocketFamily,
    /// `socket` of an allowed internet family with a type other than stream.
    InetNotStream,
}

/// One reviewed rule.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub syscalls: &'static [(&'static str, i64)],
    pub when: When,
    /// The errno the call fails with.
    pub errno: i32,
    pub reason: &'static str,
}

macro_rules! calls {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), libc::$name)),*]
    };
}

const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// The policy. Read this list when reviewing the sandbox.
pub const POLICY: &[Rule] = &[
    Rule {
        syscalls: calls!(SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev),
        when: When::Always,
        errno: libc::EPERM,
        reason: "reading or writing another process's memory (the kernel's, a sibling's)",
    },
    Rule {
        syscalls: calls!(SYS_bpf),
        when: When::Always,
        errno: libc::EPERM,
        reason: "BPF programs run in the host kernel; a large, exploit-prone attack surface",
    },
    Rule {
        syscalls: calls!(SYS_perf_event_open),
        when: When::Always,
        errno: libc::EPERM,
        reason: "performance counters leak host activity (side channels) and are kernel attack surface",
    },
    Rule {
        syscalls: calls!(SYS_keyctl, SYS_add_key, SYS_request_key),
        when: When::Always,
        errno: libc::EPERM,
        reason: "kernel keyrings are not namespaced: they could reach the host's keys",
    },
    Rule {
        syscalls: calls!(
            SYS_mount,
            SYS_umount2,
            SYS_pivot_root,
            SYS_chroot,
            SYS_move_mount,
            SYS_open_tree,
            SYS_fsopen,
            SYS_fsconfig,
            SYS_fsmount,
            SYS_fspick,
            SYS_mount_setattr
        ),
        when: When::Always,
        errno: libc::EPERM,
        reason: "changing the file system view could undo the mount plan",
    },
    Rule {
        syscalls: calls!(SYS_setns),
        when: When::Always,
        errno: libc::EPERM,
        reason: "joining another namespace would leave the sandbox's",
    },
    Rule {
        syscalls: calls!(SYS_unshare, SYS_clone),
        when: When::AnyBit { arg: 0, mask: CLONE_NAMESPACES },
        errno: libc::EPERM,
        reason: "nested namespaces (a user namespace above all) grant capabilities over new kernel objects: attack surface",
    },
    Rule {
        syscalls: calls!(SYS_clone3),
        when: When::Always,
        errno: libc::ENOSYS,
        reason: "clone3 passes its flags in memory a filter cannot inspect; ENOSYS makes libc fall back to clone, which is checked above",
    },
    Rule {
        syscalls: calls!(SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register),
        when: When::Always,
        errno: libc::EPERM,
        reason: "io_uring performs operations without passing through this filter, and has a history of kernel exploits",
    },
    Rule {
        syscalls: calls!(SYS_userfaultfd),
        when: When::Always,
        errno: libc::EPERM,
        reason: "used to stretch kernel race windows in exploits",
    },
    Rule {
        syscalls: calls!(SYS_open_by_handle_at, SYS_name_to_handle_at),
        when: When::Always,
        errno: libc::EPERM,
        reason: "opening files by handle bypasses the mount view (the 'shocker' container escape)",
    },
    Rule {
        syscalls: calls!(
            SYS_kexec_load,
            SYS_kexec_file_load,
            SYS_init_module,
            SYS_finit_module,
            SYS_delete_module,
            SYS_reboot,
            SYS_swapon,
            SYS_swapoff,
            SYS_syslog,
            SYS_acct,
            SYS_settimeofday,
            SYS_clock_settime,
            SYS_clock_adjtime,
            SYS_adjtimex,
            SYS_quotactl,
            SYS_vhangup
        ),
        when: When::Always,
        errno: libc::EPERM,
        reason: "host administration: kernels, modules, reboot, swap, clock, kernel log, quotas",
    },
    Rule {
        syscalls: calls!(SYS_ioctl),
        // The request numbers are `c_ulong` on Linux, i.e. u64 here.
        when: When::ArgIs { arg: 1, values: &[libc::TIOCSTI, libc::TIOCLINUX] },
        errno: libc::EPERM,
        reason: "TIOCSTI/TIOCLINUX push keystrokes into a terminal another process reads",
    },
    Rule {
        syscalls: calls!(SYS_socket, SYS_socketpair),
        when: When::SocketFamily,
        errno: libc::EAFNOSUPPORT,
        reason: "only Unix sockets (and loopback TCP when the sandbox has bridges or a proxy) are needed; netlink, packet and the rest are attack surface",
    },
    Rule {
        syscalls: calls!(SYS_socket),
        when: When::InetNotStream,
        errno: libc::EPERM,
        reason: "raw, packet and datagram internet sockets: the only internet traffic allowed is TCP to the sandbox's own loopback bridges",
    },
];

#[cfg(target_arch = "x86_64")]
const X86_ONLY: &[Rule] = &[Rule {
    syscalls: calls!(SYS_iopl, SYS_ioperm, SYS_uselib),
    when: When::Always,
    errno: libc::EPERM,
    reason: "direct hardware port access and legacy library loading",
}];
#[cfg(not(target_arch = "x86_64"))]
const X86_ONLY: &[Rule] = &[];

/// Every rule that applies on this architecture.
pub fn rules() -> impl Iterator<Item = &'static Rule> {
    POLICY.iter().chain(X86_ONLY)
}

/// The socket families the agent may use: Unix always; IPv4/IPv6 only with `allow_inet`
/// (the network namespace then holds nothing but loopback and the bridges).
fn allowed_families(allow_inet: bool) -> Vec<u64> {
    let mut families = vec![libc::AF_UNIX as u64];
    if allow_inet {
        families.push(libc::AF_INET as u64);
        families.push(libc::AF_INET6 as u64);
    }
    families
}

/// The types of internet socket `InetNotStream` refuses: all but stream. `SOCK_PACKET`
/// (10) is the obsolete spelling of packet sockets.
const NOT_STREAM: [i32; 5] = [libc::SOCK_DGRAM, libc::SOCK_RAW, libc::SOCK_RDM, libc::SOCK_SEQPACKET, 10];

/// Compiles the policy into one BPF program. `allow_inet`: see [`allowed_families`].
pub fn compile(allow_inet: bool) -> Result<BpfProgram, String> {
    program::compile(rules(), allow_inet)
}

/// The compiled policy for `allow_inet`, compiled once per process (the zygote compiles
/// both before it forks any sandbox, so sandboxes get them for free).
pub fn cached(allow_inet: bool) -> Result<&'static BpfProgram, String> {
    static PROGRAMS: [std::sync::OnceLock<Result<BpfProgram, String>>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    PROGRAMS[usize::from(allow_inet)]
        .get_or_init(|| compile(allow_inet).map_err(|e| format!("compile the seccomp policy: {e}")))
        .as_ref()
        .map_err(Clone::clone)
}

/// Installs a compiled program on the calling thread (setting no_new_privs first, as
/// seccomp requires for unprivileged callers).
pub fn install(program: &BpfProgram) -> Result<(), seccompiler::Error> {
    seccompiler::apply_filter(program)
}

/// The same policy compiled by seccompiler, one program per errno chained into one: what
/// the sandbox installed before `program`, kept as the reference its program is checked
/// against.
#[cfg(test)]
mod oracle {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule, TargetArch,
    };

    use super::program::SECCOMP_RET_ALLOW;
    use super::{NOT_STREAM, Rule, When, allowed_families, rules};

    const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const BPF_JA: u16 = 0x05; // BPF_JMP | BPF_JA

    fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, seccompiler::Error> {
        Ok(SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)?)
    }

    fn rules_for(rule: &Rule, allow_inet: bool) -> Result<Vec<SeccompRule>, seccompiler::Error> {
        let dword = |arg: u8, op: SeccompCmpOp, value: u64| -> Result<SeccompCondition, seccompiler::Error> {
            Ok(SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)?)
        };
        Ok(match rule.when {
            When::Always => Vec::new(),
            When::AnyBit { arg, mask } => (0..64)
                .map(|bit| 1u64 << bit)
                .filter(|bit| mask & bit != 0)
                .map(|bit| Ok(SeccompRule::new(vec![condition(arg, SeccompCmpOp::MaskedEq(bit), bit)?])?))
                .collect::<Result<_, seccompiler::Error>>()?,
            When::ArgIs { arg, values } => values
                .iter()
                .map(|&value| Ok(SeccompRule::new(vec![dword(arg, SeccompCmpOp::Eq, value)?])?))
                .collect::<Result<_, seccompiler::Error>>()?,
            When::SocketFamily => {
                let conditions = allowed_families(allow_inet)
                    .into_iter()
                    .map(|family| dword(0, SeccompCmpOp::Ne, family))
                    .collect::<Result<Vec<_>, _>>()?;
                vec![SeccompRule::new(conditions)?]
            }
            When::InetNotStream => {
                if !allow_inet {
                    return Ok(Vec::new()); // Covered by SocketFamily.
                }
                let mut denied = Vec::new();
                for family in [libc::AF_INET as u64, libc::AF_INET6 as u64] {
                    for kind in NOT_STREAM {
                        denied.push(SeccompRule::new(vec![
                            dword(0, SeccompCmpOp::Eq, family)?,
                            dword(1, SeccompCmpOp::MaskedEq(0xf), kind as u64)?,
                        ])?);
                    }
                }
                denied
            }
        })
    }

    fn target_arch() -> Result<TargetArch, seccompiler::Error> {
        Ok(TargetArch::try_from(std::env::consts::ARCH)?)
    }

    /// The policy as seccompiler compiles it, chained into one program.
    pub(super) fn compile(allow_inet: bool) -> BpfProgram {
        chain(compile_each(allow_inet).expect("seccompiler compiles the policy"))
    }

    /// Chains programs into one: in every program but the last, "allow" becomes "go on with
    /// the next program". A call is denied by the first program that denies it, as it would
    /// be by the kernel running them one after the other.
    pub(super) fn chain(programs: Vec<BpfProgram>) -> BpfProgram {
        let count = programs.len();
        let mut chained = Vec::with_capacity(programs.iter().map(Vec::len).sum());
        for (index, mut program) in programs.into_iter().enumerate() {
            if index + 1 < count {
                let length = program.len();
                for (at, instruction) in program.iter_mut().enumerate() {
                    if instruction.code == BPF_RET_K && instruction.k == SECCOMP_RET_ALLOW {
                        *instruction = seccompiler::sock_filter {
                            code: BPF_JA,
                            jt: 0,
                            jf: 0,
                            k: (length - at - 1) as u32,
                        };
                    }
                }
            }
            chained.extend(program);
        }
        chained
    }

    /// The policy as one program per errno, the x32 guard first.
    pub(super) fn compile_each(allow_inet: bool) -> Result<Vec<BpfProgram>, seccompiler::Error> {
        let mut by_errno: Vec<(i32, std::collections::BTreeMap<i64, Vec<SeccompRule>>)> = Vec::new();
        for rule in rules() {
            let conditions = rules_for(rule, allow_inet)?;
            if matches!(rule.when, When::InetNotStream) && conditions.is_empty() {
                continue;
            }
            let slot = match by_errno.iter().position(|(errno, _)| *errno == rule.errno) {
                Some(at) => at,
                None => {
                    by_errno.push((rule.errno, Default::default()));
                    by_errno.len() - 1
                }
            };
            for &(name, number) in rule.syscalls {
                // seccompiler reads an empty rule list as "always"; conditions add up (any
                // match denies). Mixing both for one call in one errno group would turn an
                // unconditional denial into a conditional one, so the policy must not.
                let group = &mut by_errno[slot].1;
                debug_assert!(
                    !group.contains_key(&number),
                    "{name} is listed twice for errno {}",
                    rule.errno
                );
                group.insert(number, conditions.clone());
            }
        }
        let arch = target_arch()?;
        let mut programs: Vec<BpfProgram> = x32_guard().into_iter().collect();
        for (errno, rules) in by_errno {
            let filter =
                SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch)?;
            programs.push(filter.try_into()?);
        }
        Ok(programs)
    }

    /// On x86_64 the x32 ABI reuses the native architecture tag with bit 30 set in the call
    /// number, so a filter keyed on native numbers would let `x32 ptrace` through. This
    /// hand-written program refuses every x32 call.
    #[cfg(target_arch = "x86_64")]
    fn x32_guard() -> Option<BpfProgram> {
        use seccompiler::sock_filter;
        const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
        const BPF_JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
        const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
        const X32_SYSCALL_BIT: u32 = 0x4000_0000;
        Some(vec![
            sock_filter { code: BPF_LD_W_ABS, jt: 0, jf: 0, k: 0 }, // seccomp_data.nr
            sock_filter { code: BPF_JGE_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
            sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | libc::EPERM as u32 },
            sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ALLOW },
        ])
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn x32_guard() -> Option<BpfProgram> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_has_a_reason_and_the_required_denials_are_listed() {
        let names: Vec<&str> = rules().flat_map(|r| r.syscalls.iter().map(|(n, _)| *n)).collect();
        for required in [
            "SYS_ptrace",
            "SYS_process_vm_readv",
            "SYS_process_vm_writev",
            "SYS_bpf",
            "SYS_keyctl",
            "SYS_mount",
            "SYS_umount2",
            "SYS_pivot_root",
            "SYS_unshare",
            "SYS_io_uring_setup",
            "SYS_io_uring_enter",
            "SYS_io_uring_register",
            "SYS_perf_event_open",
            "SYS_userfaultfd",
            "SYS_open_by_handle_at",
            "SYS_socket",
        ] {
            assert!(names.contains(&required), "{required} is not in the policy");
        }
        assert!(rules().all(|r| r.reason.len() > 20 && !r.syscalls.is_empty()));
    }

    #[test]
    fn the_policy_compiles_with_and_without_internet_sockets() {
        let closed = compile(false).unwrap();
        let bridged = compile(true).unwrap();
        assert!(bridged.len() > closed.len(), "internet families add rules");
        assert!(bridged.len() < 4096, "the kernel's limit on a program's length");
        assert!(
            closed.len() < oracle::compile(false).len(),
            "the search is shorter than seccompiler's chain: {} instructions",
            closed.len()
        );
    }

    /// Argument values that cross every condition of the policy: families, socket types
    /// (with flags), namespace bits (alone and among others), terminal requests, and
    /// values that differ only in the high 32 bits.
    fn interesting_args() -> Vec<u64> {
        let mut values: Vec<u64> = vec![0, 1, 2, 3, 5, 10, 16, 17, u64::MAX, 0xffff_ffff, 1 << 32];
        for family in
            [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK, libc::AF_PACKET, libc::AF_VSOCK]
        {
            values.push(family as u64);
            values.push((family as u64) | (1 << 32));
        }
        for kind in
            [libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_RAW, libc::SOCK_RDM, libc::SOCK_SEQPACKET, 10]
        {
            values.push(kind as u64);
            values.push((kind | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64);
        }
        for bit in 0..64 {
            values.push(1 << bit);
        }
        values.push((libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::SIGCHLD) as u64);
        values.push((libc::CLONE_VM | libc::CLONE_NEWNET) as u64);
        values.push(libc::CLONE_NEWUSER as u64 | (1 << 40));
        values.extend([
            libc::TIOCSTI,
            libc::TIOCLINUX,
            libc::TIOCSTI | (1 << 32),
            libc::TCGETS,
            libc::FIONREAD,
        ]);
        values.sort();
        values.dedup();
        values
    }

    /// Differential check: for every call number (and x32 numbers, and a foreign
    /// architecture), with every pair of interesting first two arguments for the calls
    /// the policy names, the program answers exactly what seccompiler's chain answers.
    #[test]
    fn the_program_decides_every_call_as_seccompilers_chain_does() {
        use program::tests::{data, run};
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        let named: std::collections::BTreeSet<u32> =
            rules().flat_map(|r| r.syscalls.iter().map(|&(_, n)| n as u32)).collect();
        let args = interesting_args();
        for allow_inet in [false, true] {
            let ours = compile(allow_inet).unwrap();
            let reference = oracle::compile(allow_inet);
            let mut checked = 0;
            let numbers = (0..1024).chain([0x4000_0000, 0x4000_0065, 0x7fff_ffff, 0xffff_ffff]);
            for nr in numbers {
                for arch in [AUDIT_ARCH_X86_64, AUDIT_ARCH_I386] {
                    let pairs: Vec<(u64, u64)> = if named.contains(&nr) {
                        args.iter().flat_map(|&a| args.iter().map(move |&b| (a, b))).collect()
                    } else {
                        vec![(0, 0), (u64::MAX, u64::MAX)]
                    };
                    for (a, b) in pairs {
                        let input = data(nr, arch, [a, b, a, b, 0, 0]);
                        let (got, _) = run(&ours, &input);
                        let (want, _) = run(&reference, &input);
                        assert_eq!(
                            got, want,
                            "call {nr} arch {arch:#x} args ({a:#x}, {b:#x}), allow_inet {allow_inet}: \
                             {got:#x} against seccompiler's {want:#x}"
                        );
                        checked += 1;
                    }
                }
            }
            assert!(checked > 100_000, "{checked} cases");
        }
    }

    /// What the kernel's cache emulation pays at every install: each allowed number is
    /// decided in a few instructions, where the chain walked every denied call.
    #[test]
    fn an_allowed_call_is_decided_in_a_few_instructions() {
        use program::tests::{data, run};
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        let named: std::collections::BTreeSet<u32> =
            rules().flat_map(|r| r.syscalls.iter().map(|&(_, n)| n as u32)).collect();
        for allow_inet in [false, true] {
            let ours = compile(allow_inet).unwrap();
            let reference = oracle::compile(allow_inet);
            let (mut total, mut reference_total) = (0, 0);
            for nr in (0..512).filter(|nr| !named.contains(nr)) {
                let input = data(nr, AUDIT_ARCH_X86_64, [0; 6]);
                let (verdict, steps) = run(&ours, &input);
                assert_eq!(verdict, program::SECCOMP_RET_ALLOW, "call {nr}");
                assert!(steps <= 24, "call {nr} took {steps} instructions");
                total += steps;
                reference_total += run(&reference, &input).1;
            }
            assert!(total * 5 < reference_total, "{total} steps against the chain's {reference_total}");
        }
    }
}
