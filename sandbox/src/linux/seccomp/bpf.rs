//! Classic-BPF programs as the kernel runs them: the hand-written `x32_guard`, the listing
//! reviewers read, and the chaining of the compiled parts into one program.

use seccompiler::{BpfProgram, sock_filter};

use super::SeccompError;

/// Most instructions the kernel accepts in one classic-BPF program (`BPF_MAXINSNS`).
const BPF_MAXINSNS: usize = 4096;
/// `SECCOMP_RET_ALLOW`.
pub(super) const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// Classic-BPF opcode parts used by [`chain`].
const BPF_CLASS_MASK: u16 = 0x07;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_OP_MASK: u16 = 0xf0;
const BPF_JA: u16 = 0x00;
pub(super) const BPF_RET_K: u16 = BPF_RET;

/// A listing of a classic-BPF program (the instructions [`x32_guard`] uses), one per line.
pub fn disassemble(program: &[sock_filter]) -> String {
    let describe_ret = |k: u32| match k & 0xffff_0000 {
        0x8000_0000 => "KILL_PROCESS".to_owned(),
        0x0005_0000 => format!("ERRNO({})", k & 0xffff),
        0x7fc0_0000 => "USER_NOTIF".to_owned(),
        SECCOMP_RET_ALLOW => "ALLOW".to_owned(),
        other => format!("{other:#x}"),
    };
    program
        .iter()
        .enumerate()
        .map(|(at, insn)| {
            let text = match insn.code {
                0x20 if insn.k == 0 => "ld nr".to_owned(),
                0x20 if insn.k == 4 => "ld arch".to_owned(),
                0x20 => format!("ld [{}]", insn.k),
                0x15 => format!("jeq {:#x} ? +{} : +{}", insn.k, insn.jt, insn.jf),
                0x35 => format!("jge {:#x} ? +{} : +{}", insn.k, insn.jt, insn.jf),
                0x54 => format!("and {:#x}", insn.k),
                0x05 => format!("ja +{}", insn.k),
                0x06 => format!("ret {}", describe_ret(insn.k)),
                code => format!("op {code:#x} k {:#x}", insn.k),
            };
            format!("  {at}: {text}\n")
        })
        .collect()
}

/// Joins complete programs into one that returns the first action other than allow, taking
/// the parts in order: every `RET ALLOW` of a part but the last becomes a jump to the start of
/// the next part. For parts that never both refuse the same call (checked by a test for ours)
/// this decides exactly as installing them as separate filters, at the cost of one filter.
///
/// # Errors
/// [`SeccompError::Install`] when a part does not end in a constant return, jumps outside
/// itself, returns a computed value, or the result exceeds `BPF_MAXINSNS`.
pub fn chain(parts: &[(&str, &[sock_filter])]) -> Result<BpfProgram, SeccompError> {
    let total: usize = parts.iter().map(|(_, part)| part.len()).sum();
    if total > BPF_MAXINSNS {
        return Err(SeccompError::Install {
            name: "chain".to_owned(),
            message: format!("{total} instructions exceed BPF_MAXINSNS ({BPF_MAXINSNS})"),
        });
    }
    let mut program = Vec::with_capacity(total);
    for (index, (name, part)) in parts.iter().enumerate() {
        let malformed = |message: String| SeccompError::Install {
            name: (*name).to_owned(),
            message,
        };
        let last_part = index + 1 == parts.len();
        if part.last().is_none_or(|insn| insn.code != BPF_RET_K) {
            return Err(malformed("does not end in a constant return".to_owned()));
        }
        for (at, insn) in part.iter().enumerate() {
            let next = at + 1;
            let class = insn.code & BPF_CLASS_MASK;
            let targets_inside = match class {
                BPF_JMP if insn.code & BPF_OP_MASK == BPF_JA => {
                    usize::try_from(insn.k).is_ok_and(|k| next.saturating_add(k) < part.len())
                }
                BPF_JMP => {
                    next + usize::from(insn.jt) < part.len()
                        && next + usize::from(insn.jf) < part.len()
                }
                _ => true,
            };
            if !targets_inside {
                return Err(malformed(format!(
                    "instruction {at} jumps outside the filter"
                )));
            }
            if class == BPF_RET && insn.code != BPF_RET_K {
                return Err(malformed(format!(
                    "instruction {at} returns a computed value"
                )));
            }
            if insn.code == BPF_RET_K && insn.k == SECCOMP_RET_ALLOW && !last_part {
                let to_next_part = u32::try_from(part.len() - next)
                    .map_err(|_| malformed("too long".to_owned()))?;
                program.push(sock_filter {
                    code: BPF_JMP | BPF_JA,
                    jt: 0,
                    jf: 0,
                    k: to_next_part,
                });
            } else {
                program.push(insn.clone());
            }
        }
    }
    Ok(program)
}

/// Kills foreign-architecture syscalls and refuses x32 ones with `EPERM`.
#[cfg(target_arch = "x86_64")]
pub fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const OFFSET_NR: u32 = 0;
    const OFFSET_ARCH: u32 = 4;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ERRNO_EPERM: u32 = 0x0005_0000 | 1;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        insn(BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        insn(BPF_LD_W_ABS, 0, 0, OFFSET_NR),
        insn(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET_K, 0, 0, RET_ERRNO_EPERM),
        insn(BPF_RET_K, 0, 0, RET_ALLOW),
    ]
}
