//! The policy laid out as one classic BPF program, shaped for the kernel's cost of
//! installing it at every sandbox start.
//!
//! When a filter is attached, the kernel runs it once per system call number in a small
//! emulator (`seccomp_cache_prepare`), under the process's signal lock, to find the calls
//! it always allows; those then skip the filter for the sandbox's whole life. A policy
//! compiled as a linear chain of comparisons (one per denied call, as seccompiler lays it
//! out) makes that emulation walk the whole chain for every allowed number: about 60,000
//! steps, 0.18 ms of each sandbox start. Here the denied numbers are found by a binary
//! search instead, so an allowed number is decided in about 17 steps, and the denials
//! with argument conditions (sockets, `ioctl`, `clone`) are small blocks reached from it.
//!
//! Layout:
//!
//! ```text
//! x32 guard      nr >= X32_SYSCALL_BIT                  -> EPERM (x86_64)
//! arch check     arch != native                         -> KILL_PROCESS
//! search         jgt K: left | right; leaves: jeq nr    -> that call's block, else ALLOW
//! blocks         one per distinct rule list: conditions -> ERRNO, else ALLOW
//! ```
//!
//! The program is checked against seccompiler's compilation of the same policy, call by
//! call and argument by argument, in this module's tests.

use seccompiler::{BpfProgram, sock_filter};

use super::{Rule, When, allowed_families};

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JA: u16 = 0x05; // BPF_JMP | BPF_JA
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGT_K: u16 = 0x25; // BPF_JMP | BPF_JGT | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const BPF_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

pub(super) const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;

/// `struct seccomp_data`: `int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]`.
const NR: u32 = 0;
const ARCH: u32 = 4;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The low (`high == false`) or high 32 bits of argument `arg`.
fn arg_word(arg: u8, high: bool) -> u32 {
    let base = 16 + 8 * u32::from(arg);
    if high == cfg!(target_endian = "little") { base + 4 } else { base }
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_00f3; // AUDIT_ARCH_RISCV64

fn deny(errno: i32) -> u32 {
    SECCOMP_RET_ERRNO | (errno as u32 & 0xffff)
}

/// Where a jump goes.
#[derive(Clone, Copy)]
enum To {
    /// The next instruction.
    Next,
    /// The instruction after the next.
    Skip,
    Label(usize),
}

/// A forward-only assembler: jumps name labels, resolved to offsets at the end.
#[derive(Default)]
struct Asm {
    code: Vec<(u16, To, To, u32)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }

    fn bind(&mut self, label: usize) {
        debug_assert!(self.labels[label].is_none(), "label bound twice");
        self.labels[label] = Some(self.code.len());
    }

    fn load(&mut self, offset: u32) {
        self.code.push((BPF_LD_W_ABS, To::Next, To::Next, offset));
    }

    fn ret(&mut self, value: u32) {
        self.code.push((BPF_RET_K, To::Next, To::Next, value));
    }

    fn jump(&mut self, code: u16, k: u32, jt: To, jf: To) {
        self.code.push((code, jt, jf, k));
    }

    /// An unconditional jump: 32 bits of offset, for targets out of a conditional's reach.
    fn ja(&mut self, label: usize) {
        self.code.push((BPF_JA, To::Label(label), To::Next, 0));
    }

    fn finish(self) -> Result<BpfProgram, String> {
        let offset = |at: usize, to: To| -> Result<usize, String> {
            Ok(match to {
                To::Next => 0,
                To::Skip => 1,
                To::Label(label) => {
                    let target = self.labels[label].ok_or("a jump to a label never bound")?;
                    target.checked_sub(at + 1).ok_or("a backward jump")?
                }
            })
        };
        let short = |at: usize, to: To| -> Result<u8, String> {
            u8::try_from(offset(at, to)?).map_err(|_| format!("a conditional jump at {at} is out of reach"))
        };
        self.code
            .iter()
            .enumerate()
            .map(|(at, &(code, jt, jf, k))| {
                Ok(if code == BPF_JA {
                    sock_filter { code, jt: 0, jf: 0, k: offset(at, jt)? as u32 }
                } else {
                    sock_filter { code, jt: short(at, jt)?, jf: short(at, jf)?, k }
                })
            })
            .collect()
    }
}

/// What a denied call's block checks, in policy order: the first condition that holds
/// decides its errno.
type Conditions = Vec<(When, i32)>;

/// Compiles `rules` into one program (see the module documentation).
pub(super) fn compile<'a>(
    rules: impl Iterator<Item = &'a Rule>,
    allow_inet: bool,
) -> Result<BpfProgram, String> {
    let mut by_call: std::collections::BTreeMap<u32, Conditions> = Default::default();
    for rule in rules {
        if matches!(rule.when, When::InetNotStream) && !allow_inet {
            continue; // Covered by SocketFamily.
        }
        for &(_, number) in rule.syscalls {
            let number = u32::try_from(number).map_err(|_| format!("system call number {number}"))?;
            by_call.entry(number).or_default().push((rule.when, rule.errno));
        }
    }
    let mut asm = Asm::default();
    if cfg!(target_arch = "x86_64") {
        // x32 reuses the native architecture tag with this bit set in the number.
        asm.load(NR);
        asm.jump(BPF_JGE_K, X32_SYSCALL_BIT, To::Next, To::Skip);
        asm.ret(deny(libc::EPERM));
    }
    asm.load(ARCH);
    asm.jump(BPF_JEQ_K, AUDIT_ARCH_NATIVE, To::Skip, To::Next);
    asm.ret(SECCOMP_RET_KILL_PROCESS);
    asm.load(NR);

    // Calls with the same conditions share a block.
    let mut blocks: Vec<(Conditions, usize)> = Vec::new();
    let mut targets = Vec::with_capacity(by_call.len());
    for (&number, conditions) in &by_call {
        let label = match blocks.iter().find(|(c, _)| c == conditions) {
            Some((_, label)) => *label,
            None => {
                let label = asm.label();
                blocks.push((conditions.clone(), label));
                label
            }
        };
        targets.push((number, label));
    }
    search(&mut asm, &targets);
    for (conditions, label) in &blocks {
        asm.bind(*label);
        block(&mut asm, conditions, allow_inet);
    }
    asm.finish()
}

/// A binary search of the sorted `targets` on the number in A: a number listed jumps to
/// its block, any other is allowed.
fn search(asm: &mut Asm, targets: &[(u32, usize)]) {
    match targets {
        [] => asm.ret(SECCOMP_RET_ALLOW),
        [(number, block)] => {
            asm.jump(BPF_JEQ_K, *number, To::Next, To::Skip);
            asm.ja(*block);
            asm.ret(SECCOMP_RET_ALLOW);
        }
        _ => {
            let (left, right) = targets.split_at(targets.len() / 2);
            let right_label = asm.label();
            asm.jump(BPF_JGT_K, left[left.len() - 1].0, To::Next, To::Skip);
            asm.ja(right_label);
            search(asm, left);
            asm.bind(right_label);
            search(asm, right);
        }
    }
}

/// One call's checks, ending in "allow" when none holds.
fn block(asm: &mut Asm, conditions: &Conditions, allow_inet: bool) {
    let mut denials: Vec<(i32, usize)> = Vec::new();
    let mut denial = |asm: &mut Asm, errno: i32| match denials.iter().find(|(e, _)| *e == errno) {
        Some((_, label)) => *label,
        None => {
            let label = asm.label();
            denials.push((errno, label));
            label
        }
    };
    let mut ended = false;
    for &(when, errno) in conditions {
        match when {
            When::Always => {
                // Nothing after it can be reached.
                asm.ret(deny(errno));
                ended = true;
                break;
            }
            When::AnyBit { arg, mask } => {
                let deny_label = denial(asm, errno);
                for (high, bits) in [(false, mask as u32), (true, (mask >> 32) as u32)] {
                    if bits != 0 {
                        asm.load(arg_word(arg, high));
                        asm.jump(BPF_JSET_K, bits, To::Label(deny_label), To::Next);
                    }
                }
            }
            When::ArgIs { arg, values } => {
                let deny_label = denial(asm, errno);
                asm.load(arg_word(arg, false));
                for &value in values {
                    asm.jump(BPF_JEQ_K, value as u32, To::Label(deny_label), To::Next);
                }
            }
            When::SocketFamily => {
                let allowed = asm.label();
                asm.load(arg_word(0, false));
                for family in allowed_families(allow_inet) {
                    asm.jump(BPF_JEQ_K, family as u32, To::Label(allowed), To::Next);
                }
                asm.ret(deny(errno));
                asm.bind(allowed);
            }
            When::InetNotStream => {
                let deny_label = denial(asm, errno);
                let inet = asm.label();
                let other = asm.label();
                asm.load(arg_word(0, false));
                asm.jump(BPF_JEQ_K, libc::AF_INET as u32, To::Label(inet), To::Next);
                asm.jump(BPF_JEQ_K, libc::AF_INET6 as u32, To::Label(inet), To::Label(other));
                asm.bind(inet);
                asm.load(arg_word(1, false));
                asm.jump(BPF_AND_K, 0xf, To::Next, To::Next);
                for kind in super::NOT_STREAM {
                    asm.jump(BPF_JEQ_K, kind as u32, To::Label(deny_label), To::Next);
                }
                asm.bind(other);
            }
        }
    }
    if !ended {
        asm.ret(SECCOMP_RET_ALLOW);
    }
    for (errno, label) in denials {
        asm.bind(label);
        asm.ret(deny(errno));
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A classic BPF interpreter for what seccomp programs use, counting the
    /// instructions it runs.
    pub(crate) fn run(program: &BpfProgram, data: &[u8; 64]) -> (u32, usize) {
        let mut a: u32 = 0;
        let mut pc = 0;
        let mut steps = 0;
        loop {
            let insn = &program[pc];
            steps += 1;
            pc += 1;
            let k = insn.k;
            let cond = |taken: bool| if taken { insn.jt as usize } else { insn.jf as usize };
            match insn.code {
                BPF_LD_W_ABS => {
                    let at = k as usize;
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                BPF_JA => pc += k as usize,
                BPF_JEQ_K => pc += cond(a == k),
                BPF_JGT_K => pc += cond(a > k),
                BPF_JGE_K => pc += cond(a >= k),
                BPF_JSET_K => pc += cond(a & k != 0),
                BPF_AND_K => a &= k,
                BPF_RET_K => return (k, steps),
                other => panic!("the interpreter does not know opcode {other:#x}"),
            }
        }
    }

    pub(crate) fn data(nr: u32, arch: u32, args: [u64; 6]) -> [u8; 64] {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_ne_bytes());
        }
        data
    }

    #[test]
    fn far_targets_go_through_an_unconditional_jump() {
        let mut asm = Asm::default();
        let far = asm.label();
        asm.ja(far);
        for _ in 0..300 {
            asm.ret(0);
        }
        asm.bind(far);
        asm.ret(1);
        let program = asm.finish().unwrap();
        assert_eq!(run(&program, &[0; 64]), (1, 2));

        let mut asm = Asm::default();
        let far = asm.label();
        asm.jump(BPF_JEQ_K, 0, To::Label(far), To::Next);
        for _ in 0..300 {
            asm.ret(0);
        }
        asm.bind(far);
        asm.ret(1);
        assert!(asm.finish().unwrap_err().contains("out of reach"));
    }
}
