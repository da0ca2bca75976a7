use super::*;
use pretty_assertions::assert_eq;

fn limits(json: serde_json::Value) -> Limits {
    serde_json::from_value(json).unwrap()
}

#[test]
fn cgroups_enforce_memory_and_processes_for_the_tree() {
    let caps = Capabilities {
        tracking: true,
        memory: Some(CgroupVersion::V1),
        pids: Some(CgroupVersion::V2),
    };
    let plan = plan(
        &limits(serde_json::json!({"memoryBytes": 64, "processes": 8, "cpuSeconds": 2})),
        caps,
    )
    .unwrap();
    assert_eq!(plan.memory, Some((CgroupVersion::V1, 64)));
    assert_eq!(plan.pids, Some((CgroupVersion::V2, 8)));
    assert_eq!(plan.cpu_budget, Some(Duration::from_secs(2)));
    assert_eq!(plan.rlimits.cpu_seconds, Some(2));
    assert_eq!(plan.rlimits.address_space_bytes, None);
    let memory = plan.applied.memory_bytes.unwrap();
    assert_eq!(
        (memory.enforcement, memory.scope),
        (Enforcement::CgroupV1, LimitScope::Tree)
    );
}

#[test]
fn without_cgroups_memory_and_processes_fail_unless_best_effort() {
    let caps = Capabilities::default();
    let error = plan(&limits(serde_json::json!({"processes": 64})), caps).unwrap_err();
    assert!(
        matches!(
            error,
            PlanError::Unenforceable {
                limit: LimitName::Processes,
                value: 64,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("limits.processes (64)"),
        "{error}"
    );
    let error = plan(&limits(serde_json::json!({"memoryBytes": 1024})), caps).unwrap_err();
    assert!(error.to_string().contains("limits.memoryBytes"), "{error}");

    let best =
        limits(serde_json::json!({"memoryBytes": 1024, "processes": 64, "bestEffort": true}));
    let plan = plan(&best, caps).unwrap();
    assert_eq!(plan.rlimits.address_space_bytes, Some(1024));
    assert_eq!(
        plan.applied.memory_bytes.unwrap().enforcement,
        Enforcement::Rlimit
    );
    assert_eq!(
        plan.applied.processes.unwrap().enforcement,
        Enforcement::None
    );
    assert_eq!(plan.pids, None);
}

#[test]
fn zero_and_overlong_limits_are_refused() {
    let caps = Capabilities::default();
    assert_eq!(
        plan(&limits(serde_json::json!({"openFiles": 0})), caps),
        Err(PlanError::Zero {
            limit: LimitName::OpenFiles
        })
    );
    assert!(matches!(
        plan(
            &limits(serde_json::json!({"wallSeconds": MAX_WALL_SECONDS + 1})),
            caps
        ),
        Err(PlanError::WallTooLong { .. })
    ));
}

#[test]
fn rlimit_and_timer_limits_work_everywhere() {
    let plan = plan(
        &limits(serde_json::json!({"cpuSeconds": 1, "wallSeconds": 3, "fileSizeBytes": 10, "openFiles": 32})),
        Capabilities::default(),
    )
    .unwrap();
    assert_eq!(
        plan.rlimits,
        CommandLimits {
            cpu_seconds: Some(1),
            file_size_bytes: Some(10),
            open_files: Some(32),
            wall_seconds: Some(3),
            ..CommandLimits::default()
        }
    );
    assert_eq!(plan.wall, Some(Duration::from_secs(3)));
    assert_eq!(plan.cpu_budget, None, "no cgroup: no tree budget");
    assert_eq!(plan.applied.cpu_seconds.unwrap().scope, LimitScope::Process);
}

#[test]
fn a_sandboxed_start_gets_its_share_of_the_hosts_tasks_unless_it_sets_processes() {
    let cgroup = Capabilities {
        pids: Some(CgroupVersion::V1),
        ..Capabilities::default()
    };
    let mut plain = plan(&Limits::default(), cgroup).unwrap();
    plain.for_sandbox(cgroup, 4096);
    assert_eq!(plain.pids, Some((CgroupVersion::V1, 4096)));
    assert_eq!(plain.rlimits.processes, None, "the cgroup holds it");
    let applied = plain.applied.get(LimitName::Processes).unwrap();
    assert_eq!((applied.value, applied.scope), (4096, LimitScope::Tree));
    // No pids cgroup: RLIMIT_NPROC, counted in the sandbox's user namespace.
    let mut rlimit = plan(&Limits::default(), Capabilities::default()).unwrap();
    rlimit.for_sandbox(Capabilities::default(), 4096);
    assert_eq!((rlimit.pids, rlimit.rlimits.processes), (None, Some(4096)));
    assert_eq!(
        rlimit
            .applied
            .get(LimitName::Processes)
            .unwrap()
            .enforcement,
        Enforcement::Rlimit
    );
    // A start's own processes stays as asked.
    let asked = limits(serde_json::json!({"processes": 20000}));
    let mut own = plan(&asked, cgroup).unwrap();
    own.for_sandbox(cgroup, 4096);
    assert_eq!(own.pids, Some((CgroupVersion::V1, 20000)));
}

#[test]
fn pool_bounds_are_held_by_the_sandbox_and_refused_without_one() {
    let asked = limits(serde_json::json!({
        "inotifyInstances": 3, "inotifyWatches": 40, "pendingSignals": 5,
        "messageQueueBytes": 4096, "ptys": 2
    }));
    let mut sandboxed = plan(&asked, Capabilities::default()).unwrap();
    assert_eq!(
        sandboxed.rlimits.pools,
        sandbox::limits::PoolLimits {
            inotify_instances: Some(3),
            inotify_watches: Some(40),
            pending_signals: Some(5),
            message_queue_bytes: Some(4096),
            ptys: Some(2),
        }
    );
    assert!(sandboxed.rlimits.rlimits().is_empty());
    for name in LimitName::POOLS {
        let applied = sandboxed.applied.get(name).unwrap();
        assert_eq!(applied.enforcement, Enforcement::Sandbox, "{name}");
        assert!(applied.detail.contains("share"), "{}", applied.detail);
    }
    // Without a sandbox nothing holds them: refused, naming the limit...
    let error = sandboxed.clone().without_sandbox().unwrap_err();
    assert!(
        error.to_string().contains("limits.inotifyInstances (3)")
            && error.to_string().contains("no sandbox"),
        "{error}"
    );
    // ... or, with best effort, reported as not enforced and not passed on.
    sandboxed.best_effort = true;
    sandboxed.without_sandbox().unwrap();
    assert!(sandboxed.rlimits.pools.is_empty());
    assert_eq!(
        sandboxed.applied.ptys.unwrap().enforcement,
        Enforcement::None
    );
    // A plan without them starts without a sandbox.
    let mut plain = plan(
        &limits(serde_json::json!({"openFiles": 64})),
        Capabilities::default(),
    )
    .unwrap();
    plain.without_sandbox().unwrap();
    assert_eq!(plain.rlimits.open_files, Some(64));
    assert_eq!(
        parse_default_limits("ptys=8,messageQueueBytes=1M,pendingSignals=100")
            .unwrap()
            .message_queue_bytes,
        Some(1 << 20)
    );
}

#[test]
fn default_limits_parse_names_sizes_and_best_effort() {
    let parsed =
        parse_default_limits("memoryBytes=2G, processes=512,fileSizeBytes=10k,bestEffort").unwrap();
    assert_eq!(
        parsed,
        limits(serde_json::json!({
            "memoryBytes": 2u64 << 30, "processes": 512, "fileSizeBytes": 10240, "bestEffort": true
        }))
    );
    for bad in [
        "memory=1",
        "processes",
        "processes=1G",
        "openFiles=0",
        "cpuSeconds=x",
    ] {
        let error = parse_default_limits(bad).unwrap_err();
        assert_eq!(error.item, bad);
    }
}

#[test]
fn exit_reasons_prefer_what_the_server_did_then_what_the_kernel_says() {
    let killed = ExitFacts {
        code: 137,
        signal: Some(libc::SIGKILL),
        ..ExitFacts::default()
    };
    assert_eq!(
        exit_reason(&ExitFacts {
            terminated: true,
            ..killed
        }),
        ExitReason::Terminated
    );
    assert_eq!(
        exit_reason(&ExitFacts {
            wall_fired: true,
            ..killed
        }),
        ExitReason::WallTimeout
    );
    assert_eq!(
        exit_reason(&ExitFacts {
            oom_kills: 1,
            ..killed
        }),
        ExitReason::Oom
    );
    assert_eq!(
        exit_reason(&ExitFacts {
            oom_kills: 1,
            code: 0,
            signal: None,
            ..killed
        }),
        ExitReason::Exit,
        "a process that succeeded despite an OOM kill below it exited"
    );
    assert_eq!(
        exit_reason(&ExitFacts {
            code: 152,
            signal: Some(libc::SIGXCPU),
            ..killed
        }),
        ExitReason::CpuLimit
    );
    let past_cpu = ExitFacts {
        cpu_limit: Some(Duration::from_secs(1)),
        cpu_used: Duration::from_millis(2000),
        ..killed
    };
    assert_eq!(exit_reason(&past_cpu), ExitReason::CpuLimit);
    let past_wall = ExitFacts {
        wall_limit: Some(Duration::from_secs(1)),
        elapsed: Duration::from_millis(1500),
        ..killed
    };
    assert_eq!(exit_reason(&past_wall), ExitReason::WallTimeout);
    assert_eq!(exit_reason(&killed), ExitReason::Signal);
    assert_eq!(
        exit_reason(&ExitFacts {
            code: 3,
            ..ExitFacts::default()
        }),
        ExitReason::Exit
    );
}
