use super::bpf::{BPF_RET_K, SECCOMP_RET_ALLOW};
use super::*;

const VARIANTS: [Variant; 4] = [
    Variant {
        network_allowed: false,
        audit: false,
    },
    Variant {
        network_allowed: true,
        audit: false,
    },
    Variant {
        network_allowed: false,
        audit: true,
    },
    Variant {
        network_allowed: true,
        audit: true,
    },
];

#[test]
fn every_variant_compiles_for_every_supported_arch() {
    for variant in VARIANTS {
        for arch in ["x86_64", "aarch64", "riscv64"] {
            let filters = filters_for_arch(variant, arch).unwrap();
            let target = TargetArch::try_from(arch).unwrap();
            let programs = compile(&filters, target).unwrap();
            assert_eq!(programs.len(), filters.len());
        }
    }
}

#[test]
fn embedded_programs_equal_a_fresh_compile_of_the_json() {
    let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
    for variant in VARIANTS {
        let fresh = compile(&filters_for(variant).unwrap(), arch).unwrap();
        let embedded: Vec<(String, BpfProgram)> = compiled_parts(variant)
            .unwrap()
            .into_iter()
            .map(|(name, program)| (name.to_owned(), program.to_vec()))
            .collect();
        assert_eq!(embedded, fresh, "rebuild: build.rs output is stale");
    }
}

#[test]
fn the_allow_list_refuses_by_default_with_enosys_and_the_refusals_with_eperm() {
    for variant in VARIANTS {
        let filters = filters_for(variant).unwrap();
        let allow = &filters.last().unwrap().1;
        assert_eq!(allow.mismatch_action, serde_json::json!({"errno": 38}));
        assert_eq!(allow.match_action, serde_json::json!("allow"));
        for (name, filter) in &filters[..filters.len() - 1] {
            assert_eq!(filter.mismatch_action, serde_json::json!("allow"), "{name}");
            assert_eq!(
                filter.match_action,
                serde_json::json!({"errno": 1}),
                "{name}"
            );
        }
    }
}

#[test]
fn the_compact_allow_list_admits_exactly_the_listed_numbers() {
    for variant in VARIANTS {
        let allowed: Vec<i64> = allowed_syscalls(variant)
            .unwrap()
            .iter()
            .map(|name| crate::syscall_table::number(name).unwrap())
            .collect();
        let (_, allow) = compiled_parts(variant)
            .unwrap()
            .into_iter()
            .find(|(name, _)| *name == "allow")
            .unwrap();
        assert!(allow.len() < 300, "{} instructions", allow.len());
        let arch = seccomp_policy::audit_arch(std::env::consts::ARCH).unwrap();
        for nr in 0..1024u32 {
            let data = SeccompData {
                nr,
                arch,
                args: [0; 6],
            };
            let expected = if allowed.contains(&i64::from(nr)) {
                SECCOMP_RET_ALLOW
            } else {
                0x0005_0000 | 38
            };
            assert_eq!(run_bpf(allow, &data), expected, "nr {nr} {variant:?}");
        }
        let foreign = SeccompData {
            nr: 0,
            arch: 0x4000_0003,
            args: [0; 6],
        };
        assert_eq!(run_bpf(allow, &foreign), 0x8000_0000, "foreign arch");
    }
}

#[test]
fn nothing_dangerous_is_on_the_allow_list() {
    for variant in VARIANTS {
        let allowed = allowed_syscalls(variant).unwrap();
        for refused in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "mount",
            "umount2",
            "open_tree",
            "move_mount",
            "fsopen",
            "fsmount",
            "mount_setattr",
            "unshare",
            "setns",
            "bpf",
            "perf_event_open",
            "keyctl",
            "io_uring_setup",
            "userfaultfd",
            "clone3",
            "openat2",
            "chroot",
            "pivot_root",
            "init_module",
            "kexec_load",
        ] {
            assert!(
                !allowed.iter().any(|name| name == refused),
                "{refused} is on the allow-list"
            );
        }
    }
}

/// `struct seccomp_data` as the filters see it.
struct SeccompData {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

/// A classic-BPF interpreter for the instructions seccompiler and `x32_guard` emit.
fn run_bpf(program: &[sock_filter], data: &SeccompData) -> u32 {
    run_bpf_counting(program, data).0
}

/// [`run_bpf`], also counting the instructions it ran and saying whether it read more than the
/// number and architecture.
fn run_bpf_counting(program: &[sock_filter], data: &SeccompData) -> (u32, usize, bool) {
    let word = |offset: u32| -> u32 {
        match offset {
            0 => data.nr,
            4 => data.arch,
            16..=63 => {
                let arg = data.args[(offset as usize - 16) / 8];
                if offset.is_multiple_of(8) {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => panic!("load from offset {offset}"),
        }
    };
    let (mut acc, mut pc, mut steps, mut read_more) = (0u32, 0usize, 0usize, false);
    loop {
        let insn = &program[pc];
        pc += 1;
        steps += 1;
        let jump = |taken: bool| usize::from(if taken { insn.jt } else { insn.jf });
        match insn.code {
            0x20 => {
                read_more |= insn.k > 4;
                acc = word(insn.k);
            }
            0x54 => acc &= insn.k,
            0x05 => pc += insn.k as usize,
            0x15 => pc += jump(acc == insn.k),
            0x25 => pc += jump(acc > insn.k),
            0x35 => pc += jump(acc >= insn.k),
            0x45 => pc += jump(acc & insn.k != 0),
            0x06 => return (insn.k, steps, read_more),
            code => panic!("unexpected opcode {code:#x} at {}", pc - 1),
        }
    }
}

/// What the chained program must decide: the parts in order, the first that does not
/// allow decides.
fn run_in_order(parts: &[(&str, &[sock_filter])], data: &SeccompData) -> u32 {
    parts
        .iter()
        .map(|(_, part)| run_bpf(part, data))
        .find(|ret| *ret != SECCOMP_RET_ALLOW)
        .unwrap_or(SECCOMP_RET_ALLOW)
}

#[test]
fn chained_program_decides_like_its_parts_taken_in_order() {
    const AUDIT_ARCHES: [u32; 4] = [0xc000_003e, 0x4000_0003, 0xc000_00b7, 0xc000_00f3];
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let mut values: Vec<u64> = vec![0, 1, 2, 10, 16, 17, 0x5412, 0x541c, 0x5413, u64::MAX];
    values.extend((11..31).map(|bit| 1u64 << bit)); // every CLONE_NEW* flag and neighbours
    values.extend([0x5412 | (1 << 32), 1 | (1 << 32), 0x7e02_0000]);
    let mut arg_sets: Vec<[u64; 6]> = values.iter().map(|v| [*v; 6]).collect();
    for v in &values {
        arg_sets.push([*v, 0, 0, 0, 0, 0]);
        arg_sets.push([0, *v, 0, 0, 0, 0]);
    }
    for variant in VARIANTS {
        let guard;
        let mut parts: Vec<(&str, &[sock_filter])> = Vec::new();
        if cfg!(target_arch = "x86_64") {
            guard = x32_guard_program();
            parts.push(("x32_guard", &guard));
        }
        parts.extend(compiled_parts(variant).unwrap());
        let (names, chained) = program_for(variant).unwrap();
        assert_eq!(names.len(), parts.len());
        let (mut refused, mut checked) = (0, 0);
        for arch in AUDIT_ARCHES {
            for nr in (0..=1100).chain((0..=512).map(|nr| nr | X32_SYSCALL_BIT)) {
                for args in &arg_sets {
                    let data = SeccompData {
                        nr,
                        arch,
                        args: *args,
                    };
                    let expected = run_in_order(&parts, &data);
                    assert_eq!(
                        run_bpf(&chained, &data),
                        expected,
                        "arch {arch:#x} nr {nr} args {args:x?} {variant:?}"
                    );
                    refused += usize::from(expected != SECCOMP_RET_ALLOW);
                    checked += 1;
                }
            }
        }
        assert!(refused > 0 && refused < checked, "{refused} of {checked}");
    }
}

#[cfg(target_arch = "x86_64")]
fn x32_guard_program() -> BpfProgram {
    x32_guard()
}

#[cfg(not(target_arch = "x86_64"))]
fn x32_guard_program() -> BpfProgram {
    unreachable!("x32_guard exists on x86_64 only")
}

#[test]
fn chain_rejects_parts_that_jump_outside_themselves() {
    let ret_allow = sock_filter {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k: SECCOMP_RET_ALLOW,
    };
    let escaping = [
        sock_filter {
            code: 0x15,
            jt: 1,
            jf: 0,
            k: 0,
        },
        ret_allow.clone(),
    ];
    let ok = [ret_allow.clone()];
    assert!(chain(&[("escaping", &escaping), ("ok", &ok)]).is_err());
    let unterminated = [sock_filter {
        code: 0x20,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    assert!(chain(&[("unterminated", &unterminated), ("ok", &ok)]).is_err());
    assert_eq!(chain(&[("ok", &ok), ("ok", &ok)]).unwrap().len(), 2);
}

#[test]
fn uncommented_rules_are_rejected() {
    let text = r#"{"f": {"mismatch_action": "allow", "match_action": {"errno": 1},
        "filter": [{"syscall": "ptrace", "comment": " "}]}}"#;
    assert!(seccomp_policy::parse(text).is_err());
    let text = r#"{"f": {"mismatch_action": "allow", "match_action": {"errno": 1},
        "filter": [{"syscall": "ptrace"}]}}"#;
    assert!(seccomp_policy::parse(text).is_err());
    let text = r#"{"f": {"mismatch_action": "allow", "match_action": {"errno": 1},
        "filter": [{"syscall": "ptrace", "comment": "c", "network": "maybe"}]}}"#;
    assert!(seccomp_policy::parse(text).is_err());
}

#[test]
fn ioctl_rules_compare_32_bits() {
    let filters = filters_for(VARIANTS[1]).unwrap();
    let ioctl: Vec<&seccomp_policy::Rule> = filters
        .iter()
        .flat_map(|(_, f)| f.filter.iter())
        .filter(|r| r.syscall == "ioctl")
        .collect();
    assert!(!ioctl.is_empty());
    assert!(
        ioctl
            .iter()
            .all(|r| r.args.iter().all(|c| c.len == "dword"))
    );
}

/// The kernel reads the socket calls' family, type, protocol, flags, level and option name
/// as ints: a rule comparing 64 bits would let `value | 1 << 32` through.
#[test]
fn socket_rules_compare_32_bits() {
    for variant in VARIANTS {
        let filters = filters_for(variant).unwrap();
        let rules: Vec<&seccomp_policy::Rule> = filters
            .iter()
            .flat_map(|(_, f)| f.filter.iter())
            .filter(|r| {
                [
                    "socket",
                    "socketpair",
                    "sendto",
                    "sendmsg",
                    "sendmmsg",
                    "setsockopt",
                ]
                .contains(&r.syscall.as_str())
            })
            .filter(|r| !r.args.is_empty())
            .collect();
        assert!(rules.len() >= 9, "{variant:?}: {rules:?}");
        assert!(
            rules
                .iter()
                .all(|r| r.args.iter().all(|c| c.len == "dword")),
            "{variant:?}"
        );
    }
}

/// The installed program decides a call whose action does not depend on its arguments in a
/// few instructions (the search in front of the chain), so installing it is cheap: the kernel
/// runs the program for every syscall number then, to find the calls it may allow without
/// running it (about half a millisecond of each sandboxed start while the chain was walked).
#[test]
fn the_search_decides_argument_free_calls_in_a_few_instructions() {
    let arch = crate::linux::seccomp_policy::audit_arch(std::env::consts::ARCH).unwrap();
    for variant in VARIANTS {
        let (_, program) = program_for(variant).unwrap();
        let (mut with_arguments, mut slowest) = (0, 0);
        for nr in 0..1024 {
            let data = SeccompData {
                nr,
                arch,
                args: [0; 6],
            };
            let (_, steps, read_arguments) = run_bpf_counting(&program, &data);
            if read_arguments {
                with_arguments += 1;
            } else {
                slowest = slowest.max(steps);
            }
        }
        // The few calls whose arguments are looked at (clone, ioctl, socket, ...) walk the chain.
        assert!(
            with_arguments < 40,
            "{with_arguments} calls read arguments ({variant:?})"
        );
        assert!(
            slowest <= 20,
            "an argument-free call took {slowest} instructions ({variant:?})"
        );
    }
}

#[test]
fn every_syscall_of_the_seccomp_policies_has_a_name() {
    for (network_allowed, audit) in [(false, true), (true, true)] {
        let variant = Variant {
            network_allowed,
            audit,
        };
        for (_, filter) in filters_for(variant).unwrap() {
            for rule in filter.filter {
                assert!(
                    crate::syscall_table::number(&rule.syscall).is_some(),
                    "{} missing",
                    rule.syscall
                );
            }
        }
    }
}
