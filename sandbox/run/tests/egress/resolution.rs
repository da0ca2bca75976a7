//! Names are checked by the addresses they resolve to: loopback, an IPv4-mapped answer and the
//! host's own addresses are reached only when the address itself is named.

use super::*;

#[test]
fn a_name_resolving_to_loopback_is_refused_unless_the_address_is_named() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let before = origin.connections();
        let url = format!("http://registry.test:{}/hello", origin.port);
        let only_name = [
            "--allow-domain".to_owned(),
            format!("registry.test:{}", origin.port),
        ];
        let output = ws.run(&strs(&only_name), &["curl", "-sS", "-f", "-m", "10", &url]);
        assert!(!output.status.success(), "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stderr).contains("resolves to 127.0.0.1"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections(), before, "{uid:?}");
        let named = ws.run(
            &strs(&allow(&["registry.test"], &origin)),
            &["curl", "-sS", "-f", "-m", "10", &url],
        );
        assert!(named.status.success(), "{uid:?}: {}", describe(&named));
    }
}

#[test]
fn an_ipv4_mapped_answer_is_checked_as_its_ipv4_address() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        std::fs::write(&ws.hosts, "::ffff:127.0.0.1 mapped.test\n").unwrap();
        let url = format!("http://mapped.test:{}/hello", origin.port);
        let args = allow(&["mapped.test"], &origin);
        // The control: the mapped form of the named address is that address.
        let before = origin.connections();
        let output = ws.run(&strs(&args), &["curl", "-sS", "-f", "-m", "10", &url]);
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        assert_eq!(origin.connections() - before, 1, "{uid:?}");
        // A deny pattern naming the IPv4 address holds against the mapped answer.
        let mut denied = args.clone();
        denied.extend(["--deny-domain".to_owned(), "127.0.0.1".to_owned()]);
        let before = origin.connections();
        let output = ws.run(&strs(&denied), &["curl", "-sS", "-f", "-m", "10", &url]);
        assert!(!output.status.success(), "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stderr).contains("denied by the pattern \"127.0.0.1\""),
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections(), before, "{uid:?}");
    }
}

#[test]
fn a_name_resolving_to_one_of_the_hosts_own_addresses_is_refused_unless_named() {
    in_private_network(&["11.22.33.5/32", "2606:4700:10::5/128"], || {
        let origin = Origin::start_on("[::]:0", None);
        let p = origin.port;
        for uid in identities() {
            let ws = Workspace::new(uid);
            std::fs::write(
                &ws.hosts,
                "11.22.33.5 own4.test\n2606:4700:10::5 own6.test\n",
            )
            .unwrap();
            let names = [
                "--allow-domain".to_owned(),
                format!("own4.test:{p}"),
                "--allow-domain".to_owned(),
                format!("own6.test:{p}"),
            ];
            let script = format!(
                "curl -sS -f -m 10 http://own4.test:{p}/hello; echo \"v4=$?\"; \
                 curl -sS -f -m 10 http://own6.test:{p}/hello; echo \"v6=$?\""
            );
            let before = origin.connections();
            let output = ws.run(&strs(&names), &["sh", "-c", &script]);
            let out = text(&output.stdout);
            assert!(
                out.contains("v4=22") && out.contains("v6=22"),
                "{uid:?}: {}",
                describe(&output)
            );
            for refused in ["resolves to 11.22.33.5", "resolves to [2606:4700:10::5]"] {
                assert!(
                    text(&output.stderr).contains(refused)
                        && text(&output.stderr).contains("this host's own address"),
                    "{uid:?}: {refused}: {}",
                    describe(&output)
                );
            }
            assert_eq!(origin.connections(), before, "{uid:?}");
            // The control: with the addresses named, both are reached.
            let mut named = names.to_vec();
            named.extend([
                "--allow-domain".to_owned(),
                format!("11.22.33.5:{p}"),
                "--allow-domain".to_owned(),
                format!("[2606:4700:10::5]:{p}"),
            ]);
            let output = ws.run(&strs(&named), &["sh", "-c", &script]);
            let out = text(&output.stdout);
            assert!(
                out.contains("hello from origin\nv4=0") && out.contains("hello from origin\nv6=0"),
                "{uid:?}: {}",
                describe(&output)
            );
            assert_eq!(origin.connections() - before, 2, "{uid:?}");
        }
    });
}
