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

/// Syscall numbers below this are decided by [`with_dispatch`]'s search; the rest (the x32
/// numbers among them) go through the chained parts.
const DISPATCH_NUMBERS: u32 = 1024;
/// Classic-BPF opcodes the dispatch emits or [`leaves`] follows.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_JA_K: u16 = BPF_JMP | BPF_JA;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGT_K: u16 = 0x25;
const BPF_JGE_K: u16 = 0x35;
const BPF_JSET_K: u16 = 0x45;
/// Offsets of `struct seccomp_data`'s `nr` and `arch`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// What the accumulator holds while [`leaves`] follows a range of numbers.
#[derive(Clone, Copy)]
enum Held {
    /// The syscall number.
    Number,
    /// A value that is the same for the whole range.
    Value(u32),
}

/// Follows `program` for syscall numbers `0..DISPATCH_NUMBERS` of `arch` all at once, splitting
/// the range where a comparison of the number splits it, and returns what each piece ends in
/// (sorted by its first number, adjacent equal pieces merged): the action `program` returns
/// whatever the arguments, or [`Leaf::Chained`] where it reads anything but the number and
/// the architecture or uses an instruction this does not follow. The kernel makes the same
/// analysis, one number at a time, when a filter is installed (`seccomp_is_const_allow`).
fn leaves(program: &[sock_filter], arch: u32) -> Vec<(u32, Leaf)> {
    let mut found: Vec<(u32, Leaf)> = Vec::new();
    // (pc, accumulator, first number, last number)
    let mut pending = vec![(0usize, Held::Value(0), 0u32, DISPATCH_NUMBERS - 1)];
    while let Some((mut pc, mut held, lo, hi)) = pending.pop() {
        let leaf = loop {
            let Some(insn) = program.get(pc) else {
                break Leaf::Chained;
            };
            pc += 1;
            let (jt, jf) = (pc + usize::from(insn.jt), pc + usize::from(insn.jf));
            // A comparison of the number: the pieces of [lo, hi] where it holds and where not.
            let split = |holds: (u32, u32), fails: &[(u32, u32)], pending: &mut Vec<_>| {
                for (from, to) in std::iter::once(holds)
                    .map(|r| (jt, r))
                    .chain(fails.iter().map(|r| (jf, *r)))
                {
                    let (first, last) = (to.0.max(lo), to.1.min(hi));
                    if first <= last {
                        pending.push((from, Held::Number, first, last));
                    }
                }
            };
            match (insn.code, held) {
                (BPF_LD_W_ABS, _) if insn.k == DATA_NR => held = Held::Number,
                (BPF_LD_W_ABS, _) if insn.k == DATA_ARCH => held = Held::Value(arch),
                (BPF_ALU_AND_K, Held::Value(value)) => held = Held::Value(value & insn.k),
                (BPF_JA_K, _) => match usize::try_from(insn.k) {
                    Ok(k) => pc += k,
                    Err(_) => break Leaf::Chained,
                },
                (BPF_RET_K, _) => break Leaf::Return(insn.k),
                (BPF_JEQ_K, Held::Value(value)) => pc = if value == insn.k { jt } else { jf },
                (BPF_JGT_K, Held::Value(value)) => pc = if value > insn.k { jt } else { jf },
                (BPF_JGE_K, Held::Value(value)) => pc = if value >= insn.k { jt } else { jf },
                (BPF_JSET_K, Held::Value(value)) => {
                    pc = if value & insn.k != 0 { jt } else { jf };
                }
                (BPF_JEQ_K, Held::Number) => {
                    let k = insn.k;
                    let below = (0, k.saturating_sub(1));
                    let above = (k.saturating_add(1), u32::MAX);
                    let fails: Vec<(u32, u32)> =
                        [(k > 0).then_some(below), (k < u32::MAX).then_some(above)]
                            .into_iter()
                            .flatten()
                            .collect();
                    split((k, k), &fails, &mut pending);
                    break Leaf::Split;
                }
                (BPF_JGT_K, Held::Number) => {
                    let fails = [(0, insn.k)];
                    match insn.k.checked_add(1) {
                        Some(first) => split((first, u32::MAX), &fails, &mut pending),
                        None => split((1, 0), &fails, &mut pending),
                    }
                    break Leaf::Split;
                }
                (BPF_JGE_K, Held::Number) => {
                    match insn.k.checked_sub(1) {
                        Some(last) => split((insn.k, u32::MAX), &[(0, last)], &mut pending),
                        None => split((0, u32::MAX), &[], &mut pending),
                    }
                    break Leaf::Split;
                }
                _ => break Leaf::Chained,
            }
        };
        if leaf != Leaf::Split {
            found.push((lo, leaf));
        }
    }
    found.sort_unstable_by_key(|(first, _)| *first);
    found.dedup_by(|later, earlier| later.1 == earlier.1);
    found
}

/// How the dispatch ends for a range of syscall numbers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leaf {
    /// The chained program returns this whatever the arguments.
    Return(u32),
    /// The chained program looks at more than the number: it decides.
    Chained,
    /// (While [`leaves`] follows a range: it was split, each piece is followed on its own.)
    Split,
}

/// Puts a binary search over the syscall number in front of `chained`, deciding every number
/// whose action does not depend on the arguments in a handful of instructions, and jumping
/// into `chained` for the others (and for every other architecture). It decides exactly as
/// `chained` does (the search's answers are `chained`'s own, found by following `chained` for
/// all the numbers at once).
///
/// Why: a chain of parts walks every check before the one that matches, and the kernel walks
/// it for every syscall number when the filter is installed (to find the calls it may allow
/// without running the filter), which made installing the command's filter cost about half
/// a millisecond of every sandboxed start.
///
/// # Errors
/// [`SeccompError::Install`] when the result exceeds `BPF_MAXINSNS`.
pub fn with_dispatch(chained: BpfProgram, arch: u32) -> Result<BpfProgram, SeccompError> {
    let mut ranges = leaves(&chained, arch);
    if ranges.last().is_none_or(|(_, last)| *last != Leaf::Chained) {
        ranges.push((DISPATCH_NUMBERS, Leaf::Chained));
    }
    let mut program = vec![
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: DATA_ARCH,
        },
        sock_filter {
            code: BPF_JEQ_K,
            jt: 1,
            jf: 0,
            k: arch,
        },
    ];
    // Jumps to the chained part, fixed once the search's length is known.
    let mut to_chained = vec![program.len()];
    program.push(sock_filter {
        code: BPF_JA_K,
        jt: 0,
        jf: 0,
        k: 0,
    });
    program.push(sock_filter {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k: DATA_NR,
    });
    search(&ranges, &mut program, &mut to_chained);
    let start = program.len();
    for at in to_chained {
        let too_far = || SeccompError::Install {
            name: "dispatch".to_owned(),
            message: "the search is too long to jump over".to_owned(),
        };
        program[at].k = u32::try_from(start - at - 1).map_err(|_| too_far())?;
    }
    program.extend(chained);
    if program.len() > BPF_MAXINSNS {
        return Err(SeccompError::Install {
            name: "dispatch".to_owned(),
            message: format!(
                "{} instructions exceed BPF_MAXINSNS ({BPF_MAXINSNS})",
                program.len()
            ),
        });
    }
    Ok(program)
}

/// Emits the search over `ranges` (each from its number up to the next one's) into `program`,
/// recording the jumps to the chained part in `to_chained`.
fn search(ranges: &[(u32, Leaf)], program: &mut Vec<sock_filter>, to_chained: &mut Vec<usize>) {
    match ranges {
        [] => {}
        [(_, leaf)] => {
            if *leaf == Leaf::Chained {
                to_chained.push(program.len());
            }
            program.push(sock_filter {
                code: if *leaf == Leaf::Chained {
                    BPF_JA_K
                } else {
                    BPF_RET_K
                },
                jt: 0,
                jf: 0,
                k: match leaf {
                    Leaf::Return(action) => *action,
                    Leaf::Chained | Leaf::Split => 0,
                },
            });
        }
        _ => {
            let (below, from) = ranges.split_at(ranges.len() / 2);
            // jge: at or above the middle number skips the lower half (by a jump over it).
            let test = program.len();
            program.push(sock_filter {
                code: BPF_JGE_K,
                jt: 0,
                jf: 1,
                k: from[0].0,
            });
            let over = program.len();
            program.push(sock_filter {
                code: BPF_JA_K,
                jt: 0,
                jf: 0,
                k: 0,
            });
            search(below, program, to_chained);
            let lower = program.len() - over - 1;
            // A lower half short enough is jumped over by the test itself.
            match u8::try_from(lower) {
                Ok(jt) => {
                    program.remove(over);
                    // The jumps recorded in the lower half moved one instruction back.
                    for at in to_chained.iter_mut().filter(|at| **at > over) {
                        *at -= 1;
                    }
                    program[test].jt = jt;
                    program[test].jf = 0;
                }
                Err(_) => program[over].k = u32::try_from(lower).unwrap_or(u32::MAX),
            }
            search(from, program, to_chained);
        }
    }
}
