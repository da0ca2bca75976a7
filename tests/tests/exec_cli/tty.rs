//! `--tty` on a real PTY: echo, Ctrl-C, Ctrl-D and the window size.

use super::*;

/// `exec-server exec --tty` on the slave side of a fresh PTY; returns the child and the master.
fn exec_on_pty(url: &str, command: &[&str], cols: u16, rows: u16) -> (Child, OwnedFd) {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).unwrap();
    let flags = nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_GETFD).unwrap();
    nix::fcntl::fcntl(
        &pty.master,
        nix::fcntl::FcntlArg::F_SETFD(
            nix::fcntl::FdFlag::from_bits_truncate(flags) | nix::fcntl::FdFlag::FD_CLOEXEC,
        ),
    )
    .unwrap();
    let slave = pty.slave;
    let child = exec(url, &["--tty"], command)
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    (child, pty.master)
}

/// Everything read from the PTY master, sent as it grows.
fn read_master(master: &OwnedFd) -> mpsc::Receiver<String> {
    let mut file = std::fs::File::from(master.try_clone().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        let mut buffer = [0u8; 4096];
        while let Ok(n) = file.read(&mut buffer) {
            if n == 0 {
                return;
            }
            all.push_str(&String::from_utf8_lossy(&buffer[..n]));
            if tx.send(all.clone()).is_err() {
                return;
            }
        }
    });
    rx
}

fn wait_text(rx: &mpsc::Receiver<String>, needle: &str, count: usize) -> String {
    let started = Instant::now();
    loop {
        let text = rx
            .recv_timeout(DEADLINE.saturating_sub(started.elapsed()))
            .unwrap_or_else(|_| {
                panic!("{needle:?} x{count} not seen on the terminal within {DEADLINE:?}")
            });
        if text.matches(needle).count() >= count {
            return text;
        }
    }
}

fn type_keys(master: &OwnedFd, bytes: &[u8]) {
    nix::unistd::write(master.as_fd(), bytes).unwrap();
}

#[test]
fn tty_cat_echoes_input_and_ctrl_d_ends_it() {
    let server = server();
    let (mut child, master) = exec_on_pty(server.url(), &["/bin/cat"], 80, 24);
    let screen = read_master(&master);
    type_keys(&master, b"hello\r");
    // Once from the remote terminal's echo, once from cat.
    wait_text(&screen, "hello", 2);
    type_keys(&master, b"\x04");
    let status = wait_child(&mut child, DEADLINE);
    assert_eq!(status.code(), Some(0));
}

#[test]
fn tty_ctrl_c_interrupts_the_remote_program() {
    let server = server();
    let (mut child, master) = exec_on_pty(server.url(), &sh("echo ready; exec /bin/cat"), 80, 24);
    let screen = read_master(&master);
    wait_text(&screen, "ready", 1);
    type_keys(&master, b"\x03");
    let status = wait_child(&mut child, DEADLINE);
    assert_eq!(status.code(), Some(130), "SIGINT in the remote terminal");
}

#[test]
fn tty_window_size_is_forwarded_at_start_and_on_sigwinch() {
    let server = server();
    let script = "trap 'stty size' WINCH; stty size; echo ready; while :; do /bin/sleep 0.05; done";
    let (mut child, master) = exec_on_pty(server.url(), &sh(script), 100, 30);
    let screen = read_master(&master);
    let started = wait_text(&screen, "ready", 1);
    assert!(
        started.contains("30 100"),
        "initial size not forwarded: {started:?}"
    );
    set_window_size(&master, 120, 40);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGWINCH,
    )
    .unwrap();
    wait_text(&screen, "40 120", 1);
    type_keys(&master, b"\x03");
    let status = wait_child(&mut child, DEADLINE);
    assert_eq!(status.code(), Some(130));
}

fn set_window_size(master: &OwnedFd, cols: u16, rows: u16) {
    use std::os::fd::AsRawFd;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which points at a live local.
    let status = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(status, 0, "TIOCSWINSZ");
}
